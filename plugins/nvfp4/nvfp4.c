/* Format "nvfp4": E2M1 weights packed two per byte, E4M3 scales per block
 * of 16 along K, and an FP32 per-tensor factor, in either public
 * convention (told apart by the checkpoint names):
 *
 *   ModelOpt                      compressed-tensors
 *   W.weight        U8 [N, K/2]   W.weight_packed        U8 [N, K/2]
 *   W.weight_scale  E4M3 [N, K/16]  W.weight_scale       E4M3 [N, K/16]
 *   W.weight_scale_2  F32 (x)     W.weight_global_scale  F32 [1] (/)
 *   W.input_scale     F32 (x)     W.input_global_scale   F32 [1] (/)
 *
 * A ModelOpt factor multiplies (w = fp4 * scale * weight_scale_2), a
 * compressed-tensors one divides (w = fp4 * scale / weight_global_scale).
 *
 * Runtime tensors (names in the module):
 *   weight           U8 [N, K/2]          DIRECT: the checkpoint bytes
 *   weight_scale     U8/E4M3 [Np, Sp]     (or [Np * Sp]) the block scales in
 *                    the 128x4 swizzled layout of CUTLASS/FlashInfer
 *                    block-scaled GEMMs, Np = ceil(N/128)*128,
 *                    Sp = ceil((K/16)/4)*4, pad zero
 *   alpha            F32 [1]   the GEMM's output factor: ModelOpt
 *                    input_scale * weight_scale_2, compressed-tensors
 *                    1 / (input_global_scale * weight_global_scale); without
 *                    an input scale, the weight factor alone
 *   input_scale_inv  F32 [1]   optional: what activations are multiplied by
 *                    before FP4 quantization (1 / input_scale, or
 *                    input_global_scale)
 * Scales and factors are STAGED: post-load builds weight_scale, alpha and
 * input_scale_inv from the staged checkpoint values only, so a reload of
 * the same checkpoint writes the same bytes and nothing is fused twice.
 *
 * Online: a module whose one checkpoint tensor is an F32/F16/BF16
 * W.weight [N, K] stages it and quantizes it at post-load into the same
 * runtime tensors (weight [N, ceil(K/2)], weight_scale swizzled with
 * ceil(K/16) blocks, alpha = 1 / global scale), compressed-tensors NVFP4
 * with round to nearest (plugins/nvfp4/quant_nvfp4.h has the arithmetic). The
 * global scale comes from this rank's slice; blocks start at its first
 * column. input_scale_inv has no source then and is refused.
 *
 * Post-load: the CPU references on host memory; on a CUDA device this
 * plugin's own kernel (quant_nvfp4.cu, embedded as nvfp4_image by
 * refit-embed), planned by nvfp4_launch.c and launched through the host's
 * GPU service, the same bytes: post_load_many gives every module of a
 * loading call on one device to one launcher call (a piece a module,
 * online and checkpoint together). It never waits: a NaN lowers the
 * call's status word (status_word_many), which the host reads at finalize
 * (the update then rolls back naming the module and tensor). Post-load
 * only reads its staged views, so plan sets STAGED_IN_PLACE. A plugin
 * built without nvcc runs on host memory only (seal refuses device
 * runtime tensors then).
 *
 * Params: in_features (unsharded K; needed only when K is not a multiple
 * of 16), online (bool, optional: asserts the weight's dtype). A K shard
 * must start on a block. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <refit/format.h>

#include "kernels/copy.h"
#include "plugins/fp8/quant_fp8.h"
#include "plugins/int4/quant_int4.h"
#include <refit/sdk/group.h>
#include <refit/sdk/pgpu_host.h>
#include "plugins/nvfp4/nvfp4_launch.h"
#include "plugins/nvfp4/quant_nvfp4.h"

#ifdef REFIT_NVFP4_DEVICE_CODE
extern const unsigned char nvfp4_image[];
extern const size_t nvfp4_image_size;
#endif

#ifndef REFIT_PLUGIN_EXPORT
#define REFIT_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

#define ERR(h, st, ...) (h)->error((h)->host, (st), __VA_ARGS__)

enum { R_WEIGHT, R_SCALE, R_WGLOBAL, R_INPUT, R_COUNT };
enum { RT_WEIGHT, RT_SCALE, RT_ALPHA, RT_INV, RT_COUNT };
static const char *const rt_name[RT_COUNT] = {"weight", "weight_scale", "alpha",
                                              "input_scale_inv"};
enum { CONV_NONE, CONV_MODELOPT, CONV_CT };

/* Checkpoint suffixes, with the convention each implies. */
static const struct {
    const char *suffix;
    int role, conv;
} roles[] = {
    {"weight", R_WEIGHT, CONV_NONE},
    {"weight_packed", R_WEIGHT, CONV_NONE},
    {"weight_scale", R_SCALE, CONV_NONE},
    {"weight_scale_2", R_WGLOBAL, CONV_MODELOPT},
    {"input_scale", R_INPUT, CONV_MODELOPT},
    {"weight_global_scale", R_WGLOBAL, CONV_CT},
    {"input_global_scale", R_INPUT, CONV_CT},
};

typedef struct nvfp4_state {
    int ck[R_COUNT];
    int rt[RT_COUNT];
    int conv;
    int online;               /* the weight is F32/F16/BF16, quantized at post-load */
    int64_t n, bytes, blocks;
} nvfp4_state;

/* Dtype names for messages (refit_dtype_name is a core symbol; a plugin
 * links none). */
static const char *dt_name(refit_dtype d)
{
    static const struct {
        uint8_t code, bits;
        const char *name;
    } names[] = {
        {REFIT_DTYPE_FLOAT, 32, "f32"},         {REFIT_DTYPE_FLOAT, 16, "f16"},
        {REFIT_DTYPE_BFLOAT, 16, "bf16"},       {REFIT_DTYPE_INT, 32, "i32"},
        {REFIT_DTYPE_INT, 64, "i64"},           {REFIT_DTYPE_UINT, 8, "u8"},
        {REFIT_DTYPE_FLOAT8_E4M3FN, 8, "f8_e4m3"}, {REFIT_DTYPE_FLOAT8_E8M0FNU, 8, "f8_e8m0"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (d.code == names[i].code && d.bits == names[i].bits)
            return names[i].name;
    return "?";
}

static const char *suffix(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

static int is_dtype(refit_dtype d, uint8_t code, uint8_t bits)
{
    return d.code == code && d.bits == bits && d.lanes == 1;
}

static int is_byte(refit_dtype d)
{
    return d.lanes == 1 && d.bits == 8 &&
           (d.code == REFIT_DTYPE_UINT || d.code == REFIT_DTYPE_FLOAT8_E4M3FN);
}

static int64_t numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

static int classify(const refit_host_v2 *h, const refit_fmt_module *m, nvfp4_state *s,
                    uint32_t i)
{
    const char *suf = suffix(refit_ckpt(m, i)->name);
    size_t r = 0;
    while (r < sizeof roles / sizeof roles[0] && strcmp(suf, roles[r].suffix))
        r++;
    if (r == sizeof roles / sizeof roles[0])
        return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: format nvfp4 does not know this "
                   "tensor (ModelOpt: weight, weight_scale, weight_scale_2, input_scale; "
                   "compressed-tensors: weight_packed, weight_scale, weight_global_scale, "
                   "input_global_scale)", m->name, refit_ckpt(m, i)->name);
    if (roles[r].conv != CONV_NONE) {
        if (s->conv != CONV_NONE && s->conv != roles[r].conv)
            return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: mixes ModelOpt and "
                       "compressed-tensors scale names", m->name, refit_ckpt(m, i)->name);
        s->conv = roles[r].conv;
    }
    int role = roles[r].role;
    if (s->ck[role] >= 0)
        return ERR(h, REFIT_EFORMAT, "module %s: tensors %s and %s play the same part; one "
                   "nvfp4 weight per module (fused targets need the core to pass the offset "
                   "of each part to formats)", m->name, refit_ckpt(m, s->ck[role])->name,
                   refit_ckpt(m, i)->name);
    s->ck[role] = (int)i;
    return REFIT_OK;
}

static int find_roles(const refit_host_v2 *h, const refit_fmt_module *m, nvfp4_state *s)
{
    for (int r = 0; r < R_COUNT; r++)
        s->ck[r] = -1;
    for (int r = 0; r < RT_COUNT; r++)
        s->rt[r] = -1;
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        int rc = classify(h, m, s, i);
        if (rc)
            return rc;
    }
    for (uint32_t i = 0; i < m->n_runtime; i++)
        for (int r = 0; r < RT_COUNT; r++)
            if (!strcmp(refit_runtime(m, i)->name, rt_name[r]))
                s->rt[r] = (int)i;
    s->online = s->ck[R_WEIGHT] >= 0 && kern_is_float_dtype(refit_ckpt(m, s->ck[R_WEIGHT])->dtype);
    if (s->online) {
        for (int r = R_SCALE; r < R_COUNT; r++)
            if (s->ck[r] >= 0)
                return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: an online module (f32/f16/"
                           "bf16 weight) computes its scales; it takes none from the checkpoint",
                           m->name, refit_ckpt(m, s->ck[r])->name);
        if (s->rt[RT_INV] >= 0)
            return ERR(h, REFIT_EFORMAT, "module %s: runtime input_scale_inv has no source in "
                       "an online module (no input scale); unbind it", m->name);
    } else if (s->ck[R_WEIGHT] < 0 || s->ck[R_SCALE] < 0 || s->ck[R_WGLOBAL] < 0)
        return ERR(h, REFIT_EFORMAT, "module %s: format nvfp4 needs the packed weight, "
                   "W.weight_scale and W.weight_scale_2 or W.weight_global_scale (or one "
                   "f32/f16/bf16 W.weight, quantized online)", m->name);
    for (int r = RT_WEIGHT; r <= RT_ALPHA; r++)
        if (s->rt[r] < 0)
            return ERR(h, REFIT_EFORMAT, "module %s: format nvfp4 needs a runtime tensor "
                       "named %s", m->name, rt_name[r]);
    if (s->rt[RT_INV] >= 0 && s->ck[R_INPUT] < 0)
        return ERR(h, REFIT_EFORMAT, "module %s: runtime input_scale_inv needs an input scale "
                   "in the checkpoint (W.input_scale or W.input_global_scale)", m->name);
    return REFIT_OK;
}

static int param_int(const refit_host_v2 *h, const refit_fmt_module *m, const char *key,
                     int64_t *out)
{
    const char *v = h->param(h->host, m, key);
    char *end = NULL;
    *out = v ? strtoll(v, &end, 10) : 0;
    if (v && (end == v || *end || *out < 0))
        return ERR(h, REFIT_EINVAL, "module %s: param %s: '%s' is not a count", m->name, key, v);
    return REFIT_OK;
}

/* -1 absent, 0 false, 1 true. */
static int param_bool(const refit_host_v2 *h, const refit_fmt_module *m, const char *key,
                      int *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    const char *v = h->param(h->host, m, key);
    *out = -1;
    for (int i = 0; v && i < 4; i++) {
        if (!strcasecmp(v, yes[i]))
            *out = 1;
        if (!strcasecmp(v, no[i]))
            *out = 0;
    }
    if (v && *out < 0)
        return ERR(h, REFIT_EINVAL, "module %s: param %s must be true or false, not '%s'",
                   m->name, key, v);
    return REFIT_OK;
}

static int check_scalar(const refit_host_v2 *h, const refit_fmt_module *m, int idx)
{
    const refit_fmt_ckpt *c = refit_ckpt(m, idx);
    if (!is_dtype(c->dtype, REFIT_DTYPE_FLOAT, 32) || numel(c->ndim, c->shape) != 1)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: expected one F32 value, got %s "
                   "with %lld elements", m->name, c->name, dt_name(c->dtype),
                   (long long)numel(c->ndim, c->shape));
    return REFIT_OK;
}

/* The packed weight and its scales must describe the same rows and the
 * same K range: 2 elements a byte, 16 a block. */
/* An online weight: 2-D float [N, K]; its blocks start at its first column
 * (a K shard therefore keeps its own blocks; see the header). */
static int check_online(const refit_host_v2 *h, const refit_fmt_module *m, nvfp4_state *s)
{
    const refit_fmt_ckpt *w = refit_ckpt(m, s->ck[R_WEIGHT]);
    if (w->ndim != 2)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: an online weight is 2-D [N, K], "
                   "not %d-D (stacked experts are not supported)", m->name, w->name, w->ndim);
    s->n = w->shape[0];
    s->bytes = (w->shape[1] + 1) / 2;
    s->blocks = (w->shape[1] + KERN_NVFP4_BLOCK - 1) / KERN_NVFP4_BLOCK;
    return REFIT_OK;
}

static int check_ckpt(const refit_host_v2 *h, const refit_fmt_module *m, nvfp4_state *s)
{
    int online;
    int rc = param_bool(h, m, "online", &online);
    if (rc)
        return rc;
    if (online >= 0 && online != s->online)
        return ERR(h, REFIT_EMISMATCH, "module %s: param online is %s but the weight %s is %s",
                   m->name, online ? "true" : "false", refit_ckpt(m, s->ck[R_WEIGHT])->name,
                   dt_name(refit_ckpt(m, s->ck[R_WEIGHT])->dtype));
    if (s->online)
        return check_online(h, m, s);
    const refit_fmt_ckpt *w = refit_ckpt(m, s->ck[R_WEIGHT]), *sc = refit_ckpt(m, s->ck[R_SCALE]);
    if (!is_dtype(w->dtype, REFIT_DTYPE_UINT, 8) || w->ndim != 2)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: expected U8 [N, K/2], got %s with "
                   "%d dims (stacked experts are not supported)", m->name, w->name,
                   dt_name(w->dtype), w->ndim);
    if (!is_byte(sc->dtype) || sc->ndim != 2 || sc->shape[0] != w->shape[0])
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: expected F8_E4M3 [%lld, K/16]",
                   m->name, sc->name, (long long)w->shape[0]);
    s->n = w->shape[0];
    s->bytes = w->shape[1];
    s->blocks = sc->shape[1];
    if (s->n > INT64_MAX / 4 || s->blocks > INT64_MAX / 4)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: extents too large", m->name,
                   w->name);
    int64_t k = 0;
    rc = param_int(h, m, "in_features", &k);
    if (rc)
        return rc;
    kern_q4_split sp = kern_q4_split_check(s->bytes, 2, s->blocks, KERN_NVFP4_BLOCK, k);
    if (sp == KERN_Q4_SPLIT_RAGGED)
        return ERR(h, REFIT_EMISMATCH, "module %s: %lld bytes of K against %lld blocks of 16: K "
                   "is not a whole number of blocks; declare param in_features so that a ragged "
                   "last block can be told from a shard boundary", m->name,
                   (long long)s->bytes, (long long)s->blocks);
    if (sp)
        return ERR(h, REFIT_EMISMATCH, "module %s: %lld bytes of K against %lld blocks of 16%s: "
                   "a shard boundary cuts a block, or the shapes disagree", m->name,
                   (long long)s->bytes, (long long)s->blocks, k ? " and in_features" : "");
    rc = check_scalar(h, m, s->ck[R_WGLOBAL]);
    if (!rc && s->ck[R_INPUT] >= 0)
        rc = check_scalar(h, m, s->ck[R_INPUT]);
    return rc;
}

static int on_host(const refit_view *v)
{
    return v->device.device_type == REFIT_DEVICE_CPU ||
           v->device.device_type == REFIT_DEVICE_CUDA_HOST;
}

static int contiguous(const refit_view *v)
{
    int64_t want = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[i] != 1 && v->strides[i] != want)
            return 0;
        want *= v->shape[i];
    }
    return 1;
}

/* 1 when post-load can run on dev: a CUDA device the host serves, and
 * this plugin carries its device code. */
static int device_service(const refit_host_v2 *h, refit_device dev)
{
#ifdef REFIT_NVFP4_DEVICE_CODE
    return dev.device_type == REFIT_DEVICE_CUDA && refit_host_serves(h, dev);
#else
    (void)h;
    (void)dev;
    return 0;
#endif
}

/* Host memory, or every runtime tensor on one device the service serves. */
static int check_placement(const refit_host_v2 *h, const refit_fmt_module *m)
{
    int all_host = 1;
    for (uint32_t i = 0; i < m->n_runtime; i++)
        all_host &= on_host(&refit_runtime(m, i)->view);
    if (all_host)
        return REFIT_OK;
    refit_device d = refit_runtime(m, 0)->view.device;
    for (uint32_t i = 1; i < m->n_runtime; i++) {
        refit_device e = refit_runtime(m, i)->view.device;
        if (e.device_type != d.device_type || e.device_id != d.device_id)
            return ERR(h, REFIT_EUNSUPPORTED, "module %s: runtime %s and %s are on different "
                       "devices; nvfp4's post-load writes them in one place", m->name,
                       refit_runtime(m, 0)->name, refit_runtime(m, i)->name);
    }
    if (!device_service(h, d))
        return ERR(h, REFIT_EUNSUPPORTED, "module %s: nvfp4's post-load on device type %d needs "
                   "a CUDA device the host serves and this plugin's device code; %s", m->name,
                   d.device_type,
#ifdef REFIT_NVFP4_DEVICE_CODE
                   "the host serves no such device"
#else
                   "this plugin was built without nvcc"
#endif
                   );
    return REFIT_OK;
}

static int check_runtime(const refit_host_v2 *h, const refit_fmt_module *m,
                         const nvfp4_state *s)
{
    const refit_view *w = &refit_runtime(m, s->rt[RT_WEIGHT])->view;
    const refit_view *sc = &refit_runtime(m, s->rt[RT_SCALE])->view;
    int64_t rp = kern_swizzle_rows(s->n), cp = kern_swizzle_cols(s->blocks);
    if (!is_dtype(w->dtype, REFIT_DTYPE_UINT, 8) || w->ndim != 2 || w->shape[0] != s->n ||
        w->shape[1] != s->bytes)
        return ERR(h, REFIT_EMISMATCH, "module %s: runtime weight must be U8 [%lld, %lld]",
                   m->name, (long long)s->n, (long long)s->bytes);
    int shape_ok = (sc->ndim == 2 && sc->shape[0] == rp && sc->shape[1] == cp) ||
                   (sc->ndim == 1 && sc->shape[0] == rp * cp);
    if (!is_byte(sc->dtype) || !shape_ok || !contiguous(sc))
        return ERR(h, REFIT_EMISMATCH, "module %s: runtime weight_scale must be a contiguous "
                   "U8/F8_E4M3 [%lld, %lld] (rows padded to 128, blocks to 4: the swizzled "
                   "layout)", m->name, (long long)rp, (long long)cp);
    for (int r = RT_ALPHA; r <= RT_INV; r++) {
        if (s->rt[r] < 0)
            continue;
        const refit_view *v = &refit_runtime(m, s->rt[r])->view;
        if (!is_dtype(v->dtype, REFIT_DTYPE_FLOAT, 32) || numel(v->ndim, v->shape) != 1)
            return ERR(h, REFIT_EMISMATCH, "module %s: runtime %s must be one F32 value",
                       m->name, rt_name[r]);
    }
    return check_placement(h, m);
}

static int nvfp4_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    nvfp4_state s;
    memset(&s, 0, sizeof s);
    int rc = find_roles(h, m, &s);
    if (!rc)
        rc = check_ckpt(h, m, &s);
    if (!rc)
        rc = check_runtime(h, m, &s);
    if (rc)
        return rc;
    refit_fmt_ckpt *w = refit_ckpt(m, s.ck[R_WEIGHT]);
    if (w->target_index != s.rt[RT_WEIGHT])
        return ERR(h, REFIT_EINVAL, "module %s, tensor %s: its target must be runtime weight",
                   m->name, w->name);
    for (uint32_t i = 0; i < m->n_ckpt; i++)
        refit_ckpt(m, i)->route = REFIT_ROUTE_STAGED;
    if (!s.online)
        w->route = REFIT_ROUTE_DIRECT;
    /* E4M3 scales per 16 elements of a row under one global scale from the
     * tensor's amax: any change rebuilds the tensor */
    else if (REFIT_ELEM_HAS(m->ckpt_stride, refit_fmt_ckpt, group))
        w->group = (refit_quant_group){1, 16, REFIT_GROUP_DECLARED | REFIT_GROUP_WHOLE};
    /* post-load only reads its staged views (the references and the
     * kernel alike): they may be the caller's bytes */
    m->flags = REFIT_MODULE_WHOLE | REFIT_MODULE_POST_LOAD | REFIT_MODULE_STAGED_IN_PLACE;
    nvfp4_state *keep = h->mem_alloc(h->host, sizeof *keep);
    if (!keep)
        return ERR(h, REFIT_ENOMEM, "module %s: out of memory", m->name);
    *keep = s;
    m->state = keep;
    return REFIT_OK;
}

static void nvfp4_release(const refit_host_v2 *h, refit_fmt_module *m)
{
    h->mem_free(h->host, m->state);
    m->state = NULL;
}

static float staged_f32(const refit_fmt_module *m, int idx)
{
    float f;
    memcpy(&f, refit_ckpt(m, idx)->staged.data, sizeof f);
    return f;
}

static void store_f32(const refit_view *v, float f)
{
    memcpy(v->data, &f, sizeof f);
}

/* alpha and input_scale_inv from the staged factors, with the operations
 * (and their order) the engines use, so the bits match theirs. A factor
 * that makes either non-finite (NaN, infinity, a zero divisor) is refused
 * before anything is written. */
static int fuse_factors(const refit_host_v2 *h, const refit_fmt_module *m, const nvfp4_state *s)
{
    float in = s->ck[R_INPUT] >= 0 ? staged_f32(m, s->ck[R_INPUT]) : 0.0f;
    float alpha, inv = 0.0f;
    kern_nvfp4_fuse(s->conv == CONV_CT ? KERN_NVFP4_CT : KERN_NVFP4_MODELOPT,
                    staged_f32(m, s->ck[R_WGLOBAL]), s->ck[R_INPUT] >= 0 ? &in : NULL, &alpha,
                    &inv);
    if (!isfinite(alpha) || (s->ck[R_INPUT] >= 0 && !isfinite(inv)))
        return ERR(h, REFIT_ECORRUPT, "module %s, tensor %s%s%s: the global factor%s give%s "
                   "alpha %g, input_scale_inv %g; refusing a NaN, infinity or zero factor",
                   m->name, refit_ckpt(m, s->ck[R_WGLOBAL])->name,
                   s->ck[R_INPUT] >= 0 ? " and " : "",
                   s->ck[R_INPUT] >= 0 ? refit_ckpt(m, s->ck[R_INPUT])->name : "",
                   s->ck[R_INPUT] >= 0 ? "s" : "", s->ck[R_INPUT] >= 0 ? "" : "s",
                   (double)alpha, (double)inv);
    store_f32(&refit_runtime(m, s->rt[RT_ALPHA])->view, alpha);
    if (s->rt[RT_INV] >= 0)
        store_f32(&refit_runtime(m, s->rt[RT_INV])->view, inv);
    return REFIT_OK;
}

/* The first E4M3 NaN (S.1111.111) among the staged block scales, or -1. */
static int64_t scale_nan_at(const refit_view *v)
{
    for (int64_t r = 0; r < v->shape[0]; r++)
        for (int64_t c = 0; c < v->shape[1]; c++)
            if ((((const uint8_t *)v->data)[r * v->strides[0] + c * v->strides[1]] & 0x7fu) ==
                0x7fu)
                return r * v->shape[1] + c;
    return -1;
}

#ifdef REFIT_NVFP4_DEVICE_CODE
/* The module as one piece of the launcher. */
static void make_piece(const refit_fmt_module *m, const nvfp4_state *s, refit_nvfp4_piece *p)
{
    memset(p, 0, sizeof *p);
    const refit_fmt_ckpt *w = refit_ckpt(m, s->ck[R_WEIGHT]);
    p->name = w->name;
    p->scale = refit_runtime(m, s->rt[RT_SCALE])->view;
    p->alpha = refit_runtime(m, s->rt[RT_ALPHA])->view;
    if (s->online) {
        p->mode = REFIT_NVFP4_ONLINE;
        p->src = w->staged;
        p->packed = refit_runtime(m, s->rt[RT_WEIGHT])->view;
        return;
    }
    p->mode = s->conv == CONV_CT ? REFIT_NVFP4_CT : REFIT_NVFP4_MODELOPT;
    p->name = refit_ckpt(m, s->ck[R_SCALE])->name;
    p->src = refit_ckpt(m, s->ck[R_SCALE])->staged;
    p->weight_factor = refit_ckpt(m, s->ck[R_WGLOBAL])->staged;
    if (s->ck[R_INPUT] >= 0)
        p->input_factor = refit_ckpt(m, s->ck[R_INPUT])->staged;
    if (s->rt[RT_INV] >= 0)
        p->input_scale_inv = refit_runtime(m, s->rt[RT_INV])->view;
}
#endif

/* The references linked here, on host memory (seal made sure). */
static int post_load_here(const refit_host_v2 *h, const refit_fmt_module *m, void *stream,
                          void *arg)
{
    (void)stream, (void)arg;
    const nvfp4_state *s = m->state;
    if (!s->online) {
        const refit_fmt_ckpt *sc = refit_ckpt(m, s->ck[R_SCALE]);
        int64_t at = scale_nan_at(&sc->staged);
        if (at >= 0)
            return ERR(h, REFIT_ECORRUPT, "module %s, tensor %s: block scale %lld is an E4M3 NaN; "
                       "refusing it", m->name, sc->name, (long long)at);
        int rc = fuse_factors(h, m, s);
        if (!rc)
            kern_swizzle(refit_runtime(m, s->rt[RT_SCALE])->view.data, &sc->staged);
        return rc;
    }
    const refit_fmt_ckpt *w = refit_ckpt(m, s->ck[R_WEIGHT]);
    int rc = kern_quant_nvfp4(&refit_runtime(m, s->rt[RT_WEIGHT])->view,
                              refit_runtime(m, s->rt[RT_SCALE])->view.data,
                              refit_runtime(m, s->rt[RT_ALPHA])->view.data, &w->staged);
    if (rc == REFIT_ECORRUPT)
        return ERR(h, rc, "module %s, tensor %s: NaN or infinity in the weight; refusing to "
                   "quantize it", m->name, w->name);
    if (rc)
        return ERR(h, rc, "module %s, tensor %s: quantization refused the views (%d)", m->name,
                   w->name, rc);
    return REFIT_OK;
}

#ifdef REFIT_NVFP4_DEVICE_CODE
static const char nan_what[] = "NaN or infinity in the weight, a block scale or a global "
                               "factor (or a zero factor); refusing it";

/* The launcher over pieces p[0 .. n) of modules mods[0 .. n) (piece i of
 * module mods[i]) on dev, through the host's GPU service: one status word
 * names the module and tensor of a bad piece. */
static int launch_pieces(const refit_host_v2 *h, uint32_t n, const refit_fmt_module *const *mods,
                         const refit_nvfp4_piece *p, const char *const *names, refit_device dev,
                         void *stream)
{
    int one = 1;
    for (uint32_t i = 1; i < n; i++)
        one = one && mods[i] == mods[0];
    refit_pgpu_host g;
    int rc = one ? refit_pgpu_host_init(&g, h, mods[0], dev, stream, nvfp4_image,
                                        nvfp4_image_size, n, names, nan_what)
                 : refit_pgpu_host_init_many(&g, h, dev, stream, nvfp4_image, nvfp4_image_size,
                                             n, mods, names, nan_what);
    int32_t bad = -1;
    if (!rc && (rc = nvfp4_launch(&g.g, n, p, 0, &bad)) && g.g.msg[0])
        return ERR(h, rc, "module %s, tensor %s: %s", mods[bad >= 0 ? bad : 0]->name,
                   names[bad >= 0 ? bad : 0], g.g.msg);
    return rc;
}
#endif

static refit_device module_device(const refit_fmt_module *m)
{
    const nvfp4_state *s = m->state;
    return refit_runtime(m, s->rt[RT_SCALE])->view.device;
}

static int on_device(const refit_fmt_module *m)
{
    const nvfp4_state *s = m->state;
    return !on_host(&refit_runtime(m, s->rt[RT_SCALE])->view);
}

/* The modules of mods[lead .. n) not done yet on the device of mods[lead]
 * (one piece each: nvfp4_launch takes online and checkpoint pieces
 * together), in one call of the launcher; done[] marks them. A host
 * without status_word_many: one call a module. */
static int post_load_device(const refit_host_v2 *h, const refit_fmt_module *const *mods,
                            uint32_t n, uint32_t lead, unsigned char *done, void *stream,
                            void *arg)
{
    (void)arg;
    refit_device dev = module_device(mods[lead]);
#ifdef REFIT_NVFP4_DEVICE_CODE
    uint32_t cap = 0;
    for (uint32_t k = lead; k < n; k++) {
        refit_device d = module_device(mods[k]);
        if (!done[k] && on_device(mods[k]) && d.device_type == dev.device_type &&
            d.device_id == dev.device_id) {
            done[k] = 2; /* this group's */
            cap++;
        }
    }
    refit_nvfp4_piece *p = h->mem_alloc(h->host, (sizeof *p + 2 * sizeof(void *)) * cap);
    if (!p)
        return ERR(h, REFIT_ENOMEM, "module %s: out of memory", mods[lead]->name);
    const char **names = (const char **)(void *)(p + cap);
    const refit_fmt_module **of = (const refit_fmt_module **)(void *)(names + cap);
    uint32_t np = 0;
    for (uint32_t k = lead; k < n; k++) {
        if (done[k] != 2)
            continue;
        done[k] = 1;
        make_piece(mods[k], mods[k]->state, &p[np]);
        names[np] = p[np].name;
        of[np++] = mods[k];
    }
    int rc = REFIT_OK;
    if (np > 1 && !REFIT_HOST_HAS(h, status_word_many))
        for (uint32_t i = 0; i < np && !rc; i++)
            rc = launch_pieces(h, 1, of + i, p + i, names + i, dev, stream);
    else
        rc = launch_pieces(h, np, of, p, names, dev, stream);
    h->mem_free(h->host, p);
    return rc;
#else
    (void)n, (void)done, (void)stream;
    return ERR(h, REFIT_EUNSUPPORTED, "module %s: nvfp4 was built without its device code "
               "(no nvcc), so it cannot run on device type %d", mods[lead]->name,
               dev.device_type);
#endif
}

static int nvfp4_where(const refit_fmt_module *m, void *arg)
{
    (void)arg;
    return on_device(m) ? REFIT_SDK_GROUP_LEAD : REFIT_SDK_GROUP_ONE;
}

static const refit_sdk_group_ops nvfp4_groups = {nvfp4_where, post_load_device, post_load_here};

/* Modules in call order: on host memory the references, one module at a
 * time (a bad one stops the call: REFIT_ECORRUPT, its message); on a CUDA
 * device one launcher call for every module of the call on that device
 * (the device code is checked at seal). */
static int nvfp4_post_load_many(const refit_host_v2 *h, const refit_fmt_module *const *mods,
                                uint32_t n, void *stream)
{
    return refit_sdk_post_load_groups(h, mods, n, stream, &nvfp4_groups, NULL);
}

static int nvfp4_post_load(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    return nvfp4_post_load_many(h, &m, 1, stream);
}

REFIT_PLUGIN_EXPORT const refit_format_v2 refit_format_plugin_v2 = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "nvfp4",
    .plan = nvfp4_plan,
    .post_load = nvfp4_post_load,
    .release = nvfp4_release,
#ifdef REFIT_PLUGIN_MIN_CC /* device code built: none of it below this */
    .min_compute_capability = REFIT_PLUGIN_MIN_CC,
#endif
    .post_load_many = nvfp4_post_load_many,
};
