/* Format "int4": compressed-tensors pack-quantized INT4 weights, delivered
 * through VIEW routes so that no repack runs on load.
 *
 * Checkpoint tensors of a module, told apart by the suffix after the last
 * '.' of their names:
 *   W.weight_packed      I32 [N, ceil(K/8)]  8 values per word along K,
 *                        low nibble first, stored as value + 8
 *   W.weight_scale       F32/F16/BF16 [N, G] G = ceil(K/group), 1 per channel
 *   W.weight_zero_point  I32 [ceil(N/8), G]  asymmetric only, packed along N
 *   W.weight_shape       I32/I64 [2]         (N, K); checked at post-load
 *
 * Runtime tensors (names in the module), for `layout: gptq` (default):
 *   weight             I32 [ceil(K/8), N]  the checkpoint words transposed:
 *                      the GPTQ qweight layout (uint4b8), what exllama and
 *                      Marlin's repack take
 *   weight_scale       float [G, N]        any of F32/F16/BF16 (cast)
 *   weight_zero_point  I32 [G, ceil(N/8)]  GPTQ qzeros layout
 * and for `layout: u8`:
 *   weight             U8 [N, P]           the words' little-endian bytes,
 *                      i.e. two values per byte along K, low nibble first;
 *                      P >= 4 * ceil(K/8), a multiple of 4 (row pitch); pad
 *                      bytes are re-zeroed at every load
 *   weight_scale       float [N, G]
 *   weight_zero_point  I32 [ceil(N/8), G]
 * Each checkpoint tensor is written through a checkpoint-layout view the
 * plan lays over its runtime tensor (transposed strides, or an I32 view of
 * the byte rows), so the core's copy is the whole load.
 *
 * Params: group_size (required; -1 = one scale per row), layout,
 * in_features / out_features (the unsharded K and N; needed only when K or
 * N is not a whole number of groups / zero-point words), online.
 *
 * Online (STAGED): a module whose one checkpoint tensor is an F32/F16/BF16
 * W.weight [N, K] quantizes it at post-load into the same runtime layouts
 * (no zero points: symmetric), round-to-nearest per group in the
 * compressed-tensors convention (plugins/int4/quant_int4.h): the CPU
 * reference on host memory; on a CUDA device this plugin's own kernels
 * (quant_int4.cu, embedded as int4_image), planned by int4_launch.c and
 * launched through the host's GPU service without a wait: post_load_many
 * gives the online modules of a loading call to one launcher call for
 * each (device, group size), under one status word (a NaN lowers it; the
 * host reads it at finalize and names the module and tensor). Post-load
 * only reads its staged views (the weight, weight_shape), so plan sets
 * STAGED_IN_PLACE.
 *
 * Post-load on a device: the staged weight_shape comes back through the
 * host's fetch service, the u8 row pad is zeroed through its zero service
 * (a strided view of the pad columns).
 *
 * The module is WHOLE: a packed weight means nothing without its scales. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/format.h>

#include "kernels/copy.h"
#include <refit/sdk/group.h>
#include <refit/sdk/pgpu_host.h>
#include "plugins/int4/int4_launch.h"
#include "plugins/int4/quant_int4.h"

#ifdef REFIT_INT4_DEVICE_CODE
extern const unsigned char int4_image[];
extern const size_t int4_image_size;
#endif

#ifndef REFIT_PLUGIN_EXPORT
#define REFIT_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

enum { R_PACKED, R_SCALE, R_ZP, R_SHAPE, R_WEIGHT, R_COUNT };
static const char *const role_name[R_COUNT] = {"weight_packed", "weight_scale",
                                               "weight_zero_point", "weight_shape", "weight"};
enum { RT_WEIGHT, RT_SCALE, RT_ZP, RT_COUNT };
static const char *const rt_name[RT_COUNT] = {"weight", "weight_scale", "weight_zero_point"};

enum { LAYOUT_GPTQ, LAYOUT_U8 };

typedef struct int4_state {
    int ck[R_COUNT];          /* index in m->ckpt, -1 when absent */
    int rt[RT_COUNT];         /* index in m->runtime, -1 when absent */
    int layout;
    int64_t group;            /* 0: per channel */
    int64_t n, words, groups; /* this rank's slice */
    int64_t in_features, out_features;
    int64_t pitch;            /* u8: bytes per runtime row */
    int online;               /* a float W.weight, quantized at post-load */
    int64_t k;                /* online: this rank's K */
    int shape_checked;        /* weight_shape already checked in this
                                 post_load_many (check_shapes_at_once) */
} int4_state;

#define ERR(h, st, ...) (h)->error((h)->host, (st), __VA_ARGS__)

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

static int is_float(refit_dtype d)
{
    return d.lanes == 1 && ((d.code == REFIT_DTYPE_FLOAT && (d.bits == 32 || d.bits == 16)) ||
                            (d.code == REFIT_DTYPE_BFLOAT && d.bits == 16));
}

static int is_dtype(refit_dtype d, uint8_t code, uint8_t bits)
{
    return d.code == code && d.bits == bits && d.lanes == 1;
}

static const char *suffix(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

/* An integer param; def when absent. -1 on a malformed value. */
static int param_int(const refit_host_v2 *h, const refit_fmt_module *m, const char *key,
                     int64_t def, int64_t *out)
{
    const char *s = h->param(h->host, m, key);
    if (!s) {
        *out = def;
        return 0;
    }
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end)
        return ERR(h, REFIT_EINVAL, "module %s: param %s: '%s' is not an integer", m->name, key,
                   s);
    *out = v;
    return 0;
}

static int read_params(const refit_host_v2 *h, const refit_fmt_module *m, int4_state *s)
{
    const char *layout = h->param(h->host, m, "layout");
    if (!layout || !strcmp(layout, "gptq"))
        s->layout = LAYOUT_GPTQ;
    else if (!strcmp(layout, "u8"))
        s->layout = LAYOUT_U8;
    else
        return ERR(h, REFIT_EINVAL, "module %s: format int4: layout '%s' (known: gptq, u8)",
                   m->name, layout);
    if (!h->param(h->host, m, "group_size"))
        return ERR(h, REFIT_EINVAL, "module %s: format int4 needs param group_size (the "
                   "checkpoint's quantization group; -1 for one scale per row)", m->name);
    int rc = REFIT_OK;
    const char *online = h->param(h->host, m, "online");
    s->online = -1; /* not asserted */
    if (online && !strcmp(online, "true"))
        s->online = 1;
    else if (online && !strcmp(online, "false"))
        s->online = 0;
    else if (online)
        return ERR(h, REFIT_EINVAL, "module %s: param online: '%s' is not true or false",
                   m->name, online);
    if (!rc)
        rc = param_int(h, m, "group_size", 0, &s->group);
    if (!rc)
        rc = param_int(h, m, "in_features", 0, &s->in_features);
    if (!rc)
        rc = param_int(h, m, "out_features", 0, &s->out_features);
    if (rc)
        return rc;
    if (s->group == -1)
        s->group = 0;
    else if (s->group <= 0)
        return ERR(h, REFIT_EINVAL, "module %s: group_size %lld must be positive or -1",
                   m->name, (long long)s->group);
    return REFIT_OK;
}

/* Sort checkpoint tensors into roles and runtime tensors by name. */
static int find_roles(const refit_host_v2 *h, const refit_fmt_module *m, int4_state *s)
{
    for (int r = 0; r < R_COUNT; r++)
        s->ck[r] = -1;
    for (int r = 0; r < RT_COUNT; r++)
        s->rt[r] = -1;
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        const char *suf = suffix(refit_ckpt(m, i)->name);
        int r = 0;
        while (r < R_COUNT && strcmp(suf, role_name[r]))
            r++;
        if (r == R_COUNT)
            return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: format int4 takes W.weight_packed, "
                       "W.weight_scale, W.weight_zero_point and W.weight_shape, or one float "
                       "W.weight to quantize online (act-order g_idx is not supported)",
                       m->name, refit_ckpt(m, i)->name);
        if (s->ck[r] >= 0)
            return ERR(h, REFIT_EFORMAT, "module %s: tensors %s and %s are both %s; one int4 "
                       "weight per module (fused targets need the core to pass the offset "
                       "of a VIEW route)", m->name, refit_ckpt(m, s->ck[r])->name, refit_ckpt(m, i)->name,
                       role_name[r]);
        s->ck[r] = (int)i;
    }
    for (uint32_t i = 0; i < m->n_runtime; i++)
        for (int r = 0; r < RT_COUNT; r++)
            if (!strcmp(refit_runtime(m, i)->name, rt_name[r]))
                s->rt[r] = (int)i;
    int online = s->ck[R_WEIGHT] >= 0;
    if (s->online >= 0 && s->online != online)
        return ERR(h, REFIT_EMISMATCH, "module %s: param online is %s but the module holds %s",
                   m->name, s->online ? "true" : "false",
                   online ? "a float W.weight" : "no float W.weight");
    s->online = online;
    if (online && m->n_ckpt != 1)
        return ERR(h, REFIT_EFORMAT, "module %s: an online int4 module holds one float W.weight "
                   "and nothing else (it has %u checkpoint tensors)", m->name, m->n_ckpt);
    if (online && s->rt[RT_ZP] >= 0)
        return ERR(h, REFIT_EFORMAT, "module %s: online int4 is symmetric; it writes no runtime "
                   "weight_zero_point", m->name);
    if (!online && (s->ck[R_PACKED] < 0 || s->ck[R_SCALE] < 0))
        return ERR(h, REFIT_EFORMAT, "module %s: format int4 needs W.weight_packed and "
                   "W.weight_scale (or one float W.weight, quantized online)", m->name);
    int need[RT_COUNT] = {1, 1, s->ck[R_ZP] >= 0};
    for (int r = 0; r < RT_COUNT; r++)
        if (need[r] && s->rt[r] < 0)
            return ERR(h, REFIT_EFORMAT, "module %s: format int4 needs a runtime tensor named "
                       "%s", m->name, rt_name[r]);
    return REFIT_OK;
}

static int split_error(const refit_host_v2 *h, const refit_fmt_module *m, kern_q4_split sp,
                       const char *what, const char *full_param)
{
    if (sp == KERN_Q4_SPLIT_RAGGED)
        return ERR(h, REFIT_EMISMATCH, "module %s: %s is not a whole number of blocks; "
                   "declare param %s (the unsharded extent) so that a ragged last block can "
                   "be told from a shard boundary", m->name, what, full_param);
    if (sp == KERN_Q4_SPLIT_MISMATCH)
        return ERR(h, REFIT_EMISMATCH, "module %s: %s disagrees with param %s", m->name, what,
                   full_param);
    return ERR(h, REFIT_EMISMATCH, "module %s: %s: a shard boundary cuts a group (shard only "
               "at multiples of the block)", m->name, what);
}

/* Dtypes and shapes of the checkpoint slices; the groups they imply. */
static int check_ckpt(const refit_host_v2 *h, const refit_fmt_module *m, int4_state *s)
{
    const refit_fmt_ckpt *p = refit_ckpt(m, s->ck[R_PACKED]), *sc = refit_ckpt(m, s->ck[R_SCALE]);
    if (!is_dtype(p->dtype, REFIT_DTYPE_INT, 32) || p->ndim != 2)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: expected I32 [N, K/8], got %s "
                   "with %d dims (stacked experts are not supported)", m->name, p->name,
                   dt_name(p->dtype), p->ndim);
    s->n = p->shape[0];
    s->words = p->shape[1];
    if (s->words > INT64_MAX / 8 || s->n > INT64_MAX / 8)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: extents too large", m->name,
                   p->name);
    if (!is_float(sc->dtype) || sc->ndim != 2 || sc->shape[0] != s->n)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: expected F32/F16/BF16 [%lld, G]",
                   m->name, sc->name, (long long)s->n);
    s->groups = sc->shape[1];
    char what[160];
    snprintf(what, sizeof what, "%lld int32 words of K against %lld groups of %lld",
             (long long)s->words, (long long)s->groups, (long long)s->group);
    kern_q4_split sp = s->group ? kern_q4_split_check(s->words, 8, s->groups, s->group,
                                                      s->in_features)
                                : (s->groups == 1 ? KERN_Q4_SPLIT_OK : KERN_Q4_SPLIT_MISMATCH);
    if (sp)
        return split_error(h, m, sp, what, "in_features");
    if (s->ck[R_ZP] >= 0) {
        const refit_fmt_ckpt *z = refit_ckpt(m, s->ck[R_ZP]);
        if (!is_dtype(z->dtype, REFIT_DTYPE_INT, 32) || z->ndim != 2 ||
            z->shape[1] != s->groups)
            return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: expected I32 [N/8, %lld]",
                       m->name, z->name, (long long)s->groups);
        snprintf(what, sizeof what, "%lld zero-point words of N against %lld rows",
                 (long long)z->shape[0], (long long)s->n);
        sp = kern_q4_split_check(z->shape[0], 8, s->n, 1, s->out_features);
        if (sp)
            return split_error(h, m, sp, what, "out_features");
    }
    if (s->ck[R_SHAPE] >= 0) {
        const refit_fmt_ckpt *w = refit_ckpt(m, s->ck[R_SHAPE]);
        if ((!is_dtype(w->dtype, REFIT_DTYPE_INT, 32) && !is_dtype(w->dtype, REFIT_DTYPE_INT, 64)) ||
            w->ndim != 1 || w->shape[0] != 2)
            return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: expected I32/I64 [2]",
                       m->name, w->name);
    }
    return REFIT_OK;
}

static int runtime_is(const refit_view *v, int64_t a, int64_t b)
{
    return v->ndim == 2 && v->shape[0] == a && v->shape[1] == b;
}

/* A [b, a] runtime tensor seen as the checkpoint's [a, b], as dt. */
static refit_view swapped(const refit_view *rt, refit_dtype dt)
{
    refit_view v = *rt;
    v.dtype = dt;
    v.shape[0] = rt->shape[1];
    v.shape[1] = rt->shape[0];
    v.strides[0] = rt->strides[1];
    v.strides[1] = rt->strides[0];
    return v;
}

/* Route one checkpoint tensor to its runtime tensor: through a transposed
 * view (gptq) or DIRECT (u8 scales and zero points). */
static int route_tensor(const refit_host_v2 *h, refit_fmt_module *m, const int4_state *s,
                        int role, int rt_role, int64_t rows, int64_t cols, int want_float)
{
    refit_fmt_ckpt *c = refit_ckpt(m, s->ck[role]);
    const refit_fmt_runtime *rt = refit_runtime(m, s->rt[rt_role]);
    const refit_view *v = &rt->view;
    int gptq = s->layout == LAYOUT_GPTQ;
    if (c->target_index != s->rt[rt_role])
        return ERR(h, REFIT_EINVAL, "module %s, tensor %s: its target must be runtime %s",
                   m->name, c->name, rt_name[rt_role]);
    int dt_ok = want_float ? is_float(v->dtype) : is_dtype(v->dtype, REFIT_DTYPE_INT, 32);
    if (!dt_ok || !runtime_is(v, gptq ? cols : rows, gptq ? rows : cols))
        return ERR(h, REFIT_EMISMATCH, "module %s: runtime %s must be %s [%lld, %lld] for "
                   "layout %s (it is %s with %d dims)", m->name, rt->name,
                   want_float ? "F32/F16/BF16" : "I32", (long long)(gptq ? cols : rows),
                   (long long)(gptq ? rows : cols), gptq ? "gptq" : "u8",
                   dt_name(v->dtype), v->ndim);
    if (!kern_dtype_eq(v->dtype, c->dtype))
        c->flags |= REFIT_CKPT_CAST;
    if (gptq) {
        c->route = REFIT_ROUTE_VIEW;
        c->place = swapped(v, v->dtype);
    } else {
        c->route = REFIT_ROUTE_DIRECT;
    }
    return REFIT_OK;
}

static int check_u8_weight(const refit_host_v2 *h, const refit_fmt_module *m,
                           const int4_state *s)
{
    const refit_view *v = &refit_runtime(m, s->rt[RT_WEIGHT])->view;
    if (!is_dtype(v->dtype, REFIT_DTYPE_UINT, 8) || v->ndim != 2 || v->shape[0] != s->n ||
        v->shape[1] < 4 * s->words || v->shape[1] % 4 || v->strides[1] != 1 ||
        v->strides[0] % 4 || (uintptr_t)v->data % 4)
        return ERR(h, REFIT_EMISMATCH, "module %s: runtime weight must be U8 [%lld, P], P >= "
                   "%lld and a multiple of 4, bytes contiguous in a row, rows and data "
                   "4-byte aligned (layout u8)", m->name, (long long)s->n,
                   (long long)(4 * s->words));
    return REFIT_OK;
}

/* The u8 runtime's byte rows seen as the checkpoint's I32 words. */
static refit_view u8_words(const refit_view *v, const int4_state *s)
{
    refit_view w = *v;
    w.dtype = REFIT_I32;
    w.shape[1] = s->words;
    w.strides[0] = v->strides[0] / 4;
    return w;
}

/* u8 layout: an I32 view of the byte rows, so the words land unchanged. */
static int route_u8_weight(const refit_host_v2 *h, refit_fmt_module *m, int4_state *s)
{
    refit_fmt_ckpt *c = refit_ckpt(m, s->ck[R_PACKED]);
    const refit_fmt_runtime *rt = refit_runtime(m, s->rt[RT_WEIGHT]);
    const refit_view *v = &rt->view;
    if (c->target_index != s->rt[RT_WEIGHT])
        return ERR(h, REFIT_EINVAL, "module %s, tensor %s: its target must be runtime weight",
                   m->name, c->name);
    int rc = check_u8_weight(h, m, s);
    if (rc)
        return rc;
    c->place = u8_words(v, s);
    c->route = REFIT_ROUTE_VIEW;
    s->pitch = v->shape[1];
    return REFIT_OK;
}

static int route_gptq_weight(const refit_host_v2 *h, refit_fmt_module *m, int4_state *s)
{
    return route_tensor(h, m, s, R_PACKED, RT_WEIGHT, s->n, s->words, 0);
}

static int on_host(const refit_view *v)
{
    return v->device.device_type == REFIT_DEVICE_CPU ||
           v->device.device_type == REFIT_DEVICE_CUDA_HOST;
}

/* 1 when a backend of the host serves dev. */
static int served(const refit_host_v2 *h, refit_device dev)
{
    return refit_host_serves(h, dev);
}

/* 1 when this plugin carries its device code (quant_int4.cu). */
static int device_code(void)
{
#ifdef REFIT_INT4_DEVICE_CODE
    return 1;
#else
    return 0;
#endif
}

/* Post-load on a runtime outside host memory needs the host's services:
 * fetch (the weight_shape check), zero (the u8 pad), and for online
 * modules this plugin's device code and the GPU service. */
static int check_device(const refit_host_v2 *h, const refit_fmt_module *m, const int4_state *s,
                        int shape, int pad, int online)
{
    const refit_view *w = &refit_runtime(m, s->rt[RT_WEIGHT])->view;
    const refit_view *sc = &refit_runtime(m, s->rt[RT_SCALE])->view;
    if (on_host(w) && (!online || on_host(sc)))
        return REFIT_OK;
    if (online && (w->device.device_type != sc->device.device_type ||
                   w->device.device_id != sc->device.device_id))
        return ERR(h, REFIT_EUNSUPPORTED, "module %s: runtime weight and weight_scale are on "
                   "different devices; online int4 writes both in one place", m->name);
    const char *missing = !served(h, w->device) ? "a backend serving its device"
                          : shape && !(REFIT_HOST_HAS(h, fetch) && h->fetch) ? "the fetch service"
                          : pad && !(REFIT_HOST_HAS(h, zero) && h->zero) ? "the zero service"
                          : online && !device_code() ? "this plugin's device code (built "
                                                       "without nvcc)" : NULL;
    if (missing)
        return ERR(h, REFIT_EUNSUPPORTED, "module %s: format int4's post-load on device type %d "
                   "needs %s, which this host lacks", m->name, w->device.device_type, missing);
    return REFIT_OK;
}

static int int4_plan_routes(const refit_host_v2 *h, refit_fmt_module *m, int4_state *s)
{
    int rc = s->layout == LAYOUT_GPTQ ? route_gptq_weight(h, m, s) : route_u8_weight(h, m, s);
    if (!rc)
        rc = route_tensor(h, m, s, R_SCALE, RT_SCALE, s->n, s->groups, 1);
    if (!rc && s->ck[R_ZP] >= 0)
        rc = route_tensor(h, m, s, R_ZP, RT_ZP, refit_ckpt(m, s->ck[R_ZP])->shape[0], s->groups, 0);
    if (rc)
        return rc;
    m->flags = REFIT_MODULE_WHOLE;
    int pad = s->layout == LAYOUT_U8 && s->pitch > 4 * s->words;
    if (s->ck[R_SHAPE] >= 0 || pad) {
        /* post-load only reads the staged weight_shape: it may be the
         * caller's bytes */
        m->flags |= REFIT_MODULE_POST_LOAD | REFIT_MODULE_STAGED_IN_PLACE;
        int rc2 = check_device(h, m, s, s->ck[R_SHAPE] >= 0, pad, 0);
        if (rc2)
            return rc2;
    }
    if (s->ck[R_SHAPE] >= 0)
        refit_ckpt(m, s->ck[R_SHAPE])->route = REFIT_ROUTE_STAGED;
    return REFIT_OK;
}

/* Online: the float weight's slice, the runtime tensors it is quantized
 * into, and a K shard that starts and ends on whole groups and words. */
static int plan_online(const refit_host_v2 *h, refit_fmt_module *m, int4_state *s)
{
    refit_fmt_ckpt *c = refit_ckpt(m, s->ck[R_WEIGHT]);
    if (!is_float(c->dtype) || c->ndim != 2)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: an online int4 weight is "
                   "F32/F16/BF16 [N, K], not %s with %d dims", m->name, c->name,
                   dt_name(c->dtype), c->ndim);
    if (c->target_index != s->rt[RT_WEIGHT])
        return ERR(h, REFIT_EINVAL, "module %s, tensor %s: its target must be runtime weight",
                   m->name, c->name);
    s->n = c->shape[0];
    s->k = c->shape[1];
    s->words = (s->k + 7) / 8;
    s->groups = s->group ? (s->k + s->group - 1) / s->group : 1;
    int64_t full_k = c->full_shape[1];
    if ((s->in_features && full_k != s->in_features) ||
        (s->out_features && c->full_shape[0] != s->out_features))
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: [%lld, %lld] disagrees with params "
                   "out_features/in_features", m->name, c->name, (long long)c->full_shape[0],
                   (long long)full_k);
    if (c->split_dim == 1 && s->k != full_k) {
        /* a row-parallel shard quantizes its own columns: only whole
         * groups (and whole words) give the bytes the whole matrix gives */
        int64_t step = s->group; /* the least multiple of both group and 8 */
        while (step && step % 8)
            step += s->group;
        if (!s->group || c->slice_lo % step || (c->slice_hi != full_k && c->slice_hi % step))
            return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: columns [%lld, %lld) of %lld: "
                       "a shard boundary cuts a group (shard K only at multiples of %lld%s)",
                       m->name, c->name, (long long)c->slice_lo, (long long)c->slice_hi,
                       (long long)full_k, (long long)(s->group ? step : full_k),
                       s->group ? "" : "; one scale per row needs the whole row");
    }
    const refit_fmt_runtime *rw = refit_runtime(m, s->rt[RT_WEIGHT]), *rs = refit_runtime(m, s->rt[RT_SCALE]);
    int gptq = s->layout == LAYOUT_GPTQ;
    if (gptq && (!is_dtype(rw->view.dtype, REFIT_DTYPE_INT, 32) ||
                 !runtime_is(&rw->view, s->words, s->n)))
        return ERR(h, REFIT_EMISMATCH, "module %s: runtime weight must be I32 [%lld, %lld] for "
                   "layout gptq (it is %s with %d dims)", m->name, (long long)s->words,
                   (long long)s->n, dt_name(rw->view.dtype), rw->view.ndim);
    if (!gptq) {
        int rc = check_u8_weight(h, m, s);
        if (rc)
            return rc;
        s->pitch = rw->view.shape[1];
    }
    if (!is_float(rs->view.dtype) || !runtime_is(&rs->view, gptq ? s->groups : s->n,
                                                 gptq ? s->n : s->groups))
        return ERR(h, REFIT_EMISMATCH, "module %s: runtime weight_scale must be F32/F16/BF16 "
                   "[%lld, %lld] for layout %s (it is %s with %d dims)", m->name,
                   (long long)(gptq ? s->groups : s->n), (long long)(gptq ? s->n : s->groups),
                   gptq ? "gptq" : "u8", dt_name(rs->view.dtype), rs->view.ndim);
    c->route = REFIT_ROUTE_STAGED;
    /* a scale (and zero point) per group of G along a row: a band of rows
     * quantizes alone; in layout u8 the runtime rows are the staged rows,
     * gptq packs them along dim 1, so there a change rebuilds the tensor */
    if (REFIT_ELEM_HAS(m->ckpt_stride, refit_fmt_ckpt, group))
        c->group = (refit_quant_group){1, s->group, REFIT_GROUP_DECLARED |
                                       (gptq ? 0u : REFIT_GROUP_ROW_SLICES |
                                                    REFIT_GROUP_RUNTIME_ROWS)};
    /* the quantizer (reference and kernels) only reads the staged weight:
     * it may be the caller's bytes */
    m->flags = REFIT_MODULE_WHOLE | REFIT_MODULE_POST_LOAD | REFIT_MODULE_STAGED_IN_PLACE;
    return check_device(h, m, s, 0, !gptq && s->pitch > 4 * s->words, 1);
}

static int int4_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    int4_state s;
    memset(&s, 0, sizeof s);
    int rc = read_params(h, m, &s);
    if (!rc)
        rc = find_roles(h, m, &s);
    if (!rc && s.online)
        rc = plan_online(h, m, &s);
    if (!rc && !s.online)
        rc = check_ckpt(h, m, &s);
    if (!rc && !s.online)
        rc = int4_plan_routes(h, m, &s);
    if (rc)
        return rc;
    int4_state *keep = h->mem_alloc(h->host, sizeof *keep);
    if (!keep)
        return ERR(h, REFIT_ENOMEM, "module %s: out of memory", m->name);
    *keep = s;
    m->state = keep;
    return REFIT_OK;
}

static void int4_release(const refit_host_v2 *h, refit_fmt_module *m)
{
    h->mem_free(h->host, m->state);
    m->state = NULL;
}

static int64_t load_int(const refit_view *v, int64_t i)
{
    const char *p = (const char *)v->data + i * v->strides[0] * (v->dtype.bits / 8);
    if (v->dtype.bits == 64) {
        int64_t x;
        memcpy(&x, p, 8);
        return x;
    }
    int32_t x;
    memcpy(&x, p, 4);
    return x;
}

/* The checkpoint's (N, K) must describe the slices the plan was built for:
 * a whole extent may end in a ragged group, a shard must not cut one. */
/* The two values of a weight_shape whose bytes are at raw, host memory. */
static void shape_values(const refit_fmt_ckpt *c, const void *raw, int64_t nk[2])
{
    refit_view one = c->staged;
    one.data = (void *)raw;
    one.device = (refit_device){REFIT_DEVICE_CPU, 0};
    one.strides[0] = 1;
    for (int i = 0; i < 2; i++)
        nk[i] = load_int(&one, i);
}

static int check_shape_values(const refit_host_v2 *h, const refit_fmt_module *m,
                              const int4_state *s, const int64_t nk[2]);

static int check_shape(const refit_host_v2 *h, const refit_fmt_module *m, const int4_state *s,
                       void *stream)
{
    const refit_fmt_ckpt *c = refit_ckpt(m, s->ck[R_SHAPE]);
    int64_t nk[2];
    if (on_host(&c->staged)) {
        for (int i = 0; i < 2; i++)
            nk[i] = load_int(&c->staged, i);
    } else { /* staged on the device: its two values come back (checked at seal) */
        char raw[16];
        int rc = h->fetch(h->host, raw, 2 * (size_t)(c->staged.dtype.bits / 8), &c->staged,
                          stream);
        if (rc)
            return rc;
        shape_values(c, raw, nk);
    }
    return check_shape_values(h, m, s, nk);
}

static int check_shape_values(const refit_host_v2 *h, const refit_fmt_module *m,
                              const int4_state *s, const int64_t nk[2])
{
    const refit_fmt_ckpt *c = refit_ckpt(m, s->ck[R_SHAPE]);
    if (nk[0] <= 0 || nk[1] <= 0 || (s->in_features && nk[1] != s->in_features) ||
        (s->out_features && nk[0] != s->out_features))
        return ERR(h, REFIT_ECORRUPT, "module %s, tensor %s: shape (%lld, %lld) disagrees with "
                   "the module's params", m->name, c->name, (long long)nk[0], (long long)nk[1]);
    kern_q4_split sp = s->group ? kern_q4_split_check(s->words, 8, s->groups, s->group, nk[1])
                                : (s->words <= (nk[1] + 7) / 8 ? KERN_Q4_SPLIT_OK
                                                               : KERN_Q4_SPLIT_MISMATCH);
    if (!sp && s->n > nk[0])
        sp = KERN_Q4_SPLIT_MISMATCH;
    if (!sp && s->ck[R_ZP] >= 0)
        sp = kern_q4_split_check(refit_ckpt(m, s->ck[R_ZP])->shape[0], 8, s->n, 1, nk[0]);
    if (sp)
        return ERR(h, REFIT_ECORRUPT, "module %s, tensor %s: shape (%lld, %lld) does not fit "
                   "this rank's %lld rows, %lld words and %lld groups of %lld%s", m->name,
                   c->name, (long long)nk[0], (long long)nk[1], (long long)s->n,
                   (long long)s->words, (long long)s->groups, (long long)s->group,
                   sp == KERN_Q4_SPLIT_CUT ? " (a shard boundary cuts a group)" : "");
    return REFIT_OK;
}

/* u8 layout: bytes past the words of each row are padding, zero at every
 * load (a write only; nothing of the runtime is read): the host's zero
 * service on the pad columns, a strided view, wherever they live. */
static int zero_pad(const refit_host_v2 *h, const refit_fmt_module *m, const int4_state *s,
                    void *stream)
{
    const refit_view *v = &refit_runtime(m, s->rt[RT_WEIGHT])->view;
    if (REFIT_HOST_HAS(h, zero) && h->zero) {
        refit_view pad = *v;
        pad.data = (char *)v->data + 4 * s->words;
        pad.shape[1] = s->pitch - 4 * s->words;
        return h->zero(h->host, &pad, stream);
    }
    for (int64_t i = 0; i < s->n; i++) /* an older host: host memory (checked at seal) */
        memset((char *)v->data + i * v->strides[0] + 4 * s->words, 0,
               (size_t)(s->pitch - 4 * s->words));
    return REFIT_OK;
}

/* Online: the runtime words and scales of module m seen in checkpoint
 * layout, as the quantizer writes them. */
static void quant_views(const refit_fmt_module *m, const int4_state *s, refit_view *q,
                        refit_view *sc)
{
    const refit_view *w = &refit_runtime(m, s->rt[RT_WEIGHT])->view;
    const refit_view *sv = &refit_runtime(m, s->rt[RT_SCALE])->view;
    if (s->layout == LAYOUT_GPTQ) {
        *q = swapped(w, w->dtype);
        *sc = swapped(sv, sv->dtype);
    } else {
        *q = u8_words(w, s);
        *sc = *sv;
    }
}

/* Online on host memory: the reference linked here. */
static int quantize_here(const refit_host_v2 *h, const refit_fmt_module *m, const int4_state *s)
{
    const refit_fmt_ckpt *c = refit_ckpt(m, s->ck[R_WEIGHT]);
    refit_view q, sc;
    quant_views(m, s, &q, &sc);
    int rc = kern_quant_int4(&q, &sc, &c->staged, s->group);
    if (rc == REFIT_ECORRUPT)
        return ERR(h, rc, "module %s, tensor %s: NaN or infinity in the weight, or a group whose "
                   "scale is past the scale dtype's range; refusing to quantize it", m->name,
                   c->name);
    if (rc)
        return ERR(h, rc, "module %s, tensor %s: quantization refused the views (%d)", m->name,
                   c->name, rc);
    return REFIT_OK;
}

/* What post-load does after (or instead of) quantizing: the weight_shape
 * check, the u8 row pad. */
static int finish(const refit_host_v2 *h, const refit_fmt_module *m, const int4_state *s,
                  void *stream)
{
    int rc = REFIT_OK;
    if (!s->online && s->ck[R_SHAPE] >= 0 && !s->shape_checked)
        rc = check_shape(h, m, s, stream);
    ((int4_state *)m->state)->shape_checked = 0;
    if (!rc && s->layout == LAYOUT_U8 && s->pitch > 4 * s->words)
        rc = zero_pad(h, m, s, stream);
    return rc;
}

/* 1 when m's post-load quantizes on a device. */
static int quantizes_on_device(const refit_fmt_module *m)
{
    const int4_state *s = m->state;
    return s->online && !on_host(&refit_runtime(m, s->rt[RT_WEIGHT])->view);
}

#ifdef REFIT_INT4_DEVICE_CODE
/* Device and group size equal: one launcher call can take both. */
static int same_group(const refit_fmt_module *a, const refit_fmt_module *b)
{
    const int4_state *sa = a->state, *sb = b->state;
    refit_device da = refit_runtime(a, sa->rt[RT_WEIGHT])->view.device;
    refit_device db = refit_runtime(b, sb->rt[RT_WEIGHT])->view.device;
    return da.device_type == db.device_type && da.device_id == db.device_id &&
           sa->group == sb->group;
}

static const char nan_what[] = "NaN or infinity in the weight, or a group whose scale is past "
                               "the scale dtype's range; refusing to quantize it";

/* The launcher over n pieces (piece i: the weight of module mods[i]) of
 * one device and group size, through the host's GPU service: one status
 * word names the module and tensor of a bad piece. */
static int launch_pieces(const refit_host_v2 *h, uint32_t n, const refit_fmt_module *const *mods,
                         const refit_view *q, const refit_view *sc, const refit_view *x,
                         const char *const *names, int64_t group, void *stream)
{
    refit_pgpu_host g;
    int rc = n == 1 ? refit_pgpu_host_init(&g, h, mods[0], q[0].device, stream, int4_image,
                                           int4_image_size, 1, names, nan_what)
                    : refit_pgpu_host_init_many(&g, h, q[0].device, stream, int4_image,
                                                int4_image_size, n, mods, names, nan_what);
    int32_t bad = -1;
    if (!rc && (rc = int4_launch(&g.g, n, q, sc, x, group, &bad)) && g.g.msg[0])
        return ERR(h, rc, "module %s, tensor %s: %s", mods[bad >= 0 ? bad : 0]->name,
                   names[bad >= 0 ? bad : 0], g.g.msg);
    return rc;
}
#endif

/* The online modules of mods[lead .. n) not done yet on the device and
 * with the group size of mods[lead] (the launcher takes one group size a
 * call), quantized in one call of the launcher, then their pads zeroed;
 * done[] marks them. A host without status_word_many: one call a module.
 * Never waits (the status word names the tensor at finalize). */
static int quantize_device(const refit_host_v2 *h, const refit_fmt_module *const *mods,
                           uint32_t n, uint32_t lead, unsigned char *done, void *stream,
                           void *arg)
{
    (void)arg;
#ifdef REFIT_INT4_DEVICE_CODE
    uint32_t cap = 0;
    for (uint32_t k = lead; k < n; k++)
        if (!done[k] && quantizes_on_device(mods[k]) && same_group(mods[k], mods[lead])) {
            done[k] = 2; /* this group's */
            cap++;
        }
    refit_view *v = h->mem_alloc(h->host, (3 * sizeof *v + 2 * sizeof(void *)) * cap);
    if (!v)
        return ERR(h, REFIT_ENOMEM, "module %s: out of memory", mods[lead]->name);
    refit_view *q = v, *sc = v + cap, *x = v + 2 * cap;
    const char **names = (const char **)(void *)(v + 3 * cap);
    const refit_fmt_module **of = (const refit_fmt_module **)(void *)(names + cap);
    uint32_t np = 0;
    for (uint32_t k = lead; k < n; k++) {
        if (done[k] != 2)
            continue;
        const int4_state *s = mods[k]->state;
        const refit_fmt_ckpt *c = refit_ckpt(mods[k], s->ck[R_WEIGHT]);
        quant_views(mods[k], s, &q[np], &sc[np]);
        x[np] = c->staged;
        names[np] = c->name;
        of[np++] = mods[k];
    }
    int64_t group = ((const int4_state *)mods[lead]->state)->group;
    int rc = REFIT_OK;
    if (np > 1 && !REFIT_HOST_HAS(h, status_word_many))
        for (uint32_t i = 0; i < np && !rc; i++)
            rc = launch_pieces(h, 1, of + i, q + i, sc + i, x + i, names + i, group, stream);
    else
        rc = launch_pieces(h, np, of, q, sc, x, names, group, stream);
    for (uint32_t k = lead; k < n && !rc; k++)
        if (done[k] == 2) {
            done[k] = 1;
            rc = finish(h, mods[k], mods[k]->state, stream);
        }
    h->mem_free(h->host, v);
    return rc;
#else
    (void)n, (void)done, (void)stream;
    const int4_state *s = mods[lead]->state;
    return ERR(h, REFIT_EUNSUPPORTED, "module %s: int4 was built without its device code "
               "(no nvcc), so it cannot run on device type %d", mods[lead]->name,
               refit_runtime(mods[lead], s->rt[RT_WEIGHT])->view.device.device_type);
#endif
}

/* Not quantized on a device: online, the reference here; then finish. */
static int post_load_one(const refit_host_v2 *h, const refit_fmt_module *m, void *stream,
                         void *arg)
{
    (void)arg;
    const int4_state *s = m->state;
    int rc = s->online ? quantize_here(h, m, s) : REFIT_OK;
    return rc ? rc : finish(h, m, s, stream);
}

static int int4_where(const refit_fmt_module *m, void *arg)
{
    (void)arg;
    return quantizes_on_device(m) ? REFIT_SDK_GROUP_LEAD : REFIT_SDK_GROUP_ONE;
}

static const refit_sdk_group_ops int4_groups = {int4_where, quantize_device, post_load_one};

/* Modules in call order. Online on a CUDA device: one launcher call for
 * each (device, group size) among them (the device code is checked at
 * seal); online on host memory: the reference, a bad module stopping the
 * call (REFIT_ECORRUPT, its message). Then each module's weight_shape
 * check and u8 pad. */
/* 1 when m's weight_shape is staged on a device (read back to check it). */
static int shape_on_device(const refit_fmt_module *m)
{
    const int4_state *s = m->state;
    return !s->online && s->ck[R_SHAPE] >= 0 && !on_host(&refit_ckpt(m, s->ck[R_SHAPE])->staged);
}

/* Whether a's and b's weight_shape are staged on one device. */
static int same_device(const refit_fmt_module *a, const refit_fmt_module *b)
{
    refit_device da = refit_ckpt(a, ((const int4_state *)a->state)->ck[R_SHAPE])->staged.device;
    refit_device db = refit_ckpt(b, ((const int4_state *)b->state)->ck[R_SHAPE])->staged.device;
    return da.device_type == db.device_type && da.device_id == db.device_id;
}

static void shapes_unchecked(const refit_fmt_module *const *mods, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++)
        ((int4_state *)mods[k]->state)->shape_checked = 0;
}

/* The weight_shape of every module of one call staged on the device of
 * the first such module, checked with one read back: each [2] is copied
 * into one scratch there, which comes back in one fetch. A fetch waits
 * for the stream, so a call of thousands of expert modules waits once,
 * not once a module. Fewer than two, or no scratch: finish reads each. */
static int check_shapes_at_once(const refit_host_v2 *h, const refit_fmt_module *const *mods,
                                uint32_t n, void *stream)
{
    uint32_t first = n, cnt = 0;
    for (uint32_t k = 0; k < n; k++)
        if (shape_on_device(mods[k]) && (first == n || same_device(mods[k], mods[first]))) {
            first = first == n ? k : first;
            cnt++;
        }
    if (cnt < 2)
        return REFIT_OK;
    refit_device dev = refit_ckpt(mods[first], ((const int4_state *)mods[first]->state)
                                                   ->ck[R_SHAPE])->staged.device;
    char *dbuf = h->scratch(h->host, dev, 16 * (size_t)cnt);
    unsigned char *raw = h->mem_alloc(h->host, 16 * (size_t)cnt);
    int rc = REFIT_OK;
    uint32_t i = 0;
    for (uint32_t k = first; k < n && dbuf && raw && !rc; k++) {
        if (!shape_on_device(mods[k]) || !same_device(mods[k], mods[first]))
            continue;
        const refit_fmt_ckpt *c = refit_ckpt(mods[k], ((const int4_state *)mods[k]->state)
                                                          ->ck[R_SHAPE]);
        refit_view dst = c->staged;
        dst.data = dbuf + 16 * (size_t)i++;
        dst.strides[0] = 1;
        rc = h->copy(h->host, &dst, &c->staged, stream);
    }
    if (dbuf && raw && !rc) {
        refit_view all = {.data = dbuf, .device = dev, .dtype = {REFIT_DTYPE_UINT, 8, 1},
                          .ndim = 1, .shape = {16 * (int64_t)cnt}, .strides = {1}};
        rc = h->fetch(h->host, raw, 16 * (size_t)cnt, &all, stream);
    }
    i = 0;
    for (uint32_t k = first; k < n && dbuf && raw && !rc; k++) {
        if (!shape_on_device(mods[k]) || !same_device(mods[k], mods[first]))
            continue;
        int4_state *s = (int4_state *)mods[k]->state;
        int64_t nk[2];
        shape_values(refit_ckpt(mods[k], s->ck[R_SHAPE]), raw + 16 * (size_t)i++, nk);
        rc = check_shape_values(h, mods[k], s, nk);
        s->shape_checked = !rc;
    }
    if (raw)
        h->mem_free(h->host, raw);
    if (rc)
        shapes_unchecked(mods, n);
    return rc; /* no scratch or host memory: finish reads each one */
}

static int int4_post_load_many(const refit_host_v2 *h, const refit_fmt_module *const *mods,
                               uint32_t n, void *stream)
{
    int rc = check_shapes_at_once(h, mods, n, stream);
    if (!rc)
        rc = refit_sdk_post_load_groups(h, mods, n, stream, &int4_groups, NULL);
    if (rc)
        shapes_unchecked(mods, n);
    return rc;
}

static int int4_post_load(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    return int4_post_load_many(h, &m, 1, stream);
}

REFIT_PLUGIN_EXPORT const refit_format_v2 refit_format_plugin_v2 = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "int4",
    .plan = int4_plan,
    .post_load = int4_post_load,
    .release = int4_release,
#ifdef REFIT_PLUGIN_MIN_CC /* device code built: none of it below this */
    .min_compute_capability = REFIT_PLUGIN_MIN_CC,
#endif
    .post_load_many = int4_post_load_many,
};
