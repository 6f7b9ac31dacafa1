/* Delta updates into runtimes quantized online (issue 31 item 5), on the
 * host backend, through the format plugins on the search path (fp8,
 * mxfp8, mxfp4, nvfp4, int4: their CPU references). With
 * refit_options.delta_master_budget refit keeps a master of each online
 * checkpoint tensor; a patch writes the master and rebuilds the touched
 * groups' rows (or the whole tensor for a per-tensor scale). Each case
 * patches about 3% of the elements, scattered, plus a run, with version
 * 2's values, and compares every runtime byte with a full reload of the
 * patched checkpoint. Then: TP shards, fused qkv, stacked experts; a NaN
 * in a patched FP8 block refused with nothing changed; no master (budget
 * 0, or too small) refused with the message; an abort after half the
 * patches restores runtime and master; whole and patched tensors of one
 * unit in one update refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/sys/stats.h>

#include "testutil.h"

#define E4M3 ((refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1})
#define BIG_BUDGET (64ull << 20)

static void open_world(tw *w, uint64_t budget)
{
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    o.delta_master_budget = budget;
    assert_int_equal(tw_open(w, &o), REFIT_OK);
}

/* Declare a bf16 checkpoint tensor into runtime "weight". */
static void expect_w(tw *w, const char *mod, const char *name, int64_t n, int64_t k,
                     int64_t expert, int64_t row)
{
    refit_ckpt_spec s = tt_spec(REFIT_BF16, 2, TT_SHAPE(n, k));
    s.target = "weight";
    s.expert = expert;
    s.dst_offset[0] = row;
    assert_int_equal(tw_expect(w, mod, name, &s), REFIT_OK);
}

/* ---- the models ---- */

#define N 256
#define K 256

static void fp8_module(tw *w, const char *scheme, int64_t scale_elems)
{
    char params[96];
    snprintf(params, sizeof params, "scheme: %s\nonline: true", scheme);
    tw_module(w, "lin", "fp8", params);
    tw_runtime(w, "lin", "weight", E4M3, 2, TT_SHAPE(N, K));
    tw_runtime(w, "lin", "weight_scale", REFIT_F32, 1, TT_SHAPE(scale_elems));
    expect_w(w, "lin", "w.weight", N, K, -1, 0);
}

static void build_fp8_tensor(tw *w) { fp8_module(w, "per_tensor", 1); }
static void build_fp8_channel(tw *w) { fp8_module(w, "per_channel", N); }
static void build_fp8_block(tw *w) { fp8_module(w, "block128", (N / 128) * (K / 128)); }

static void build_mxfp8(tw *w)
{
    tw_module(w, "lin", "mxfp8", "online: true");
    tw_runtime(w, "lin", "weight", E4M3, 2, TT_SHAPE(N, K));
    tw_runtime(w, "lin", "weight_scale", REFIT_U8, 2, TT_SHAPE(N, K / 32));
    expect_w(w, "lin", "w.weight", N, K, -1, 0);
}

static void build_mxfp4(tw *w)
{
    tw_module(w, "lin", "mxfp4", NULL);
    tw_runtime(w, "lin", "weight", REFIT_U8, 2, TT_SHAPE(N, K / 2));
    tw_runtime(w, "lin", "weight_scale", REFIT_U8, 2, TT_SHAPE(N, K / 32));
    expect_w(w, "lin", "w.weight", N, K, -1, 0);
}

static void build_nvfp4(tw *w)
{
    tw_module(w, "lin", "nvfp4", NULL);
    tw_runtime(w, "lin", "weight", REFIT_U8, 2, TT_SHAPE(N, K / 2));
    tw_runtime(w, "lin", "weight_scale", E4M3, 1, TT_SHAPE(N * (K / 16))); /* swizzled: N, K/16 padded to 128, 4 */
    tw_runtime(w, "lin", "alpha", REFIT_F32, 1, TT_SHAPE(1));
    expect_w(w, "lin", "w.weight", N, K, -1, 0);
}

static void build_int4_u8(tw *w)
{
    tw_module(w, "lin", "int4", "group_size: 32\nlayout: u8\nonline: true");
    tw_runtime(w, "lin", "weight", REFIT_U8, 2, TT_SHAPE(N, K / 2));
    tw_runtime(w, "lin", "weight_scale", REFIT_BF16, 2, TT_SHAPE(N, K / 32));
    expect_w(w, "lin", "w.weight", N, K, -1, 0);
}

static void build_int4_gptq(tw *w)
{
    tw_module(w, "lin", "int4", "group_size: 32\nonline: true");
    tw_runtime(w, "lin", "weight", REFIT_I32, 2, TT_SHAPE(K / 8, N));
    tw_runtime(w, "lin", "weight_scale", REFIT_F32, 2, TT_SHAPE(K / 32, N));
    expect_w(w, "lin", "w.weight", N, K, -1, 0);
}

/* Fused qkv, block-128: q [256, K], k and v [128, K] at rows 0, 256, 384. */
static void build_fp8_qkv(tw *w)
{
    tw_module(w, "attn", "fp8", "scheme: block128\nonline: true");
    tw_runtime(w, "attn", "weight", E4M3, 2, TT_SHAPE(512, K));
    tw_runtime(w, "attn", "weight_scale", REFIT_F32, 2, TT_SHAPE(4, K / 128));
    expect_w(w, "attn", "q.weight", 256, K, -1, 0);
    expect_w(w, "attn", "k.weight", 128, K, -1, 256);
    expect_w(w, "attn", "v.weight", 128, K, -1, 384);
}

/* Fused per-tensor with one scale for the three: any change rebuilds all. */
static void build_fp8_qkv_tensor(tw *w)
{
    tw_module(w, "attn", "fp8", "scheme: per_tensor\nonline: true");
    tw_runtime(w, "attn", "weight", E4M3, 2, TT_SHAPE(512, K));
    tw_runtime(w, "attn", "weight_scale", REFIT_F32, 1, TT_SHAPE(1));
    expect_w(w, "attn", "q.weight", 256, K, -1, 0);
    expect_w(w, "attn", "k.weight", 128, K, -1, 256);
    expect_w(w, "attn", "v.weight", 128, K, -1, 384);
}

/* Stacked experts [3, 128, 128], per-channel (expert slices) and
 * block-128 mxfp8-like rows. */
static void build_fp8_experts(tw *w)
{
    tw_module(w, "moe", "fp8", "scheme: per_channel\nonline: true");
    tw_runtime(w, "moe", "weight", E4M3, 3, TT_SHAPE(3, 128, 128));
    tw_runtime(w, "moe", "weight_scale", REFIT_F32, 2, TT_SHAPE(3, 128));
    for (int e = 0; e < 3; e++) {
        char name[64];
        snprintf(name, sizeof name, "experts.%d.weight", e);
        expect_w(w, "moe", name, 128, 128, e, 0);
    }
}

static void build_mxfp8_experts(tw *w)
{
    tw_module(w, "moe", "mxfp8", "online: true");
    tw_runtime(w, "moe", "weight", E4M3, 3, TT_SHAPE(3, 128, 128));
    tw_runtime(w, "moe", "weight_scale", REFIT_U8, 3, TT_SHAPE(3, 128, 4));
    for (int e = 0; e < 3; e++) {
        char name[64];
        snprintf(name, sizeof name, "experts.%d.weight", e);
        expect_w(w, "moe", name, 128, 128, e, 0);
    }
}

/* TP: rank 1 of 2 of a [512, K] block-128 weight cut along N; and rank 0
 * of 2 of a [128, 512] per-channel weight cut along K (row-parallel). */
static void build_fp8_tp_rows(tw *w)
{
    tw_module(w, "col", "fp8", "scheme: block128\nonline: true");
    tw_runtime(w, "col", "weight", E4M3, 2, TT_SHAPE(256, K));
    tw_runtime(w, "col", "weight_scale", REFIT_F32, 2, TT_SHAPE(2, K / 128));
    refit_ckpt_spec s = tt_spec(REFIT_BF16, 2, TT_SHAPE(512, K));
    s.target = "weight";
    s.shard_dim = 0;
    s.shard_rank = 1;
    s.shard_count = 2;
    assert_int_equal(tw_expect(w, "col", "col.weight", &s), REFIT_OK);
    tw_module(w, "row", "fp8", "scheme: per_channel\nonline: true");
    tw_runtime(w, "row", "weight", E4M3, 2, TT_SHAPE(128, 256));
    tw_runtime(w, "row", "weight_scale", REFIT_F32, 1, TT_SHAPE(128));
    s = tt_spec(REFIT_BF16, 2, TT_SHAPE(128, 512));
    s.target = "weight";
    s.shard_dim = 1;
    s.shard_rank = 0;
    s.shard_count = 2;
    assert_int_equal(tw_expect(w, "row", "row.weight", &s), REFIT_OK);
}

/* ---- patches ---- */

typedef struct patch {
    const char *name;
    int64_t n;
    int64_t *idx;
    tt_tensor *vals;
    tt_tensor *patched; /* version 1 with the patch: the checkpoint a full reload reads */
} patch;

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* About 3% of name's elements, scattered, and a run of 40 from `run_at`,
 * take version 2's values (or `poison` at the first index when not 0). */
static patch make_patch(tw *w, const char *name, uint64_t seed, int64_t run_at)
{
    patch p = {name, 0, NULL, NULL, NULL};
    tt_tensor *v1 = tw_ckpt_tensor(w, name, 1), *v2 = tw_ckpt_tensor(w, name, 2);
    int64_t numel = tt_numel(v1), want = numel * 3 / 100 + 40;
    int64_t *idx = malloc((size_t)want * sizeof *idx);
    tt_rng r = {seed};
    int64_t n = 0;
    for (int64_t i = 0; i < 40 && run_at + i < numel; i++)
        idx[n++] = run_at + i;
    while (n < want)
        idx[n++] = (int64_t)tt_randn(&r, (uint64_t)numel);
    qsort(idx, (size_t)n, sizeof *idx, cmp_i64);
    int64_t u = 0;
    for (int64_t i = 0; i < n; i++)
        if (!u || idx[u - 1] != idx[i])
            idx[u++] = idx[i];
    /* unsorted on the wire: refit sorts */
    for (int64_t i = 0; i + 1 < u; i += 7) {
        int64_t x = idx[i];
        idx[i] = idx[i + 1];
        idx[i + 1] = x;
    }
    p.n = u;
    p.idx = idx;
    p.vals = tw_tmp(w, v1->t.dtype, 1, TT_SHAPE(u));
    p.patched = tw_tmp(w, v1->t.dtype, v1->t.ndim, v1->t.shape);
    memcpy(p.patched->buf, v1->buf, v1->bytes);
    for (int64_t i = 0; i < u; i++) {
        double x = tt_get_flat(v2, idx[i]);
        tt_set_flat(p.vals, i, x);
        tt_set_flat(p.patched, idx[i], x);
    }
    return p;
}

static refit_txn *begin_delta(tw *w, const char *label, const char *base)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = label;
    o.base_version = base;
    o.others_unchanged = 1;
    o.rollback = 1;
    refit_txn *t = NULL;
    int rc = refit_begin(&t, w->m, &o);
    if (rc)
        fail_msg("begin: %s: %s", refit_status_name(rc), refit_errmsg(w->ctx));
    return t;
}

static int apply(tw *w, refit_txn *t, const patch *p)
{
    (void)w;
    return refit_load_delta(t, p->name, (size_t)p->n, p->idx, &p->vals->t, NULL);
}

static const patch *find_patch(const patch *ps, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(ps[i].name, name))
            return &ps[i];
    return NULL;
}

/* Every runtime byte of w equals a full reload (label) of version 1 with
 * ps applied. */
static void assert_equals_full_reload(tw *w, const patch *ps, int n, const char *label)
{
    size_t bytes;
    void *delta = tw_snapshot(w, &bytes);
    refit_txn *t = tw_begin(w, label, 1);
    for (int i = 0; i < w->n_ck; i++) {
        const patch *p = find_patch(ps, n, w->ck[i].name);
        int rc = p ? refit_load(t, p->name, &p->patched->t, NULL) : tw_load(w, t, w->ck[i].name, 1);
        if (rc)
            fail_msg("full reload of %s: %s: %s", w->ck[i].name, refit_status_name(rc),
                     refit_errmsg(w->ctx));
    }
    int rc = refit_finalize(t);
    if (rc)
        fail_msg("full reload: %s: %s", refit_status_name(rc), refit_errmsg(w->ctx));
    int same = tw_snapshot_equal(w, delta, bytes);
    free(delta);
    if (!same)
        fail_msg("the delta's runtime bytes differ from a full reload of the patched checkpoint");
}

/* Load v1, patch the named tensors in one table, commit; compare. */
static void delta_case(void (*build)(tw *), const char *const *names, int n, uint64_t *undo)
{
    tw w;
    open_world(&w, BIG_BUDGET);
    build(&w);
    tw_seal(&w);
    tw_update(&w, 1, "v1");
    patch ps[4];
    refit_delta rows[4];
    for (int i = 0; i < n; i++) {
        ps[i] = make_patch(&w, names[i], 7 + (uint64_t)i, 300 + 1000 * i);
        rows[i] = (refit_delta){ps[i].name, (size_t)ps[i].n, ps[i].idx, NULL, &ps[i].vals->t};
    }
    refit_txn *t = begin_delta(&w, "v2", "v1");
    int rc = refit_load_deltas(t, (size_t)n, rows, NULL);
    if (rc)
        fail_msg("load_deltas: %s: %s", refit_status_name(rc), refit_errmsg(w.ctx));
    refit_txn_stats st;
    assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
    if (undo)
        *undo = st.undo_host_bytes + st.undo_device_bytes;
    rc = refit_finalize(t);
    if (rc)
        fail_msg("finalize: %s: %s", refit_status_name(rc), refit_errmsg(w.ctx));
    assert_string_equal(refit_worker_version(w.ctx), "v2");
    assert_equals_full_reload(&w, ps, n, "v2-full");
    for (int i = 0; i < n; i++)
        free(ps[i].idx);
    tw_close(&w);
}

#define ONE(...) ((const char *const[]){__VA_ARGS__})

static void test_fp8_per_tensor(void **s) { (void)s; delta_case(build_fp8_tensor, ONE("w.weight"), 1, NULL); }
static void test_mxfp8(void **s) { (void)s; delta_case(build_mxfp8, ONE("w.weight"), 1, NULL); }
static void test_mxfp4(void **s) { (void)s; delta_case(build_mxfp4, ONE("w.weight"), 1, NULL); }
static void test_nvfp4(void **s) { (void)s; delta_case(build_nvfp4, ONE("w.weight"), 1, NULL); }
static void test_int4_u8(void **s) { (void)s; delta_case(build_int4_u8, ONE("w.weight"), 1, NULL); }
static void test_int4_gptq(void **s) { (void)s; delta_case(build_int4_gptq, ONE("w.weight"), 1, NULL); }

/* Row groups: the undo holds the master's patched elements, the rows
 * rebuilt and the scales, well under a full update's. */
static void test_fp8_per_channel(void **s)
{
    (void)s;
    uint64_t undo = 0;
    delta_case(build_fp8_channel, ONE("w.weight"), 1, &undo);
    assert_true(undo > 0);
}

static void test_fp8_block128(void **s)
{
    (void)s;
    delta_case(build_fp8_block, ONE("w.weight"), 1, NULL);
}

static void test_fp8_fused_qkv(void **s)
{
    (void)s;
    delta_case(build_fp8_qkv, ONE("k.weight", "v.weight"), 2, NULL);
    delta_case(build_fp8_qkv_tensor, ONE("k.weight"), 1, NULL);
    delta_case(build_fp8_qkv_tensor, ONE("q.weight", "v.weight"), 2, NULL); /* one rebuild */
}

static void test_stacked_experts(void **s)
{
    (void)s;
    delta_case(build_fp8_experts, ONE("experts.1.weight"), 1, NULL);
    delta_case(build_mxfp8_experts, ONE("experts.0.weight", "experts.2.weight"), 2, NULL);
}

static void test_tp_shards(void **s)
{
    (void)s;
    delta_case(build_fp8_tp_rows, ONE("col.weight", "row.weight"), 2, NULL);
}

/* A patch of a few elements of one block-128 block touches one 128-row
 * band: the undo is that band's codes, the scales and the master's
 * elements, not the tensor. */
static void test_block_patch_rebuilds_its_band(void **s)
{
    (void)s;
    tw w;
    open_world(&w, BIG_BUDGET);
    build_fp8_block(&w);
    tw_seal(&w);
    tw_update(&w, 1, "v1");
    tt_tensor *v2 = tw_ckpt_tensor(&w, "w.weight", 2);
    int64_t idx[3] = {130 * K + 5, 140 * K + 200, 255 * K + 255};
    tt_tensor *vals = tw_tmp(&w, REFIT_BF16, 1, TT_SHAPE(3));
    for (int i = 0; i < 3; i++)
        tt_set_flat(vals, i, tt_get_flat(v2, idx[i]));
    refit_txn *t = begin_delta(&w, "v2", "v1");
    assert_int_equal(refit_load_delta(t, "w.weight", 3, idx, &vals->t, NULL), REFIT_OK);
    refit_txn_stats st;
    assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
    /* master: 3 bf16 elements; runtime: rows [128, 256) of codes, 4 scales */
    assert_int_equal(st.undo_host_bytes, 3 * 2 + 128 * K + 4 * 4);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    tw_close(&w);
}

/* ---- refusals ---- */

static void assert_unchanged(tw *w, uint64_t fp, const char *version)
{
    assert_int_equal(tw_fp(w), fp);
    assert_string_equal(refit_worker_version(w->ctx), version);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
}

/* A NaN among the patch's values inside a block-128 block: the update
 * fails and its abort leaves bytes, version and health as they were; the
 * master came back too (a later delta still equals a full reload). */
static void test_nan_in_patched_block_refused(void **s)
{
    (void)s;
    tw w;
    open_world(&w, BIG_BUDGET);
    build_fp8_block(&w);
    tw_seal(&w);
    tw_update(&w, 1, "v1");
    uint64_t fp = tw_fp(&w);
    patch p = make_patch(&w, "w.weight", 11, 0);
    tt_set_flat(p.vals, p.n / 2, NAN);
    refit_txn *t = begin_delta(&w, "v2", "v1");
    int rc = apply(&w, t, &p);
    assert_int_equal(rc, REFIT_ECORRUPT);
    tw_assert_msg(&w, "w.weight (module lin)", "NaN", "abort it");
    assert_int_equal(refit_finalize(t), REFIT_ECORRUPT); /* failed: finalize aborts it */
    assert_unchanged(&w, fp, "v1");
    free(p.idx);
    /* the master holds version 1 again */
    patch q = make_patch(&w, "w.weight", 12, 77);
    t = begin_delta(&w, "v3", "v1");
    assert_int_equal(apply(&w, t, &q), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_equals_full_reload(&w, &q, 1, "v3-full");
    free(q.idx);
    tw_close(&w);
}

/* Without a master (budget 0): refused before any write, saying how to
 * get one. */
static void test_no_master_refused(void **s)
{
    (void)s;
    tw w;
    open_world(&w, 0);
    build_fp8_block(&w);
    tw_seal(&w);
    tw_update(&w, 1, "v1");
    uint64_t fp = tw_fp(&w);
    patch p = make_patch(&w, "w.weight", 3, 0);
    refit_txn *t = begin_delta(&w, "v2", "v1");
    assert_int_equal(apply(&w, t, &p), REFIT_EUNSUPPORTED);
    tw_assert_msg(&w, "w.weight (module lin)", "format fp8", "delta_master_budget is 0",
                  "131072 bytes", "nothing written");
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_unchanged(&w, fp, "v1");
    free(p.idx);
    tw_close(&w);
}

/* A budget too small for the tensor: no master, refused, the budget named. */
static void test_small_budget_refused(void **s)
{
    (void)s;
    tw w;
    open_world(&w, 1000);
    build_fp8_block(&w);
    tw_seal(&w);
    tw_update(&w, 1, "v1");
    uint64_t fp = tw_fp(&w);
    patch p = make_patch(&w, "w.weight", 3, 0);
    refit_txn *t = begin_delta(&w, "v2", "v1");
    assert_int_equal(apply(&w, t, &p), REFIT_EBUDGET);
    tw_assert_msg(&w, "no master of w.weight", "delta_master_budget (1000 bytes",
                  "nothing written");
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_unchanged(&w, fp, "v1");
    free(p.idx);
    tw_close(&w);
}

/* Abort after the first of two patches (k patched, v not yet): every
 * runtime byte and the master of k come back. */
static void test_abort_after_half_restores(void **s)
{
    (void)s;
    tw w;
    open_world(&w, BIG_BUDGET);
    build_fp8_qkv(&w);
    tw_seal(&w);
    tw_update(&w, 1, "v1");
    uint64_t fp = tw_fp(&w);
    patch k = make_patch(&w, "k.weight", 5, 0), v = make_patch(&w, "v.weight", 6, 0);
    refit_txn *t = begin_delta(&w, "v2", "v1");
    assert_int_equal(apply(&w, t, &k), REFIT_OK);
    assert_true(tw_fp(&w) != fp); /* k's rows were rebuilt */
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_unchanged(&w, fp, "v1");
    /* k's master is version 1 again: another patch of k, and v's, equal a
     * reload of version 1 with those two patches */
    patch both[2] = {make_patch(&w, "k.weight", 8, 500), v};
    t = begin_delta(&w, "v2", "v1");
    assert_int_equal(apply(&w, t, &both[0]), REFIT_OK);
    assert_int_equal(apply(&w, t, &both[1]), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_equals_full_reload(&w, both, 2, "v2-full");
    free(k.idx);
    free(both[0].idx);
    free(v.idx);
    tw_close(&w);
}

/* A full update that rewrote the masters and was aborted puts them back:
 * a delta against version 1 then equals a reload of version 1 patched. */
static void test_full_update_aborted_restores_masters(void **s)
{
    (void)s;
    tw w;
    open_world(&w, BIG_BUDGET);
    build_fp8_qkv(&w);
    tw_seal(&w);
    tw_update(&w, 1, "v1");
    uint64_t fp = tw_fp(&w);
    refit_txn *t = tw_begin(&w, "v2", 1);
    tw_load_all(&w, t, 2, NULL); /* every post-load ran: masters hold version 2 */
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_unchanged(&w, fp, "v1");
    patch q = make_patch(&w, "q.weight", 31, 9);
    t = begin_delta(&w, "v3", "v1");
    assert_int_equal(apply(&w, t, &q), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_equals_full_reload(&w, &q, 1, "v3-full");
    free(q.idx);
    tw_close(&w);
}

/* Successive deltas build on the master each committed. */
static void test_deltas_chain(void **s)
{
    (void)s;
    tw w;
    open_world(&w, BIG_BUDGET);
    build_fp8_channel(&w);
    tw_seal(&w);
    tw_update(&w, 1, "v1");
    patch a = make_patch(&w, "w.weight", 21, 0);
    refit_txn *t = begin_delta(&w, "v2", "v1");
    assert_int_equal(apply(&w, t, &a), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    /* a second patch over the first: version 1, a, then b's elements */
    patch b = make_patch(&w, "w.weight", 22, 5000);
    tt_tensor *both = a.patched;
    for (int64_t i = 0; i < b.n; i++)
        tt_set_flat(both, b.idx[i], tt_get_flat(b.vals, i));
    t = begin_delta(&w, "v3", "v2");
    assert_int_equal(apply(&w, t, &b), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_equals_full_reload(&w, &a, 1, "v3-full");
    free(a.idx);
    free(b.idx);
    tw_close(&w);
}

/* A unit's tensors arrive all whole or all as patches in one update. */
static void test_whole_and_patch_in_one_unit_refused(void **s)
{
    (void)s;
    tw w;
    open_world(&w, BIG_BUDGET);
    build_fp8_qkv(&w);
    tw_seal(&w);
    tw_update(&w, 1, "v1");
    uint64_t fp = tw_fp(&w);
    patch k = make_patch(&w, "k.weight", 5, 0);
    refit_txn *t = begin_delta(&w, "v2", "v1");
    assert_int_equal(apply(&w, t, &k), REFIT_OK);
    assert_int_equal(tw_load(&w, t, "q.weight", 2), REFIT_ESTATE);
    tw_assert_msg(&w, "q.weight (module attn)", "patched earlier", "nothing written");
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_unchanged(&w, fp, "v1");
    /* the other way round */
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v2";
    o.base_version = "v1";
    o.others_unchanged = 1;
    o.rollback = 1;
    o.keep_going = 1;
    assert_int_equal(refit_begin(&t, w.m, &o), REFIT_OK);
    assert_int_equal(tw_load(&w, t, "q.weight", 2), REFIT_OK);
    assert_int_equal(apply(&w, t, &k), REFIT_ESTATE);
    tw_assert_msg(&w, "k.weight (module attn)", "arrived whole", "nothing written");
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_unchanged(&w, fp, "v1");
    free(k.idx);
    tw_close(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_per_tensor),
        cmocka_unit_test(test_fp8_per_channel),
        cmocka_unit_test(test_fp8_block128),
        cmocka_unit_test(test_mxfp8),
        cmocka_unit_test(test_mxfp4),
        cmocka_unit_test(test_nvfp4),
        cmocka_unit_test(test_int4_u8),
        cmocka_unit_test(test_int4_gptq),
        cmocka_unit_test(test_fp8_fused_qkv),
        cmocka_unit_test(test_stacked_experts),
        cmocka_unit_test(test_tp_shards),
        cmocka_unit_test(test_block_patch_rebuilds_its_band),
        cmocka_unit_test(test_nan_in_patched_block_refused),
        cmocka_unit_test(test_no_master_refused),
        cmocka_unit_test(test_small_budget_refused),
        cmocka_unit_test(test_abort_after_half_restores),
        cmocka_unit_test(test_full_update_aborted_restores_masters),
        cmocka_unit_test(test_deltas_chain),
        cmocka_unit_test(test_whole_and_patch_in_one_unit_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
