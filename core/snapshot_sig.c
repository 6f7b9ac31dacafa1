#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/ctx.h"
#include "core/plugin_loader.h"
#include "core/sha256.h"
#include "core/snapshot_sig.h"

static json_t *dims(int32_t ndim, const int64_t *v)
{
    json_t *a = json_array();
    for (int32_t i = 0; a && i < ndim; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *dtype_json(refit_dtype dt)
{
    char buf[32];
    const char *name = refit_dtype_name(dt);
    if (!strcmp(name, "?")) { /* still exact: the DLPack triple */
        snprintf(buf, sizeof buf, "%u.%u.%u", dt.code, dt.bits, dt.lanes);
        name = buf;
    }
    return json_string(name);
}

static const char *route_word(uint32_t kind)
{
    switch (kind) {
    case REFIT_ROUTE_DIRECT: return "direct";
    case REFIT_ROUTE_VIEW: return "view";
    case REFIT_ROUTE_STAGED: return "staged";
    }
    return "none";
}

/* SHA-256 of the plugin file a format came from (the descriptor the
 * loader vetted and opened, else its path); "in-process" for a format the
 * embedder registered itself. */
static int plugin_identity(refit_ctx *ctx, const refit_format_v2 *fmt, char *out, size_t n)
{
    const plugin_entry *pe = plugins_entry_of(ctx->plugins, fmt);
    if (!pe) {
        snprintf(out, n, "in-process");
        return REFIT_OK;
    }
    int fd = pe->fd >= 0 ? pe->fd : open(pe->real ? pe->real : pe->path, O_RDONLY | O_CLOEXEC);
    st_sha256_ctx c;
    if (fd < 0 || st_sha256_init(&c))
        return ctx_error(ctx, fd < 0 ? REFIT_EIO : REFIT_ENOMEM, "snapshot: plugin %s: %s",
                         pe->path, fd < 0 ? strerror(errno) : "out of memory");
    char buf[65536];
    off_t at = 0;
    ssize_t got;
    int bad = 0;
    while (!bad && (got = pread(fd, buf, sizeof buf, at)) > 0) {
        bad = st_sha256_update(&c, buf, (size_t)got);
        at += got;
    }
    bad |= got < 0;
    if (fd != pe->fd)
        close(fd);
    uint8_t d[ST_SHA256_DIGEST];
    if (bad || st_sha256_final(&c, d)) {
        st_sha256_free(&c);
        return ctx_error(ctx, REFIT_EIO, "snapshot: cannot read plugin %s", pe->path);
    }
    char hex[ST_SHA256_HEX];
    st_sha256_hex(d, hex);
    snprintf(out, n, "sha256:%s", hex);
    return REFIT_OK;
}

static json_t *runtime_json(refit_ctx *ctx, const tensor_reg *r)
{
    refit_device_info di = {0};
    di.struct_size = sizeof di;
    char cc[16] = "0.0";
    if (ctx->host.device_info(ctx->host.host, r->sig.device, &di) == REFIT_OK)
        snprintf(cc, sizeof cc, "%d.%d", di.cc_major, di.cc_minor);
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(r->name));
    json_object_set_new(o, "dtype", dtype_json(r->sig.dtype));
    json_object_set_new(o, "shape", dims(r->sig.ndim, r->sig.shape));
    json_object_set_new(o, "strides", dims(r->sig.ndim, r->sig.strides));
    json_object_set_new(o, "device", json_string(di.backend ? di.backend : "none"));
    json_object_set_new(o, "compute_capability", json_string(cc));
    return o;
}

static json_t *ckpt_json(const route *r)
{
    const refit_ckpt_spec *s = &r->spec;
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(r->name));
    json_object_set_new(o, "route", json_string(route_word(r->kind)));
    json_object_set_new(o, "dtype", dtype_json(s->dtype));
    json_object_set_new(o, "shape", dims(s->ndim, s->shape));
    json_object_set_new(o, "target", r->target_name ? json_string(r->target_name) : json_null());
    json_object_set_new(o, "tie_of", r->tie_name ? json_string(r->tie_name) : json_null());
    json_t *sh = json_object();
    json_object_set_new(sh, "dim", json_integer(s->shard_count > 1 ? s->shard_dim : 0));
    json_object_set_new(sh, "rank", json_integer(s->shard_count > 1 ? s->shard_rank : 0));
    json_object_set_new(sh, "count", json_integer(s->shard_count > 1 ? s->shard_count : 1));
    json_object_set_new(o, "shard", sh);
    json_object_set_new(o, "pad_to", json_integer(s->pad_to));
    json_object_set_new(o, "expert", json_integer(s->expert));
    json_object_set_new(o, "dst_offset", dims(s->ndim, s->dst_offset));
    return o;
}

static json_t *module_json(refit_model *m, const module *mod, const char *identity)
{
    json_t *o = json_object(), *params = json_object(), *plugin = json_object();
    json_t *rt = json_array(), *ck = json_array();
    const refit_format_v2 *f = mod->fmt;
    const char *version = REFIT_STRUCT_HAS(f, refit_format_v2, version) ? f->version : NULL;
    json_object_set_new(o, "name", json_string(mod->name));
    json_object_set_new(o, "format", json_string(f->name));
    json_object_set_new(plugin, "identity", json_string(identity));
    json_object_set_new(plugin, "version", version ? json_string(version) : json_null());
    json_object_set_new(o, "plugin", plugin);
    for (size_t i = 0; i < mod->params.n; i++)
        json_object_set_new(params, mod->params.keys[i], json_string(mod->params.values[i]));
    json_object_set_new(o, "params", params);
    json_object_set_new(o, "flags", json_integer(mod->fm.flags));
    for (uint32_t k = 0; k < mod->n_runtime; k++)
        json_array_append_new(rt, runtime_json(m->ctx, &m->runtime[mod->runtime[k]]));
    json_object_set_new(o, "runtime", rt);
    for (uint32_t k = 0; k < mod->n_routes; k++)
        json_array_append_new(ck, ckpt_json(&m->routes[mod->routes[k]]));
    json_object_set_new(o, "checkpoint", ck);
    return o;
}

json_t *snap_signature(refit_model *m)
{
    refit_ctx *ctx = m->ctx;
    json_t *sig = json_object(), *abi = json_object(), *mods = json_array();
    char version[32];
    snprintf(version, sizeof version, "%d.%d.%d", REFIT_VERSION_MAJOR, REFIT_VERSION_MINOR,
             REFIT_VERSION_PATCH);
    json_object_set_new(abi, "refit", json_string(version));
    json_object_set_new(abi, "format_abi", json_integer(REFIT_FORMAT_ABI_VERSION));
    json_object_set_new(sig, "abi", abi);
    json_object_set_new(sig, "rank", json_integer(ctx->rank));
    json_object_set_new(sig, "modules", mods);
    /* one digest per distinct format (a model has a handful) */
    const refit_format_v2 *seen[REFIT_MAX_FORMATS];
    char ids[REFIT_MAX_FORMATS][80];
    uint32_t n_seen = 0;
    for (uint32_t i = 0; i < m->n_modules; i++) {
        const module *mod = &m->modules[i];
        uint32_t k = 0;
        while (k < n_seen && seen[k] != mod->fmt)
            k++;
        if (k == n_seen) {
            if (n_seen == REFIT_MAX_FORMATS || plugin_identity(ctx, mod->fmt, ids[k], sizeof ids[k])) {
                json_decref(sig);
                if (n_seen == REFIT_MAX_FORMATS)
                    ctx_error(ctx, REFIT_EINTERNAL, "snapshot: more formats than registered");
                return NULL;
            }
            seen[n_seen++] = mod->fmt;
        }
        json_array_append_new(mods, module_json(m, mod, ids[k]));
    }
    return sig;
}
