#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "kernels/cast.h"
#include "testutil.h"

/* ---- host tensors ---- */

size_t tt_esize(refit_dtype dt)
{
    return dt.bits / 8u;
}

static void tt_row_major(tt_tensor *t)
{
    int64_t s = 1;
    for (int i = t->t.ndim - 1; i >= 0; i--) {
        t->strides[i] = s;
        s *= t->shape[i] > 0 ? t->shape[i] : 1;
    }
}

int64_t tt_numel(const tt_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->t.ndim; i++)
        n *= t->shape[i];
    return n;
}

static tt_tensor *tt_alloc_struct(refit_dtype dt, int ndim, const int64_t *shape)
{
    tt_tensor *t = calloc(1, sizeof *t);
    assert_non_null(t);
    t->t.device.device_type = REFIT_DEVICE_CPU;
    t->t.ndim = ndim;
    t->t.dtype = dt;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->t.shape = t->shape;
    t->t.strides = t->strides;
    return t;
}

tt_tensor *tt_new(refit_dtype dt, int ndim, const int64_t *shape)
{
    tt_tensor *t = tt_alloc_struct(dt, ndim, shape);
    tt_row_major(t);
    t->bytes = (size_t)tt_numel(t) * tt_esize(dt);
    t->buf = malloc(t->bytes ? t->bytes : 1);
    assert_non_null(t->buf);
    memset(t->buf, 0xA5, t->bytes);
    t->t.data = t->buf;
    return t;
}

tt_tensor *tt_new_strided(refit_dtype dt, int ndim, const int64_t *shape,
                          const int64_t *strides, size_t alloc_elems, int64_t first)
{
    tt_tensor *t = tt_alloc_struct(dt, ndim, shape);
    for (int i = 0; i < ndim; i++)
        t->strides[i] = strides[i];
    t->bytes = alloc_elems * tt_esize(dt);
    t->buf = malloc(t->bytes ? t->bytes : 1);
    assert_non_null(t->buf);
    memset(t->buf, 0xA5, t->bytes);
    t->t.data = (char *)t->buf + first * (int64_t)tt_esize(dt);
    return t;
}

tt_tensor *tt_alias(const tt_tensor *base, refit_dtype dt, int ndim, const int64_t *shape,
                    const int64_t *strides, int64_t first)
{
    tt_tensor *t = tt_alloc_struct(dt, ndim, shape);
    if (strides)
        for (int i = 0; i < ndim; i++)
            t->strides[i] = strides[i];
    else
        tt_row_major(t);
    t->t.data = (char *)base->t.data + first * (int64_t)tt_esize(dt);
    return t;
}

void tt_free(tt_tensor *t)
{
    if (!t)
        return;
    free(t->buf);
    free(t);
}

void *tt_ptr(const tt_tensor *t, const int64_t *idx)
{
    int64_t off = 0;
    for (int i = 0; i < t->t.ndim; i++)
        off += idx[i] * t->strides[i];
    return (char *)t->t.data + t->t.byte_offset + off * (int64_t)tt_esize(t->t.dtype);
}

static double decode(refit_dtype dt, const void *p)
{
    if (dt.code == REFIT_DTYPE_FLOAT && dt.bits == 32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    if (dt.code == REFIT_DTYPE_FLOAT && dt.bits == 64) {
        double d;
        memcpy(&d, p, 8);
        return d;
    }
    if (dt.bits == 16) {
        uint16_t h;
        memcpy(&h, p, 2);
        return dt.code == REFIT_DTYPE_BFLOAT ? kern_bf16_to_f32(h) : kern_f16_to_f32(h);
    }
    if (dt.code == REFIT_DTYPE_INT && dt.bits == 32) {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    if (dt.bits == 8)
        return dt.code == REFIT_DTYPE_INT ? *(const int8_t *)p : *(const uint8_t *)p;
    if (dt.bits == 64) {
        int64_t v;
        memcpy(&v, p, 8);
        return (double)v;
    }
    fail_msg("decode: unsupported dtype code %u bits %u", dt.code, dt.bits);
    return 0;
}

static void encode(refit_dtype dt, void *p, double v)
{
    if (dt.code == REFIT_DTYPE_FLOAT && dt.bits == 32) {
        float f = (float)v;
        memcpy(p, &f, 4);
    } else if (dt.code == REFIT_DTYPE_FLOAT && dt.bits == 64) {
        memcpy(p, &v, 8);
    } else if (dt.bits == 16) {
        uint16_t h = dt.code == REFIT_DTYPE_BFLOAT ? kern_f32_to_bf16((float)v)
                                                   : kern_f32_to_f16((float)v);
        memcpy(p, &h, 2);
    } else if (dt.code == REFIT_DTYPE_INT && dt.bits == 32) {
        int32_t x = (int32_t)v;
        memcpy(p, &x, 4);
    } else if (dt.bits == 8) {
        if (dt.code == REFIT_DTYPE_INT)
            *(int8_t *)p = (int8_t)v;
        else /* raw bytes (fp8 codes): a negative value wraps, defined through int64 */
            *(uint8_t *)p = (uint8_t)(int64_t)v;
    } else if (dt.bits == 64) {
        int64_t x = (int64_t)v;
        memcpy(p, &x, 8);
    } else {
        fail_msg("encode: unsupported dtype code %u bits %u", dt.code, dt.bits);
    }
}

double tt_get(const tt_tensor *t, const int64_t *idx)
{
    return decode(t->t.dtype, tt_ptr(t, idx));
}

void tt_set(tt_tensor *t, const int64_t *idx, double v)
{
    encode(t->t.dtype, tt_ptr(t, idx), v);
}

static void unflatten(const tt_tensor *t, int64_t i, int64_t *idx)
{
    for (int d = t->t.ndim - 1; d >= 0; d--) {
        idx[d] = t->shape[d] ? i % t->shape[d] : 0;
        i = t->shape[d] ? i / t->shape[d] : 0;
    }
}

double tt_get_flat(const tt_tensor *t, int64_t i)
{
    int64_t idx[REFIT_MAX_DIMS] = {0};
    unflatten(t, i, idx);
    return tt_get(t, idx);
}

void tt_set_flat(tt_tensor *t, int64_t i, double v)
{
    int64_t idx[REFIT_MAX_DIMS] = {0};
    unflatten(t, i, idx);
    tt_set(t, idx, v);
}

refit_view tt_view(const tt_tensor *t)
{
    refit_view v;
    memset(&v, 0, sizeof v);
    v.data = (char *)t->t.data + t->t.byte_offset;
    v.device = t->t.device;
    v.dtype = t->t.dtype;
    v.ndim = t->t.ndim;
    for (int i = 0; i < t->t.ndim; i++) {
        v.shape[i] = t->shape[i];
        v.strides[i] = t->strides[i];
    }
    return v;
}

/* ---- deterministic data ---- */

uint64_t tt_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t tt_hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

float tt_value(uint64_t seed, int64_t i)
{
    uint64_t r = tt_mix(seed ^ tt_mix((uint64_t)i));
    /* 24 random mantissa-ish bits scaled into [-4, 4) */
    return (float)((double)(r >> 40) / (double)(1u << 24) * 8.0 - 4.0);
}

void tt_fill(tt_tensor *t, uint64_t seed)
{
    int64_t n = tt_numel(t);
    for (int64_t i = 0; i < n; i++)
        tt_set_flat(t, i, tt_value(seed, i));
}

uint64_t tt_ckpt_seed(const char *name, uint64_t version)
{
    return tt_mix(tt_hash_str(name) ^ (version * 0x5851f42d4c957f2dull));
}

refit_ckpt_spec tt_spec(refit_dtype dt, int ndim, const int64_t *shape)
{
    refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
    s.dtype = dt;
    s.ndim = ndim;
    for (int i = 0; i < ndim; i++)
        s.shape[i] = shape[i];
    return s;
}

uint64_t tt_rand(tt_rng *r)
{
    r->s += 0x9e3779b97f4a7c15ull;
    return tt_mix(r->s);
}

uint64_t tt_randn(tt_rng *r, uint64_t n)
{
    return n ? tt_rand(r) % n : 0;
}

int tt_isolated(int (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fn(arg));
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

int tt_raw_open(tt_raw *r)
{
    memset(r, 0, sizeof *r);
    r->shape[0] = 4;
    r->t = (refit_tensor){r->buf, {REFIT_DEVICE_CPU, 0}, 1, REFIT_F32, r->shape, NULL, 0};
    r->src_shape[0] = 4;
    r->s = (refit_tensor){r->src, {REFIT_DEVICE_CPU, 0}, 1, REFIT_F32, r->src_shape, NULL, 0};
    for (int i = 0; i < 4; i++) {
        r->buf[i] = -1.0f;
        r->src[i] = (float)i + 0.5f;
    }
    refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
    s.dtype = REFIT_F32;
    s.ndim = 1;
    s.shape[0] = 4;
    if (refit_open(&r->ctx, NULL) || refit_model_create(&r->m, r->ctx) ||
        refit_model_add_module(r->m, "m", "unquantized", NULL) ||
        refit_module_bind_runtime(r->m, "m", "w", &r->t) ||
        refit_model_expect(r->m, "m", "x", &s) || refit_model_seal(r->m))
        return 1;
    return 0;
}

/* ---- world ---- */

int tw_open(tw *w, const refit_options *opt)
{
    memset(w, 0, sizeof *w);
    int rc = refit_open(&w->ctx, opt);
    if (rc)
        return rc;
    rc = refit_model_create(&w->m, w->ctx);
    if (rc) {
        refit_close(w->ctx);
        w->ctx = NULL;
    }
    return rc;
}

void tw_close(tw *w)
{
    if (w->m)
        refit_model_destroy(w->m);
    refit_close(w->ctx);
    for (int i = 0; i < w->n_rt; i++)
        tt_free(w->rt[i]);
    for (int i = 0; i < w->n_tmp; i++)
        tt_free(w->tmp[i]);
    memset(w, 0, sizeof *w);
}

int tw_setup(void **state)
{
    tw *w = malloc(sizeof *w);
    if (!w)
        return -1;
    if (tw_open(w, NULL)) {
        free(w);
        return -1;
    }
    *state = w;
    return 0;
}

int tw_teardown(void **state)
{
    tw *w = *state;
    if (w) {
        tw_close(w);
        free(w);
    }
    *state = NULL;
    return 0;
}

static tt_tensor *tw_keep_tmp(tw *w, tt_tensor *t)
{
    assert_true(w->n_tmp < TW_MAX);
    w->tmp[w->n_tmp++] = t;
    return t;
}

tt_tensor *tw_tmp(tw *w, refit_dtype dt, int ndim, const int64_t *shape)
{
    return tw_keep_tmp(w, tt_new(dt, ndim, shape));
}

tt_tensor *tw_adopt(tw *w, tt_tensor *t)
{
    return tw_keep_tmp(w, t);
}

tt_tensor *tw_runtime(tw *w, const char *module, const char *name, refit_dtype dt,
                      int ndim, const int64_t *shape)
{
    return tw_bind(w, module, name, tt_new(dt, ndim, shape));
}

tt_tensor *tw_bind(tw *w, const char *module, const char *name, tt_tensor *t)
{
    assert_true(w->n_rt < TW_MAX);
    w->rt[w->n_rt] = t;
    snprintf(w->rt_module[w->n_rt], sizeof w->rt_module[0], "%s", module);
    snprintf(w->rt_name[w->n_rt], sizeof w->rt_name[0], "%s", name);
    w->n_rt++;
    int rc = refit_module_bind_runtime(w->m, module, name, &t->t);
    if (rc)
        fail_msg("bind %s/%s: %s: %s", module, name, refit_status_name(rc),
                 refit_errmsg(w->ctx));
    return t;
}

tt_tensor *tw_rt(tw *w, const char *module, const char *name)
{
    for (int i = 0; i < w->n_rt; i++)
        if (!strcmp(w->rt_module[i], module) && !strcmp(w->rt_name[i], name))
            return w->rt[i];
    fail_msg("no runtime %s/%s in the test world", module, name);
    return NULL;
}

void tw_module(tw *w, const char *name, const char *format, const char *params)
{
    int rc = refit_model_add_module(w->m, name, format, params);
    if (rc)
        fail_msg("add module %s: %s: %s", name, refit_status_name(rc), refit_errmsg(w->ctx));
}

int tw_expect(tw *w, const char *module, const char *name, const refit_ckpt_spec *spec)
{
    int rc = refit_model_expect(w->m, module, name, spec);
    if (rc)
        return rc;
    assert_true(w->n_ck < TW_MAX);
    tw_ckpt *c = &w->ck[w->n_ck++];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(c->module, sizeof c->module, "%s", module);
    c->spec = *spec;
    c->spec.target = NULL;
    c->spec.tie_of = NULL;
    if (spec->target) {
        snprintf(c->target, sizeof c->target, "%s", spec->target);
        c->spec.target = c->target;
    }
    if (spec->tie_of) {
        snprintf(c->tie, sizeof c->tie, "%s", spec->tie_of);
        c->spec.tie_of = c->tie;
    }
    return rc;
}

const tw_ckpt *tw_find_ckpt(const tw *w, const char *name)
{
    for (int i = 0; i < w->n_ck; i++)
        if (!strcmp(w->ck[i].name, name))
            return &w->ck[i];
    return NULL;
}

void tw_seal(tw *w)
{
    int rc = refit_model_seal(w->m);
    if (rc)
        fail_msg("seal: %s: %s", refit_status_name(rc), refit_errmsg(w->ctx));
}

refit_txn *tw_begin(tw *w, const char *label, int rollback)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = label;
    o.rollback = rollback;
    o.partial = w->partial;
    o.keep_going = w->keep_going;
    refit_txn *t = NULL;
    int rc = refit_begin(&t, w->m, &o);
    if (rc)
        fail_msg("begin %s: %s: %s", label ? label : "-", refit_status_name(rc),
                 refit_errmsg(w->ctx));
    assert_non_null(t);
    return t;
}

/* The record whose dtype/shape a name has (the primary of a tie). */
static const tw_ckpt *primary_of(const tw *w, const tw_ckpt *c)
{
    if (!c->spec.tie_of)
        return c;
    const tw_ckpt *p = tw_find_ckpt(w, c->spec.tie_of);
    if (!p)
        fail_msg("tie %s -> %s: primary not recorded", c->name, c->spec.tie_of);
    return p;
}

tt_tensor *tw_ckpt_tensor(tw *w, const char *name, uint64_t version)
{
    const tw_ckpt *c = tw_find_ckpt(w, name);
    if (!c)
        fail_msg("checkpoint %s not recorded", name);
    const tw_ckpt *p = primary_of(w, c);
    tt_tensor *t = tw_tmp(w, p->spec.dtype, p->spec.ndim, p->spec.shape);
    tt_fill(t, tt_ckpt_seed(p->name, version)); /* tied names: one content */
    return t;
}

int tw_load(tw *w, refit_txn *t, const char *name, uint64_t version)
{
    tt_tensor *src = tw_ckpt_tensor(w, name, version);
    return refit_load(t, name, &src->t, NULL);
}

/* A view of rows [a, b) of dim d of a full tensor (shares its memory). */
static tt_tensor *tw_slice(tw *w, const tt_tensor *full, int d, int64_t a, int64_t b)
{
    tt_tensor *s = tt_alloc_struct(full->t.dtype, full->t.ndim, full->shape);
    memcpy(s->strides, full->strides, sizeof s->strides);
    s->shape[d] = b - a;
    s->t.data = (char *)full->t.data + a * full->strides[d] * (int64_t)tt_esize(full->t.dtype);
    return tw_keep_tmp(w, s);
}

typedef struct load_item {
    int ck;
    int64_t a, b;      /* rows of the split dim; b < 0: whole */
} load_item;

static int split_dim_of(const tw_ckpt *p)
{
    if (p->spec.shard_count > 1)
        return p->spec.shard_dim;
    return p->spec.ndim > 0 ? 0 : -1;
}

void tw_load_all(tw *w, refit_txn *t, uint64_t version, const tw_load_opts *o)
{
    if (tw_try_load_all(w, t, version, o))
        fail_msg("%s", w->err);
}

int tw_try_load_all(tw *w, refit_txn *t, uint64_t version, const tw_load_opts *o)
{
    tw_load_opts defaults = {0};
    if (!o)
        o = &defaults;
    load_item *items = calloc((size_t)w->n_ck * 64 + 1, sizeof *items);
    assert_non_null(items);
    int n = 0;
    tt_rng pr = {o->part_seed};
    for (int i = 0; i < w->n_ck; i++) {
        const tw_ckpt *c = &w->ck[i];
        if (o->only_module && strcmp(o->only_module, c->module))
            continue;
        int is_alias = c->spec.tie_of != NULL;
        int has_alias = 0;
        for (int k = 0; k < w->n_ck; k++)
            if (w->ck[k].spec.tie_of && !strcmp(w->ck[k].spec.tie_of, c->name))
                has_alias = 1;
        if (is_alias && o->tie_mode == 0)
            continue;
        if (!is_alias && has_alias && o->tie_mode == 1)
            continue;
        const tw_ckpt *p = primary_of(w, c);
        int d = split_dim_of(p);
        if (!o->parts || d < 0) {
            items[n++] = (load_item){i, 0, -1};
            continue;
        }
        int64_t ext = p->spec.shape[d];
        int k = 1 + (int)tt_randn(&pr, (uint64_t)o->parts);
        if (k > ext)
            k = ext > 0 ? (int)ext : 1;
        if (k > 63)
            k = 63;
        /* k - 1 distinct cut points in (0, ext) */
        int64_t cuts[64];
        int nc = 0;
        cuts[nc++] = 0;
        while (nc < k) {
            int64_t c2 = 1 + (int64_t)tt_randn(&pr, (uint64_t)(ext > 1 ? ext - 1 : 1));
            int dup = 0;
            for (int q = 0; q < nc; q++)
                dup |= cuts[q] == c2;
            if (!dup && c2 < ext)
                cuts[nc++] = c2;
            else if (ext <= 1)
                break;
        }
        cuts[nc++] = ext;
        for (int q = 1; q < nc; q++) /* insertion sort */
            for (int r = q; r > 0 && cuts[r] < cuts[r - 1]; r--) {
                int64_t tmp = cuts[r];
                cuts[r] = cuts[r - 1];
                cuts[r - 1] = tmp;
            }
        for (int q = 0; q + 1 < nc; q++)
            items[n++] = (load_item){i, cuts[q], cuts[q + 1]};
    }
    if (o->order_seed) {
        tt_rng r = {o->order_seed};
        for (int i = n - 1; i > 0; i--) {
            int j = (int)tt_randn(&r, (uint64_t)i + 1);
            load_item tmp = items[i];
            items[i] = items[j];
            items[j] = tmp;
        }
    }
    tt_tensor **full = calloc((size_t)w->n_ck + 1, sizeof *full);
    assert_non_null(full);
    for (int i = 0; i < n; i++) {
        const tw_ckpt *c = &w->ck[items[i].ck];
        if (!full[items[i].ck])
            full[items[i].ck] = tw_ckpt_tensor(w, c->name, version);
        tt_tensor *src = full[items[i].ck];
        int rc;
        if (items[i].b < 0) {
            rc = refit_load(t, c->name, &src->t, NULL);
        } else {
            int d = split_dim_of(primary_of(w, c));
            tt_tensor *piece = tw_slice(w, src, d, items[i].a, items[i].b);
            rc = refit_load_part(t, c->name, items[i].a, &piece->t, NULL);
        }
        if (rc) {
            snprintf(w->err, sizeof w->err, "load %s rows [%lld, %lld): %s: %s", c->name,
                     (long long)items[i].a, (long long)items[i].b, refit_status_name(rc),
                     refit_errmsg(w->ctx));
            free(items);
            free(full);
            return rc;
        }
    }
    free(items);
    free(full);
    return REFIT_OK;
}

void tw_update(tw *w, uint64_t version, const char *label)
{
    refit_txn *t = tw_begin(w, label, 1);
    tw_load_all(w, t, version, NULL);
    int rc = refit_finalize(t);
    if (rc)
        fail_msg("finalize %s: %s: %s", label, refit_status_name(rc), refit_errmsg(w->ctx));
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
}

void *tw_snapshot(const tw *w, size_t *bytes)
{
    size_t n = 0;
    for (int i = 0; i < w->n_rt; i++)
        n += w->rt[i]->bytes;
    char *p = malloc(n ? n : 1);
    assert_non_null(p);
    size_t off = 0;
    for (int i = 0; i < w->n_rt; i++) {
        if (!w->rt[i]->buf)
            continue;
        memcpy(p + off, w->rt[i]->buf, w->rt[i]->bytes);
        off += w->rt[i]->bytes;
    }
    *bytes = n;
    return p;
}

uint64_t tw_fp(tw *w)
{
    uint64_t fp = 0;
    int rc = refit_model_fingerprint(w->m, &fp);
    if (rc)
        fail_msg("fingerprint: %s: %s", refit_status_name(rc), refit_errmsg(w->ctx));
    return fp;
}

/* The first string of ap (up to a NULL) that msg does not contain, or NULL. */
static const char *msg_lacks(const char *msg, va_list ap)
{
    for (const char *s; (s = va_arg(ap, const char *));)
        if (!strstr(msg, s))
            return s;
    return NULL;
}

/* Fail, naming file:line, when msg lacks lacks (from msg_lacks; called
 * after va_end, as fail_msg does not return). */
static void fail_lacking(const char *file, int line, const char *msg, const char *lacks)
{
    if (lacks)
        fail_msg("%s:%d: message \"%s\" lacks \"%s\"", file, line, msg, lacks);
}

void tw_assert_msg_(tw *w, const char *file, int line, ...)
{
    const char *msg = refit_errmsg(w->ctx);
    va_list ap;
    va_start(ap, line);
    const char *lacks = msg_lacks(msg, ap);
    va_end(ap);
    fail_lacking(file, line, msg, lacks);
}

void tw_close_refused_(tw *w, int rc, int want, const char *file, int line, ...)
{
    char msg[1100];
    snprintf(msg, sizeof msg, "%s", refit_errmsg(w->ctx));
    tw_close(w);
    if (rc != want)
        fail_msg("%s:%d: status %d, not %d (message \"%s\")", file, line, rc, want, msg);
    va_list ap;
    va_start(ap, line);
    const char *lacks = msg_lacks(msg, ap);
    va_end(ap);
    fail_lacking(file, line, msg, lacks);
}

/* ---- the STAGED test formats ---- */

static int staged_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        refit_fmt_ckpt *c = &m->ckpt[i];
        refit_dtype rt = m->runtime[c->target_index].view.dtype;
        if (c->dtype.code != REFIT_DTYPE_FLOAT || c->dtype.bits != 32 ||
            rt.code != REFIT_DTYPE_FLOAT || rt.bits != 32)
            return h->error(h->host, REFIT_EFORMAT, "module %s, tensor %s: the test formats "
                            "take f32 only", m->name, c->name);
        c->route = REFIT_ROUTE_STAGED;
    }
    m->flags = REFIT_MODULE_WHOLE | REFIT_MODULE_POST_LOAD;
    return REFIT_OK;
}

/* place (runtime, F32) = 2 * staged (+ place when accumulate). */
static int apply(const refit_host_v2 *h, const refit_fmt_module *m, int accumulate)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        const refit_fmt_ckpt *c = &m->ckpt[i];
        const refit_view *s = &c->staged, *p = &c->place;
        if (!s->data || !p->data || s->ndim != p->ndim)
            return h->error(h->host, REFIT_EINTERNAL, "module %s, tensor %s: no staged bytes "
                            "or no place", m->name, c->name);
        int64_t numel = 1;
        for (int d = 0; d < s->ndim; d++) {
            if (s->shape[d] != p->shape[d])
                return h->error(h->host, REFIT_EINTERNAL, "module %s, tensor %s: staged and "
                                "place shapes differ on dim %d", m->name, c->name, d);
            numel *= s->shape[d];
        }
        for (int64_t e = 0; e < numel; e++) {
            int64_t rem = e, so = 0, po = 0;
            for (int d = s->ndim - 1; d >= 0; d--) {
                int64_t x = rem % s->shape[d];
                rem /= s->shape[d];
                so += x * s->strides[d];
                po += x * p->strides[d];
            }
            float v = ((const float *)s->data)[so];
            float *out = (float *)p->data + po;
            *out = accumulate ? *out + 2.0f * v : 2.0f * v;
        }
    }
    return REFIT_OK;
}

static int scale_post(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    (void)stream;
    return apply(h, m, 0);
}

static int accum_post(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    (void)stream;
    return apply(h, m, 1);
}

static int fail_post(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    (void)stream;
    int rc = apply(h, m, 0);
    if (rc)
        return rc;
    /* a half-done kernel: junk over the first runtime tensor */
    const refit_view *v = &m->runtime[0].view;
    float *p = v->data;
    p[0] = 12345.0f;
    return h->error(h->host, REFIT_EFORMAT, "test-fail: injected post-load failure in "
                    "module %s", m->name);
}

const refit_format_v2 tt_format_scale = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "test-scale",
    .plan = staged_plan,
    .post_load = scale_post,
};

const refit_format_v2 tt_format_accum = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "test-accum",
    .plan = staged_plan,
    .post_load = accum_post,
};

const refit_format_v2 tt_format_fail = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "test-fail",
    .plan = staged_plan,
    .post_load = fail_post,
};

void tw_register_test_formats(tw *w)
{
    const refit_format_v2 *f[] = {&tt_format_scale, &tt_format_accum, &tt_format_fail};
    for (int i = 0; i < 3; i++) {
        int rc = refit_format_register(w->ctx, f[i]);
        if (rc)
            fail_msg("register %s: %s: %s", f[i]->name, refit_status_name(rc),
                     refit_errmsg(w->ctx));
    }
}

/* ---- the transformer-shaped model ---- */

/* Rows of rank r when n rows are split over tp ranks (lower ranks first). */
static int64_t rows_of(int64_t n, int tp, int r)
{
    return n / tp + (r < n % tp ? 1 : 0);
}

static refit_ckpt_spec sharded(refit_dtype dt, int ndim, const int64_t *shape, int dim,
                               const tt_llm_cfg *cfg)
{
    refit_ckpt_spec s = tt_spec(dt, ndim, shape);
    if (cfg->tp > 1) {
        s.shard_dim = dim;
        s.shard_rank = cfg->rank;
        s.shard_count = cfg->tp;
    }
    return s;
}

static void expect_ok(tw *w, const char *module, const char *name, const refit_ckpt_spec *s)
{
    int rc = tw_expect(w, module, name, s);
    if (rc)
        fail_msg("expect %s: %s: %s", name, refit_status_name(rc), refit_errmsg(w->ctx));
}

void tt_build_llm(tw *w, const tt_llm_cfg *cfg)
{
    const int H = 8, Q = 8, KV = 4, I = 5, E = 3, V = 10, VP = 12;
    int tp = cfg->tp > 0 ? cfg->tp : 1, r = cfg->rank;
    tt_llm_cfg c = *cfg;
    c.tp = tp;
    char mod[96], name[160];
    if (cfg->staged) /* registers it, or finds the test already did */
        (void)refit_format_register(w->ctx, &tt_format_scale);

    /* embedding, padded vocab, TP on dim 0, bf16 -> f32, tied lm_head */
    tw_module(w, "embed", "unquantized", "cast: true");
    tw_runtime(w, "embed", "weight", REFIT_F32, 2, TT_SHAPE(rows_of(VP, tp, r), H));
    refit_ckpt_spec s = sharded(REFIT_BF16, 2, TT_SHAPE(V, H), 0, &c);
    s.pad_to = VP;
    expect_ok(w, "embed", "model.embed_tokens.weight", &s);
    refit_ckpt_spec tie = REFIT_CKPT_SPEC_INIT;
    tie.tie_of = "model.embed_tokens.weight";
    expect_ok(w, "embed", "lm_head.weight", &tie);

    for (int l = 0; l < cfg->layers; l++) {
        int64_t q = rows_of(Q, tp, r), kv = rows_of(KV, tp, r), in = rows_of(I, tp, r);
        /* fused qkv + o_proj */
        snprintf(mod, sizeof mod, "layers.%d.attn", l);
        tw_module(w, mod, "unquantized", NULL);
        tw_runtime(w, mod, "qkv", REFIT_F32, 2, TT_SHAPE(q + 2 * kv, H));
        tw_runtime(w, mod, "o", REFIT_F32, 2, TT_SHAPE(H, q));
        const char *parts[3] = {"q_proj", "k_proj", "v_proj"};
        int64_t ext[3] = {Q, KV, KV}, off[3] = {0, q, q + kv};
        for (int k = 0; k < 3; k++) {
            s = sharded(REFIT_F32, 2, TT_SHAPE(ext[k], H), 0, &c);
            s.target = "qkv";
            s.dst_offset[0] = off[k];
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", l, parts[k]);
            expect_ok(w, mod, name, &s);
        }
        s = sharded(REFIT_F32, 2, TT_SHAPE(H, Q), 1, &c);
        s.target = "o";
        snprintf(name, sizeof name, "model.layers.%d.self_attn.o_proj.weight", l);
        expect_ok(w, mod, name, &s);

        /* fused gate_up (uneven over 2 ranks: 3 + 2) + down */
        snprintf(mod, sizeof mod, "layers.%d.mlp", l);
        tw_module(w, mod, "unquantized", NULL);
        tw_runtime(w, mod, "gate_up", REFIT_F32, 2, TT_SHAPE(2 * in, H));
        tw_runtime(w, mod, "down", REFIT_F32, 2, TT_SHAPE(H, in));
        const char *gu[2] = {"gate_proj", "up_proj"};
        for (int k = 0; k < 2; k++) {
            s = sharded(REFIT_F32, 2, TT_SHAPE(I, H), 0, &c);
            s.target = "gate_up";
            s.dst_offset[0] = k * in;
            snprintf(name, sizeof name, "model.layers.%d.mlp.%s.weight", l, gu[k]);
            expect_ok(w, mod, name, &s);
        }
        s = sharded(REFIT_F32, 2, TT_SHAPE(H, I), 1, &c);
        s.target = "down";
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
        expect_ok(w, mod, name, &s);

        /* stacked experts */
        snprintf(mod, sizeof mod, "layers.%d.moe", l);
        tw_module(w, mod, "unquantized", NULL);
        tw_runtime(w, mod, "w1", REFIT_F32, 3, TT_SHAPE(E, 4, H));
        tw_runtime(w, mod, "w2", REFIT_F32, 3, TT_SHAPE(E, H, rows_of(4, tp, r)));
        for (int e = 0; e < E; e++) {
            s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, H));
            s.target = "w1";
            s.expert = e;
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.w1.weight", l, e);
            expect_ok(w, mod, name, &s);
            s = sharded(REFIT_F32, 2, TT_SHAPE(H, 4), 1, &c);
            s.target = "w2";
            s.expert = e;
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.w2.weight", l, e);
            expect_ok(w, mod, name, &s);
        }

        /* norms with casts both ways */
        snprintf(mod, sizeof mod, "layers.%d.norm", l);
        tw_module(w, mod, "unquantized", "cast: true");
        tw_runtime(w, mod, "input", REFIT_F32, 1, TT_SHAPE(H));
        tw_runtime(w, mod, "post", REFIT_F16, 1, TT_SHAPE(H));
        s = tt_spec(REFIT_BF16, 1, TT_SHAPE(H));
        s.target = "input";
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        expect_ok(w, mod, name, &s);
        s = tt_spec(REFIT_F32, 1, TT_SHAPE(H));
        s.target = "post";
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        expect_ok(w, mod, name, &s);

        if (cfg->staged) {
            snprintf(mod, sizeof mod, "layers.%d.scale", l);
            tw_module(w, mod, "test-scale", NULL);
            tw_runtime(w, mod, "w", REFIT_F32, 2, TT_SHAPE(rows_of(H, tp, r), H));
            tw_runtime(w, mod, "b", REFIT_F32, 1, TT_SHAPE(H));
            s = sharded(REFIT_F32, 2, TT_SHAPE(H, H), 0, &c);
            s.target = "w";
            snprintf(name, sizeof name, "model.layers.%d.scale.weight", l);
            expect_ok(w, mod, name, &s);
            s = tt_spec(REFIT_F32, 1, TT_SHAPE(H));
            s.target = "b";
            snprintf(name, sizeof name, "model.layers.%d.scale.bias", l);
            expect_ok(w, mod, name, &s);
        }
    }
    tw_module(w, "norm", "unquantized", NULL);
    tw_runtime(w, "norm", "weight", REFIT_F32, 1, TT_SHAPE(H));
    s = tt_spec(REFIT_F32, 1, TT_SHAPE(H));
    expect_ok(w, "norm", "model.norm.weight", &s);
    tw_seal(w);
}

int tw_snapshot_equal(const tw *w, const void *snap, size_t n)
{
    size_t m;
    void *now = tw_snapshot(w, &m);
    int eq = m == n && !memcmp(now, snap, n);
    free(now);
    return eq;
}

void tw_one_module(tw *w)
{
    tw_module(w, "m", "unquantized", NULL);
    tw_runtime(w, "m", "w", REFIT_F32, 1, TT_SHAPE(4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(w, "m", "m.w", &s), REFIT_OK);
    tw_seal(w);
}

int tw_sql_count(const char *path, const char *sql)
{
    sqlite3 *db;
    sqlite3_stmt *s;
    int n = -1;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
        n = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return n;
}
