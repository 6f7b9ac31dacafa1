/* See mx_batch.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/copy.h"
#include "plugins/mxfp4/quant_mxfp4.h"
#include "plugins/mxfp8/quant_mx.h"
#include "tests/formats/mxfp8/mx_batch.h"
#include "tests/formats/common/qutil.h"

#define MXB_SRCS (MXB_MODULES + 1) /* mxfp8's module 1 takes two */
#define MXB_EXPERTS 3              /* mxfp4's module 1 */

/* What the plugin's post-loads saw. */
static struct {
    const refit_format_v2 *inner;
    int post_calls, many_calls, last_n;
    const void *staged[MXB_MODULES][2]; /* per module, per checkpoint tensor */
} seen;
static refit_format_v2 wrapped;

static void record(const refit_fmt_module *m)
{
    int i = atoi(m->name + 1); /* "l<i>.proj" */
    assert_true(i >= 0 && i < MXB_MODULES);
    for (uint32_t k = 0; k < m->n_ckpt && k < 2; k++)
        seen.staged[i][k] = refit_ckpt(m, k)->staged.data;
}

static int count_one(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    seen.post_calls++;
    record(m);
    return seen.inner->post_load(h, m, stream);
}

static int count_many(const refit_host_v2 *h, const refit_fmt_module *const *m, uint32_t n,
                      void *stream)
{
    seen.many_calls++;
    seen.last_n = (int)n;
    for (uint32_t k = 0; k < n; k++)
        record(m[k]);
    return seen.inner->post_load_many(h, m, n, stream);
}

static void seen_reset(void)
{
    seen.post_calls = seen.many_calls = seen.last_n = 0;
    memset(seen.staged, 0, sizeof seen.staged);
}

/* ---- sources: the test's own buffers ---- */

typedef struct mxb_src {
    char name[40];
    int mod, part;
    int64_t shape[3];
    int ndim;
    int64_t dst_row;
    char *buf;   /* aligned_alloc(64) */
    refit_tensor t;
} mxb_src;

typedef struct mxb_srcs {
    mxb_src s[MXB_SRCS];
    int n;
} mxb_srcs;

static int64_t numel_of(const mxb_src *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++)
        n *= s->shape[d];
    return n;
}

/* f32 -> BF16 bits, to nearest even (finite inputs). */
static uint16_t to_bf16(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

/* The sources of c at version v: misaligned puts every one 2 bytes past a
 * 64-byte boundary; nan_src >= 0 gets a NaN at element nan_at. Values span
 * magnitudes block by block (scales from 2^-12 to 2^11), with zero blocks. */
static void srcs_make(mxb_srcs *ss, const mxb_case *c, int v, int misalign, int nan_src,
                      int64_t nan_at)
{
    memset(ss, 0, sizeof *ss);
    for (int i = 0; i < MXB_MODULES; i++) {
        int parts = c->elem_bits == 8 && i == 1 ? 2 : 1;
        for (int p = 0; p < parts; p++) {
            mxb_src *s = &ss->s[ss->n++];
            s->mod = i;
            s->part = p;
            if (parts == 2)
                snprintf(s->name, sizeof s->name, "l%d.%s.weight", i, p ? "up_proj" : "gate_proj");
            else
                snprintf(s->name, sizeof s->name, "l%d.proj.weight", i);
            int64_t half = c->rows / 2;
            int64_t rows = parts == 2 ? (p ? c->rows - half : half) : c->rows;
            s->dst_row = parts == 2 && p ? half : 0;
            if (c->elem_bits == 4 && i == 1) {
                s->ndim = 3;
                s->shape[0] = MXB_EXPERTS;
                s->shape[1] = rows;
                s->shape[2] = c->k;
            } else {
                s->ndim = 2;
                s->shape[0] = rows;
                s->shape[1] = c->k;
            }
            int64_t n = numel_of(s);
            size_t bytes = ((size_t)n * 2 + 2 + 63) / 64 * 64;
            s->buf = aligned_alloc(64, bytes);
            assert_non_null(s->buf);
            uint16_t *x = (uint16_t *)(s->buf + (misalign ? 2 : 0));
            uint64_t seed = tt_ckpt_seed(s->name, (uint64_t)v);
            for (int64_t e = 0; e < n; e++) {
                int64_t blk = e / 32;
                float f = blk % 7 == 3 ? 0.0f : ldexpf(tt_value(seed, e), (int)(blk % 24) - 12);
                x[e] = to_bf16(f);
            }
            if (ss->n - 1 == nan_src)
                x[nan_at] = 0x7fc0; /* a BF16 NaN */
            s->t = (refit_tensor){.data = x, .device = {REFIT_DEVICE_CPU, 0}, .ndim = s->ndim,
                                  .dtype = REFIT_BF16, .shape = s->shape};
        }
    }
}

static void srcs_free(mxb_srcs *ss)
{
    for (int i = 0; i < ss->n; i++)
        free(ss->s[i].buf);
}

/* ---- the world ---- */

static void mod_name(char *out, size_t n, int i)
{
    snprintf(out, n, "l%d.proj", i);
}

static int experts_of(const mxb_case *c, int i)
{
    return c->elem_bits == 4 && i == 1 ? MXB_EXPERTS : 0;
}

static void build(tw *w, const mxb_case *c, const mxb_srcs *ss)
{
    q_world(w, &wrapped);
    int64_t kq = c->elem_bits == 8 ? c->k : (c->k + 1) / 2, kb = kern_mx_blocks(c->k);
    for (int i = 0; i < MXB_MODULES; i++) {
        char mod[16];
        mod_name(mod, sizeof mod, i);
        tw_module(w, mod, c->plugin->name, NULL);
        refit_dtype wdt = c->elem_bits == 8 ? Q_E4M3 : REFIT_U8;
        int64_t e = experts_of(c, i);
        if (e) {
            tw_runtime(w, mod, "weight", wdt, 3, TT_SHAPE(e, c->rows, kq));
            tw_runtime(w, mod, "weight_scale", REFIT_U8, 3, TT_SHAPE(e, c->rows, kb));
        } else {
            tw_runtime(w, mod, "weight", wdt, 2, TT_SHAPE(c->rows, kq));
            tw_runtime(w, mod, "weight_scale", REFIT_U8, 2, TT_SHAPE(c->rows, kb));
        }
    }
    for (int j = 0; j < ss->n; j++) {
        const mxb_src *s = &ss->s[j];
        char mod[16];
        mod_name(mod, sizeof mod, s->mod);
        refit_ckpt_spec sp = tt_spec(REFIT_BF16, s->ndim, s->shape);
        sp.target = "weight";
        sp.dst_offset[0] = s->dst_row;
        assert_int_equal(tw_expect(w, mod, s->name, &sp), REFIT_OK);
    }
    tw_seal(w);
}

static int load_many(tw *w, const char *label, const mxb_srcs *ss, refit_txn **out)
{
    const char *names[MXB_SRCS];
    refit_tensor t[MXB_SRCS];
    for (int j = 0; j < ss->n; j++) {
        names[j] = ss->s[j].name;
        t[j] = ss->s[j].t;
    }
    *out = tw_begin(w, label, 1);
    seen_reset();
    return refit_load_many(*out, (size_t)ss->n, names, t, NULL);
}

/* One refit_load a tensor, finalize: asserts success. */
static void update_per_call(tw *w, const char *label, const mxb_srcs *ss)
{
    refit_txn *t = tw_begin(w, label, 1);
    seen_reset();
    for (int j = 0; j < ss->n; j++)
        if (refit_load(t, ss->s[j].name, &ss->s[j].t, NULL))
            fail_msg("%s: refit_load %s: %s", label, ss->s[j].name, refit_errmsg(w->ctx));
    if (refit_finalize(t))
        fail_msg("%s: finalize: %s", label, refit_errmsg(w->ctx));
    assert_int_equal(seen.post_calls, MXB_MODULES);
    assert_int_equal(seen.many_calls, 0);
}

/* One refit_load_many, finalize: asserts success, one post_load_many of
 * every module, and each staged view the source itself (in_place) or not. */
static void update_many(tw *w, const char *label, const mxb_srcs *ss, int in_place)
{
    refit_txn *t;
    if (load_many(w, label, ss, &t))
        fail_msg("%s: refit_load_many: %s", label, refit_errmsg(w->ctx));
    assert_int_equal(seen.many_calls, 1);
    assert_int_equal(seen.last_n, MXB_MODULES);
    assert_int_equal(seen.post_calls, 0);
    for (int j = 0; j < ss->n; j++) {
        const void *st = seen.staged[ss->s[j].mod][ss->s[j].part];
        assert_non_null(st);
        if (in_place && st != ss->s[j].t.data)
            fail_msg("%s: %s was staged, not read in place", label, ss->s[j].name);
        if (!in_place && st == ss->s[j].t.data)
            fail_msg("%s: %s (unaligned) was read in place", label, ss->s[j].name);
    }
    if (refit_finalize(t))
        fail_msg("%s: finalize: %s", label, refit_errmsg(w->ctx));
}

/* The 2-D matrix e of a [E, r, c] or [r, c] row-major buffer as a view. */
static refit_view mat(void *base, refit_dtype dt, int64_t e, int64_t r, int64_t c)
{
    return q_buf_view((char *)base + e * r * c * (int64_t)kern_dtype_size(dt), dt, r, c);
}

/* The runtime bytes equal the CPU reference on ss. */
static void assert_reference(tw *w, const mxb_case *c, const mxb_srcs *ss)
{
    int64_t kq = c->elem_bits == 8 ? c->k : (c->k + 1) / 2, kb = kern_mx_blocks(c->k);
    for (int i = 0; i < MXB_MODULES; i++) {
        char mod[16];
        mod_name(mod, sizeof mod, i);
        int64_t e = experts_of(c, i), ne = e ? e : 1;
        size_t qn = (size_t)(ne * c->rows * kq), sn = (size_t)(ne * c->rows * kb);
        uint8_t *q = calloc(qn, 1), *s = calloc(sn, 1);
        assert_true(q && s);
        for (int j = 0; j < ss->n; j++) {
            const mxb_src *src = &ss->s[j];
            if (src->mod != i)
                continue;
            int64_t r = src->shape[src->ndim - 2];
            for (int64_t x = 0; x < ne; x++) {
                refit_view qv = mat(q, REFIT_U8, x, c->rows, kq);
                refit_view sv = mat(s, REFIT_U8, x, c->rows, kb);
                qv.data = (uint8_t *)qv.data + src->dst_row * kq;
                sv.data = (uint8_t *)sv.data + src->dst_row * kb;
                qv.shape[0] = sv.shape[0] = r;
                refit_view xv = mat(src->t.data, REFIT_BF16, x, r, c->k);
                int rc = c->elem_bits == 8 ? kern_quant_mxfp8(&qv, &sv, &xv)
                                           : kern_quant_mxfp4(&qv, &sv, &xv);
                assert_int_equal(rc, REFIT_OK);
            }
        }
        q_assert_bytes(q, tw_rt(w, mod, "weight")->buf, qn, mod);
        q_assert_bytes(s, tw_rt(w, mod, "weight_scale")->buf, sn, mod);
        free(q);
        free(s);
    }
}

/* A NaN at element at of source bad: load_many accepted, finalize fails
 * naming module and tensor (and want, e.g. the expert), rolled back. */
static void assert_nan_rolled_back(tw *w, const mxb_case *c, int bad, int64_t at,
                                   const char *want, const char *version, const void *snap,
                                   size_t n)
{
    mxb_srcs ss;
    srcs_make(&ss, c, 3, 0, bad, at);
    refit_txn *t;
    int rc = load_many(w, "bad", &ss, &t);
    if (rc)
        fail_msg("refit_load_many with a NaN: %s (held until finalize)", refit_errmsg(w->ctx));
    assert_int_equal(seen.many_calls, 1);
    assert_int_equal(seen.post_calls, 0);
    assert_int_equal(refit_finalize(t), REFIT_ECORRUPT);
    char mod[32];
    snprintf(mod, sizeof mod, "module l%d.proj", ss.s[bad].mod);
    tw_assert_msg(w, mod, ss.s[bad].name, "NaN or infinity", want, "rolled back");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), version);
    assert_true(tw_snapshot_equal(w, snap, n));
    srcs_free(&ss);
}

void mxb_run(const mxb_case *c)
{
    seen.inner = c->plugin;
    wrapped = *c->plugin;
    wrapped.post_load = count_one;
    /* a plugin without post_load_many gets one post_load a module */
    wrapped.post_load_many = c->plugin->post_load_many ? count_many : NULL;

    mxb_srcs v1, v2, v2u;
    srcs_make(&v1, c, 1, 0, -1, 0);
    srcs_make(&v2, c, 2, 0, -1, 0);
    srcs_make(&v2u, c, 2, 1, -1, 0);

    /* cold start by one refit_load_many of aligned sources: in place */
    tw cold;
    build(&cold, c, &v2);
    update_many(&cold, "v2", &v2, 1);
    assert_reference(&cold, c, &v2);
    size_t n;
    void *snap = tw_snapshot(&cold, &n);

    /* per-call loads, then the same version from unaligned sources in one
     * call (staged copies), then per call again: the cold start's bytes */
    tw hot;
    build(&hot, c, &v1);
    update_per_call(&hot, "v1", &v1);
    assert_reference(&hot, c, &v1);
    assert_false(tw_snapshot_equal(&hot, snap, n));
    update_many(&hot, "v2", &v2u, 0);
    assert_true(tw_snapshot_equal(&hot, snap, n));
    update_per_call(&hot, "v2b", &v2);
    assert_true(tw_snapshot_equal(&hot, snap, n));

    /* a NaN in module 3, then in module 1's second tensor / last expert */
    assert_nan_rolled_back(&hot, c, 4 - (c->elem_bits == 4), 37, "", "v2b", snap, n);
    if (c->elem_bits == 8)
        assert_nan_rolled_back(&hot, c, 2, 37, "", "v2b", snap, n);
    else
        assert_nan_rolled_back(&hot, c, 1, 2 * c->rows * c->k + 37, "(expert 2)", "v2b", snap,
                               n);
    /* the next update commits */
    update_many(&hot, "v2c", &v2, 1);
    assert_true(tw_snapshot_equal(&hot, snap, n));

    free(snap);
    tw_close(&cold);
    tw_close(&hot);
    srcs_free(&v1);
    srcs_free(&v2);
    srcs_free(&v2u);
}
