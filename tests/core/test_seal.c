/* Registration and seal: every refusal has its status and a message that
 * names the module and tensor; a refused seal changes nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cast.h"
#include "testutil.h"

/* A one-module model "m" with runtime "w" [4, 4] f32. */
static tt_tensor *simple(tw *w)
{
    tw_module(w, "m", "unquantized", NULL);
    return tw_runtime(w, "m", "w", REFIT_F32, 2, TT_SHAPE(4, 4));
}

static void expect_seal(tw *w, int status)
{
    int rc = refit_model_seal(w->m);
    if (rc != status)
        fail_msg("seal: %s (%s), want %s", refit_status_name(rc), refit_errmsg(w->ctx),
                 refit_status_name(status));
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_EMPTY);
}

static void test_unknown_format(void **state)
{
    tw *w = *state;
    assert_int_equal(refit_model_add_module(w->m, "layer0", "fp13", NULL), REFIT_ENOTFOUND);
    tw_assert_msg(w, "layer0", "fp13");
    /* the module was not added: a module of that name is still free */
    tw_module(w, "layer0", "unquantized", NULL);
}

static void test_duplicate_module(void **state)
{
    tw *w = *state;
    tw_module(w, "attn", "unquantized", NULL);
    assert_int_equal(refit_model_add_module(w->m, "attn", "unquantized", NULL), REFIT_EEXIST);
    tw_assert_msg(w, "module attn", "already");
}

static void test_duplicate_runtime_name(void **state)
{
    tw *w = *state;
    simple(w);
    tt_tensor *t = tw_tmp(w, REFIT_F32, 2, TT_SHAPE(4, 4));
    assert_int_equal(refit_module_bind_runtime(w->m, "m", "w", &t->t), REFIT_EEXIST);
    tw_assert_msg(w, "module m", "w", "already bound");
    /* the same name in another module is fine: names are module-local */
    tw_module(w, "m2", "unquantized", NULL);
    assert_int_equal(refit_module_bind_runtime(w->m, "m2", "w", &t->t), REFIT_OK);
}

static void test_duplicate_checkpoint_name(void **state)
{
    tw *w = *state;
    simple(w);
    tw_module(w, "other", "unquantized", NULL);
    tw_runtime(w, "other", "w", REFIT_F32, 2, TT_SHAPE(4, 4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 4));
    assert_int_equal(tw_expect(w, "m", "model.w", &s), REFIT_OK);
    assert_int_equal(refit_model_expect(w->m, "m", "model.w", &s), REFIT_EEXIST);
    tw_assert_msg(w, "model.w", "module m");
    /* also across modules: a checkpoint name has one home */
    assert_int_equal(refit_model_expect(w->m, "other", "model.w", &s), REFIT_EEXIST);
    tw_assert_msg(w, "model.w", "already expected by module m");
}

static void test_duplicate_side_tensor(void **state)
{
    tw *w = *state;
    tt_tensor *a = tw_tmp(w, REFIT_U8, 1, TT_SHAPE(16));
    assert_int_equal(refit_model_add_side(w->m, "workspace", &a->t), REFIT_OK);
    assert_int_equal(refit_model_add_side(w->m, "workspace", &a->t), REFIT_EEXIST);
    tw_assert_msg(w, "side tensor workspace");
}

static void test_unknown_module_in_bind_and_expect(void **state)
{
    tw *w = *state;
    tt_tensor *t = tw_tmp(w, REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(refit_module_bind_runtime(w->m, "ghost", "w", &t->t), REFIT_ENOTFOUND);
    tw_assert_msg(w, "ghost", "w");
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(refit_model_expect(w->m, "ghost", "x.weight", &s), REFIT_ENOTFOUND);
    tw_assert_msg(w, "ghost", "x.weight");
}

static void test_unknown_target(void **state)
{
    tw *w = *state;
    simple(w);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 4));
    s.target = "qkv";
    assert_int_equal(tw_expect(w, "m", "model.q", &s), REFIT_OK);
    expect_seal(w, REFIT_ENOTFOUND);
    tw_assert_msg(w, "module m", "model.q", "qkv");
}

static void test_no_target_with_two_runtimes(void **state)
{
    tw *w = *state;
    simple(w);
    tw_runtime(w, "m", "b", REFIT_F32, 1, TT_SHAPE(4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 4));
    assert_int_equal(tw_expect(w, "m", "model.w", &s), REFIT_OK);
    expect_seal(w, REFIT_EINVAL);
    tw_assert_msg(w, "module m", "model.w", "2 runtime tensors");
}

static void test_module_without_runtime(void **state)
{
    tw *w = *state;
    tw_module(w, "lonely", "unquantized", NULL);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(w, "lonely", "x", &s), REFIT_OK);
    expect_seal(w, REFIT_EINVAL);
    tw_assert_msg(w, "module lonely", "no runtime tensor");
}

static void test_module_without_expectations(void **state)
{
    tw *w = *state;
    simple(w);
    expect_seal(w, REFIT_EINVAL);
    tw_assert_msg(w, "module m", "expects no checkpoint tensor");
}

static void test_shape_does_not_fit_target(void **state)
{
    tw *w = *state;
    simple(w);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(5, 4));
    assert_int_equal(tw_expect(w, "m", "big", &s), REFIT_OK);
    expect_seal(w, REFIT_EMISMATCH);
    tw_assert_msg(w, "module m", "big", "runtime w");
}

static void test_ndim_differs_from_target(void **state)
{
    tw *w = *state;
    simple(w);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(16));
    assert_int_equal(tw_expect(w, "m", "flat", &s), REFIT_OK);
    expect_seal(w, REFIT_EMISMATCH);
    tw_assert_msg(w, "module m", "flat", "1 dims", "has 2");
}

static void test_offset_pushes_past_target(void **state)
{
    tw *w = *state;
    simple(w);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(2, 4));
    s.dst_offset[0] = 3; /* rows [3, 5) of 4 */
    assert_int_equal(tw_expect(w, "m", "k", &s), REFIT_OK);
    expect_seal(w, REFIT_EMISMATCH);
    tw_assert_msg(w, "module m", "tensor k", "[3, 5)");
}

static void test_dtype_mismatch_without_cast(void **state)
{
    tw *w = *state;
    simple(w);
    refit_ckpt_spec s = tt_spec(REFIT_BF16, 2, TT_SHAPE(4, 4));
    assert_int_equal(tw_expect(w, "m", "model.w", &s), REFIT_OK);
    expect_seal(w, REFIT_EMISMATCH);
    tw_assert_msg(w, "module m", "model.w", "bf16", "f32", "cast: true");
}

static void test_cast_false_param_still_refuses(void **state)
{
    tw *w = *state;
    tw_module(w, "m", "unquantized", "cast: false");
    tw_runtime(w, "m", "w", REFIT_F16, 1, TT_SHAPE(4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(w, "m", "x", &s), REFIT_OK);
    expect_seal(w, REFIT_EMISMATCH);
    tw_assert_msg(w, "x", "cast");
}

static void test_cast_allowed_with_param(void **state)
{
    tw *w = *state;
    tw_module(w, "m", "unquantized", "cast: true");
    tt_tensor *up = tw_runtime(w, "m", "up", REFIT_F32, 2, TT_SHAPE(3, 5));
    tt_tensor *down = tw_runtime(w, "m", "down", REFIT_BF16, 2, TT_SHAPE(3, 5));
    tt_tensor *half = tw_runtime(w, "m", "half", REFIT_F16, 2, TT_SHAPE(3, 5));
    refit_ckpt_spec s = tt_spec(REFIT_BF16, 2, TT_SHAPE(3, 5));
    s.target = "up";
    assert_int_equal(tw_expect(w, "m", "a", &s), REFIT_OK);
    s = tt_spec(REFIT_F32, 2, TT_SHAPE(3, 5));
    s.target = "down";
    assert_int_equal(tw_expect(w, "m", "b", &s), REFIT_OK);
    s = tt_spec(REFIT_BF16, 2, TT_SHAPE(3, 5));
    s.target = "half";
    assert_int_equal(tw_expect(w, "m", "c", &s), REFIT_OK);
    tw_seal(w);
    tw_update(w, 1, "v1");
    tt_tensor *a = tw_ckpt_tensor(w, "a", 1), *b = tw_ckpt_tensor(w, "b", 1);
    tt_tensor *c = tw_ckpt_tensor(w, "c", 1);
    for (int i = 0; i < 15; i++) {
        /* bf16 -> f32 is exact */
        assert_true(((float *)up->buf)[i] == kern_bf16_to_f32(((uint16_t *)a->buf)[i]));
        /* f32 -> bf16 rounds to nearest even */
        assert_int_equal(((uint16_t *)down->buf)[i], kern_f32_to_bf16(((float *)b->buf)[i]));
        /* bf16 -> f16 through f32 (exact), then rounded */
        assert_int_equal(((uint16_t *)half->buf)[i],
                         kern_f32_to_f16(kern_bf16_to_f32(((uint16_t *)c->buf)[i])));
    }
}

static void test_bad_params_yaml(void **state)
{
    tw *w = *state;
    assert_int_equal(refit_model_add_module(w->m, "m", "unquantized", "cast: true\nscale: [1, 2"),
                     REFIT_EINVAL);
    tw_assert_msg(w, "module m", "line ", "column ");
    assert_int_equal(refit_model_add_module(w->m, "m", "unquantized", "cast: true\ncast: false"),
                     REFIT_EINVAL);
    tw_assert_msg(w, "module m", "line 2", "duplicate key");
    assert_int_equal(refit_model_add_module(w->m, "m", "unquantized", "just a scalar"),
                     REFIT_EINVAL);
    tw_assert_msg(w, "module m", "line 1", "mapping");
    /* none of them was added */
    tw_module(w, "m", "unquantized", "cast: yes");
}

static void test_runtime_receives_nothing(void **state)
{
    tw *w = *state;
    simple(w);
    tw_runtime(w, "m", "bias", REFIT_F32, 1, TT_SHAPE(4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 4));
    s.target = "w";
    assert_int_equal(tw_expect(w, "m", "model.w", &s), REFIT_OK);
    expect_seal(w, REFIT_EINVAL);
    tw_assert_msg(w, "module m", "runtime bias", "receives no checkpoint tensor");
}

static void test_runtime_partly_covered(void **state)
{
    tw *w = *state;
    simple(w);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(3, 4));
    assert_int_equal(tw_expect(w, "m", "model.w", &s), REFIT_OK);
    expect_seal(w, REFIT_EINCOMPLETE);
    tw_assert_msg(w, "module m", "4 of 16 elements", "runtime w");
}

static void test_overlapping_checkpoint_tensors(void **state)
{
    tw *w = *state;
    simple(w);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(3, 4));
    assert_int_equal(tw_expect(w, "m", "q", &s), REFIT_OK);
    s = tt_spec(REFIT_F32, 2, TT_SHAPE(2, 4));
    s.dst_offset[0] = 2; /* rows [2, 4) overlap q's [0, 3) */
    assert_int_equal(tw_expect(w, "m", "k", &s), REFIT_OK);
    expect_seal(w, REFIT_EOVERLAP);
    tw_assert_msg(w, "module m", "q", "k", "overlap", "runtime w");
}

static void test_overlap_on_second_dim(void **state)
{
    tw *w = *state;
    simple(w);
    /* column blocks [0, 3) and [2, 4): dim-0 extents are equal, dim 1 overlaps */
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 3));
    assert_int_equal(tw_expect(w, "m", "left", &s), REFIT_OK);
    s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 2));
    s.dst_offset[1] = 2;
    assert_int_equal(tw_expect(w, "m", "right", &s), REFIT_OK);
    expect_seal(w, REFIT_EOVERLAP);
    tw_assert_msg(w, "left", "right");
}

static void test_expert_out_of_range(void **state)
{
    tw *w = *state;
    tw_module(w, "moe", "unquantized", NULL);
    tw_runtime(w, "moe", "w1", REFIT_F32, 3, TT_SHAPE(3, 2, 4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(2, 4));
    for (int e = 0; e < 3; e++) {
        char name[32];
        snprintf(name, sizeof name, "experts.%d", e);
        s.expert = e;
        assert_int_equal(tw_expect(w, "moe", name, &s), REFIT_OK);
    }
    s.expert = 3;
    assert_int_equal(tw_expect(w, "moe", "experts.3", &s), REFIT_OK);
    expect_seal(w, REFIT_EMISMATCH);
    tw_assert_msg(w, "module moe", "experts.3", "expert 3", "w1");
}

static void test_expert_needs_stacked_target(void **state)
{
    tw *w = *state;
    simple(w);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 4));
    s.expert = 0;
    assert_int_equal(tw_expect(w, "m", "experts.0", &s), REFIT_OK);
    expect_seal(w, REFIT_EMISMATCH);
    tw_assert_msg(w, "experts.0", "stacked");
}

static void test_tie_to_unknown_name(void **state)
{
    tw *w = *state;
    simple(w);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 4));
    assert_int_equal(tw_expect(w, "m", "embed", &s), REFIT_OK);
    refit_ckpt_spec t = REFIT_CKPT_SPEC_INIT;
    t.tie_of = "embed_tokens";
    assert_int_equal(tw_expect(w, "m", "lm_head", &t), REFIT_OK);
    expect_seal(w, REFIT_ENOTFOUND);
    tw_assert_msg(w, "module m", "lm_head", "embed_tokens");
}

static void test_tie_chain_and_cross_module_refused(void **state)
{
    tw *w = *state;
    simple(w);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 4));
    assert_int_equal(tw_expect(w, "m", "embed", &s), REFIT_OK);
    refit_ckpt_spec t = REFIT_CKPT_SPEC_INIT;
    t.tie_of = "embed";
    assert_int_equal(tw_expect(w, "m", "lm_head", &t), REFIT_OK);
    t.tie_of = "lm_head";
    assert_int_equal(tw_expect(w, "m", "output", &t), REFIT_OK);
    expect_seal(w, REFIT_EINVAL);
    tw_assert_msg(w, "output", "lm_head", "itself tied");
}

static void test_tie_across_modules_refused(void **state)
{
    tw *w = *state;
    simple(w);
    tw_module(w, "head", "unquantized", NULL);
    tw_runtime(w, "head", "w", REFIT_F32, 2, TT_SHAPE(4, 4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 4));
    assert_int_equal(tw_expect(w, "m", "embed", &s), REFIT_OK);
    refit_ckpt_spec t = REFIT_CKPT_SPEC_INIT;
    t.tie_of = "embed";
    assert_int_equal(tw_expect(w, "head", "lm_head", &t), REFIT_OK);
    expect_seal(w, REFIT_EINVAL);
    tw_assert_msg(w, "lm_head", "embed", "module m");
}

static void test_adding_after_seal(void **state)
{
    tw *w = *state;
    simple(w);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 4));
    assert_int_equal(tw_expect(w, "m", "model.w", &s), REFIT_OK);
    tw_seal(w);
    tt_tensor *t = tw_tmp(w, REFIT_F32, 2, TT_SHAPE(4, 4));
    assert_int_equal(refit_model_add_module(w->m, "late", "unquantized", NULL), REFIT_ESTATE);
    tw_assert_msg(w, "sealed");
    assert_int_equal(refit_module_bind_runtime(w->m, "m", "late", &t->t), REFIT_ESTATE);
    tw_assert_msg(w, "sealed");
    assert_int_equal(refit_model_add_side(w->m, "ws", &t->t), REFIT_ESTATE);
    tw_assert_msg(w, "sealed");
    assert_int_equal(refit_model_expect(w->m, "m", "late.w", &s), REFIT_ESTATE);
    tw_assert_msg(w, "sealed");
    assert_int_equal(refit_model_seal(w->m), REFIT_ESTATE);
    tw_assert_msg(w, "already sealed");
    assert_int_equal(refit_format_register(w->ctx, &tt_format_scale), REFIT_ESTATE);
    tw_assert_msg(w, "test-scale", "sealed");
    /* the model still works */
    tw_update(w, 1, "v1");
}

static void test_one_model_per_context(void **state)
{
    tw *w = *state;
    refit_model *second = (refit_model *)&second;
    assert_int_equal(refit_model_create(&second, w->ctx), REFIT_EEXIST);
    assert_null(second);
    tw_assert_msg(w, "one per context");
    refit_model_destroy(w->m);
    w->m = NULL;
    assert_int_equal(refit_model_create(&second, w->ctx), REFIT_OK);
    w->m = second;
    simple(w);
}

static void test_seal_refusal_changes_nothing_and_can_be_fixed(void **state)
{
    tw *w = *state;
    simple(w);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(2, 4));
    assert_int_equal(tw_expect(w, "m", "top", &s), REFIT_OK);
    size_t n0, n1;
    void *before = tw_snapshot(w, &n0);
    expect_seal(w, REFIT_EINCOMPLETE);
    void *after = tw_snapshot(w, &n1);
    int same = n0 == n1 && !memcmp(before, after, n0);
    free(before);
    free(after);
    assert_true(same);
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, w->m, NULL), REFIT_ESTATE);
    assert_null(t);
    tw_assert_msg(w, "not sealed");
    /* still open for registration: add the missing rows and seal again */
    s.dst_offset[0] = 2;
    assert_int_equal(tw_expect(w, "m", "bottom", &s), REFIT_OK);
    tw_seal(w);
    tw_update(w, 1, "v1");
    tt_tensor *top = tw_ckpt_tensor(w, "top", 1), *bottom = tw_ckpt_tensor(w, "bottom", 1);
    tt_tensor *rt = tw_rt(w, "m", "w");
    assert_memory_equal(rt->buf, top->buf, 32);
    assert_memory_equal((char *)rt->buf + 32, bottom->buf, 32);
}

static void test_bad_descriptors(void **state)
{
    tw *w = *state;
    tw_module(w, "m", "unquantized", NULL);
    assert_int_equal(refit_module_bind_runtime(w->m, "m", "w", NULL), REFIT_EINVAL);
    tw_assert_msg(w, "w", "NULL");
    tt_tensor *t = tw_tmp(w, REFIT_F32, 2, TT_SHAPE(4, 4));
    refit_tensor d = t->t;
    d.ndim = REFIT_MAX_DIMS + 1;
    assert_int_equal(refit_module_bind_runtime(w->m, "m", "w", &d), REFIT_EINVAL);
    tw_assert_msg(w, "w", "ndim");
    int64_t neg[2] = {4, -1};
    d = t->t;
    d.shape = neg;
    assert_int_equal(refit_module_bind_runtime(w->m, "m", "w", &d), REFIT_EINVAL);
    tw_assert_msg(w, "w", "negative");
    d = t->t;
    d.dtype.lanes = 4;
    assert_int_equal(refit_module_bind_runtime(w->m, "m", "w", &d), REFIT_EINVAL);
    tw_assert_msg(w, "w", "lanes");
}

static void test_bad_specs(void **state)
{
    tw *w = *state;
    simple(w);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 4));
    s.shard_count = 2;
    s.shard_rank = 2;
    assert_int_equal(refit_model_expect(w->m, "m", "x", &s), REFIT_EINVAL);
    tw_assert_msg(w, "module m", "x", "rank 2 of 2");
    s.shard_rank = 0;
    s.shard_dim = 2;
    assert_int_equal(refit_model_expect(w->m, "m", "x", &s), REFIT_EINVAL);
    tw_assert_msg(w, "x", "shard dim 2");
    s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 4));
    s.version = 7;
    assert_int_equal(refit_model_expect(w->m, "m", "x", &s), REFIT_EINVAL);
    tw_assert_msg(w, "x", "version");
    assert_int_equal(refit_model_expect(w->m, "m", "x", NULL), REFIT_EINVAL);
    s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, -4));
    assert_int_equal(refit_model_expect(w->m, "m", "x", &s), REFIT_EINVAL);
    tw_assert_msg(w, "x", "negative");
    /* pad_to below the real extent is refused at seal */
    s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 4));
    s.pad_to = 3;
    assert_int_equal(tw_expect(w, "m", "x", &s), REFIT_OK);
    expect_seal(w, REFIT_EINVAL);
    tw_assert_msg(w, "module m", "tensor x", "pad_to 3");
}

static void test_unquantized_refuses_integer_checkpoints(void **state)
{
    tw *w = *state;
    tw_module(w, "m", "unquantized", "cast: true");
    tw_runtime(w, "m", "w", REFIT_I32, 1, TT_SHAPE(4));
    refit_ckpt_spec s = tt_spec(REFIT_I32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(w, "m", "ids", &s), REFIT_OK);
    expect_seal(w, REFIT_EFORMAT);
    tw_assert_msg(w, "module m", "ids", "unquantized");
}

static void test_device_without_backend(void **state)
{
    tw *w = *state;
    tw_module(w, "m", "unquantized", NULL);
    tt_tensor *t = tw_runtime(w, "m", "w", REFIT_F32, 1, TT_SHAPE(4));
    t->t.device.device_type = 99;
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(w, "m", "x", &s), REFIT_OK);
    expect_seal(w, REFIT_EUNSUPPORTED);
    tw_assert_msg(w, "w", "device type 99");
    t->t.device.device_type = REFIT_DEVICE_CPU;
    tw_seal(w);
}

static void test_format_register_refusals(void **state)
{
    tw *w = *state;
    refit_format_v2 f = tt_format_scale;
    f.abi_version = 0;
    assert_int_equal(refit_format_register(w->ctx, &f), REFIT_EFORMAT);
    tw_assert_msg(w, "invalid version 0", "test-scale");
    f.abi_version = REFIT_FORMAT_ABI_VERSION + 1;
    assert_int_equal(refit_format_register(w->ctx, &f), REFIT_EFORMAT);
    tw_assert_msg(w, "invalid version");
    f = tt_format_scale;
    f.struct_size = 8;
    assert_int_equal(refit_format_register(w->ctx, &f), REFIT_EFORMAT);
    tw_assert_msg(w, "struct_size 8");
    f = tt_format_scale;
    f.plan = NULL;
    assert_int_equal(refit_format_register(w->ctx, &f), REFIT_EFORMAT);
    assert_int_equal(refit_format_register(w->ctx, NULL), REFIT_EINVAL);
    assert_int_equal(refit_format_register(w->ctx, &tt_format_scale), REFIT_OK);
    assert_int_equal(refit_format_register(w->ctx, &tt_format_scale), REFIT_EEXIST);
}

static void test_in_process_format_and_plugin_names(void **state)
{
    tw *w = *state;
    /* a plugin's format already used by a module cannot be replaced */
    static refit_format_v2 f;
    f = tt_format_scale;
    f.name = "unquantized";
    tw_module(w, "m", "unquantized", NULL);
    assert_int_equal(refit_format_register(w->ctx, &f), REFIT_EEXIST);
    tw_assert_msg(w, "unquantized", "module m");
    /* on a fresh context, an in-process registration replaces the plugin
     * of that name (once), and modules then get the in-process format */
    tw x;
    assert_int_equal(tw_open(&x, NULL), REFIT_OK);
    int rc1 = refit_format_register(x.ctx, &f);
    int rc2 = refit_format_register(x.ctx, &f);
    tw_module(&x, "s", "unquantized", NULL);
    tw_runtime(&x, "s", "w", REFIT_F32, 1, TT_SHAPE(4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(&x, "s", "s.w", &s), REFIT_OK);
    tw_seal(&x);
    refit_model_stats st;
    assert_int_equal(refit_model_stats_get(x.m, &st), REFIT_OK);
    tw_update(&x, 1, "v1");
    tt_tensor *rt = tw_rt(&x, "s", "w"), *ck = tw_ckpt_tensor(&x, "s.w", 1);
    int doubled = 1;
    for (int i = 0; i < 4; i++)
        doubled &= ((float *)rt->buf)[i] == 2.0f * ((float *)ck->buf)[i];
    tw_close(&x);
    assert_int_equal(rc1, REFIT_OK);
    assert_int_equal(rc2, REFIT_EEXIST);
    assert_int_equal(st.routes_staged, 1);
    assert_true(doubled);
}

static void test_plan_stats(void **state)
{
    tw *w = *state;
    tw_register_test_formats(w);
    tt_llm_cfg cfg = {.rank = 0, .tp = 2, .layers = 2, .staged = 1};
    tt_build_llm(w, &cfg);
    refit_model_stats st;
    assert_int_equal(refit_model_stats_get(w->m, &st), REFIT_OK);
    /* per layer: attn, mlp, moe, norm, scale; plus embed and norm */
    assert_int_equal(st.modules, 2 * 5 + 2);
    assert_int_equal(st.runtime_tensors, (uint32_t)w->n_rt);
    assert_int_equal(st.ckpt_tensors, (uint32_t)w->n_ck);
    assert_int_equal(st.routes_staged, 2 * 2);
    /* every primary route not staged is direct (the tie has no route of its own) */
    assert_int_equal(st.routes_direct, (uint32_t)w->n_ck - 1 - 4);
    uint64_t bytes = 0;
    for (int i = 0; i < w->n_rt; i++)
        bytes += w->rt[i]->bytes;
    assert_int_equal(st.runtime_bytes, bytes);
}

#define T(f) cmocka_unit_test_setup_teardown(f, tw_setup, tw_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_unknown_format),
        T(test_duplicate_module),
        T(test_duplicate_runtime_name),
        T(test_duplicate_checkpoint_name),
        T(test_duplicate_side_tensor),
        T(test_unknown_module_in_bind_and_expect),
        T(test_unknown_target),
        T(test_no_target_with_two_runtimes),
        T(test_module_without_runtime),
        T(test_module_without_expectations),
        T(test_shape_does_not_fit_target),
        T(test_ndim_differs_from_target),
        T(test_offset_pushes_past_target),
        T(test_dtype_mismatch_without_cast),
        T(test_cast_false_param_still_refuses),
        T(test_cast_allowed_with_param),
        T(test_bad_params_yaml),
        T(test_runtime_receives_nothing),
        T(test_runtime_partly_covered),
        T(test_overlapping_checkpoint_tensors),
        T(test_overlap_on_second_dim),
        T(test_expert_out_of_range),
        T(test_expert_needs_stacked_target),
        T(test_tie_to_unknown_name),
        T(test_tie_chain_and_cross_module_refused),
        T(test_tie_across_modules_refused),
        T(test_adding_after_seal),
        T(test_one_model_per_context),
        T(test_seal_refusal_changes_nothing_and_can_be_fixed),
        T(test_bad_descriptors),
        T(test_bad_specs),
        T(test_unquantized_refuses_integer_checkpoints),
        T(test_device_without_backend),
        T(test_format_register_refusals),
        T(test_in_process_format_and_plugin_names),
        T(test_plan_stats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
