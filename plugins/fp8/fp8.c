/* Format "fp8": E4M3 weights with F32 scales (docs/formats-fp8.md).
 *
 * Checkpoint tensors of a module, told apart by the suffix after the last
 * '.' (a module may hold several weights fused into one runtime tensor,
 * q/k/v into qkv; each W.* pairs with the W.weight of the same prefix):
 *   W.weight            F8_E4M3 [N, K] serialized, or BF16/F16/F32 [N, K]
 *                       (online: quantized at post-load)
 *   W.weight_scale      one element (per-tensor) or [N] / [N, 1]
 *                       (per-channel); serialized only
 *   W.weight_scale_inv  [ceil(N/128), ceil(K/128)] (block-128, a
 *                       multiplier despite its name); serialized only
 *   W.input_scale       static activation scale, copied as is
 * Scales are F32, or BF16/F16 (compressed-tensors writes the model's
 * dtype), cast to the runtime scale's float dtype on the copy.
 * Runtime tensors: weight (F8_E4M3), weight_scale (F32; any float dtype
 * when serialized), input_scale (float).
 *
 * Serialized: every route is DIRECT; the core places weights and scales
 * (shards, fused offsets, experts) and nothing runs at load. Online: the
 * weights are STAGED and post_load quantizes each into its place in the
 * runtime weight, writing the runtime scales (plugins/fp8/quant_fp8.h gives
 * the arithmetic): the CPU reference on host memory; on a CUDA device this
 * plugin's own kernels (quant_fp8.cu, embedded as fp8_image by
 * refit-embed), planned by fp8_launch.c and launched through the host's
 * GPU service in one call for every weight of the module, the same bytes.
 * It never waits (but for the once-per-device conversion check,
 * fp8_cvt_host.h): a NaN lowers the module's status word, which the host
 * reads at finalize. A plugin built without nvcc runs on host memory only
 * (seal refuses device runtime tensors then). Either way the module is
 * WHOLE: a weight without its scale means nothing.
 *
 * Params: scheme (per_tensor | per_channel | block128; serialized modules
 * infer it from their scale tensors), online (bool, optional: asserts the
 * weights' dtype), in_features / out_features (unsharded K and total N,
 * of one expert on a stacked [E, N, K] runtime; needed only when a
 * block-128 extent is not a whole number of blocks, so that a ragged last
 * block can be told from a shard boundary), arithmetic
 * (divide | reciprocal, online modules: kern_fp8_arith; serialized modules
 * are copied as they are and ignore it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <refit/format.h>

#include <refit/sdk/group.h>
#include <refit/sdk/pgpu_host.h>
#include "plugins/fp8/fp8_cvt_host.h"
#include "plugins/fp8/fp8_launch.h"
#include "plugins/fp8/quant_fp8.h"
#include "plugins/fp8/qplug.h"

#ifdef REFIT_FP8_DEVICE_CODE
extern const unsigned char fp8_image[];
extern const size_t fp8_image_size;
#endif

#ifdef REFIT_FP8_DEVICE_CODE
static const char nan_what[] = "NaN or infinity in the weight; refusing to quantize it";
#endif

enum { R_WEIGHT, R_SCALE, R_SCALE_INV, R_INPUT_SCALE, R_COUNT };
static const char *const role_suffix[R_COUNT] = {"weight", "weight_scale", "weight_scale_inv",
                                                 "input_scale"};
static const char *const scheme_name[3] = {"per_tensor", "per_channel", "block128"};
static const char *const arith_name[2] = {"divide", "reciprocal"};

typedef struct fp8_state {
    int online;
    kern_fp8_scheme scheme;
    kern_fp8_arith arith;     /* online: how values are divided by their scale */
    int rt_weight, rt_scale;  /* runtime indexes; -1 when absent */
    uint32_t n_weights;
    uint32_t *weights;        /* ckpt indexes of the W.weight tensors */
    int *pair;                /* per ckpt: index of its weight's scale, or -1 */
    /* per weight (as weights[]): over the weights placed at its expert
     * (every weight of an unstacked module), their rows and how many are
     * not whole 128-row blocks */
    int64_t *exp_rows;
    uint32_t *exp_ragged;
} fp8_state;

static int role_of(const char *name)
{
    const char *s = suffix(name);
    for (int r = 0; r < R_COUNT; r++)
        if (!strcmp(s, role_suffix[r]))
            return r;
    return -1;
}

/* -1 when the param is absent. */
static int scheme_param(const refit_host_v2 *h, const refit_fmt_module *m, int *out)
{
    const char *v = h->param(h->host, m, "scheme");
    *out = -1;
    if (!v)
        return REFIT_OK;
    for (int s = 0; s < 3; s++)
        if (!strcmp(v, scheme_name[s]))
            *out = s;
    if (*out < 0)
        return ERR(h, REFIT_EINVAL, "module %s: param scheme is '%s'; format fp8 takes "
                   "per_tensor, per_channel or block128", m->name, v);
    return REFIT_OK;
}

/* KERN_FP8_DIVIDE when the param is absent. */
static int arith_param(const refit_host_v2 *h, const refit_fmt_module *m, kern_fp8_arith *out)
{
    const char *v = h->param(h->host, m, "arithmetic");
    *out = KERN_FP8_DIVIDE;
    if (!v)
        return REFIT_OK;
    for (int a = 0; a < 2; a++)
        if (!strcmp(v, arith_name[a])) {
            *out = (kern_fp8_arith)a;
            return REFIT_OK;
        }
    return ERR(h, REFIT_EINVAL, "module %s: param arithmetic is '%s'; format fp8 takes "
               "divide or reciprocal", m->name, v);
}

/* ---- serialized: DIRECT routes, shapes checked ---- */

static int split_error(const refit_host_v2 *h, const refit_fmt_module *m,
                       const refit_fmt_ckpt *sc, kern_split sp, const char *dim,
                       int64_t n, int64_t blocks, const char *param)
{
    if (sp == KERN_SPLIT_CUT)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: %lld %s against %lld blocks of "
                   "128: a shard boundary cuts a 128-block (shard block-128 weights only at "
                   "multiples of 128)", m->name, sc->name, (long long)n, dim,
                   (long long)blocks);
    if (sp == KERN_SPLIT_RAGGED)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: %lld %s is not a whole number "
                   "of 128-blocks; declare param %s (the unsharded extent) so that a ragged "
                   "last block can be told from a shard boundary", m->name, sc->name,
                   (long long)n, dim, param);
    return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: %lld %s need %lld blocks of 128, "
               "the scale has %lld", m->name, sc->name, (long long)n, dim,
               (long long)((n + 127) / 128), (long long)blocks);
}

/* The block-128 scale sc of weight w, with the wholeness of each dim. */
static int check_block(const refit_host_v2 *h, const refit_fmt_module *m,
                       const refit_fmt_ckpt *w, const refit_fmt_ckpt *sc, int rows_whole,
                       int cols_whole)
{
    if (sc->ndim != 2)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: a block-128 scale is 2-D "
                   "[ceil(N/128), ceil(K/128)], not %d-D", m->name, sc->name, sc->ndim);
    kern_split sp = kern_block_split(w->shape[0], sc->shape[0], KERN_FP8_BLOCK, rows_whole);
    if (sp)
        return split_error(h, m, sc, sp, "rows", w->shape[0], sc->shape[0], "out_features");
    sp = kern_block_split(w->shape[1], sc->shape[1], KERN_FP8_BLOCK, cols_whole);
    if (sp)
        return split_error(h, m, sc, sp, "columns", w->shape[1], sc->shape[1], "in_features");
    return REFIT_OK;
}

/* Scheme a scale tensor implies, and its shape against weight w. */
static int check_scale(const refit_host_v2 *h, const refit_fmt_module *m,
                       const refit_fmt_ckpt *w, const refit_fmt_ckpt *sc, int role,
                       kern_fp8_scheme *out)
{
    if (!kern_is_float_dtype(sc->dtype))
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: scales are f32/bf16/f16, not %s",
                   m->name, sc->name, dt_name(sc->dtype));
    if (role == R_SCALE_INV) {
        *out = KERN_FP8_BLOCK128;
        return REFIT_OK;
    }
    int64_t n = w->shape[0];
    if (sc->ndim <= 2 && numel(sc->ndim, sc->shape) == 1) {
        *out = KERN_FP8_PER_TENSOR;
        return REFIT_OK;
    }
    if ((sc->ndim == 1 && sc->shape[0] == n) ||
        (sc->ndim == 2 && sc->shape[0] == n && sc->shape[1] == 1)) {
        *out = KERN_FP8_PER_CHANNEL;
        return REFIT_OK;
    }
    return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: weight_scale is one element "
               "(per-tensor) or [%lld] / [%lld, 1] (per-channel) for weight %s",
               m->name, sc->name, (long long)n, (long long)n, w->name);
}

/* The scale of weight ckpt[wi]: the one W.weight_scale(_inv) of its prefix. */
static int find_scale(const refit_host_v2 *h, const refit_fmt_module *m, uint32_t wi,
                      int *out)
{
    *out = -1;
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        int r = role_of(refit_ckpt(m, i)->name);
        if ((r != R_SCALE && r != R_SCALE_INV) || !same_prefix(refit_ckpt(m, i)->name, refit_ckpt(m, wi)->name))
            continue;
        if (*out >= 0)
            return ERR(h, REFIT_EFORMAT, "module %s: weight %s has two scales, %s and %s",
                       m->name, refit_ckpt(m, wi)->name, refit_ckpt(m, *out)->name, refit_ckpt(m, i)->name);
        *out = (int)i;
    }
    if (*out < 0)
        return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: a serialized FP8 weight needs its "
                   "%.*s.weight_scale or %.*s.weight_scale_inv", m->name, refit_ckpt(m, wi)->name,
                   (int)prefix_len(refit_ckpt(m, wi)->name), refit_ckpt(m, wi)->name,
                   (int)prefix_len(refit_ckpt(m, wi)->name), refit_ckpt(m, wi)->name);
    return REFIT_OK;
}

typedef struct wkey {
    int64_t expert;
    uint32_t w;
} wkey;

static int wkey_cmp(const void *a, const void *b)
{
    const wkey *x = a, *y = b;
    if (x->expert != y->expert)
        return x->expert < y->expert ? -1 : 1;
    return x->w < y->w ? -1 : x->w > y->w;
}

/* s->exp_rows and s->exp_ragged: on a stacked runtime [E, N, K] the params
 * describe one expert's [N, K], as an engine's config states them. Sorted
 * by expert: a stack of hundreds of experts costs n log n, not n^2. */
static int expert_groups(const refit_host_v2 *h, const refit_fmt_module *m, fp8_state *s)
{
    uint32_t n = s->n_weights;
    wkey *k = h->mem_alloc(h->host, sizeof *k * (n ? n : 1));
    if (!k)
        return ERR(h, REFIT_ENOMEM, "module %s: out of memory", m->name);
    for (uint32_t i = 0; i < n; i++)
        k[i] = (wkey){refit_ckpt(m, s->weights[i])->expert, i};
    qsort(k, n, sizeof *k, wkey_cmp);
    for (uint32_t a = 0, b; a < n; a = b) {
        int64_t rows = 0;
        uint32_t ragged = 0;
        for (b = a; b < n && k[b].expert == k[a].expert; b++) {
            int64_t r = refit_ckpt(m, s->weights[k[b].w])->shape[0];
            rows += r; /* spec extents, each checked: no overflow */
            ragged += r % KERN_FP8_BLOCK != 0;
        }
        for (uint32_t i = a; i < b; i++) {
            s->exp_rows[k[i].w] = rows;
            s->exp_ragged[k[i].w] = ragged;
        }
    }
    h->mem_free(h->host, k);
    return REFIT_OK;
}

/* Each expert's rows against out_features, each weight's columns against
 * in_features; the same on an expert's slice as on the whole stack. */
static int check_features(const refit_host_v2 *h, const refit_fmt_module *m,
                          const fp8_state *s, int64_t in_f, int64_t out_f)
{
    for (uint32_t i = 0; i < s->n_weights; i++) {
        const refit_fmt_ckpt *w = refit_ckpt(m, s->weights[i]);
        int64_t rows = s->exp_rows[i];
        if (out_f && rows > out_f && w->expert >= 0)
            return ERR(h, REFIT_EMISMATCH, "module %s: the weights of expert %lld have %lld "
                       "rows, more than param out_features %lld (one expert's N)", m->name,
                       (long long)w->expert, (long long)rows, (long long)out_f);
        if (out_f && rows > out_f)
            return ERR(h, REFIT_EMISMATCH, "module %s: the weights have %lld rows, more than "
                       "param out_features %lld", m->name, (long long)rows, (long long)out_f);
        if (in_f && w->shape[1] > in_f)
            return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: %lld columns, more than "
                       "param in_features %lld", m->name, w->name, (long long)w->shape[1],
                       (long long)in_f);
    }
    return REFIT_OK;
}

static int plan_serialized(const refit_host_v2 *h, refit_fmt_module *m, fp8_state *s,
                           int want_scheme, int64_t in_f, int64_t out_f)
{
    int rc = check_features(h, m, s, in_f, out_f);
    for (uint32_t i = 0; i < s->n_weights && !rc; i++) {
        const refit_fmt_ckpt *w = refit_ckpt(m, s->weights[i]);
        int si = -1;
        kern_fp8_scheme sch = KERN_FP8_PER_TENSOR;
        rc = find_scale(h, m, s->weights[i], &si);
        if (!rc)
            rc = check_scale(h, m, w, refit_ckpt(m, si), role_of(refit_ckpt(m, si)->name), &sch);
        if (rc)
            return rc;
        if (sch == KERN_FP8_BLOCK128)
            rc = check_block(h, m, w, refit_ckpt(m, si), wholeness(s->exp_rows[i], out_f),
                             wholeness(w->shape[1], in_f));
        if (i > 0 && sch != s->scheme)
            return ERR(h, REFIT_EMISMATCH, "module %s: weight %s is %s but %s is %s; one "
                       "scheme per module", m->name, w->name, scheme_name[sch],
                       refit_ckpt(m, s->weights[0])->name, scheme_name[s->scheme]);
        s->scheme = sch;
        s->pair[si] = (int)s->weights[i];
    }
    if (!rc && want_scheme >= 0 && (int)s->scheme != want_scheme)
        return ERR(h, REFIT_EMISMATCH, "module %s: param scheme is %s but the checkpoint's "
                   "scales are %s", m->name, scheme_name[want_scheme], scheme_name[s->scheme]);
    return rc;
}

/* ---- online: STAGED weights, quantized at post-load ---- */

/* 1 when post-load can run on dev: a CUDA device the host serves, and
 * this plugin carries its device code. */
static int device_kernel(const refit_host_v2 *h, refit_device dev)
{
#ifdef REFIT_FP8_DEVICE_CODE
    return dev.device_type == REFIT_DEVICE_CUDA && refit_host_serves(h, dev);
#else
    (void)h;
    (void)dev;
    return 0;
#endif
}

/* The runtime weight and scale an online module writes. */
static int check_online_runtime(const refit_host_v2 *h, const refit_fmt_module *m,
                                fp8_state *s)
{
    s->rt_scale = find_runtime(m, "weight_scale");
    if (s->rt_weight < 0 || s->rt_scale < 0)
        return ERR(h, REFIT_EFORMAT, "module %s: online fp8 writes runtime tensors named "
                   "weight and weight_scale; bind both", m->name);
    const refit_view *w = &refit_runtime(m, s->rt_weight)->view, *sc = &refit_runtime(m, s->rt_scale)->view;
    if (!is_e4m3(w->dtype) || (w->ndim != 2 && w->ndim != 3) || !row_major(w))
        return ERR(h, REFIT_EMISMATCH, "module %s: runtime weight must be a contiguous "
                   "f8_e4m3 [N, K] or [E, N, K] tensor (it is %s, %d-D)", m->name,
                   dt_name(w->dtype), w->ndim);
    if (!is_f32(sc->dtype) || !row_major(sc))
        return ERR(h, REFIT_EMISMATCH, "module %s: runtime weight_scale must be a contiguous "
                   "f32 tensor (it is %s)", m->name, dt_name(sc->dtype));
    if (host_memory(w->device) && host_memory(sc->device))
        return REFIT_OK;
    if (w->device.device_type != sc->device.device_type ||
        w->device.device_id != sc->device.device_id)
        return ERR(h, REFIT_EUNSUPPORTED, "module %s: runtime weight and weight_scale are on "
                   "different devices; online fp8 writes both in one place", m->name);
    if (!device_kernel(h, w->device))
        return ERR(h, REFIT_EUNSUPPORTED, "module %s: online fp8 quantization on device type "
                   "%d needs a CUDA device the host serves and this plugin's device code; %s",
                   m->name, w->device.device_type,
#ifdef REFIT_FP8_DEVICE_CODE
                   "the host serves no such device"
#else
                   "this plugin was built without nvcc"
#endif
                   );
    return REFIT_OK;
}

/* Scale slots the runtime weight_scale must hold for the scheme. */
static int check_online_slots(const refit_host_v2 *h, const refit_fmt_module *m,
                              const fp8_state *s)
{
    const refit_view *w = &refit_runtime(m, s->rt_weight)->view, *sc = &refit_runtime(m, s->rt_scale)->view;
    int64_t e = w->ndim == 3 ? w->shape[0] : 1, n = w->shape[w->ndim - 2];
    int64_t k = w->shape[w->ndim - 1], have = numel(sc->ndim, sc->shape), want;
    if (s->scheme == KERN_FP8_PER_TENSOR) {
        if (have == 1 || have == e || have == (int64_t)s->n_weights)
            return REFIT_OK;
        return ERR(h, REFIT_EMISMATCH, "module %s: per-tensor runtime weight_scale holds %lld "
                   "scales; it takes 1, one per expert (%lld) or one per weight (%u)",
                   m->name, (long long)have, (long long)e, s->n_weights);
    }
    want = s->scheme == KERN_FP8_PER_CHANNEL
               ? e * n
               : e * ((n + KERN_FP8_BLOCK - 1) / KERN_FP8_BLOCK) *
                     ((k + KERN_FP8_BLOCK - 1) / KERN_FP8_BLOCK);
    if (have != want)
        return ERR(h, REFIT_EMISMATCH, "module %s: %s runtime weight_scale holds %lld scales, "
                   "the runtime weight needs %lld", m->name, scheme_name[s->scheme],
                   (long long)have, (long long)want);
    return REFIT_OK;
}

/* Block-128 fused weights start on 128-row blocks, so of each expert's
 * weights (the module's, unstacked) only one may be ragged: the last,
 * which post-load checks (quant_rows). */
static int check_ragged(const refit_host_v2 *h, const refit_fmt_module *m, const fp8_state *s)
{
    for (uint32_t i = 0; i < s->n_weights; i++) {
        int64_t e = refit_ckpt(m, s->weights[i])->expert;
        uint32_t ragged = s->exp_ragged[i];
        if (ragged > 1 && e >= 0)
            return ERR(h, REFIT_EMISMATCH, "module %s: %u fused weights of expert %lld are "
                       "not whole 128-row blocks; only the last shard of a fused block-128 "
                       "weight may be ragged", m->name, ragged, (long long)e);
        if (ragged > 1)
            return ERR(h, REFIT_EMISMATCH, "module %s: %u fused weights are not whole 128-row "
                       "blocks; only the last shard of a fused block-128 weight may be ragged",
                       m->name, ragged);
    }
    return REFIT_OK;
}

static int plan_online(const refit_host_v2 *h, refit_fmt_module *m, fp8_state *s,
                       int want_scheme, int64_t in_f, int64_t out_f)
{
    s->scheme = want_scheme >= 0 ? (kern_fp8_scheme)want_scheme : KERN_FP8_PER_TENSOR;
    int rc = arith_param(h, m, &s->arith);
    if (!rc)
        rc = check_online_runtime(h, m, s);
    if (!rc)
        rc = check_features(h, m, s, in_f, out_f);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < s->n_weights; i++) {
        refit_fmt_ckpt *w = refit_ckpt(m, s->weights[i]);
        if (w->target_index != s->rt_weight)
            return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: an online weight goes to runtime "
                       "weight, not %s", m->name, w->name, w->target);
        if (w->ndim != 2 || w->shape[1] != refit_runtime(m, s->rt_weight)->view.shape[
                                               refit_runtime(m, s->rt_weight)->view.ndim - 1])
            return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: an online weight is [N, K] "
                       "with the runtime weight's K (fused shards stack along N)", m->name,
                       w->name);
        w->route = REFIT_ROUTE_STAGED;
        /* per-tensor: one amax over the weight (or its slot): the whole
         * unit; otherwise a row, or a 128-row band, quantizes alone */
        if (s->scheme == KERN_FP8_PER_TENSOR)
            declare_group(m, w, 0, 0, REFIT_GROUP_WHOLE);
        else if (s->scheme == KERN_FP8_PER_CHANNEL)
            declare_group(m, w, 1, 0, REFIT_GROUP_ROW_SLICES);
        else
            declare_group(m, w, KERN_FP8_BLOCK, KERN_FP8_BLOCK, REFIT_GROUP_ROW_SLICES);
    }
    if (s->scheme == KERN_FP8_BLOCK128 && (rc = check_ragged(h, m, s)))
        return rc;
    return check_online_slots(h, m, s);
}

/* ---- plan ---- */

static int check_direct_target(const refit_host_v2 *h, const refit_fmt_module *m,
                               refit_fmt_ckpt *c, int e4m3)
{
    refit_dtype rt = refit_runtime(m, c->target_index)->view.dtype;
    if (e4m3 ? !is_e4m3(rt) : !kern_is_float_dtype(rt))
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: runtime %s is %s; format fp8 "
                   "puts it in a %s tensor", m->name, c->name, c->target, dt_name(rt),
                   e4m3 ? "f8_e4m3" : "f32/bf16/f16");
    /* scales: compressed-tensors writes them in the model's dtype (often
     * bf16), kernels mostly read f32; bf16/f16 -> f32 is exact */
    if (!e4m3 && (rt.code != c->dtype.code || rt.bits != c->dtype.bits))
        c->flags |= REFIT_CKPT_CAST;
    c->route = REFIT_ROUTE_DIRECT;
    return REFIT_OK;
}

/* Roles and dtypes of the checkpoint tensors; weights listed in s. */
static int classify(const refit_host_v2 *h, refit_fmt_module *m, fp8_state *s)
{
    int n_e4m3 = 0, n_float = 0;
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        refit_fmt_ckpt *c = refit_ckpt(m, i);
        int r = role_of(c->name);
        s->pair[i] = -1;
        if (r < 0)
            return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: format fp8 takes W.weight, "
                       "W.weight_scale, W.weight_scale_inv and W.input_scale", m->name, c->name);
        if (r == R_INPUT_SCALE && !kern_is_float_dtype(c->dtype))
            return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: input_scale is f32/bf16/f16, "
                       "not %s",
                       m->name, c->name, dt_name(c->dtype));
        if (r != R_WEIGHT)
            continue;
        int rc = e4m3_weight(h, m, c, "fp8", &n_e4m3, &n_float);
        if (rc)
            return rc;
        s->weights[s->n_weights++] = i;
    }
    int rc = e4m3_weights_done(h, m, "fp8", (int)s->n_weights, n_e4m3, n_float);
    if (rc)
        return rc;
    s->online = n_float > 0;
    return REFIT_OK;
}

/* Routes of the tensors that are not online weights, and orphan scales. */
static int route_rest(const refit_host_v2 *h, refit_fmt_module *m, const fp8_state *s)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        refit_fmt_ckpt *c = refit_ckpt(m, i);
        int r = role_of(c->name), rc = REFIT_OK;
        if (r == R_WEIGHT && !s->online)
            rc = check_direct_target(h, m, c, 1);
        else if (r == R_INPUT_SCALE)
            rc = check_direct_target(h, m, c, 0);
        else if (r == R_SCALE || r == R_SCALE_INV) {
            if (s->online)
                return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: an online module (bf16/f16/"
                           "f32 weights) computes its scales; it takes none from the checkpoint",
                           m->name, c->name);
            if (s->pair[i] < 0)
                return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: no %.*s.weight in the "
                           "module for this scale", m->name, c->name, (int)prefix_len(c->name),
                           c->name);
            rc = check_direct_target(h, m, c, 0);
        }
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

static int fp8_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    size_t bytes;
    if (__builtin_mul_overflow((size_t)m->n_ckpt,
                               sizeof(int64_t) + 2 * sizeof(uint32_t) + sizeof(int), &bytes) ||
        __builtin_add_overflow(bytes, sizeof(fp8_state), &bytes))
        return ERR(h, REFIT_ENOMEM, "module %s: too many checkpoint tensors", m->name);
    fp8_state *s = h->mem_alloc(h->host, bytes);
    if (!s)
        return ERR(h, REFIT_ENOMEM, "module %s: out of memory", m->name);
    memset(s, 0, sizeof *s);
    s->exp_rows = (int64_t *)(void *)(s + 1); /* 8-aligned: the struct holds pointers */
    s->weights = (uint32_t *)(s->exp_rows + m->n_ckpt);
    s->exp_ragged = s->weights + m->n_ckpt;
    s->pair = (int *)(s->exp_ragged + m->n_ckpt);
    s->rt_weight = find_runtime(m, "weight");
    s->rt_scale = -1;
    m->state = s; /* release frees it, also when plan fails */
    int want_scheme, online;
    int64_t in_f, out_f;
    int rc = scheme_param(h, m, &want_scheme);
    if (!rc)
        rc = bool_param(h, m, "online", &online);
    if (!rc)
        rc = int_param(h, m, "in_features", &in_f);
    if (!rc)
        rc = int_param(h, m, "out_features", &out_f);
    if (!rc)
        rc = classify(h, m, s);
    if (!rc)
        rc = expert_groups(h, m, s);
    if (!rc && online >= 0 && online != s->online)
        rc = ERR(h, REFIT_EMISMATCH, "module %s: param online is %s but the weights are %s",
                 m->name, online ? "true" : "false", s->online ? "bf16/f16/f32" : "f8_e4m3");
    if (!rc)
        rc = s->online ? plan_online(h, m, s, want_scheme, in_f, out_f)
                       : plan_serialized(h, m, s, want_scheme, in_f, out_f);
    if (!rc)
        rc = route_rest(h, m, s);
    /* post_load reads its staged weights only: they may be the caller's */
    m->flags = REFIT_MODULE_WHOLE |
               (s->online ? REFIT_MODULE_POST_LOAD | REFIT_MODULE_STAGED_IN_PLACE : 0);
    /* an expert's weights, scale rows and amax are its own, but for one
     * per-tensor scale over the whole stack */
    if (!rc && s->online && (s->scheme != KERN_FP8_PER_TENSOR ||
                             numel(refit_runtime(m, s->rt_scale)->view.ndim,
                                   refit_runtime(m, s->rt_scale)->view.shape) > 1))
        m->flags |= REFIT_MODULE_EXPERT_SLICES;
    return rc;
}

static void fp8_release(const refit_host_v2 *h, refit_fmt_module *m)
{
    h->mem_free(h->host, m->state);
    m->state = NULL;
}

/* ---- post-load (online) ---- */

/* Per-tensor: one scale per slot (per weight, per expert, or one), the
 * amax taken over every weight of the slot. sh is sorted. */
static int quant_per_tensor(const refit_host_v2 *h, const refit_fmt_module *m,
                            const fp8_state *s, const shard *sh)
{
    const refit_view *sv = &refit_runtime(m, s->rt_scale)->view;
    int64_t slots = numel(sv->ndim, sv->shape);
    float *scale = sv->data;
    for (uint32_t g0 = 0, g1; g0 < s->n_weights; g0 = g1) {
        int64_t slot = slots == (int64_t)s->n_weights ? g0 : slots == 1 ? 0 : sh[g0].e;
        for (g1 = g0 + 1; g1 < s->n_weights; g1++)
            if ((slots == (int64_t)s->n_weights) || (slots != 1 && sh[g1].e != sh[g0].e))
                break;
        float amax = 0.0f;
        for (uint32_t i = g0; i < g1; i++) {
            const refit_view *x = &refit_ckpt(m, sh[i].ck)->staged;
            float a = kern_amax_f32(x, 0, x->shape[0], 0, x->shape[1]);
            if (a < 0.0f)
                return corrupt(h, m, sh[i].ck);
            amax = a > amax ? a : amax;
        }
        scale[slot] = kern_fp8_scale(amax);
        for (uint32_t i = g0; i < g1; i++) {
            const refit_fmt_ckpt *c = refit_ckpt(m, sh[i].ck);
            kern_fp8_encode_tile_arith(&c->place, &c->staged, scale[slot], s->arith, 0,
                                       c->staged.shape[0], 0, c->staged.shape[1]);
        }
    }
    return REFIT_OK;
}

/* Per-channel and block-128: each weight's scales are rows of the runtime
 * scale grid at its own row offset. */
static int quant_rows(const refit_host_v2 *h, const refit_fmt_module *m, const fp8_state *s,
                      const shard *sh)
{
    const refit_view *rt = &refit_runtime(m, s->rt_weight)->view;
    int64_t n = rt->shape[rt->ndim - 2], k = rt->shape[rt->ndim - 1];
    int64_t bn = (n + KERN_FP8_BLOCK - 1) / KERN_FP8_BLOCK, bk = (k + KERN_FP8_BLOCK - 1) /
                                                                  KERN_FP8_BLOCK;
    int block = s->scheme == KERN_FP8_BLOCK128;
    for (uint32_t i = 0; i < s->n_weights; i++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, sh[i].ck);
        if (block && sh[i].row % KERN_FP8_BLOCK)
            return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: lands at row %lld of runtime "
                       "weight, inside a 128-row block; fused block-128 weights start on block "
                       "boundaries", m->name, c->name, (long long)sh[i].row);
        refit_view sv = {.device = rt->device, .dtype = REFIT_F32, .ndim = 2};
        int64_t first = block ? (sh[i].e * bn + sh[i].row / KERN_FP8_BLOCK) * bk
                              : sh[i].e * n + sh[i].row;
        sv.data = (float *)refit_runtime(m, s->rt_scale)->view.data + first;
        kern_fp8_scale_shape(s->scheme, c->staged.shape[0], k, sv.shape);
        sv.strides[0] = block ? bk : 1;
        sv.strides[1] = 1;
        int rc = kern_quant_fp8_arith(&c->place, &sv, &c->staged, s->scheme, s->arith);
        if (rc == REFIT_ECORRUPT)
            return corrupt(h, m, sh[i].ck);
        if (rc)
            return ERR(h, rc, "module %s, tensor %s: quantization refused the views (%d)",
                       m->name, c->name, rc);
    }
    return REFIT_OK;
}

/* The launcher over pieces of one or more modules on one device, through
 * the host's GPU service: one status word names the module (mods[i]) and
 * weight (names[i]) of a bad piece. */
static int quant_launch(const refit_host_v2 *h, uint32_t nw, const refit_fmt_module *const *mods,
                        const refit_view *q, const refit_view *sc, const refit_view *x,
                        const char *const *names, int scheme, kern_fp8_arith arith,
                        void *stream)
{
    refit_device dev = q[0].device;
#ifdef REFIT_FP8_DEVICE_CODE
    int one = 1;
    for (uint32_t i = 1; i < nw; i++)
        one = one && mods[i] == mods[0];
    int hw = fp8_cvt_host(h, mods[0], dev, stream, nw, names, nan_what);
    refit_pgpu_host g;
    int rc = one ? refit_pgpu_host_init(&g, h, mods[0], dev, stream, fp8_image, fp8_image_size,
                                        nw, names, nan_what)
                 : refit_pgpu_host_init_many(&g, h, dev, stream, fp8_image, fp8_image_size, nw,
                                             mods, names, nan_what);
    int32_t bad = -1;
    int flags = (hw ? QF_HW : 0) | (arith == KERN_FP8_RECIPROCAL ? QF_RECIP : 0);
    if (!rc && (rc = fp8_launch(&g.g, nw, q, sc, x, scheme, flags, &bad)) && g.g.msg[0])
        return ERR(h, rc, "module %s%s%s: %s", mods[bad >= 0 ? bad : 0]->name,
                   bad >= 0 ? ", tensor " : "", bad >= 0 ? names[bad] : "", g.g.msg);
    return rc;
#else
    (void)nw, (void)sc, (void)x, (void)names, (void)scheme, (void)arith, (void)stream;
    return ERR(h, REFIT_EUNSUPPORTED, "module %s: fp8 was built without its device code "
               "(no nvcc), so it cannot run on device type %d", mods[0]->name, dev.device_type);
#endif
}

/* The launcher's arrays for n pieces. */
typedef struct pieces {
    uint32_t n;
    refit_view *q, *sc, *x;
    const char **names;
    const refit_fmt_module **mods;
} pieces;

static int pieces_alloc(const refit_host_v2 *h, pieces *p, uint32_t cap)
{
    size_t n = cap ? cap : 1;
    p->n = 0;
    p->q = h->mem_alloc(h->host, (sizeof *p->q * 3 + sizeof(char *) + sizeof(void *)) * n);
    if (!p->q)
        return REFIT_ENOMEM;
    p->sc = p->q + n;
    p->x = p->q + 2 * n;
    p->names = (const char **)(void *)(p->q + 3 * n);
    p->mods = (const refit_fmt_module **)(void *)(p->names + n);
    return REFIT_OK;
}

/* Module m's weights (sh: where each landed, in row order) appended to p.
 * Per-tensor weights of one slot get the same one-element scale view: the
 * launcher takes their amax together. */
static int device_pieces(const refit_host_v2 *h, const refit_fmt_module *m, const fp8_state *s,
                         const shard *sh, pieces *p)
{
    const refit_view *rt = &refit_runtime(m, s->rt_weight)->view, *sv = &refit_runtime(m, s->rt_scale)->view;
    uint32_t nw = s->n_weights;
    int64_t n = rt->shape[rt->ndim - 2], k = rt->shape[rt->ndim - 1];
    int64_t bn = (n + KERN_FP8_BLOCK - 1) / KERN_FP8_BLOCK, bk = (k + KERN_FP8_BLOCK - 1) /
                                                                  KERN_FP8_BLOCK;
    int64_t slots = numel(sv->ndim, sv->shape);
    int block = s->scheme == KERN_FP8_BLOCK128;
    for (uint32_t i = 0; i < nw; i++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, sh[i].ck);
        uint32_t at = p->n++;
        refit_view *sc = &p->sc[at];
        p->q[at] = c->place;
        p->x[at] = c->staged;
        p->names[at] = c->name;
        p->mods[at] = m;
        memset(sc, 0, sizeof *sc);
        sc->device = sv->device;
        sc->dtype = sv->dtype;
        sc->ndim = 2;
        sc->strides[1] = 1;
        if (s->scheme == KERN_FP8_PER_TENSOR) {
            /* one slot per weight, per expert, or one (see quant_per_tensor) */
            int64_t slot = slots == (int64_t)nw ? i : slots == 1 ? 0 : sh[i].e;
            sc->data = (float *)sv->data + slot;
            sc->shape[0] = sc->shape[1] = 1;
            sc->strides[0] = 1;
            continue;
        }
        if (block && sh[i].row % KERN_FP8_BLOCK)
            return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: lands at row %lld of runtime "
                       "weight, inside a 128-row block; fused block-128 weights start on block "
                       "boundaries", m->name, c->name, (long long)sh[i].row);
        int64_t first = block ? (sh[i].e * bn + sh[i].row / KERN_FP8_BLOCK) * bk
                              : sh[i].e * n + sh[i].row;
        sc->data = (float *)sv->data + first;
        kern_fp8_scale_shape(s->scheme, c->staged.shape[0], k, sc->shape);
        sc->strides[0] = block ? bk : 1;
    }
    return REFIT_OK;
}

/* Where each weight of online module m landed, in row order (memory from
 * host->mem_alloc, freed by the caller), or NULL with the error set. */
static shard *module_shards(const refit_host_v2 *h, const refit_fmt_module *m,
                            const fp8_state *s, int *rc)
{
    shard *sh = h->mem_alloc(h->host, sizeof *sh * (s->n_weights ? s->n_weights : 1));
    *rc = sh ? REFIT_OK : ERR(h, REFIT_ENOMEM, "module %s: out of memory", m->name);
    for (uint32_t i = 0; i < s->n_weights && !*rc; i++)
        *rc = locate(h, m, s->rt_weight, s->weights[i], &sh[i]);
    if (*rc) {
        h->mem_free(h->host, sh);
        return NULL;
    }
    qsort(sh, s->n_weights, sizeof *sh, shard_cmp);
    return sh;
}

static int on_device(const fp8_state *s, const refit_fmt_module *m)
{
    return s && s->online && !host_memory(refit_runtime(m, s->rt_weight)->view.device);
}

/* The online modules of mods[0 .. n) on the device and of the scheme and
 * arithmetic of mods[lead], all in one call of the launcher; done[] marks
 * them. */
static int quant_device_group(const refit_host_v2 *h, const refit_fmt_module *const *mods,
                              uint32_t n, uint32_t lead, unsigned char *done, void *stream,
                              void *arg)
{
    (void)arg;
    const fp8_state *ls = mods[lead]->state;
    refit_device dev = refit_runtime(mods[lead], ls->rt_weight)->view.device;
    uint32_t cap = 0;
    for (uint32_t k = lead; k < n; k++) {
        const fp8_state *s = mods[k]->state;
        refit_device d = on_device(s, mods[k]) ? refit_runtime(mods[k], s->rt_weight)->view.device
                                               : (refit_device){-1, -1};
        if (!done[k] && d.device_type == dev.device_type && d.device_id == dev.device_id &&
            s->scheme == ls->scheme && s->arith == ls->arith) {
            done[k] = 2; /* this group's */
            cap += s->n_weights;
        }
    }
    pieces p;
    int rc = pieces_alloc(h, &p, cap);
    if (rc)
        return ERR(h, rc, "module %s: out of memory", mods[lead]->name);
    for (uint32_t k = lead; k < n && !rc; k++) {
        if (done[k] != 2)
            continue;
        done[k] = 1;
        shard *sh = module_shards(h, mods[k], mods[k]->state, &rc);
        if (sh)
            rc = device_pieces(h, mods[k], mods[k]->state, sh, &p);
        h->mem_free(h->host, sh);
    }
    if (!rc && p.n)
        rc = quant_launch(h, p.n, p.mods, p.q, p.sc, p.x, p.names, (int)ls->scheme, ls->arith,
                          stream);
    h->mem_free(h->host, p.q);
    return rc;
}

/* On host memory: the reference kernels linked here (done on return). */
static int quant_host(const refit_host_v2 *h, const refit_fmt_module *m, void *stream, void *arg)
{
    (void)stream, (void)arg;
    const fp8_state *s = m->state;
    int rc;
    shard *sh = module_shards(h, m, s, &rc);
    if (!sh)
        return rc;
    rc = s->scheme == KERN_FP8_PER_TENSOR ? quant_per_tensor(h, m, s, sh)
                                          : quant_rows(h, m, s, sh);
    h->mem_free(h->host, sh);
    return rc;
}

/* Online modules only: on a device, a group of each (device, scheme,
 * arithmetic). */
static int fp8_where(const refit_fmt_module *m, void *arg)
{
    (void)arg;
    const fp8_state *s = m->state;
    if (!s || !s->online)
        return REFIT_SDK_GROUP_SKIP;
    return on_device(s, m) ? REFIT_SDK_GROUP_LEAD : REFIT_SDK_GROUP_ONE;
}

static const refit_sdk_group_ops fp8_groups = {fp8_where, quant_device_group, quant_host};

/* Modules in call order; on a device, one launcher call for each (device,
 * scheme, arithmetic) among them (the device code is checked at seal). A bad module
 * on host memory stops the call (REFIT_ECORRUPT, its message). */
static int fp8_post_load_many(const refit_host_v2 *h, const refit_fmt_module *const *mods,
                              uint32_t n, void *stream)
{
    return refit_sdk_post_load_groups(h, mods, n, stream, &fp8_groups, NULL);
}

static int fp8_post_load(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    return fp8_post_load_many(h, &m, 1, stream);
}

REFIT_PLUGIN_EXPORT const refit_format_v2 refit_format_plugin_v2 = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "fp8",
    .plan = fp8_plan,
    .post_load = fp8_post_load,
    .release = fp8_release,
#ifdef REFIT_PLUGIN_MIN_CC /* device code built: none of it below this */
    .min_compute_capability = REFIT_PLUGIN_MIN_CC,
#endif
    .post_load_many = fp8_post_load_many,
};
