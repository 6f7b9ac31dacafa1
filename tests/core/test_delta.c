/* Delta updates (docs/core.md "Delta updates"): patches of checkpoint
 * tensors against a named base, the scope declared, undo of what is
 * touched. A delta reload must equal a full reload of the patched
 * checkpoint bit for bit, on every structural route (TP shards with
 * padding, fused qkv and gate_up, stacked experts, tied names, casts),
 * and a bad patch, a wrong base or a missing declared module must leave
 * bytes, version and health as they were. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/sys/stats.h>

#include "testutil.h"

/* A patch of one checkpoint tensor: sorted unique indices and values. */
typedef struct tpatch {
    const char *name;
    int64_t *idx;
    size_t n;
    tt_tensor *vals;
} tpatch;

/* Every declared checkpoint name that is not a tie alias. */
static int primaries(const tw *w, const char **names)
{
    int n = 0;
    for (int i = 0; i < w->n_ck; i++)
        if (!w->ck[i].spec.tie_of)
            names[n++] = w->ck[i].name;
    return n;
}

/* About pct percent of the elements of name (at least one), their values
 * from version `from`; indices ascending unless shuffled. The patched
 * checkpoint is base with those elements replaced: written into *full
 * when full is given (a full-reload source). */
static tpatch make_patch(tw *w, const char *name, uint64_t base, uint64_t from, int pct,
                         uint64_t seed, int shuffled, tt_tensor **full)
{
    tt_tensor *b = tw_ckpt_tensor(w, name, base), *nv = tw_ckpt_tensor(w, name, from);
    int64_t numel = tt_numel(b);
    tpatch p = {name, malloc(sizeof(int64_t) * (size_t)numel), 0, NULL};
    assert_non_null(p.idx);
    tt_rng rng = {seed ^ tt_hash_str(name)};
    for (int64_t i = 0; i < numel; i++)
        if ((int64_t)tt_randn(&rng, 100) < pct)
            p.idx[p.n++] = i;
    if (p.n == 0)
        p.idx[p.n++] = (int64_t)tt_randn(&rng, (uint64_t)numel);
    if (shuffled)
        for (size_t i = p.n; i > 1; i--) {
            size_t j = tt_randn(&rng, i);
            int64_t x = p.idx[i - 1];
            p.idx[i - 1] = p.idx[j];
            p.idx[j] = x;
        }
    p.vals = tw_tmp(w, b->t.dtype, 1, TT_SHAPE((int64_t)p.n));
    for (size_t j = 0; j < p.n; j++)
        tt_set_flat(p.vals, (int64_t)j, tt_get_flat(nv, p.idx[j]));
    if (full) {
        *full = tw_tmp(w, b->t.dtype, b->t.ndim, b->shape);
        memcpy((*full)->buf, b->buf, b->bytes);
        for (size_t j = 0; j < p.n; j++)
            tt_set_flat(*full, p.idx[j], tt_get_flat(nv, p.idx[j]));
    }
    return p;
}

static refit_txn *begin_delta(tw *w, const char *label, const char *base,
                              const char *const *mods, uint32_t n_mods, int rollback)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = label;
    o.rollback = rollback;
    o.base_version = base;
    o.changed_modules = mods;
    o.n_changed_modules = n_mods;
    o.others_unchanged = n_mods == 0;
    refit_txn *t = NULL;
    int rc = refit_begin(&t, w->m, &o);
    if (rc)
        fail_msg("begin %s: %s: %s", label, refit_status_name(rc), refit_errmsg(w->ctx));
    return t;
}

static void llm(tw *w, int rank, int tp)
{
    tt_llm_cfg c = {rank, tp, 2, 0};
    tt_build_llm(w, &c); /* sealed */
}

/* Patch every tensor of the model (tie_alias: the tied embedding through
 * lm_head's name), commit; then a full reload of the patched checkpoint
 * must write exactly the bytes the patches left. */
static void delta_equals_full(tw *w, int tie_alias, int shuffled, int runs)
{
    tw_update(w, 1, "v1");
    size_t nb;
    void *v1 = tw_snapshot(w, &nb);
    const char *names[TW_MAX];
    int n = primaries(w, names);
    tt_tensor *full[TW_MAX];
    refit_txn *t = begin_delta(w, "v2", "v1", NULL, 0, 1);
    uint64_t elements = 0;
    for (int i = 0; i < n; i++) {
        tpatch p = make_patch(w, names[i], 1, 2, 7, 11, shuffled, &full[i]);
        const char *as = tie_alias && !strcmp(names[i], "model.embed_tokens.weight")
                             ? "lm_head.weight" : names[i];
        int rc;
        if (runs) { /* each index a run of one, merged where they touch */
            int64_t *ones = malloc(sizeof(int64_t) * p.n);
            assert_non_null(ones);
            for (size_t j = 0; j < p.n; j++)
                ones[j] = 1;
            rc = refit_load_delta_runs(t, as, p.n, p.idx, ones, &p.vals->t, NULL);
            free(ones);
        } else {
            rc = refit_load_delta(t, as, p.n, p.idx, &p.vals->t, NULL);
        }
        elements += p.n;
        free(p.idx);
        if (rc)
            fail_msg("load_delta %s: %s: %s", as, refit_status_name(rc), refit_errmsg(w->ctx));
    }
    uint64_t counted;
    uint32_t tensors;
    refit_sys_txn_delta(t, &counted, &tensors);
    assert_int_equal(counted, elements);
    assert_int_equal(tensors, (uint32_t)n);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v2");
    size_t nd;
    void *delta = tw_snapshot(w, &nd);
    assert_true(memcmp(delta, v1, nb) != 0); /* the patches wrote */
    /* the full reload of the patched checkpoint */
    t = tw_begin(w, "v2-full", 1);
    for (int i = 0; i < n; i++)
        assert_int_equal(refit_load(t, names[i], &full[i]->t, NULL), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    int same = tw_snapshot_equal(w, delta, nd);
    free(delta);
    free(v1);
    assert_true(same);
}

static void test_delta_equals_full_plain(void **state)
{
    tw *w = *state;
    llm(w, 0, 1);
    delta_equals_full(w, 0, 0, 0);
}

static void test_delta_equals_full_tp_rank0(void **state)
{
    tw *w = *state;
    llm(w, 0, 2);
    delta_equals_full(w, 0, 1, 0);
}

static void test_delta_equals_full_tp_rank2_of_3(void **state)
{
    tw *w = *state;
    llm(w, 2, 3);
    delta_equals_full(w, 0, 0, 1);
}

static void test_delta_equals_full_tied_alias(void **state)
{
    tw *w = *state;
    llm(w, 1, 2);
    delta_equals_full(w, 1, 1, 0);
}

/* Row ranges as runs: rows [1, 3) of a [4, 8] weight, one run. */
static void test_row_runs(void **state)
{
    tw *w = *state;
    tw_module(w, "m", "unquantized", NULL);
    tw_runtime(w, "m", "w", REFIT_F32, 2, TT_SHAPE(4, 8));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 8));
    assert_int_equal(tw_expect(w, "m", "m.w", &s), REFIT_OK);
    tw_seal(w);
    tw_update(w, 1, "v1");
    tt_tensor *rt = tw_rt(w, "m", "w"), *b = tw_ckpt_tensor(w, "m.w", 1);
    tt_tensor *vals = tw_tmp(w, REFIT_F32, 1, TT_SHAPE(16));
    for (int i = 0; i < 16; i++)
        tt_set_flat(vals, i, 100 + i);
    refit_txn *t = begin_delta(w, "v2", "v1", NULL, 0, 1);
    int64_t start = 8, count = 16;
    assert_int_equal(refit_load_delta_runs(t, "m.w", 1, &start, &count, &vals->t, NULL),
                     REFIT_OK);
    refit_txn_stats st;
    assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
    assert_int_equal(st.undo_device_bytes + st.undo_host_bytes, 16 * 4);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    for (int i = 0; i < 32; i++)
        assert_true(tt_get_flat(rt, i) == (i >= 8 && i < 24 ? 100 + i - 8 : tt_get_flat(b, i)));
}

/* The refusals: each leaves bytes, version and health as they were, and
 * (the update failing closed) the txn aborts with nothing written. */
typedef enum bad_kind { BAD_RANGE, BAD_DUP, BAD_DTYPE, BAD_COUNT, BAD_NEG, BAD_OVERLAP } bad_kind;

static void refused_patch(tw *w, bad_kind k, int want, const char *say)
{
    llm(w, 0, 2);
    tw_update(w, 1, "v1");
    size_t nb;
    void *snap = tw_snapshot(w, &nb);
    uint64_t fp = tw_fp(w);
    refit_txn *t = begin_delta(w, "v2", "v1", NULL, 0, 1);
    /* a good patch first, so the refusal comes after bytes were written */
    tpatch good = make_patch(w, "model.layers.0.self_attn.q_proj.weight", 1, 2, 20, 3, 0, NULL);
    assert_int_equal(refit_load_delta(t, good.name, good.n, good.idx, &good.vals->t, NULL),
                     REFIT_OK);
    free(good.idx);
    const char *name = "model.layers.1.mlp.down_proj.weight";
    int64_t idx[3] = {1, 5, 9};
    int64_t counts[3] = {1, 1, 1};
    refit_dtype dt = REFIT_F32;
    int64_t nvals = 3;
    switch (k) {
    case BAD_RANGE: idx[2] = 8 * 5; break;                  /* [8, 5]: 40 elements */
    case BAD_DUP: idx[2] = 1; break;
    case BAD_DTYPE: dt = REFIT_BF16; break;
    case BAD_COUNT: nvals = 2; break;
    case BAD_NEG: idx[0] = -1; break;
    case BAD_OVERLAP: counts[1] = 5; break;                 /* [5, 10) holds 9 */
    }
    tt_tensor *vals = tw_tmp(w, dt, 1, TT_SHAPE(nvals));
    tt_fill(vals, 5);
    int rc = k == BAD_OVERLAP ? refit_load_delta_runs(t, name, 3, idx, counts, &vals->t, NULL)
                              : refit_load_delta(t, name, 3, idx, &vals->t, NULL);
    assert_int_equal(rc, want);
    tw_assert_msg(w, name, say, "nothing", "update 'v2' failed");
    assert_int_equal(refit_finalize(t), want);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
    assert_int_equal(tw_fp(w), fp);
    int same = tw_snapshot_equal(w, snap, nb);
    free(snap);
    assert_true(same);
}

static void test_index_out_of_range(void **state)
{
    refused_patch(*state, BAD_RANGE, REFIT_EINVAL, "index 2 (40) is outside the tensor's 40");
}

static void test_negative_index(void **state)
{
    refused_patch(*state, BAD_NEG, REFIT_EINVAL, "index 0 (-1) is outside");
}

static void test_duplicate_index(void **state)
{
    refused_patch(*state, BAD_DUP, REFIT_EDUPLICATE, "element 1 is given twice");
}

static void test_overlapping_runs(void **state)
{
    refused_patch(*state, BAD_OVERLAP, REFIT_EDUPLICATE, "element 9 is given twice (runs");
}

static void test_values_dtype(void **state)
{
    refused_patch(*state, BAD_DTYPE, REFIT_EMISMATCH, "values: ");
}

static void test_values_count(void **state)
{
    refused_patch(*state, BAD_COUNT, REFIT_EMISMATCH, "2 values for 3 elements");
}

/* More indices than elements, or runs longer together than the tensor:
 * refused before anything is sorted or written. */
static void test_more_than_the_tensor(void **state)
{
    tw *w = *state;
    llm(w, 0, 1);
    tw_update(w, 1, "v1");
    uint64_t fp = tw_fp(w);
    w->keep_going = 1;
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v2";
    o.base_version = "v1";
    o.others_unchanged = 1;
    o.keep_going = 1;
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, w->m, &o), REFIT_OK);
    const char *name = "model.layers.1.mlp.down_proj.weight"; /* [8, 5] */
    int64_t idx[41];
    for (int i = 0; i < 41; i++)
        idx[i] = i % 40;
    tt_tensor *vals = tw_tmp(w, REFIT_F32, 1, TT_SHAPE(51));
    tt_fill(vals, 2);
    assert_int_equal(refit_load_delta(t, name, 41, idx, &vals->t, NULL), REFIT_EINVAL);
    tw_assert_msg(w, "41 indices for a tensor of 40 elements", "nothing written");
    int64_t starts[3] = {0, 1, 5}, counts[3] = {1, 20, 30};
    assert_int_equal(refit_load_delta_runs(t, name, 3, starts, counts, &vals->t, NULL),
                     REFIT_EDUPLICATE);
    tw_assert_msg(w, "give 51 elements, more than the tensor's 40", "nothing written");
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_int_equal(tw_fp(w), fp);
}

/* A wrong base: refused at begin, nothing written, nothing journaled as
 * an update; the module holding another version is named. */
static void test_wrong_base(void **state)
{
    tw *w = *state;
    llm(w, 0, 1);
    tw_update(w, 1, "v1");
    uint64_t fp = tw_fp(w);
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v3";
    o.base_version = "v2";
    o.others_unchanged = 1;
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, w->m, &o), REFIT_EMISMATCH);
    assert_null(t);
    tw_assert_msg(w, "against base 'v2'", "module embed holds version 'v1'", "nothing written");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
    assert_int_equal(tw_fp(w), fp);
}

/* One module at another version (a partial update): a delta against the
 * last label is refused, naming it. */
static void test_base_behind_one_module(void **state)
{
    tw *w = *state;
    llm(w, 0, 1);
    tw_update(w, 1, "v1");
    w->partial = 1;
    refit_txn *t = tw_begin(w, "v2", 1);
    tw_load_opts lo = {.only_module = "layers.1.mlp"};
    tw_load_all(w, t, 2, &lo);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v3";
    o.base_version = "v2";
    o.others_unchanged = 1;
    t = NULL;
    assert_int_equal(refit_begin(&t, w->m, &o), REFIT_EMISMATCH);
    tw_assert_msg(w, "module embed holds version 'v1'");
}

/* The scope must be declared; a declared module that is not one is named. */
static void test_scope_declared(void **state)
{
    tw *w = *state;
    llm(w, 0, 1);
    tw_update(w, 1, "v1");
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v2";
    o.base_version = "v1";
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, w->m, &o), REFIT_EINVAL);
    tw_assert_msg(w, "must declare its scope", "changed_modules", "others_unchanged");
    const char *mods[] = {"embed", "nope"};
    o.changed_modules = mods;
    o.n_changed_modules = 2;
    assert_int_equal(refit_begin(&t, w->m, &o), REFIT_ENOTFOUND);
    tw_assert_msg(w, "changed_modules[1] (nope)");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
}

/* Completeness by declaration: a listed module that received nothing
 * fails finalize, rolled back; a module not listed refuses its patch. */
static void test_missing_declared_module(void **state)
{
    tw *w = *state;
    llm(w, 0, 1);
    tw_update(w, 1, "v1");
    size_t nb;
    void *snap = tw_snapshot(w, &nb);
    const char *mods[] = {"layers.0.attn", "layers.1.mlp"};
    refit_txn *t = begin_delta(w, "v2", "v1", mods, 2, 1);
    tpatch p = make_patch(w, "model.layers.0.self_attn.k_proj.weight", 1, 2, 30, 1, 0, NULL);
    assert_int_equal(refit_load_delta(t, p.name, p.n, p.idx, &p.vals->t, NULL), REFIT_OK);
    free(p.idx);
    assert_int_equal(refit_finalize(t), REFIT_EINCOMPLETE);
    tw_assert_msg(w, "lists module layers.1.mlp", "nothing of it arrived",
                  "bytes rolled back");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
    int same = tw_snapshot_equal(w, snap, nb);
    free(snap);
    assert_true(same);
    /* a module not listed */
    w->keep_going = 1;
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v2";
    o.base_version = "v1";
    o.changed_modules = mods;
    o.n_changed_modules = 1;
    o.keep_going = 1;
    assert_int_equal(refit_begin(&t, w->m, &o), REFIT_OK);
    p = make_patch(w, "model.layers.1.mlp.down_proj.weight", 1, 2, 30, 1, 0, NULL);
    assert_int_equal(refit_load_delta(t, p.name, p.n, p.idx, &p.vals->t, NULL),
                     REFIT_EUNEXPECTED);
    free(p.idx);
    tw_assert_msg(w, "does not list module layers.1.mlp", "nothing written");
    assert_int_equal(refit_abort(t), REFIT_OK);
}

/* After a commit every module holds the new label, the untouched ones
 * with their bytes; the next delta names it as its base. */
static void test_whole_model_takes_label(void **state)
{
    tw *w = *state;
    llm(w, 0, 1);
    tw_update(w, 1, "v1");
    tt_tensor *norm = tw_rt(w, "layers.1.norm", "input");
    float before[8];
    memcpy(before, norm->buf, sizeof before);
    const char *mods[] = {"layers.0.mlp"};
    refit_txn *t = begin_delta(w, "v2", "v1", mods, 1, 1);
    tpatch p = make_patch(w, "model.layers.0.mlp.up_proj.weight", 1, 2, 10, 4, 0, NULL);
    assert_int_equal(refit_load_delta(t, p.name, p.n, p.idx, &p.vals->t, NULL), REFIT_OK);
    free(p.idx);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_string_equal(refit_worker_version(w->ctx), "v2");
    assert_string_equal(refit_module_version(w->m, "layers.1.norm"), "v2");
    assert_string_equal(refit_module_version(w->m, "embed"), "v2");
    assert_memory_equal(before, norm->buf, sizeof before);
    /* a delta that changes nothing still moves the label */
    t = begin_delta(w, "v3", "v2", NULL, 0, 1);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_string_equal(refit_worker_version(w->ctx), "v3");
}

/* Patches only in delta updates; online formats (post-load) refused,
 * naming the module and why. */
static void test_refused_routes(void **state)
{
    tw *w = *state;
    tt_llm_cfg c = {0, 1, 1, 1};
    tt_build_llm(w, &c); /* sealed */
    tw_update(w, 1, "v1");
    w->keep_going = 1;
    refit_txn *t = tw_begin(w, "v2", 1);
    tpatch p = make_patch(w, "model.layers.0.mlp.up_proj.weight", 1, 2, 10, 4, 0, NULL);
    assert_int_equal(refit_load_delta(t, p.name, p.n, p.idx, &p.vals->t, NULL), REFIT_ESTATE);
    tw_assert_msg(w, "not a delta update", "base_version");
    assert_int_equal(refit_abort(t), REFIT_OK);
    free(p.idx);
    /* the staged module of the test format */
    const char *staged = NULL;
    for (int i = 0; i < w->n_ck; i++)
        if (strstr(w->ck[i].module, "scale"))
            staged = w->ck[i].name;
    assert_non_null(staged);
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v2";
    o.base_version = "v1";
    o.others_unchanged = 1;
    o.keep_going = 1;
    assert_int_equal(refit_begin(&t, w->m, &o), REFIT_OK);
    p = make_patch(w, staged, 1, 2, 10, 4, 0, NULL);
    assert_int_equal(refit_load_delta(t, p.name, p.n, p.idx, &p.vals->t, NULL),
                     REFIT_EUNSUPPORTED);
    free(p.idx);
    tw_assert_msg(w, staged, "format test-scale", "post-load step", "online quantization",
                  "nothing written");
    assert_int_equal(refit_abort(t), REFIT_OK);
}

/* A tensor patched twice, or patched and loaded: a duplicate. In a table,
 * the row is named and nothing is written. */
static void test_duplicate_tensor(void **state)
{
    tw *w = *state;
    llm(w, 0, 1);
    tw_update(w, 1, "v1");
    size_t nb;
    void *snap = tw_snapshot(w, &nb);
    w->keep_going = 1;
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v2";
    o.base_version = "v1";
    o.others_unchanged = 1;
    o.keep_going = 1;
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, w->m, &o), REFIT_OK);
    tpatch a = make_patch(w, "model.layers.0.mlp.up_proj.weight", 1, 2, 10, 4, 0, NULL);
    tpatch b = make_patch(w, "model.layers.0.mlp.gate_proj.weight", 1, 2, 10, 4, 0, NULL);
    refit_delta rows[3] = {
        {b.name, b.n, b.idx, NULL, &b.vals->t},
        {a.name, a.n, a.idx, NULL, &a.vals->t},
        {a.name, a.n, a.idx, NULL, &a.vals->t},
    };
    assert_int_equal(refit_load_deltas(t, 3, rows, NULL), REFIT_EDUPLICATE);
    tw_assert_msg(w, "row 2 (model.layers.0.mlp.up_proj.weight)", "row 1 patches the same");
    refit_txn_stats st;
    assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
    assert_int_equal(st.tensors_loaded, 0);
    assert_true(tw_snapshot_equal(w, snap, nb));
    assert_int_equal(refit_load_deltas(t, 2, rows, NULL), REFIT_OK);
    assert_int_equal(tw_load(w, t, a.name, 2), REFIT_EDUPLICATE);
    assert_int_equal(refit_load_delta(t, b.name, b.n, b.idx, &b.vals->t, NULL),
                     REFIT_EDUPLICATE);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    free(a.idx);
    free(b.idx);
    free(snap);
}

/* Undo of what is touched: an aborted ~3% delta saves ~3% of what a full
 * update's undo saves, and abort after half the patches restores every
 * byte. */
static void test_undo_proportional(void **state)
{
    tw *w = *state;
    llm(w, 0, 2);
    tw_update(w, 1, "v1");
    size_t nb;
    void *snap = tw_snapshot(w, &nb);
    uint64_t fp = tw_fp(w);
    /* a full update's undo */
    refit_txn *t = tw_begin(w, "full", 1);
    tw_load_all(w, t, 2, NULL);
    refit_txn_stats st;
    assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
    uint64_t full_undo = st.undo_host_bytes + st.undo_device_bytes;
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_true(tw_snapshot_equal(w, snap, nb));
    /* a 3% delta, every tensor, aborted after half the patches */
    const char *names[TW_MAX];
    int n = primaries(w, names);
    t = begin_delta(w, "v2", "v1", NULL, 0, 1);
    uint64_t written = 0;
    for (int i = 0; i < n; i++) {
        tpatch p = make_patch(w, names[i], 1, 2, 3, 21, 1, NULL);
        assert_int_equal(refit_load_delta(t, p.name, p.n, p.idx, &p.vals->t, NULL), REFIT_OK);
        free(p.idx);
        if (i == n / 2) {
            assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
            written = st.undo_host_bytes + st.undo_device_bytes;
        }
    }
    assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
    uint64_t delta_undo = st.undo_host_bytes + st.undo_device_bytes;
    print_message("undo: full update %llu bytes, 3%% delta %llu bytes (%.1f%%)\n",
                  (unsigned long long)full_undo, (unsigned long long)delta_undo,
                  100.0 * (double)delta_undo / (double)full_undo);
    assert_true(written > 0 && written < delta_undo);
    /* at most the patched elements (4 bytes each at most) plus the
     * pad-free shards of this rank: well under a tenth of the full undo */
    assert_true(delta_undo * 10 < full_undo);
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
    assert_int_equal(tw_fp(w), fp);
    int same = tw_snapshot_equal(w, snap, nb);
    free(snap);
    assert_true(same);
}

/* Abort half-way through patches of one tensor that are then overwritten
 * by a full load of another name of the same storage: the LIFO undo
 * restores the original bytes. */
static void test_abort_after_patch_and_load(void **state)
{
    tw *w = *state;
    llm(w, 0, 1);
    tw_update(w, 1, "v1");
    size_t nb;
    void *snap = tw_snapshot(w, &nb);
    w->keep_going = 1;
    const char *mods[] = {"layers.0.attn"};
    refit_txn *t = begin_delta(w, "v2", "v1", mods, 1, 1);
    tpatch p = make_patch(w, "model.layers.0.self_attn.q_proj.weight", 1, 2, 50, 9, 0, NULL);
    assert_int_equal(refit_load_delta(t, p.name, p.n, p.idx, &p.vals->t, NULL), REFIT_OK);
    free(p.idx);
    /* k lands in the same fused qkv tensor: its whole span is saved now */
    assert_int_equal(tw_load(w, t, "model.layers.0.self_attn.k_proj.weight", 2), REFIT_OK);
    assert_int_equal(refit_abort(t), REFIT_OK);
    int same = tw_snapshot_equal(w, snap, nb);
    free(snap);
    assert_true(same);
}

/* A patch of no elements beside real ones, with rollback: accepted, saves
 * nothing, and the update commits (before: its undo save was counted but
 * not made, and finalize stopped on the transaction's invariant). */
static void test_empty_patch(void **state)
{
    tw *w = *state;
    llm(w, 0, 1);
    tw_update(w, 1, "v1");
    const char *names[TW_MAX];
    int n = primaries(w, names);
    refit_txn *t = begin_delta(w, "v2", "v1", NULL, 0, 1);
    tpatch p = make_patch(w, names[0], 1, 2, 3, 5, 0, NULL);
    int rc = refit_load_delta(t, p.name, p.n, p.idx, &p.vals->t, NULL);
    assert_int_equal(rc, REFIT_OK);
    free(p.idx);
    int64_t idx0 = 0, cnt0 = 1;
    for (int k = 1; k <= 2; k++) { /* no indices; then no runs */
        tt_tensor *none = tw_tmp(w, tw_ckpt_tensor(w, names[n - k], 1)->t.dtype, 1,
                                 TT_SHAPE(0));
        rc = k == 1 ? refit_load_delta(t, names[n - k], 0, &idx0, &none->t, NULL)
                    : refit_load_delta_runs(t, names[n - k], 0, &idx0, &cnt0, &none->t, NULL);
        if (rc)
            fail_msg("an empty patch of %s: %s: %s", names[n - k], refit_status_name(rc),
                     refit_errmsg(w->ctx));
    }
    rc = refit_finalize(t);
    if (rc)
        fail_msg("finalize: %s: %s", refit_status_name(rc), refit_errmsg(w->ctx));
    assert_string_equal(refit_worker_version(w->ctx), "v2");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
}

/* A version 2 caller's options end at keep_going: begin reads no further
 * (under ASan, a read past the allocation would stop the test). */
static void test_v2_options_read_no_further(void **state)
{
    tw *w = *state;
    llm(w, 0, 1);
    struct update_opts_v2 {
        uint32_t version;
        const char *version_label, *source_uri;
        int rollback;
        const char *source_digest;
        int fingerprint, partial, keep_going;
    };
    assert_int_equal(sizeof(struct update_opts_v2), offsetof(refit_update_opts, base_version));
    struct update_opts_v2 *o = calloc(1, sizeof *o);
    assert_non_null(o);
    o->version = 2;
    o->version_label = "v1";
    o->rollback = 1;
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, w->m, (const refit_update_opts *)(void *)o), REFIT_OK);
    free(o);
    tw_load_all(w, t, 1, NULL);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_delta_equals_full_plain, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_delta_equals_full_tp_rank0, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_delta_equals_full_tp_rank2_of_3, tw_setup,
                                        tw_teardown),
        cmocka_unit_test_setup_teardown(test_delta_equals_full_tied_alias, tw_setup,
                                        tw_teardown),
        cmocka_unit_test_setup_teardown(test_row_runs, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_index_out_of_range, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_negative_index, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_index, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_overlapping_runs, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_values_dtype, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_values_count, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_more_than_the_tensor, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_wrong_base, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_base_behind_one_module, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_scope_declared, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_missing_declared_module, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_whole_model_takes_label, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_refused_routes, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_tensor, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_undo_proportional, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_abort_after_patch_and_load, tw_setup,
                                        tw_teardown),
        cmocka_unit_test_setup_teardown(test_empty_patch, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_v2_options_read_no_further, tw_setup,
                                        tw_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
