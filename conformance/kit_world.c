/* Worlds of a conformance case: see kit.h. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance/kit.h"
#include "conformance/kit_mem.h"

static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t hash_str(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static size_t bytes_of(refit_dtype dt, int64_t numel)
{
    return ((size_t)numel * dt.bits * (dt.lanes ? dt.lanes : 1) + 7) / 8;
}

static int64_t numel_of(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

int kit_has_nan(refit_dtype dt)
{
    switch (dt.code) {
    case REFIT_DTYPE_FLOAT:
        return dt.bits == 16 || dt.bits == 32 || dt.bits == 64;
    case REFIT_DTYPE_BFLOAT:
    case REFIT_DTYPE_FLOAT8_E4M3FN:
    case REFIT_DTYPE_FLOAT8_E5M2:
    case REFIT_DTYPE_FLOAT8_E8M0FNU:
        return 1;
    default:
        return 0;
    }
}

static void put_nan(void *p, refit_dtype dt)
{
    if (dt.code == REFIT_DTYPE_FLOAT && dt.bits == 32) {
        float f = NAN;
        memcpy(p, &f, 4);
    } else if (dt.code == REFIT_DTYPE_FLOAT && dt.bits == 64) {
        double f = NAN;
        memcpy(p, &f, 8);
    } else if (dt.code == REFIT_DTYPE_FLOAT && dt.bits == 16) {
        uint16_t v = 0x7e00;
        memcpy(p, &v, 2);
    } else if (dt.code == REFIT_DTYPE_BFLOAT) {
        uint16_t v = 0x7fc0;
        memcpy(p, &v, 2);
    } else if (dt.code == REFIT_DTYPE_FLOAT8_E4M3FN) {
        *(uint8_t *)p = 0x7f;
    } else if (dt.code == REFIT_DTYPE_FLOAT8_E5M2) {
        *(uint8_t *)p = 0x7e;
    } else if (dt.code == REFIT_DTYPE_FLOAT8_E8M0FNU) {
        *(uint8_t *)p = 0xff;
    }
}

void kit_value(void *p, refit_dtype dt, const char *name, uint64_t version, int64_t i)
{
    uint64_t h = mix(hash_str(name) ^ mix(version * 0x9e3779b97f4a7c15ull) ^ (uint64_t)i);
    unsigned s = (unsigned)(h >> 63);
    /* finite values of magnitude [0.25, 4) for every float dtype */
    float f = (s ? -1.0f : 1.0f) * (0.25f + (float)(h % 3750u) / 1000.0f);
    switch (dt.code) {
    case REFIT_DTYPE_FLOAT:
        if (dt.bits == 32) {
            memcpy(p, &f, 4);
        } else if (dt.bits == 64) {
            double v = f;
            memcpy(p, &v, 8);
        } else {
            uint16_t v = (uint16_t)(s << 15 | (13u + (unsigned)(h >> 20) % 4u) << 10 |
                                    (unsigned)(h >> 32) % 1024u);
            memcpy(p, &v, 2);
        }
        return;
    case REFIT_DTYPE_BFLOAT: {
        uint32_t b;
        memcpy(&b, &f, 4);
        uint16_t v = (uint16_t)(b >> 16);
        memcpy(p, &v, 2);
        return;
    }
    case REFIT_DTYPE_FLOAT8_E4M3FN:
        *(uint8_t *)p = (uint8_t)(s << 7 | (4u + (unsigned)(h >> 20) % 8u) << 3 |
                                  (unsigned)(h >> 32) % 8u);
        return;
    case REFIT_DTYPE_FLOAT8_E5M2:
        *(uint8_t *)p = (uint8_t)(s << 7 | (12u + (unsigned)(h >> 20) % 7u) << 2 |
                                  (unsigned)(h >> 32) % 4u);
        return;
    case REFIT_DTYPE_FLOAT8_E8M0FNU:
        *(uint8_t *)p = (uint8_t)(120u + h % 16u);
        return;
    case REFIT_DTYPE_BOOL:
        *(uint8_t *)p = (uint8_t)(h & 1u);
        return;
    default: /* integers, packed 4-bit codes: any bits */
        memcpy(p, &h, bytes_of(dt, 1) < 8 ? bytes_of(dt, 1) : 8);
        return;
    }
}

int kit_slice(const mdoc_ck *ck, int rank, int64_t *lo, int64_t *hi)
{
    if (ck->shard_count <= 1 || ck->ndim == 0) {
        *lo = 0;
        *hi = ck->ndim ? ck->shape[0] : 1;
        return 0;
    }
    int r = ck->shard_rank >= 0 ? ck->shard_rank : rank;
    int64_t e = ck->pad_to ? ck->pad_to : ck->shape[ck->shard_dim];
    int64_t base = e / ck->shard_count, extra = e % ck->shard_count;
    *lo = r * base + (r < extra ? r : extra);
    *hi = *lo + base + (r < extra ? 1 : 0);
    return 1;
}

const mdoc_ck *kit_entry(const mdoc *doc, const char *name, const mdoc_mod **mod)
{
    for (size_t i = 0; i < doc->n_mods; i++)
        for (size_t j = 0; j < doc->mods[i].n_ck; j++)
            if (!doc->mods[i].ck[j].tie && !strcmp(doc->mods[i].ck[j].name, name)) {
                if (mod)
                    *mod = &doc->mods[i];
                return &doc->mods[i].ck[j];
            }
    return NULL;
}

/* ---- worlds ---- */

static int on_device(const kit_env *env)
{
    return env->device.device_type == REFIT_DEVICE_CUDA;
}

static int fail(char *why, size_t n, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *why, size_t n, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
    return rc ? rc : REFIT_EINTERNAL;
}

static void quiet_log(void *user, int level, const char *msg)
{
    (void)user;
    if (level == 0)
        fprintf(stderr, "# refit: %s\n", msg);
}

/* The module's params as a flat YAML mapping. */
static char *params_yaml(const mdoc_mod *mod)
{
    size_t n = 1;
    for (size_t i = 0; i < mod->n_params; i++)
        n += strlen(mod->params[i].key) + strlen(mod->params[i].value) + 8;
    char *s = calloc(1, n), *p = s;
    if (!s)
        return NULL;
    for (size_t i = 0; i < mod->n_params; i++)
        p += sprintf(p, "%s: \"%s\"\n", mod->params[i].key, mod->params[i].value);
    return s;
}

/* The case as API calls, each sharded entry declared as rank's slice. */
static int add_sliced(kit_world *w, char *why, size_t n)
{
    const mdoc *doc = w->env->doc;
    for (size_t i = 0; i < doc->n_mods; i++) {
        const mdoc_mod *mod = &doc->mods[i];
        char *params = mod->n_params ? params_yaml(mod) : NULL;
        if (mod->n_params && !params)
            return fail(why, n, REFIT_ENOMEM, "out of memory");
        int rc = refit_model_add_module(w->m, mod->name, mod->format, params);
        free(params);
        if (rc)
            return fail(why, n, rc, "module %s: %s", mod->name, refit_errmsg(w->ctx));
        for (size_t j = 0; j < mod->n_ck; j++) {
            const mdoc_ck *ck = &mod->ck[j];
            refit_ckpt_spec sp = REFIT_CKPT_SPEC_INIT;
            sp.dtype = ck->dtype;
            sp.ndim = ck->ndim;
            memcpy(sp.shape, ck->shape, sizeof sp.shape);
            memcpy(sp.dst_offset, ck->dst_offset, sizeof sp.dst_offset);
            sp.target = ck->target;
            sp.expert = ck->expert;
            sp.tie_of = ck->tie;
            sp.pad_to = ck->pad_to;
            int64_t lo, hi;
            if (kit_slice(ck, w->rank, &lo, &hi)) {
                if (ck->pad_to)
                    return fail(why, n, REFIT_EUNSUPPORTED, "%s is padded and sharded: the kit "
                                "has no unsharded twin of it", ck->name);
                sp.shape[ck->shard_dim] = hi - lo;
            } else if (ck->shard_count > 1) {
                sp.shard_dim = ck->shard_dim;
                sp.shard_count = ck->shard_count;
                sp.shard_rank = ck->shard_rank >= 0 ? ck->shard_rank : w->rank;
            }
            rc = refit_model_expect(w->m, mod->name, ck->name, &sp);
            if (rc)
                return fail(why, n, rc, "expect %s: %s", ck->name, refit_errmsg(w->ctx));
        }
    }
    return REFIT_OK;
}

int kit_world_open(kit_world *w, const kit_env *env, int rank, kit_layout layout,
                   unsigned char junk, char *why, size_t n)
{
    memset(w, 0, sizeof *w);
    w->env = env;
    w->rank = rank;
    w->layout = layout;
    if (on_device(env)) { /* the host twin: the plugin's CPU path */
        struct twin_box {
            kit_world w; /* first: freed through w->twin */
            kit_env env;
        } *box = calloc(1, sizeof *box);
        if (!box)
            return fail(why, n, REFIT_ENOMEM, "out of memory");
        box->env = *env;
        box->env.device = (refit_device){REFIT_DEVICE_CPU, 0};
        w->twin = &box->w;
        char twhy[1024];
        int rc = kit_world_open(w->twin, &box->env, rank, layout, junk, twhy, sizeof twhy);
        if (rc)
            return fail(why, n, rc, "the host twin of the device world: %s", twhy);
    }
    refit_options o = REFIT_OPTIONS_INIT;
    o.plugin_dirs = env->plugin_dir;
    o.journal_path = "";
    o.rank = rank;
    o.worker_id = "conformance";
    o.log_fn = quiet_log;
    int rc = refit_open(&w->ctx, &o);
    if (rc)
        return fail(why, n, rc, "refit_open: %s", refit_status_name(rc));
    rc = refit_model_create(&w->m, w->ctx);
    if (rc)
        return fail(why, n, rc, "refit_model_create: %s", refit_errmsg(w->ctx));
    if (layout == KIT_SHARDED) {
        rc = refit_model_load_manifest(w->m, env->case_path);
        if (rc)
            return fail(why, n, rc, "%s", refit_errmsg(w->ctx));
    } else if ((rc = add_sliced(w, why, n)) != REFIT_OK) {
        return rc;
    }
    size_t total = 0;
    for (size_t i = 0; i < env->doc->n_mods; i++)
        total += env->doc->mods[i].n_rt;
    w->rt = calloc(total ? total : 1, sizeof *w->rt);
    if (!w->rt)
        return fail(why, n, REFIT_ENOMEM, "out of memory");
    for (size_t i = 0; i < env->doc->n_mods; i++) {
        const mdoc_mod *mod = &env->doc->mods[i];
        for (size_t j = 0; j < mod->n_rt; j++) {
            const mdoc_rt *d = &mod->rt[j];
            kit_rt *r = &w->rt[w->n_rt++];
            r->module = mod->name;
            r->name = d->name;
            memcpy(r->shape, d->shape, sizeof r->shape);
            r->bytes = bytes_of(d->dtype, numel_of(d->ndim, d->shape));
            r->buf = kit_mem_alloc(env->device, r->bytes);
            if (!r->buf)
                return fail(why, n, REFIT_ENOMEM, "no memory for runtime tensor %s/%s (%zu "
                            "bytes)", mod->name, d->name, r->bytes);
            if (kit_mem_fill(env->device, r->buf, junk, r->bytes))
                return fail(why, n, REFIT_EINTERNAL, "filling runtime tensor %s/%s failed",
                            mod->name, d->name);
            r->t = (refit_tensor){r->buf, env->device, d->ndim, d->dtype, r->shape, NULL, 0};
            rc = refit_module_bind_runtime(w->m, mod->name, d->name, &r->t);
            if (rc)
                return fail(why, n, rc, "bind %s/%s: %s", mod->name, d->name,
                            refit_errmsg(w->ctx));
        }
    }
    rc = refit_model_seal(w->m);
    if (rc)
        return fail(why, n, rc, "seal: %s", refit_errmsg(w->ctx));
    return REFIT_OK;
}

void kit_world_close(kit_world *w)
{
    refit_close(w->ctx);
    kit_release_sources(w);
    free(w->keep);
    for (size_t i = 0; i < w->n_rt; i++)
        kit_mem_free(w->env->device, w->rt[i].buf);
    free(w->rt);
    if (w->twin) {
        kit_world_close(w->twin);
        free(w->twin);
    }
    memset(w, 0, sizeof *w);
}

void kit_release_sources(kit_world *w)
{
    for (size_t i = 0; i < w->n_keep; i++)
        kit_mem_free(w->env->device, w->keep[i]);
    w->n_keep = 0;
}

/* The source at host bytes buf where the world's update reads it: buf
 * itself on the host; on a device, a device copy kept until the update
 * ends (kit_release_sources). NULL when out of memory. */
static void *placed(kit_world *w, const void *buf, size_t bytes)
{
    if (!on_device(w->env))
        return (void *)buf;
    void **keep = realloc(w->keep, (w->n_keep + 1) * sizeof *keep);
    if (!keep)
        return NULL;
    w->keep = keep;
    void *p = kit_mem_alloc(w->env->device, bytes);
    if (p && kit_mem_put(w->env->device, p, buf, bytes)) {
        kit_mem_free(w->env->device, p);
        p = NULL;
    }
    if (p)
        w->keep[w->n_keep++] = p;
    return p;
}

/* ---- deliveries ---- */

/* The source of entry ck for this world: the full tensor (SHARDED) or
 * rank's slice of it (SLICED), filled for d. *split: its split dim. */
static void *make_source(const kit_world *w, const mdoc_ck *ck, const kit_delivery *d,
                         int64_t *shape, int *split, size_t *bytes)
{
    int64_t lo, hi;
    int sharded = kit_slice(ck, w->rank, &lo, &hi);
    int dim = sharded ? ck->shard_dim : 0;
    memcpy(shape, ck->shape, sizeof(int64_t) * REFIT_MAX_DIMS);
    int64_t off = 0; /* first row of the source along dim, in the full tensor */
    if (sharded && w->layout == KIT_SLICED) {
        shape[dim] = hi - lo;
        off = lo;
    }
    *split = dim;
    int64_t numel = numel_of(ck->ndim, shape);
    *bytes = bytes_of(ck->dtype, numel);
    /* 64-byte aligned, as a framework's allocations are: a format that
     * reads its staged views in place then reads these */
    unsigned char *buf = aligned_alloc(64, (*bytes + 63) & ~(size_t)63 ? (*bytes + 63) &
                                                                         ~(size_t)63 : 64);
    if (!buf)
        return NULL;
    size_t es = ck->dtype.bits >= 8 ? (size_t)ck->dtype.bits / 8 : 0;
    if (!es) { /* packed sub-byte codes: bytes, no poisoning, no NaN */
        for (size_t i = 0; i < *bytes; i++)
            kit_value(buf + i, REFIT_U8, ck->name, d->version, (int64_t)i);
        return buf;
    }
    int64_t idx[REFIT_MAX_DIMS] = {0};
    for (int64_t e = 0; e < numel; e++) {
        /* flat index of this element in the full tensor */
        int64_t full = 0;
        for (int k = 0; k < ck->ndim; k++)
            full = full * ck->shape[k] + idx[k] + (k == dim ? off : 0);
        unsigned char *p = buf + (size_t)e * es;
        int other = sharded && w->layout == KIT_SHARDED && ck->ndim &&
                    (idx[dim] < lo || idx[dim] >= hi);
        if (other && d->poison_others && kit_has_nan(ck->dtype))
            put_nan(p, ck->dtype);
        else
            kit_value(p, ck->dtype, ck->name, d->version ^ (other && d->poison_others ?
                                                            0x5eedull : 0), full);
        for (int k = ck->ndim - 1; k >= 0; k--) {
            if (++idx[k] < shape[k])
                break;
            idx[k] = 0;
        }
    }
    if (d->nan_in && !strcmp(d->nan_in, ck->name))
        put_nan(buf, ck->dtype); /* row 0: rank 0's */
    return buf;
}

/* Every tensor of d in one refit_load_many, the sources alive until it
 * returns. */
static int deliver_many(kit_world *w, refit_txn *t, const kit_delivery *d, char *why, size_t n)
{
    const mdoc *doc = w->env->doc;
    size_t cap = 0, k = 0;
    for (size_t i = 0; i < doc->n_mods; i++)
        cap += doc->mods[i].n_ck;
    const char **names = calloc(cap + 1, sizeof *names);
    refit_tensor *srcs = calloc(cap + 1, sizeof *srcs);
    int64_t (*shapes)[REFIT_MAX_DIMS] = calloc(cap + 1, sizeof *shapes);
    void **bufs = calloc(cap + 1, sizeof *bufs);
    int rc = names && srcs && shapes && bufs ? REFIT_OK
                                             : fail(why, n, REFIT_ENOMEM, "out of memory");
    for (size_t i = 0; i < doc->n_mods && !rc; i++)
        for (size_t j = 0; j < doc->mods[i].n_ck && !rc; j++) {
            const mdoc_ck *ck = &doc->mods[i].ck[j];
            if (ck->tie || (d->skip && !strcmp(d->skip, ck->name)))
                continue;
            int dim;
            size_t bytes;
            if (!(bufs[k] = make_source(w, ck, d, shapes[k], &dim, &bytes))) {
                rc = fail(why, n, REFIT_ENOMEM, "out of memory");
                break;
            }
            names[k] = ck->name;
            void *at = placed(w, bufs[k], bytes);
            if (!at) {
                free(bufs[k]);
                rc = fail(why, n, REFIT_ENOMEM, "no memory for the source of %s", ck->name);
                break;
            }
            /* on a device the host bytes stay, to compare the source with */
            srcs[k] = (refit_tensor){at, w->env->device, ck->ndim, ck->dtype, shapes[k], NULL, 0};
            k++;
        }
    if (!rc && (rc = refit_load_many(t, k, names, srcs, NULL)))
        fail(why, n, rc, "refit_load_many of %zu tensors: %s: %s", k, refit_status_name(rc),
             refit_errmsg(w->ctx));
    /* a source a post-load read in place must come back as it was given */
    for (size_t i = 0, at = 0; i < doc->n_mods && !rc; i++)
        for (size_t j = 0; j < doc->mods[i].n_ck && !rc; j++) {
            const mdoc_ck *ck = &doc->mods[i].ck[j];
            if (ck->tie || (d->skip && !strcmp(d->skip, ck->name)))
                continue;
            int64_t shape[REFIT_MAX_DIMS];
            int dim;
            size_t bytes;
            void *again = make_source(w, ck, d, shape, &dim, &bytes);
            void *now = again ? malloc(bytes ? bytes : 1) : NULL;
            if (!now)
                rc = fail(why, n, REFIT_ENOMEM, "out of memory");
            else if (kit_mem_get(w->env->device, now, srcs[at].data, bytes))
                rc = fail(why, n, REFIT_EINTERNAL, "reading the source of %s back failed",
                          ck->name);
            else if (memcmp(again, now, bytes))
                rc = fail(why, n, REFIT_EINTERNAL, "refit_load_many: the caller's source of "
                          "%s changed during the call: a post-load wrote a staged view it "
                          "reads in place (REFIT_MODULE_STAGED_IN_PLACE)", ck->name);
            free(again);
            free(now);
            at++;
        }
    for (size_t i = 0; bufs && i < k; i++)
        free(bufs[i]);
    free(names);
    free(srcs);
    free(shapes);
    free(bufs);
    return rc;
}

int kit_deliver(kit_world *w, refit_txn *t, const kit_delivery *d, char *why, size_t n)
{
    const mdoc *doc = w->env->doc;
    if (d->many)
        return deliver_many(w, t, d, why, n);
    for (size_t i = 0; i < doc->n_mods; i++) {
        for (size_t j = 0; j < doc->mods[i].n_ck; j++) {
            const mdoc_ck *ck = &doc->mods[i].ck[j];
            if (ck->tie || (d->skip && !strcmp(d->skip, ck->name)))
                continue;
            int64_t shape[REFIT_MAX_DIMS];
            int dim;
            size_t bytes;
            unsigned char *host = make_source(w, ck, d, shape, &dim, &bytes);
            unsigned char *buf = host ? placed(w, host, bytes) : NULL;
            if (!buf) {
                free(host);
                return fail(why, n, REFIT_ENOMEM, "no memory for the source of %s", ck->name);
            }
            refit_tensor src = {buf, w->env->device, ck->ndim, ck->dtype, shape, NULL, 0};
            int rc;
            size_t es = ck->dtype.bits >= 8 ? (size_t)ck->dtype.bits / 8 : 0;
            if (d->cuts > 0 && es && ck->ndim > 0 && shape[dim] > 1) {
                int64_t strides[REFIT_MAX_DIMS], s = 1;
                for (int k = ck->ndim - 1; k >= 0; k--) {
                    strides[k] = s;
                    s *= shape[k];
                }
                int64_t rows = shape[dim];
                int cuts = d->cuts < rows ? d->cuts : (int)rows;
                rc = REFIT_OK;
                /* last cut first: parts may come in any order */
                for (int c = cuts - 1; c >= 0 && !rc; c--) {
                    int64_t a = rows * c / cuts, b = rows * (c + 1) / cuts;
                    int64_t pshape[REFIT_MAX_DIMS];
                    memcpy(pshape, shape, sizeof pshape);
                    pshape[dim] = b - a;
                    refit_tensor part = {buf + (size_t)(a * strides[dim]) * es,
                                         w->env->device, ck->ndim, ck->dtype, pshape,
                                         strides, 0};
                    rc = refit_load_part(t, ck->name, a, &part, NULL);
                }
            } else {
                rc = refit_load(t, ck->name, &src, NULL);
            }
            free(host);
            if (rc)
                return fail(why, n, rc, "load %s: %s: %s", ck->name, refit_status_name(rc),
                            refit_errmsg(w->ctx));
        }
    }
    return REFIT_OK;
}

/* One update on w alone: see kit_update. */
static int update_one(kit_world *w, const kit_delivery *d, const char *label, char *why,
                      size_t n)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = label;
    o.rollback = 1;
    refit_txn *t;
    int rc = refit_begin(&t, w->m, &o);
    if (rc)
        return fail(why, n, rc, "begin %s: %s", label, refit_errmsg(w->ctx));
    rc = kit_deliver(w, t, d, why, n);
    if (rc) {
        refit_abort(t);
        kit_release_sources(w);
        return rc;
    }
    rc = refit_finalize(t);
    kit_release_sources(w);
    if (rc)
        return fail(why, n, rc, "finalize %s: %s: %s", label, refit_status_name(rc),
                    refit_errmsg(w->ctx));
    return REFIT_OK;
}

int kit_update(kit_world *w, const kit_delivery *d, const char *label, char *why, size_t n)
{
    int rc = update_one(w, d, label, why, n);
    if (!w->twin)
        return rc;
    char hwhy[2048];
    int hrc = update_one(w->twin, d, label, hwhy, sizeof hwhy);
    if (rc && hrc)
        return rc; /* both refused: the check judges the device's refusal */
    if (rc) {
        char dwhy[2048];
        snprintf(dwhy, sizeof dwhy, "%s", why);
        return fail(why, n, REFIT_EMISMATCH, "update %s failed on the device but committed on "
                    "the host (the plugin's CPU path): %s", label, dwhy);
    }
    if (hrc)
        return fail(why, n, REFIT_EMISMATCH, "update %s committed on the device but failed on "
                    "the host (the plugin's CPU path): %s", label, hwhy);
    if (w->env->fault && !strcmp(w->env->fault, "twin"))
        kit_flip_first_byte(w); /* --self-test-fault=twin */
    size_t nd = 0, nh = 0;
    void *dev = kit_snapshot(w, &nd), *host = kit_snapshot(w->twin, &nh);
    char where[256] = "";
    if (!dev || !host || nd != nh)
        rc = fail(why, n, REFIT_EINTERNAL, "update %s: reading the runtime bytes back failed",
                  label);
    else if (memcmp(dev, host, nd))
        rc = fail(why, n, REFIT_EMISMATCH, "update %s: the device's bytes differ from the "
                  "plugin's CPU path at %s (device, then host)", label,
                  kit_diff(w, dev, host, where, sizeof where));
    free(dev);
    free(host);
    return rc;
}

void *kit_snapshot(const kit_world *w, size_t *bytes)
{
    size_t n = 0;
    for (size_t i = 0; i < w->n_rt; i++)
        n += w->rt[i].bytes;
    unsigned char *s = malloc(n ? n : 1), *p = s;
    if (!s)
        return NULL;
    for (size_t i = 0; i < w->n_rt; i++) {
        if (kit_mem_get(w->env->device, p, w->rt[i].buf, w->rt[i].bytes)) {
            free(s);
            return NULL;
        }
        p += w->rt[i].bytes;
    }
    *bytes = n;
    return s;
}

void kit_flip_first_byte(kit_world *w)
{
    unsigned char b;
    if (w->n_rt && w->rt[0].bytes && !kit_mem_get(w->env->device, &b, w->rt[0].buf, 1)) {
        b ^= 1;
        kit_mem_put(w->env->device, w->rt[0].buf, &b, 1);
    }
}

const char *kit_diff(const kit_world *w, const void *a, const void *b, char *buf, size_t n)
{
    const unsigned char *x = a, *y = b;
    size_t at = 0;
    buf[0] = 0;
    for (size_t i = 0; i < w->n_rt; i++) {
        for (size_t k = 0; k < w->rt[i].bytes; k++)
            if (x[at + k] != y[at + k]) {
                snprintf(buf, n, "%s/%s byte %zu (0x%02x, then 0x%02x)", w->rt[i].module,
                         w->rt[i].name, k, x[at + k], y[at + k]);
                return buf;
            }
        at += w->rt[i].bytes;
    }
    return buf;
}
