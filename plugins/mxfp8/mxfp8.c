/* Format "mxfp8": OCP MX FP8, E4M3 elements with one E8M0 scale per 32
 * elements along K (docs/formats-fp8.md; the scale rule is in
 * plugins/mxfp8/quant_mx.h).
 *
 * Checkpoint tensors of a module (several weights may fuse into one
 * runtime weight along N; each W.* pairs with the W.weight of its prefix):
 *   W.weight            F8_E4M3 [N, K] serialized, or BF16/F16/F32 [N, K]
 *                       (online: quantized at post-load)
 *   W.weight_scale_inv  U8 or F8_E8M0 [N, ceil(K/32)], E8M0 codes, row-major
 *   (or W.weight_scale)  and unswizzled: the layout of the mxfp8 checkpoints
 *                       SGLang/Miles write (quant_method "mxfp8",
 *                       weight_block_size [1, 32], scale_fmt "ue8m0"), which
 *                       name it weight_scale_inv; compressed-tensors' MX
 *                       formats name it weight_scale. Serialized only.
 * Runtime tensors: weight (F8_E4M3 [N, K] or stacked [E, N, K]) and
 * weight_scale (U8 or F8_E8M0, [N, ceil(K/32)] or [E, N, ceil(K/32)],
 * row-major: swizzling for a GEMM is the engine's, see the docs).
 *
 * Serialized: DIRECT routes; a K shard must cut at a multiple of 32.
 * Online: the weights are STAGED and post_load quantizes each into its
 * rows of the runtime weight and scale: the CPU reference on host memory;
 * on a CUDA device this plugin's own kernels (quant_mx.cu, embedded as
 * mx_image; mx_device.h), the same bytes, without a wait (the status word
 * names the module and weight at finalize): post_load_many puts every
 * online module of a loading call on one device in one launcher call.
 * post_load only reads the staged weights (STAGED_IN_PLACE: they may be
 * the caller's own source bytes, no staged copy). A plugin built without
 * nvcc runs on host memory only (seal refuses device runtime tensors
 * then). The module is WHOLE.
 *
 * Params: online (bool, optional assertion of the weights' dtype),
 * in_features (unsharded K; needed only when a serialized K is not a
 * multiple of 32, to tell a ragged last block from a shard boundary). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/format.h>

#include "plugins/fp8/quant_fp8.h"
#include "plugins/mxfp8/mx_device.h"
#include "plugins/mxfp8/quant_mx.h"
#include "plugins/fp8/qplug.h"

enum { R_WEIGHT, R_SCALE, R_SCALE_INV, R_COUNT };
static const char *const role_suffix[R_COUNT] = {"weight", "weight_scale", "weight_scale_inv"};

typedef struct mx_state {
    int online;
    int rt_weight, rt_scale;  /* runtime indexes; -1 when absent */
    uint32_t n_weights;
    uint32_t *weights;        /* ckpt indexes of the W.weight tensors */
} mx_state;

static int role_of(const char *name)
{
    const char *s = suffix(name);
    for (int r = 0; r < R_COUNT; r++)
        if (!strcmp(s, role_suffix[r]))
            return r;
    return -1;
}

static int is_scale_dtype(refit_dtype d)
{
    return d.bits == 8 && d.lanes == 1 &&
           (d.code == REFIT_DTYPE_UINT || d.code == REFIT_DTYPE_FLOAT8_E8M0FNU);
}

/* ---- serialized ---- */

/* The scale of weight ckpt[wi], checked against it. */
static int check_pair(const refit_host_v2 *h, refit_fmt_module *m, uint32_t wi, int64_t in_f,
                      int *paired)
{
    const refit_fmt_ckpt *w = refit_ckpt(m, wi);
    int si = -1;
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        int r = role_of(refit_ckpt(m, i)->name);
        if ((r != R_SCALE && r != R_SCALE_INV) || !same_prefix(refit_ckpt(m, i)->name, w->name))
            continue;
        if (si >= 0)
            return ERR(h, REFIT_EFORMAT, "module %s: weight %s has two scales, %s and %s",
                       m->name, w->name, refit_ckpt(m, si)->name, refit_ckpt(m, i)->name);
        si = (int)i;
    }
    if (si < 0)
        return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: a serialized MXFP8 weight needs its "
                   "%.*s.weight_scale_inv (or .weight_scale)", m->name, w->name,
                   (int)prefix_len(w->name), w->name);
    const refit_fmt_ckpt *sc = refit_ckpt(m, si);
    paired[si] = 1;
    if (!is_scale_dtype(sc->dtype) || sc->ndim != 2 || sc->shape[0] != w->shape[0])
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: an MX scale is u8/f8_e8m0 "
                   "[%lld, ceil(K/32)] (it is %s, %d-D)", m->name, sc->name,
                   (long long)w->shape[0], dt_name(sc->dtype), sc->ndim);
    if (in_f && w->shape[1] > in_f)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: %lld columns, more than param "
                   "in_features %lld", m->name, w->name, (long long)w->shape[1],
                   (long long)in_f);
    kern_split sp = kern_block_split(w->shape[1], sc->shape[1], KERN_MX_BLOCK,
                                     wholeness(w->shape[1], in_f));
    if (sp == KERN_SPLIT_CUT)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: %lld columns against %lld blocks "
                   "of 32: a shard boundary cuts a 32-block", m->name, sc->name,
                   (long long)w->shape[1], (long long)sc->shape[1]);
    if (sp == KERN_SPLIT_RAGGED)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: %lld columns are not a whole "
                   "number of 32-blocks; declare param in_features (the unsharded K) so that "
                   "a ragged last block can be told from a shard boundary", m->name, sc->name,
                   (long long)w->shape[1]);
    if (sp)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: %lld columns need %lld blocks of "
                   "32, the scale has %lld", m->name, sc->name, (long long)w->shape[1],
                   (long long)kern_mx_blocks(w->shape[1]), (long long)sc->shape[1]);
    return REFIT_OK;
}

/* Each weight with its scale; every scale belongs to a weight; routes. */
static int plan_serialized(const refit_host_v2 *h, refit_fmt_module *m, const mx_state *s,
                           int64_t in_f)
{
    int *paired = h->mem_alloc(h->host, sizeof(int) * (m->n_ckpt ? m->n_ckpt : 1));
    if (!paired)
        return ERR(h, REFIT_ENOMEM, "module %s: out of memory", m->name);
    memset(paired, 0, sizeof(int) * m->n_ckpt);
    int rc = REFIT_OK;
    for (uint32_t i = 0; i < s->n_weights && !rc; i++)
        rc = check_pair(h, m, s->weights[i], in_f, paired);
    for (uint32_t i = 0; i < m->n_ckpt && !rc; i++) {
        refit_fmt_ckpt *c = refit_ckpt(m, i);
        refit_dtype rt = refit_runtime(m, c->target_index)->view.dtype;
        if (role_of(c->name) != R_WEIGHT && !paired[i])
            rc = ERR(h, REFIT_EFORMAT, "module %s, tensor %s: no %.*s.weight in the module for "
                     "this scale", m->name, c->name, (int)prefix_len(c->name), c->name);
        else if (rt.code != c->dtype.code || rt.bits != c->dtype.bits)
            rc = ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: checkpoint %s but runtime %s is "
                     "%s; format mxfp8 copies it as is", m->name, c->name, dt_name(c->dtype),
                     c->target, dt_name(rt));
        c->route = REFIT_ROUTE_DIRECT;
    }
    h->mem_free(h->host, paired);
    return rc;
}

/* ---- online ---- */

/* 1 when post-load can run on dev: a CUDA device the host serves, and
 * this plugin carries MX's device code (plugins/mxfp8/mx_device.h). */
static int device_kernel(const refit_host_v2 *h, refit_device dev)
{
    return mx_device_code() && dev.device_type == REFIT_DEVICE_CUDA && refit_host_serves(h, dev);
}

static int plan_online(const refit_host_v2 *h, refit_fmt_module *m, mx_state *s)
{
    s->rt_scale = find_runtime(m, "weight_scale");
    if (s->rt_weight < 0 || s->rt_scale < 0)
        return ERR(h, REFIT_EFORMAT, "module %s: online mxfp8 writes runtime tensors named "
                   "weight and weight_scale; bind both", m->name);
    const refit_view *w = &refit_runtime(m, s->rt_weight)->view, *sc = &refit_runtime(m, s->rt_scale)->view;
    if (!is_e4m3(w->dtype) || (w->ndim != 2 && w->ndim != 3) || !row_major(w))
        return ERR(h, REFIT_EMISMATCH, "module %s: runtime weight must be a contiguous f8_e4m3 "
                   "[N, K] or [E, N, K] tensor (it is %s, %d-D)", m->name, dt_name(w->dtype),
                   w->ndim);
    int64_t e = w->ndim == 3 ? w->shape[0] : 1, n = w->shape[w->ndim - 2];
    int64_t k = w->shape[w->ndim - 1], want = e * n * kern_mx_blocks(k);
    if (!is_scale_dtype(sc->dtype) || !row_major(sc) || numel(sc->ndim, sc->shape) != want)
        return ERR(h, REFIT_EMISMATCH, "module %s: runtime weight_scale must be a contiguous "
                   "u8/f8_e8m0 tensor of %lld codes ([E,] N, ceil(K/32))", m->name,
                   (long long)want);
    if (!host_memory(w->device) || !host_memory(sc->device)) {
        if (w->device.device_type != sc->device.device_type ||
            w->device.device_id != sc->device.device_id)
            return ERR(h, REFIT_EUNSUPPORTED, "module %s: runtime weight and weight_scale are on "
                       "different devices; online mxfp8 writes both in one place", m->name);
        if (!device_kernel(h, w->device))
            return ERR(h, REFIT_EUNSUPPORTED, "module %s: online mxfp8 quantization of device "
                       "memory needs a CUDA device the host serves and this "
                       "plugin's device code; %s (device type %d)", m->name,
                       mx_device_code() ? "the host serves no such device"
                                        : "this plugin was built without nvcc",
                       w->device.device_type);
    }
    for (uint32_t i = 0; i < s->n_weights; i++) {
        refit_fmt_ckpt *c = refit_ckpt(m, s->weights[i]);
        if (c->target_index != s->rt_weight || c->shape[1] != k)
            return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: an online weight goes to "
                       "runtime weight with its K (%lld); fused weights stack along N",
                       m->name, c->name, (long long)k);
        c->route = REFIT_ROUTE_STAGED;
        /* one E8M0 scale per 32 elements of a row: a row quantizes alone */
        declare_group(m, c, 1, KERN_MX_BLOCK, REFIT_GROUP_ROW_SLICES);
    }
    return REFIT_OK;
}

/* ---- plan ---- */

static int classify(const refit_host_v2 *h, refit_fmt_module *m, mx_state *s)
{
    int n_e4m3 = 0, n_float = 0;
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, i);
        int r = role_of(c->name);
        if (r < 0)
            return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: format mxfp8 takes W.weight and "
                       "W.weight_scale_inv (or W.weight_scale)", m->name, c->name);
        if (r != R_WEIGHT)
            continue;
        int rc = e4m3_weight(h, m, c, "mxfp8", &n_e4m3, &n_float);
        if (rc)
            return rc;
        s->weights[s->n_weights++] = i;
    }
    int rc = e4m3_weights_done(h, m, "mxfp8", (int)s->n_weights, n_e4m3, n_float);
    if (rc)
        return rc;
    s->online = n_float > 0;
    if (s->online && (uint32_t)n_float != m->n_ckpt)
        return ERR(h, REFIT_EFORMAT, "module %s: an online module (bf16/f16/f32 weights) "
                   "computes its scales; it takes none from the checkpoint", m->name);
    return REFIT_OK;
}

static int mx_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    size_t bytes;
    if (__builtin_mul_overflow((size_t)m->n_ckpt, sizeof(uint32_t), &bytes) ||
        __builtin_add_overflow(bytes, sizeof(mx_state), &bytes))
        return ERR(h, REFIT_ENOMEM, "module %s: too many checkpoint tensors", m->name);
    mx_state *s = h->mem_alloc(h->host, bytes);
    if (!s)
        return ERR(h, REFIT_ENOMEM, "module %s: out of memory", m->name);
    memset(s, 0, sizeof *s);
    s->weights = (uint32_t *)(s + 1);
    s->rt_weight = find_runtime(m, "weight");
    s->rt_scale = -1;
    m->state = s; /* release frees it, also when plan fails */
    int online;
    int64_t in_f;
    int rc = bool_param(h, m, "online", &online);
    if (!rc)
        rc = int_param(h, m, "in_features", &in_f);
    if (!rc)
        rc = classify(h, m, s);
    if (!rc && online >= 0 && online != s->online)
        rc = ERR(h, REFIT_EMISMATCH, "module %s: param online is %s but the weights are %s",
                 m->name, online ? "true" : "false", s->online ? "bf16/f16/f32" : "f8_e4m3");
    if (!rc)
        rc = s->online ? plan_online(h, m, s) : plan_serialized(h, m, s, in_f);
    /* post_load only reads its staged weights (kern_quant_mxfp8 and
     * quant_mx.cu take x const): they may be the caller's */
    m->flags = REFIT_MODULE_WHOLE |
               (s->online ? REFIT_MODULE_POST_LOAD | REFIT_MODULE_STAGED_IN_PLACE : 0);
    /* an expert's E8M0 blocks run along K within its own rows */
    if (!rc && s->online)
        m->flags |= REFIT_MODULE_EXPERT_SLICES;
    return rc;
}

static void mx_release(const refit_host_v2 *h, refit_fmt_module *m)
{
    h->mem_free(h->host, m->state);
    m->state = NULL;
}

/* ---- post-load (online) ---- */

/* The scale rows of weight ckpt ck: rows of the runtime scale at its row
 * offset. */
static int scale_view(const refit_host_v2 *h, const refit_fmt_module *m, const mx_state *s,
                      uint32_t ck, refit_view *sv)
{
    const refit_view *rt = &refit_runtime(m, s->rt_weight)->view, *rs = &refit_runtime(m, s->rt_scale)->view;
    int64_t n = rt->shape[rt->ndim - 2], kb = kern_mx_blocks(rt->shape[rt->ndim - 1]);
    shard sh = {0, 0, 0};
    int rc = locate(h, m, s->rt_weight, ck, &sh);
    if (rc)
        return rc;
    memset(sv, 0, sizeof *sv);
    sv->device = rs->device;
    sv->dtype = rs->dtype;
    sv->ndim = 2;
    sv->data = (uint8_t *)rs->data + (sh.e * n + sh.row) * kb;
    sv->shape[0] = refit_ckpt(m, ck)->staged.shape[0];
    sv->shape[1] = kb;
    sv->strides[0] = kb;
    sv->strides[1] = 1;
    return REFIT_OK;
}

/* The module's weights appended to a launcher call (mx_post_load_many). */
static int add_pieces(const refit_host_v2 *h, const refit_fmt_module *m, mx_call *c)
{
    const mx_state *s = m->state;
    for (uint32_t i = 0; i < s->n_weights; i++) {
        const refit_fmt_ckpt *ck = refit_ckpt(m, s->weights[i]);
        uint32_t at = c->n++;
        c->q[at] = ck->place;
        c->x[at] = ck->staged;
        c->names[at] = ck->name;
        c->mods[at] = m;
        int rc = scale_view(h, m, s, s->weights[i], &c->sc[at]);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

static uint32_t count_pieces(const refit_fmt_module *m, size_t *text)
{
    *text = 0;
    return ((const mx_state *)m->state)->n_weights;
}

static int where(const refit_fmt_module *m, refit_device *dev)
{
    const mx_state *s = m->state;
    if (!s || !s->online)
        return -1;
    *dev = refit_runtime(m, s->rt_weight)->view.device;
    return !host_memory(*dev);
}

/* The reference linked here, weight by weight (host memory only). */
static int quant_linked(const refit_host_v2 *h, const refit_fmt_module *m)
{
    const mx_state *s = m->state;
    for (uint32_t i = 0; i < s->n_weights; i++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, s->weights[i]);
        refit_view sv;
        int rc = scale_view(h, m, s, s->weights[i], &sv);
        if (rc)
            return rc;
        rc = kern_quant_mxfp8(&c->place, &sv, &c->staged);
        if (rc == REFIT_ECORRUPT)
            return corrupt(h, m, s->weights[i]);
        if (rc)
            return ERR(h, rc, "module %s, tensor %s: quantization refused the views (%d)",
                       m->name, c->name, rc);
    }
    return REFIT_OK;
}

static const mx_ops mxfp8_ops = {8, where, count_pieces, add_pieces, quant_linked};

/* The reference linked here on host memory (done on return); MX's device
 * code on a CUDA device (checked at seal): one launcher call for every
 * online module of the call on a device. */
static int mx_post_load_many_fmt(const refit_host_v2 *h, const refit_fmt_module *const *mods,
                                 uint32_t n, void *stream)
{
    return mx_post_load_many(h, mods, n, stream, &mxfp8_ops);
}

static int mx_post_load(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    return mx_post_load_many(h, &m, 1, stream, &mxfp8_ops);
}

REFIT_PLUGIN_EXPORT const refit_format_v2 refit_format_plugin_v2 = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "mxfp8",
    .plan = mx_plan,
    .post_load = mx_post_load,
    .release = mx_release,
#ifdef REFIT_PLUGIN_MIN_CC /* device code built: none of it below this */
    .min_compute_capability = REFIT_PLUGIN_MIN_CC,
#endif
    .post_load_many = mx_post_load_many_fmt,
};
