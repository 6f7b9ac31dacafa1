/* Format "mxfp4": OCP MX FP4, E2M1 values packed two per byte along K (low
 * nibble first) with one E8M0 scale per 32 elements of a row.
 *
 * Serialized checkpoints (the module holds values and scales), with or
 * without a leading experts dim:
 *   W.weight_packed / W.weight (U8)   [(E,) N, K/2]
 *   *_blocks (gpt-oss)                [(E,) N, K/32, 16]
 *   W.weight_scale / *_scales         U8 or F8_E8M0 [(E,) N, K/32]
 * go DIRECT into runtime `weight` U8 [(E,) N, K/2] and `weight_scale`
 * U8/F8_E8M0 [(E,) N, K/32] (a per-expert checkpoint tensor lands at its
 * expert of a stacked runtime tensor through the core's placement). The
 * 4-D *_blocks form lands through a VIEW that sees the runtime's K/2 bytes
 * as K/32 blocks of 16; scales whose 8-bit dtype differs from the
 * runtime's (U8 vs E8M0: the same bits) through a VIEW of the checkpoint's
 * dtype. No post-load: the bytes are the runtime.
 *
 * Online quantization: a module holding one F32/F16/BF16 W.weight
 * [(E,) N, K] stages it; post-load quantizes it (plugins/mxfp4/quant_mxfp4.h,
 * the shared MX scale rule of plugins/mxfp8/quant_mx.h) into `weight` U8
 * [(E,) N, ceil(K/2)] and `weight_scale` [(E,) N, ceil(K/32)]. Blocks start
 * at the first column of this rank's slice: the CPU reference on host
 * memory; on a CUDA device MX's own kernels (plugins/mxfp8/quant_mx.cu,
 * embedded as mx_image; mx_device.h), the same bytes, without a wait (the
 * status word names the module and expert at finalize): post_load_many
 * puts every expert of every online module of a loading call on one
 * device in one launcher call. post_load only reads the staged weight
 * (STAGED_IN_PLACE: it may be the caller's own source, no staged copy).
 * A plugin built without nvcc runs on host memory only (seal refuses
 * device runtime tensors then).
 *
 * Params: in_features (unsharded K; needed only when a serialized K/2-byte
 * layout holds a K that is not a multiple of 32). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/format.h>

#include "kernels/copy.h"
#include "plugins/int4/quant_int4.h"
#include "plugins/mxfp8/mx_device.h"
#include "plugins/mxfp8/quant_mx.h"
#include "plugins/mxfp4/quant_mxfp4.h"

#ifndef REFIT_PLUGIN_EXPORT
#define REFIT_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

#define ERR(h, st, ...) (h)->error((h)->host, (st), __VA_ARGS__)

enum { R_VALUES, R_SCALES, R_SOURCE, R_COUNT };
enum { RT_WEIGHT, RT_SCALE, RT_COUNT };
static const char *const rt_name[RT_COUNT] = {"weight", "weight_scale"};

typedef struct mxfp4_state {
    int ck[R_COUNT];          /* the first tensor of each role, -1 if none */
    uint32_t count[R_COUNT];
    int rt[RT_COUNT];
} mxfp4_state;

static int is_float(refit_dtype d)
{
    return d.lanes == 1 && ((d.code == REFIT_DTYPE_FLOAT && (d.bits == 32 || d.bits == 16)) ||
                            (d.code == REFIT_DTYPE_BFLOAT && d.bits == 16));
}

static int is_u8(refit_dtype d)
{
    return d.code == REFIT_DTYPE_UINT && d.bits == 8 && d.lanes == 1;
}

static int is_scale_dtype(refit_dtype d)
{
    return is_u8(d) || (d.code == REFIT_DTYPE_FLOAT8_E8M0FNU && d.bits == 8 && d.lanes == 1);
}

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && !strcmp(s + n - t, tail);
}

static int role_of(const refit_fmt_ckpt *c)
{
    if (ends_with(c->name, "scale") || ends_with(c->name, "scales"))
        return R_SCALES;
    if (ends_with(c->name, "blocks") || ends_with(c->name, "weight_packed"))
        return R_VALUES;
    if (ends_with(c->name, "weight"))
        return is_float(c->dtype) ? R_SOURCE : R_VALUES;
    return -1;
}

static int find_roles(const refit_host_v2 *h, const refit_fmt_module *m, mxfp4_state *s)
{
    for (int r = 0; r < R_COUNT; r++)
        s->ck[r] = -1;
    for (int r = 0; r < RT_COUNT; r++)
        s->rt[r] = -1;
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        int r = role_of(refit_ckpt(m, i));
        if (r < 0)
            return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: format mxfp4 takes W.weight_packed "
                       "or *_blocks with W.weight_scale or *_scales, or a float W.weight to "
                       "quantize", m->name, refit_ckpt(m, i)->name);
        if (s->ck[r] < 0)
            s->ck[r] = (int)i;
        s->count[r]++;
    }
    for (uint32_t i = 0; i < m->n_runtime; i++)
        for (int r = 0; r < RT_COUNT; r++)
            if (!strcmp(refit_runtime(m, i)->name, rt_name[r]))
                s->rt[r] = (int)i;
    /* several value/scale pairs: per-expert tensors into stacked runtimes */
    int serialized = s->count[R_VALUES] > 0 && s->count[R_VALUES] == s->count[R_SCALES] &&
                     !s->count[R_SOURCE];
    int online = s->count[R_SOURCE] == 1 && !s->count[R_VALUES] && !s->count[R_SCALES];
    if (!serialized && !online)
        return ERR(h, REFIT_EFORMAT, "module %s: format mxfp4 needs packed values with their "
                   "scales (pairs, for per-expert tensors), or one float weight to quantize",
                   m->name);
    for (int r = 0; r < RT_COUNT; r++)
        if (s->rt[r] < 0)
            return ERR(h, REFIT_EFORMAT, "module %s: format mxfp4 needs a runtime tensor named "
                       "%s", m->name, rt_name[r]);
    return REFIT_OK;
}

static int same_dims(const int64_t *a, const int64_t *b, int n)
{
    return n <= 0 || !memcmp(a, b, sizeof(int64_t) * (size_t)n);
}

/* The runtime tensor a checkpoint tensor may go DIRECT into: the same
 * shape, or a stack of them (the core places it at its expert). */
static int direct_fits(const refit_fmt_ckpt *c, const refit_view *v)
{
    if (v->ndim == c->ndim)
        return same_dims(v->shape, c->shape, c->ndim);
    return v->ndim == c->ndim + 1 && same_dims(v->shape + 1, c->shape, c->ndim);
}

static int param_k(const refit_host_v2 *h, const refit_fmt_module *m, int64_t *k)
{
    const char *v = h->param(h->host, m, "in_features");
    char *end = NULL;
    *k = v ? strtoll(v, &end, 10) : 0;
    if (v && (end == v || *end || *k < 0))
        return ERR(h, REFIT_EINVAL, "module %s: param in_features: '%s' is not a count",
                   m->name, v);
    return REFIT_OK;
}

/* Values and scales must cover the same rows and the same K range. */
static int check_pair(const refit_host_v2 *h, const refit_fmt_module *m,
                      const refit_fmt_ckpt *v, const refit_fmt_ckpt *sc)
{
    int bl = ends_with(v->name, "blocks");
    int vd = bl ? v->ndim - 1 : v->ndim; /* dims of the [.., N, K-ish] form */
    if (!is_u8(v->dtype) || vd < 2 || vd > 3 || (bl && v->shape[v->ndim - 1] != 16))
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: expected U8 [(E,) N, K/2]%s",
                   m->name, v->name, bl ? " as [(E,) N, K/32, 16]" : "");
    if (!is_scale_dtype(sc->dtype) || sc->ndim != vd || !same_dims(sc->shape, v->shape, vd - 1))
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: expected U8/F8_E8M0 scales with "
                   "the leading dims of %s and one per 32 elements of K", m->name, sc->name,
                   v->name);
    int64_t units = v->shape[vd - 1], blocks = sc->shape[vd - 1], k = 0;
    int rc = param_k(h, m, &k);
    if (rc)
        return rc;
    kern_q4_split sp = bl ? (units == blocks ? KERN_Q4_SPLIT_OK : KERN_Q4_SPLIT_CUT)
                                 : kern_q4_split_check(units, 2, blocks, KERN_MX_BLOCK, k);
    if (sp == KERN_Q4_SPLIT_RAGGED)
        return ERR(h, REFIT_EMISMATCH, "module %s: %lld bytes of K against %lld blocks of 32: "
                   "K is not a whole number of blocks; declare param in_features so that a "
                   "ragged last block can be told from a shard boundary", m->name,
                   (long long)units, (long long)blocks);
    if (sp)
        return ERR(h, REFIT_EMISMATCH, "module %s: %s holds %lld %s of K against %lld blocks of "
                   "32 in %s: a shard boundary cuts a block, or the shapes disagree", m->name,
                   v->name, (long long)units, bl ? "blocks" : "bytes",
                   (long long)blocks, sc->name);
    return REFIT_OK;
}

/* *_blocks [.., N, nb, 16] over a runtime [.., N, nb * 16]: same bytes. */
static int view_blocks(refit_fmt_ckpt *c, const refit_view *w)
{
    int d = w->ndim;
    if (d != c->ndim - 1 || !same_dims(w->shape, c->shape, d - 1) ||
        c->shape[d - 1] > INT64_MAX / 16 || w->shape[d - 1] != c->shape[d - 1] * 16)
        return 0;
    refit_view v = *w;
    v.ndim = c->ndim;
    v.shape[d - 1] = c->shape[d - 1];
    v.shape[d] = 16;
    v.strides[d - 1] = 16 * w->strides[d - 1];
    v.strides[d] = w->strides[d - 1];
    c->place = v;
    c->route = REFIT_ROUTE_VIEW;
    return 1;
}

static int route_pair(const refit_host_v2 *h, refit_fmt_module *m, const mxfp4_state *s,
                      refit_fmt_ckpt *v, refit_fmt_ckpt *sc)
{
    int blocks = ends_with(v->name, "blocks");
    const refit_view *w = &refit_runtime(m, s->rt[RT_WEIGHT])->view;
    const refit_view *ws = &refit_runtime(m, s->rt[RT_SCALE])->view;
    if (v->target_index != s->rt[RT_WEIGHT] || sc->target_index != s->rt[RT_SCALE])
        return ERR(h, REFIT_EINVAL, "module %s: %s must target runtime weight and %s runtime "
                   "weight_scale", m->name, v->name, sc->name);
    if (is_u8(w->dtype) && direct_fits(v, w))
        v->route = REFIT_ROUTE_DIRECT;
    else if (!is_u8(w->dtype) || !blocks || !view_blocks(v, w))
        return ERR(h, REFIT_EMISMATCH, "module %s: runtime weight must be U8 with %s's shape%s "
                   "(a per-expert *_blocks tensor needs a [E, N, K/32, 16] runtime: a VIEW "
                   "cannot be placed at an expert)", m->name, v->name,
                   blocks ? " or [.., N, K/2]" : ", or a stack of it");
    if (!is_scale_dtype(ws->dtype) || !direct_fits(sc, ws))
        return ERR(h, REFIT_EMISMATCH, "module %s: runtime weight_scale must be U8/F8_E8M0 with "
                   "%s's shape, or a stack of it", m->name, sc->name);
    sc->route = REFIT_ROUTE_DIRECT;
    if (sc->dtype.code != ws->dtype.code) { /* U8 vs E8M0: the same bits, seen as the ckpt's */
        if (ws->ndim != sc->ndim)
            return ERR(h, REFIT_EMISMATCH, "module %s: %s is %s but runtime weight_scale is "
                       "not; make them equal for a per-expert scale tensor", m->name, sc->name,
                       is_u8(sc->dtype) ? "U8" : "F8_E8M0");
        sc->place = *ws;
        sc->place.dtype = sc->dtype;
        sc->route = REFIT_ROUTE_VIEW;
    }
    return REFIT_OK;
}

/* Length of a name without its role suffix: values and scales of one
 * weight share it (x.gate_up_proj_blocks / x.gate_up_proj_scales,
 * e.0.weight_packed / e.0.weight_scale). */
static size_t stem(const char *name, int role)
{
    static const char *const vals[] = {"_blocks", "weight_packed", "weight"};
    static const char *const scs[] = {"_scales", "weight_scales", "weight_scale"};
    const char *const *list = role == R_VALUES ? vals : scs;
    for (int i = 0; i < 3; i++)
        if (ends_with(name, list[i]))
            return strlen(name) - strlen(list[i]);
    return strlen(name);
}

static int find_scales(const refit_fmt_module *m, const refit_fmt_ckpt *v)
{
    size_t n = stem(v->name, R_VALUES);
    for (uint32_t j = 0; j < m->n_ckpt; j++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, j);
        if (role_of(c) == R_SCALES && stem(c->name, R_SCALES) == n &&
            !strncmp(c->name, v->name, n))
            return (int)j;
    }
    return -1;
}

/* Every values tensor with the scales of the same stem. */
static int plan_serialized(const refit_host_v2 *h, refit_fmt_module *m, const mxfp4_state *s)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        refit_fmt_ckpt *v = refit_ckpt(m, i);
        if (role_of(v) != R_VALUES)
            continue;
        int j = find_scales(m, v);
        if (j < 0)
            return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: no scales tensor of the same "
                       "name stem", m->name, v->name);
        int rc = check_pair(h, m, v, refit_ckpt(m, j));
        if (!rc)
            rc = route_pair(h, m, s, v, refit_ckpt(m, j));
        if (rc)
            return rc;
    }
    m->flags = REFIT_MODULE_WHOLE;
    return REFIT_OK;
}

static int on_host(const refit_view *v)
{
    return v->device.device_type == REFIT_DEVICE_CPU ||
           v->device.device_type == REFIT_DEVICE_CUDA_HOST;
}

/* 1 when post-load can run on dev: a CUDA device the host serves, and
 * this plugin carries MX's device code (plugins/mxfp8/mx_device.h). */
static int device_kernel(const refit_host_v2 *h, refit_device dev)
{
    return mx_device_code() && dev.device_type == REFIT_DEVICE_CUDA && refit_host_serves(h, dev);
}

/* Where online quantization writes: host memory, or one device the host
 * quantizes on. */
static int check_place(const refit_host_v2 *h, const refit_fmt_module *m, const refit_view *w,
                       const refit_view *ws)
{
    if (on_host(w) && on_host(ws))
        return REFIT_OK;
    if (w->device.device_type != ws->device.device_type ||
        w->device.device_id != ws->device.device_id)
        return ERR(h, REFIT_EUNSUPPORTED, "module %s: runtime weight and weight_scale are on "
                   "different devices; online mxfp4 writes both in one place", m->name);
    if (!device_kernel(h, w->device))
        return ERR(h, REFIT_EUNSUPPORTED, "module %s: online mxfp4 quantization of device "
                   "memory needs a CUDA device the host serves and this plugin's device code; "
                   "%s (device type %d)", m->name, mx_device_code() ? "the host serves no such "
                   "device" : "this plugin was built without nvcc", w->device.device_type);
    return REFIT_OK;
}

/* Online: runtime shapes follow the staged slice [(E,) N, K]. */
static int route_online(const refit_host_v2 *h, refit_fmt_module *m, const mxfp4_state *s)
{
    refit_fmt_ckpt *c = refit_ckpt(m, s->ck[R_SOURCE]);
    const refit_view *w = &refit_runtime(m, s->rt[RT_WEIGHT])->view;
    const refit_view *ws = &refit_runtime(m, s->rt[RT_SCALE])->view;
    int d = c->ndim;
    int64_t k = d >= 2 ? c->shape[d - 1] : 0;
    if (k > INT64_MAX - 32)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: extents too large", m->name,
                   c->name);
    if (d < 2 || d > 3 || w->ndim != d || ws->ndim != d || !is_u8(w->dtype) ||
        !is_scale_dtype(ws->dtype) || !same_dims(w->shape, c->shape, d - 1) ||
        !same_dims(ws->shape, c->shape, d - 1) || w->shape[d - 1] != (k + 1) / 2 ||
        ws->shape[d - 1] != kern_mx_blocks(k) || (w->shape[d - 1] > 1 && w->strides[d - 1] != 1))
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: online mxfp4 needs runtime weight "
                   "U8 [.., %lld] (bytes contiguous along K) and weight_scale [.., %lld] with the "
                   "checkpoint's leading dims (a per-expert source needs the core to pass its "
                   "expert index: stack experts in one checkpoint tensor)", m->name, c->name,
                   (long long)((k + 1) / 2), (long long)kern_mx_blocks(k));
    int rc = check_place(h, m, w, ws);
    if (rc)
        return rc;
    c->route = REFIT_ROUTE_STAGED;
    /* one E8M0 scale per 32 elements of a row; the runtime rows are the
     * staged rows, so a band of rows quantizes alone into its own rows */
    if (REFIT_ELEM_HAS(m->ckpt_stride, refit_fmt_ckpt, group))
        c->group = (refit_quant_group){1, KERN_MX_BLOCK, REFIT_GROUP_DECLARED |
                                       REFIT_GROUP_ROW_SLICES | REFIT_GROUP_RUNTIME_ROWS};
    /* post_load only reads the staged weight (kern_quant_mxfp4 and
     * quant_mx.cu take x const): it may be the caller's */
    m->flags = REFIT_MODULE_WHOLE | REFIT_MODULE_POST_LOAD | REFIT_MODULE_STAGED_IN_PLACE;
    return REFIT_OK;
}

static int mxfp4_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    mxfp4_state s;
    memset(&s, 0, sizeof s);
    int rc = find_roles(h, m, &s);
    if (!rc)
        rc = s.ck[R_SOURCE] >= 0 ? route_online(h, m, &s) : plan_serialized(h, m, &s);
    if (rc)
        return rc;
    mxfp4_state *keep = h->mem_alloc(h->host, sizeof *keep);
    if (!keep)
        return ERR(h, REFIT_ENOMEM, "module %s: out of memory", m->name);
    *keep = s;
    m->state = keep;
    return REFIT_OK;
}

static void mxfp4_release(const refit_host_v2 *h, refit_fmt_module *m)
{
    h->mem_free(h->host, m->state);
    m->state = NULL;
}

/* The 2-D [N, X] matrix at expert e of a 2-D or 3-D view. */
static refit_view matrix(const refit_view *v, int64_t e)
{
    if (v->ndim == 2)
        return *v;
    refit_view r = *v;
    r.data = (char *)v->data + e * v->strides[0] * (int64_t)kern_dtype_size(v->dtype);
    r.ndim = 2;
    for (int i = 0; i < 2; i++) {
        r.shape[i] = v->shape[i + 1];
        r.strides[i] = v->strides[i + 1];
    }
    return r;
}

static int64_t experts_of(const refit_fmt_ckpt *c)
{
    return c->ndim == 3 ? c->shape[0] : 1;
}

/* 1: m's post-load runs on its device; 0: on host memory; -1: none. */
static int where(const refit_fmt_module *m, refit_device *dev)
{
    const mxfp4_state *s = m->state;
    if (!s || s->ck[R_SOURCE] < 0)
        return -1;
    const refit_view *w = &refit_runtime(m, s->rt[RT_WEIGHT])->view;
    *dev = w->device;
    return !on_host(w);
}

/* A piece an expert; an expert's name in messages is "W (expert e)". */
static uint32_t count_pieces(const refit_fmt_module *m, size_t *text)
{
    const mxfp4_state *s = m->state;
    const refit_fmt_ckpt *c = refit_ckpt(m, s->ck[R_SOURCE]);
    int64_t experts = experts_of(c);
    if (experts < 1 || experts > 0x7fffffff)
        experts = experts < 1 ? 0 : 0x80000000; /* past the launcher: refused */
    *text = (size_t)experts * (strlen(c->name) + 32);
    return (uint32_t)experts;
}

static int add_pieces(const refit_host_v2 *h, const refit_fmt_module *m, mx_call *call)
{
    const mxfp4_state *s = m->state;
    const refit_fmt_ckpt *c = refit_ckpt(m, s->ck[R_SOURCE]);
    const refit_view *w = &refit_runtime(m, s->rt[RT_WEIGHT])->view;
    const refit_view *ws = &refit_runtime(m, s->rt[RT_SCALE])->view;
    int64_t experts = experts_of(c);
    for (int64_t e = 0; e < experts; e++) {
        uint32_t at = call->n++;
        call->q[at] = matrix(w, e);
        call->sc[at] = matrix(ws, e);
        call->x[at] = matrix(&c->staged, e);
        call->mods[at] = m;
        call->names[at] = mx_call_name(call, c->ndim == 3 ? "%s (expert %lld)" : "%s", c->name,
                                       (long long)e);
        if (!call->names[at])
            return ERR(h, REFIT_EINTERNAL, "module %s, tensor %s: no room for its name",
                       m->name, c->name);
    }
    return REFIT_OK;
}

/* The reference linked here, expert by expert (host memory; done on
 * return). */
static int quant_host(const refit_host_v2 *h, const refit_fmt_module *m)
{
    const mxfp4_state *s = m->state;
    const refit_fmt_ckpt *c = refit_ckpt(m, s->ck[R_SOURCE]);
    const refit_view *w = &refit_runtime(m, s->rt[RT_WEIGHT])->view;
    const refit_view *ws = &refit_runtime(m, s->rt[RT_SCALE])->view;
    for (int64_t e = 0; e < experts_of(c); e++) {
        refit_view q = matrix(w, e), sc = matrix(ws, e), x = matrix(&c->staged, e);
        int rc = kern_quant_mxfp4(&q, &sc, &x);
        if (rc == REFIT_ECORRUPT)
            return ERR(h, rc, "module %s, tensor %s: NaN or infinity in the weight (expert "
                       "%lld); MXFP4 cannot hold it", m->name, c->name, (long long)e);
        if (rc)
            return ERR(h, rc, "module %s, tensor %s: quantization refused the views", m->name,
                       c->name);
    }
    return REFIT_OK;
}

static const mx_ops mxfp4_ops = {4, where, count_pieces, add_pieces, quant_host};

/* MX's device code on a CUDA device (checked at seal): one launcher call
 * for every online module of the call on a device; the reference linked
 * here on host memory. */
static int mxfp4_post_load_many(const refit_host_v2 *h, const refit_fmt_module *const *mods,
                                uint32_t n, void *stream)
{
    return mx_post_load_many(h, mods, n, stream, &mxfp4_ops);
}

static int mxfp4_post_load(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    return mx_post_load_many(h, &m, 1, stream, &mxfp4_ops);
}

REFIT_PLUGIN_EXPORT const refit_format_v2 refit_format_plugin_v2 = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "mxfp4",
    .plan = mxfp4_plan,
    .post_load = mxfp4_post_load,
    .release = mxfp4_release,
#ifdef REFIT_PLUGIN_MIN_CC /* device code built: none of it below this */
    .min_compute_capability = REFIT_PLUGIN_MIN_CC,
#endif
    .post_load_many = mxfp4_post_load_many,
};
