/* Online FP8 on the device through the public API and the fp8 plugin: BF16,
 * F16 and F32 weights are staged in device memory and quantized at
 * post-load by the host's quant_fp8 service, which runs the CUDA kernel.
 * The same model is registered twice, in device memory and in host memory
 * (the CPU reference); every update goes to both and the device bytes and
 * fingerprints must equal the host's. Modules: fused q/k/v per-tensor with
 * a scale per weight and with one shared scale, fused gate/up per-channel,
 * a ragged block-128 weight, fused block-128 weights, stacked experts
 * per-tensor (a scale per expert), block-128 and per-channel (two weights
 * per expert), and one of each scheme with param arithmetic: reciprocal
 * (vLLM's x * (1 / scale), its own launcher call). Checked: reloading the same weights gives identical bytes,
 * a reload equals a cold start, sources in device, pinned and pageable
 * memory and a caller's stream, a NaN refused (module and tensor named)
 * with the previous bytes kept, an abort with rollback after post-load.
 * Skipped without a CUDA device. REFIT_GPU_FP8_ON_HOST=1 runs the "device"
 * model in host memory instead, to check the test itself without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include <refit/format.h>
#include <refit/refit.h>

#include "core/cuda/backend_cuda.h"
#include "gpu_pair.h"
#include "gpu_many.h"
#include "kernels/cast.h"

#define E4M3 ((refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1})

/* ---- the model: online FP8 modules and their checkpoint weights ---- */

/* An online module: runtime weight [e,] n, k (E4M3) and its F32 scale. */
static void module(pair_world *w, const char *name, const char *params, int64_t e, int64_t n,
                   int64_t k, int snd, const int64_t *sshape)
{
    OK(w, refit_model_add_module(w->m, name, "fp8", params));
    if (e > 1)
        pair_bind(w, name, "weight", E4M3, 3, (int64_t[]){e, n, k});
    else
        pair_bind(w, name, "weight", E4M3, 2, (int64_t[]){n, k});
    pair_bind(w, name, "weight_scale", F32, snd, sshape);
}

/* A checkpoint weight [rows, k] at row `row` of expert e (-1: none). */
static void weight(pair_world *w, const char *module, const char *name, refit_dtype dt,
                   int64_t rows, int64_t k, int64_t row, int64_t e)
{
    pair_expect(w, module, name, dt, 2, (int64_t[]){rows, k}, "weight", row, e);
}

static void build(pair_world *w)
{
    char n[64];

    /* fused q/k/v, per-tensor: a scale per weight; then one shared scale (F16) */
    module(w, "l0.qkv", "scheme: per_tensor", 1, 280, 136, 1, (int64_t[]){3});
    weight(w, "l0.qkv", "l0.q_proj.weight", BF16, 200, 136, 0, -1);
    weight(w, "l0.qkv", "l0.k_proj.weight", BF16, 40, 136, 200, -1);
    weight(w, "l0.qkv", "l0.v_proj.weight", BF16, 40, 136, 240, -1);
    module(w, "l1.qkv", "scheme: per_tensor\nonline: true", 1, 280, 136, 1, (int64_t[]){1});
    weight(w, "l1.qkv", "l1.q_proj.weight", F16, 200, 136, 0, -1);
    weight(w, "l1.qkv", "l1.k_proj.weight", F16, 40, 136, 200, -1);
    weight(w, "l1.qkv", "l1.v_proj.weight", F16, 40, 136, 240, -1);

    /* fused gate/up, per-channel */
    module(w, "l0.gate_up", "scheme: per_channel", 1, 600, 200, 2, (int64_t[]){600, 1});
    weight(w, "l0.gate_up", "l0.gate_proj.weight", BF16, 300, 200, 0, -1);
    weight(w, "l0.gate_up", "l0.up_proj.weight", BF16, 300, 200, 300, -1);

    /* block-128: ragged in both dims (F32); fused, the last ragged */
    module(w, "l0.down", "scheme: block128", 1, 200, 600, 2, (int64_t[]){2, 5});
    weight(w, "l0.down", "l0.down_proj.weight", F32, 200, 600, 0, -1);
    module(w, "l1.gate_up", "scheme: block128", 1, 356, 136, 2, (int64_t[]){3, 2});
    weight(w, "l1.gate_up", "l1.gate_proj.weight", BF16, 256, 136, 0, -1);
    weight(w, "l1.gate_up", "l1.up_proj.weight", BF16, 100, 136, 256, -1);

    /* stacked experts: per-tensor a scale each, block-128, per-channel x2 */
    module(w, "l0.experts", "scheme: per_tensor", 4, 96, 64, 1, (int64_t[]){4});
    for (int e = 0; e < 4; e++) {
        snprintf(n, sizeof n, "l0.experts.%d.down_proj.weight", e);
        weight(w, "l0.experts", n, BF16, 96, 64, 0, e);
    }
    module(w, "l1.experts", "scheme: block128", 3, 128, 260, 3, (int64_t[]){3, 1, 3});
    for (int e = 0; e < 3; e++) {
        snprintf(n, sizeof n, "l1.experts.%d.down_proj.weight", e);
        weight(w, "l1.experts", n, BF16, 128, 260, 0, e);
    }
    module(w, "l2.experts", "scheme: per_channel", 2, 128, 72, 3, (int64_t[]){2, 128, 1});
    for (int e = 0; e < 2; e++) {
        snprintf(n, sizeof n, "l2.experts.%d.gate_proj.weight", e);
        weight(w, "l2.experts", n, BF16, 64, 72, 0, e);
        snprintf(n, sizeof n, "l2.experts.%d.up_proj.weight", e);
        weight(w, "l2.experts", n, BF16, 64, 72, 64, e);
    }

    /* arithmetic: reciprocal (vLLM's x * (1 / scale)) beside the same schemes
     * dividing: its own launcher call on the device, kern_quant_fp8_arith's
     * bytes on the host */
    module(w, "l3.qkv", "scheme: per_tensor\narithmetic: reciprocal", 1, 280, 136, 1,
           (int64_t[]){1});
    weight(w, "l3.qkv", "l3.q_proj.weight", BF16, 200, 136, 0, -1);
    weight(w, "l3.qkv", "l3.k_proj.weight", BF16, 40, 136, 200, -1);
    weight(w, "l3.qkv", "l3.v_proj.weight", F32, 40, 136, 240, -1);
    module(w, "l3.gate_up", "scheme: per_channel\narithmetic: reciprocal", 1, 600, 200, 2,
           (int64_t[]){600, 1});
    weight(w, "l3.gate_up", "l3.gate_proj.weight", BF16, 300, 200, 0, -1);
    weight(w, "l3.gate_up", "l3.up_proj.weight", F16, 300, 200, 300, -1);
    module(w, "l3.experts", "scheme: block128\narithmetic: reciprocal", 3, 128, 260, 3,
           (int64_t[]){3, 1, 3});
    for (int e = 0; e < 3; e++) {
        snprintf(n, sizeof n, "l3.experts.%d.down_proj.weight", e);
        weight(w, "l3.experts", n, BF16, 128, 260, 0, e);
    }
}

/* Every checkpoint tensor is a float weight; defect 1: a NaN at element 37. */
static const pair_format fp8_model = {"REFIT_GPU_FP8_ON_HOST", "fp8", build, pair_float_ckpt};

/* ---- tests ---- */

/* Device quantization equals the CPU reference, from every source kind. */
static void test_matches_host(void **state)
{
    pair_check_matches_host(state);
}

/* The same weights twice give the same bytes; B over A equals a cold
 * start on B (a second device model loaded once), fingerprints too. */
static void test_reload_equals_cold(void **state)
{
    pair_check_reload_equals_cold(state, 1);
}

/* A caller's non-blocking stream. */
static void test_user_stream(void **state)
{
    pair_check_user_stream(state);
}

/* A NaN in one weight: refused naming module and tensor; with rollback
 * every byte stays; an abort after every post-load restores too. */
static void test_nan_and_abort(void **state)
{
    /* l1.k_proj (a shared per-tensor scale), l0.q_proj, l0.up_proj
     * (per-channel), l0.down_proj (block-128, F32), an expert */
    static const int bads[5] = {4, 0, 7, 8, 12};
    pair_check_nan_and_abort(state, bads, 5);
}

/* A NaN in l0.q_proj (module l0.qkv) and in l0.down_proj (l0.down): every
 * post-load is enqueued, finalize names the first only, and the next
 * update commits. */
static void test_status_at_finalize(void **state)
{
    pair_check_status_at_finalize(state, 0, 8, "NaN or infinity");
}

/* One refit_load_many: one post_load_many over every module, sources read
 * in place (aligned) or staged (not); the bytes of a refit_load a tensor
 * and of the host. */
static void test_load_many(void **state)
{
    pair_check_load_many_watched(state, &fp8_model);
}

/* A NaN in l0.q_proj (module l0.qkv), then in l0.down_proj (l0.down), in
 * one refit_load_many: named at finalize, rolled back. */
static void test_load_many_nan(void **state)
{
    static const int bads[2] = {0, 8};
    pair_check_load_many_nan(state, &fp8_model, bads, 2);
}

int main(void)
{
    int on_host_only = pair_use(&fp8_model);
    if (!on_host_only && twin_skip_suite_without_device())
        return 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_host),
        cmocka_unit_test(test_reload_equals_cold),
        cmocka_unit_test(test_user_stream),
        cmocka_unit_test(test_nan_and_abort),
        cmocka_unit_test(test_status_at_finalize),
        cmocka_unit_test(test_load_many),
        cmocka_unit_test(test_load_many_nan),
    };
    return cmocka_run_group_tests(tests, pair_setup, pair_teardown);
}
