/* The author's reference: see kit_reference.h. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "conformance/kit_mem.h"
#include "conformance/kit_reference.h"
#include "core/safetensors.h"
#include "core/safetensors_write.h"

static int say(char *why, size_t n, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int say(char *why, size_t n, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
    return rc;
}

/* The safetensors dtype of dt; -1 when the spec has none. */
static int st_of(refit_dtype dt, st_dtype *out)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        refit_dtype r = st_dtype_to_refit((st_dtype)i);
        if (r.code == dt.code && r.bits == dt.bits && (dt.lanes ? dt.lanes : 1) == 1) {
            *out = (st_dtype)i;
            return 0;
        }
    }
    return -1;
}

static int64_t numel(int ndim, const int64_t *shape)
{
    int64_t e = 1;
    for (int d = 0; d < ndim; d++)
        e *= shape[d];
    return e;
}

/* rank's slice of entry ck at version, as the kit delivers it (kit_value
 * of each element's index in the full tensor): malloc'd, shape set. */
static void *slice_of(const mdoc_ck *ck, int rank, uint64_t version, int64_t *shape,
                      size_t *bytes, char *why, size_t n)
{
    int64_t lo, hi;
    int sharded = kit_slice(ck, rank, &lo, &hi);
    memcpy(shape, ck->shape, sizeof(int64_t) * REFIT_MAX_DIMS);
    size_t es = ck->dtype.bits >= 8 ? (size_t)ck->dtype.bits / 8 : 0;
    if (sharded && (!es || ck->pad_to)) {
        say(why, n, REFIT_EUNSUPPORTED, "%s is sharded and %s: the reference gets no slice of "
            "it", ck->name, es ? "padded" : "packed below a byte");
        return NULL;
    }
    if (sharded)
        shape[ck->shard_dim] = hi - lo;
    int64_t count = numel(ck->ndim, shape);
    *bytes = es ? (size_t)count * es : ((size_t)count * ck->dtype.bits + 7) / 8;
    unsigned char *buf = malloc(*bytes ? *bytes : 1);
    if (!buf) {
        say(why, n, REFIT_ENOMEM, "out of memory");
        return NULL;
    }
    if (!es) { /* packed codes: the kit's bytes, as make_source writes them */
        for (size_t i = 0; i < *bytes; i++)
            kit_value(buf + i, REFIT_U8, ck->name, version, (int64_t)i);
        return buf;
    }
    int64_t idx[REFIT_MAX_DIMS] = {0};
    for (int64_t e = 0; e < count; e++) {
        int64_t full = 0;
        for (int k = 0; k < ck->ndim; k++)
            full = full * ck->shape[k] + idx[k] + (sharded && k == ck->shard_dim ? lo : 0);
        kit_value(buf + (size_t)e * es, ck->dtype, ck->name, version, full);
        for (int k = ck->ndim - 1; k >= 0; k--) {
            if (++idx[k] < shape[k])
                break;
            idx[k] = 0;
        }
    }
    return buf;
}

static json_t *shape_json(int ndim, const int64_t *shape)
{
    json_t *a = json_array();
    for (int d = 0; d < ndim; d++)
        json_array_append_new(a, json_integer(shape[d]));
    return a;
}

static const char *st_name_of(refit_dtype dt)
{
    st_dtype s;
    return st_of(dt, &s) ? refit_dtype_name(dt) : st_dtype_name(s);
}

/* One module's entry of request.json. */
static json_t *module_json(const mdoc_mod *mod, int rank, const int64_t (*shapes)[REFIT_MAX_DIMS],
                           size_t first)
{
    json_t *m = json_object(), *params = json_object(), *cks = json_array(),
           *rts = json_array();
    json_object_set_new(m, "name", json_string(mod->name));
    for (size_t i = 0; i < mod->n_params; i++)
        json_object_set_new(params, mod->params[i].key, json_string(mod->params[i].value));
    json_object_set_new(m, "params", params);
    for (size_t j = 0, k = first; j < mod->n_ck; j++) {
        const mdoc_ck *ck = &mod->ck[j];
        json_t *c = json_object();
        json_object_set_new(c, "name", json_string(ck->name));
        if (ck->tie) { /* no bytes of its own: the tensor it ties */
            json_object_set_new(c, "tie", json_string(ck->tie));
            json_array_append_new(cks, c);
            continue;
        }
        const mdoc_rt *t = mdoc_target(mod, ck);
        json_object_set_new(c, "dtype", json_string(st_name_of(ck->dtype)));
        json_object_set_new(c, "shape", shape_json(ck->ndim, shapes[k]));
        json_object_set_new(c, "target", t ? json_string(t->name) : json_null());
        int64_t lo, hi;
        if (kit_slice(ck, rank, &lo, &hi)) {
            json_t *sh = json_object();
            json_object_set_new(sh, "dim", json_integer(ck->shard_dim));
            json_object_set_new(sh, "count", json_integer(ck->shard_count));
            json_object_set_new(sh, "rank", json_integer(ck->shard_rank >= 0 ? ck->shard_rank
                                                                               : rank));
            json_object_set_new(sh, "start", json_integer(lo));
            json_object_set_new(sh, "full_shape", shape_json(ck->ndim, ck->shape));
            json_object_set_new(c, "shard", sh);
        }
        json_object_set_new(c, "dst_offset", shape_json(t ? t->ndim : 0, ck->dst_offset));
        if (ck->expert >= 0)
            json_object_set_new(c, "expert", json_integer(ck->expert));
        json_array_append_new(cks, c);
        k++;
    }
    json_object_set_new(m, "checkpoint", cks);
    for (size_t j = 0; j < mod->n_rt; j++) {
        json_t *r = json_object();
        json_object_set_new(r, "name", json_string(mod->rt[j].name));
        json_object_set_new(r, "key", json_sprintf("%s/%s", mod->name, mod->rt[j].name));
        json_object_set_new(r, "dtype", json_string(st_name_of(mod->rt[j].dtype)));
        json_object_set_new(r, "shape", shape_json(mod->rt[j].ndim, mod->rt[j].shape));
        json_array_append_new(rts, r);
    }
    json_object_set_new(m, "runtime", rts);
    return m;
}

/* `cmd request` through /bin/sh, its stdout on stderr (stdout is TAP). */
static int run_command(const char *cmd, const char *request, char *why, size_t n)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return say(why, n, REFIT_EIO, "fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(2, 1);
        char line[8192];
        snprintf(line, sizeof line, "%s \"$1\"", cmd);
        execl("/bin/sh", "sh", "-c", line, "sh", request, (char *)NULL);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return say(why, n, REFIT_EIO, "waitpid: %s", strerror(errno));
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return REFIT_OK;
    if (WIFEXITED(st))
        return say(why, n, REFIT_EINVAL, "the reference `%s %s` exited with status %d", cmd,
                   request, WEXITSTATUS(st));
    return say(why, n, REFIT_EINVAL, "the reference `%s %s` was killed by signal %d", cmd,
               request, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* Runtime tensor r of w (bytes here, on the host) against the reference's
 * tensor of the same key in out. */
static int compare_one(const kit_rt *r, const void *mine, const st_set *out, const char *key,
                       char *why, size_t n)
{
    const st_tensor *t = st_find(out, key);
    if (!t)
        return say(why, n, REFIT_EMISMATCH, "the reference's runtime.safetensors has no tensor "
                   "%s (runtime tensor %s of module %s)", key, r->name, r->module);
    refit_dtype dt = st_dtype_to_refit(t->dtype);
    int same_shape = t->ndim == r->t.ndim;
    for (int d = 0; same_shape && d < t->ndim; d++)
        same_shape = t->shape[d] == r->shape[d];
    if (dt.code != r->t.dtype.code || dt.bits != r->t.dtype.bits || !same_shape ||
        t->nbytes != r->bytes)
        return say(why, n, REFIT_EMISMATCH, "the reference's %s is %s of %d dims (%llu bytes); "
                   "runtime tensor %s/%s is %s of %d dims (%zu bytes)", key,
                   st_dtype_name(t->dtype), t->ndim, (unsigned long long)t->nbytes, r->module,
                   r->name, refit_dtype_name(r->t.dtype), r->t.ndim, r->bytes);
    const unsigned char *a = mine, *b = t->data;
    for (size_t k = 0; k < r->bytes; k++)
        if (a[k] != b[k]) {
            size_t es = r->t.dtype.bits >= 8 ? (size_t)r->t.dtype.bits / 8 : 1;
            return say(why, n, REFIT_EMISMATCH, "runtime tensor %s/%s differs from the "
                       "reference at byte %zu (element %zu): the plugin wrote 0x%02x, the "
                       "reference expects 0x%02x", r->module, r->name, k, k / es, a[k], b[k]);
        }
    return REFIT_OK;
}

static int is_format(const kit_world *w, const mdoc_mod *mod)
{
    return !strcmp(mod->format, w->env->format);
}

/* Write the request into dir. */
static int write_request(const kit_world *w, uint64_t version, const char *dir, char *why,
                         size_t n)
{
    const mdoc *doc = w->env->doc;
    size_t cap = 0, k = 0;
    for (size_t i = 0; i < doc->n_mods; i++)
        cap += doc->mods[i].n_ck;
    st_out_tensor *ts = calloc(cap + 1, sizeof *ts);
    int64_t (*shapes)[REFIT_MAX_DIMS] = calloc(cap + 1, sizeof *shapes);
    void **bufs = calloc(cap + 1, sizeof *bufs);
    json_t *mods = json_array();
    int rc = ts && shapes && bufs && mods ? REFIT_OK : say(why, n, REFIT_ENOMEM, "out of memory");
    for (size_t i = 0; i < doc->n_mods && !rc; i++) {
        const mdoc_mod *mod = &doc->mods[i];
        if (!is_format(w, mod))
            continue;
        size_t first = k;
        for (size_t j = 0; j < mod->n_ck && !rc; j++) {
            const mdoc_ck *ck = &mod->ck[j];
            if (ck->tie)
                continue;
            st_dtype sd;
            size_t bytes;
            if (st_of(ck->dtype, &sd)) {
                rc = say(why, n, REFIT_EUNSUPPORTED, "%s is %s, which safetensors cannot "
                         "name", ck->name, refit_dtype_name(ck->dtype));
            } else if ((bufs[k] = slice_of(ck, w->rank, version, shapes[k], &bytes, why, n))) {
                ts[k] = (st_out_tensor){ck->name, sd, ck->ndim, shapes[k], bufs[k]};
                k++;
            } else {
                rc = REFIT_EUNSUPPORTED;
            }
        }
        if (!rc)
            json_array_append_new(mods, module_json(mod, w->rank, shapes, first));
    }
    char ckpt[600], rt[600], req[600];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.safetensors", dir);
    snprintf(rt, sizeof rt, "%s/runtime.safetensors", dir);
    snprintf(req, sizeof req, "%s/request.json", dir);
    st_error err;
    if (!rc && (rc = st_write_file(ckpt, ts, k, NULL, 0, &err))) {
        char line[1024];
        say(why, n, rc, "writing the checkpoint for the reference: %s",
            st_error_line(&err, line, sizeof line));
    }
    if (!rc) {
        json_t *r = json_pack("{s:s, s:s, s:i, s:i, s:I, s:s, s:s, s:O}", "format",
                              w->env->format, "case", w->env->case_path, "rank", w->rank,
                              "ranks", w->env->tp, "version", (json_int_t)version,
                              "checkpoint", ckpt, "runtime", rt, "modules", mods);
        if (!r || json_dump_file(r, req, JSON_INDENT(1) | JSON_SORT_KEYS))
            rc = say(why, n, REFIT_EIO, "cannot write %s", req);
        json_decref(r);
    }
    json_decref(mods);
    for (size_t i = 0; bufs && i < k; i++)
        free(bufs[i]);
    free(ts);
    free(shapes);
    free(bufs);
    return rc;
}

/* Every runtime tensor of the format's modules against out; a tensor of
 * out that is none of them is an error too (a misspelt key). */
static int compare_all(const kit_world *w, const st_set *out, char *why, size_t n)
{
    size_t wanted = 0;
    for (size_t i = 0; i < w->n_rt; i++) {
        const kit_rt *r = &w->rt[i];
        const mdoc_mod *mod = NULL;
        for (size_t m = 0; m < w->env->doc->n_mods && !mod; m++)
            if (!strcmp(w->env->doc->mods[m].name, r->module))
                mod = &w->env->doc->mods[m];
        if (!mod || !is_format(w, mod))
            continue;
        wanted++;
        char key[512];
        snprintf(key, sizeof key, "%s/%s", r->module, r->name);
        unsigned char *mine = malloc(r->bytes ? r->bytes : 1);
        int rc = !mine ? say(why, n, REFIT_ENOMEM, "out of memory")
                 : kit_mem_get(w->env->device, mine, r->buf, r->bytes)
                     ? say(why, n, REFIT_EINTERNAL, "reading %s back failed", key)
                     : compare_one(r, mine, out, key, why, n);
        free(mine);
        if (rc)
            return rc;
    }
    if (st_count(out) != wanted)
        for (size_t i = 0; i < st_count(out); i++) {
            const char *name = st_tensor_at(out, i)->name, *slash = strchr(name, '/');
            int known = 0;
            for (size_t j = 0; slash && j < w->n_rt && !known; j++)
                known = !strncmp(name, w->rt[j].module, (size_t)(slash - name)) &&
                        !w->rt[j].module[slash - name] && !strcmp(slash + 1, w->rt[j].name);
            if (!known)
                return say(why, n, REFIT_EMISMATCH, "the reference's runtime.safetensors holds "
                           "%s, which is no runtime tensor of the case (keys are "
                           "MODULE/NAME)", name);
        }
    return REFIT_OK;
}

int kit_reference_run(const kit_world *w, uint64_t version, char *why, size_t n)
{
    char dir[] = "/tmp/refit-reference-XXXXXX";
    if (!mkdtemp(dir))
        return say(why, n, REFIT_EIO, "mkdtemp: %s", strerror(errno));
    char ckpt[600], rt[600], req[600];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.safetensors", dir);
    snprintf(rt, sizeof rt, "%s/runtime.safetensors", dir);
    snprintf(req, sizeof req, "%s/request.json", dir);
    int rc = write_request(w, version, dir, why, n);
    if (!rc)
        rc = run_command(w->env->reference, req, why, n);
    st_set *out = NULL;
    st_error err;
    if (!rc && (rc = st_open(&out, rt, &err))) {
        char line[1024];
        say(why, n, REFIT_EMISMATCH, "the reference's answer: %s",
            st_error_line(&err, line, sizeof line));
        rc = REFIT_EMISMATCH;
    }
    if (!rc)
        rc = compare_all(w, out, why, n);
    st_close(out);
    unlink(ckpt);
    unlink(rt);
    unlink(req);
    rmdir(dir);
    return rc;
}
