/* Helpers shared by the fp8, int8 and mxfp8 format plugins (one private
 * header, included by each plugin's single source file: every plugin is
 * its own shared module, so these are static). Names, dtypes, params,
 * layouts, and where an online weight landed in its runtime tensor. */
#ifndef REFIT_PLUGINS_FP8_QPLUG_H
#define REFIT_PLUGINS_FP8_QPLUG_H

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <refit/format.h>

#ifndef REFIT_PLUGIN_EXPORT
#define REFIT_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

#define ERR(h, st, ...) ((h)->error((h)->host, (st), __VA_ARGS__))

static inline const char *suffix(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

static inline size_t prefix_len(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? (size_t)(dot - name) : 0;
}

static inline int same_prefix(const char *a, const char *b)
{
    size_t n = prefix_len(a);
    return n == prefix_len(b) && !strncmp(a, b, n);
}

static inline int is_e4m3(refit_dtype d)
{
    return d.code == REFIT_DTYPE_FLOAT8_E4M3FN && d.bits == 8 && d.lanes == 1;
}

static inline int is_f32(refit_dtype d)
{
    return d.code == REFIT_DTYPE_FLOAT && d.bits == 32 && d.lanes == 1;
}

/* Dtype names for messages (refit_dtype_name is a core symbol; a plugin
 * links none). */
static inline const char *dt_name(refit_dtype d)
{
    switch (d.code) {
    case REFIT_DTYPE_FLOAT:
        return d.bits == 32 ? "f32" : d.bits == 16 ? "f16" : d.bits == 64 ? "f64" : "float";
    case REFIT_DTYPE_BFLOAT:
        return "bf16";
    case REFIT_DTYPE_INT:
        return d.bits == 8 ? "i8" : d.bits == 32 ? "i32" : "int";
    case REFIT_DTYPE_UINT:
        return d.bits == 8 ? "u8" : "uint";
    case REFIT_DTYPE_FLOAT8_E4M3FN:
        return "f8_e4m3";
    case REFIT_DTYPE_FLOAT8_E5M2:
        return "f8_e5m2";
    case REFIT_DTYPE_FLOAT8_E8M0FNU:
        return "f8_e8m0";
    default:
        return "an unsupported dtype";
    }
}

static inline int64_t numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

static inline int find_runtime(const refit_fmt_module *m, const char *name)
{
    for (uint32_t i = 0; i < m->n_runtime; i++)
        if (!strcmp(refit_runtime(m, i)->name, name))
            return (int)i;
    return -1;
}

/* A non-negative integer param, 0 when absent. */
static inline int int_param(const refit_host_v2 *h, const refit_fmt_module *m, const char *key,
                            int64_t *out)
{
    const char *v = h->param(h->host, m, key);
    *out = 0;
    if (!v)
        return REFIT_OK;
    char *end;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || x < 0)
        return ERR(h, REFIT_EINVAL, "module %s: param %s must be a non-negative integer, not "
                   "'%s'", m->name, key, v);
    *out = x;
    return REFIT_OK;
}

/* -1 absent, 0 false, 1 true (true/yes/on/1, false/no/off/0, any case). */
static inline int bool_param(const refit_host_v2 *h, const refit_fmt_module *m, const char *key,
                             int *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no",
                                                                                "off", "0"};
    const char *v = h->param(h->host, m, key);
    *out = -1;
    if (!v)
        return REFIT_OK;
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, yes[i]))
            *out = 1;
        if (!strcasecmp(v, no[i]))
            *out = 0;
    }
    if (*out < 0)
        return ERR(h, REFIT_EINVAL, "module %s: param %s must be true or false, not '%s'",
                   m->name, key, v);
    return REFIT_OK;
}

/* 1 whole, -1 a shard, 0 unknown: how this rank's extent `have` relates
 * to a declared unsharded extent `full` (0 = undeclared). */
static inline int wholeness(int64_t have, int64_t full)
{
    return full == 0 ? 0 : have == full ? 1 : -1;
}

static inline int row_major(const refit_view *v)
{
    int64_t st = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[i] != 1 && v->strides[i] != st)
            return 0;
        st *= v->shape[i];
    }
    return 1;
}

static inline int host_memory(refit_device d)
{
    return d.device_type == REFIT_DEVICE_CPU || d.device_type == REFIT_DEVICE_CUDA_HOST;
}

/* Where one weight landed in the runtime weight: expert and first row. */
typedef struct shard {
    uint32_t ck;
    int64_t e, row;
} shard;

static inline int shard_cmp(const void *a, const void *b)
{
    const shard *x = a, *y = b;
    if (x->e != y->e)
        return x->e < y->e ? -1 : 1;
    if (x->row != y->row)
        return x->row < y->row ? -1 : 1;
    return x->ck < y->ck ? -1 : x->ck > y->ck;
}

/* Decompose the offset of ckpt ck's place in the (row-major) runtime
 * weight into (expert, row); it must cover whole rows. */
static inline int locate(const refit_host_v2 *h, const refit_fmt_module *m, int rt_weight,
                         uint32_t ck, shard *out)
{
    const refit_view *rt = &refit_runtime(m, rt_weight)->view;
    const refit_fmt_ckpt *c = refit_ckpt(m, ck);
    int64_t n = rt->shape[rt->ndim - 2], k = rt->shape[rt->ndim - 1];
    int64_t off = c->place.data ? (int64_t)((const char *)c->place.data - (const char *)rt->data)
                                : -1;
    if (off < 0 || c->place.ndim != 2 || c->place.shape[1] != k ||
        (c->place.shape[0] > 1 && c->place.strides[0] != k) || (k && off % k))
        return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: its place in runtime weight is not "
                   "whole rows of it (online quantization stacks fused weights along N)", m->name,
                   c->name);
    int64_t row = k ? off / k : 0;
    out->ck = ck;
    out->e = n ? row / n : 0;
    out->row = n ? row % n : 0;
    return REFIT_OK;
}

/* Declare the quantization group of online weight c (a host of this ABI
 * whose elements predate the member is told nothing: patches stay refused). */
static inline void declare_group(const refit_fmt_module *m, refit_fmt_ckpt *c, int64_t rows,
                                 int64_t cols, uint32_t flags)
{
    if (REFIT_ELEM_HAS(m->ckpt_stride, refit_fmt_ckpt, group))
        c->group = (refit_quant_group){rows, cols, REFIT_GROUP_DECLARED | flags};
}

static inline int corrupt(const refit_host_v2 *h, const refit_fmt_module *m, uint32_t ck)
{
    return ERR(h, REFIT_ECORRUPT, "module %s, tensor %s: NaN or infinity in the weight; "
               "refusing to quantize it", m->name, refit_ckpt(m, ck)->name);
}

/* A weight of an E4M3 format (fp8, mxfp8): 2-D, serialized f8_e4m3 or
 * online bf16/f16/f32; counts which. Errors name module, tensor, format. */
static inline int e4m3_weight(const refit_host_v2 *h, const refit_fmt_module *m,
                              const refit_fmt_ckpt *c, const char *fmt, int *n_e4m3,
                              int *n_float)
{
    if (c->ndim != 2)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: a weight is 2-D [N, K], not "
                   "%d-D", m->name, c->name, c->ndim);
    if (is_e4m3(c->dtype))
        (*n_e4m3)++;
    else if (kern_is_float_dtype(c->dtype))
        (*n_float)++;
    else
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: an %s weight is f8_e4m3 "
                   "(serialized) or bf16/f16/f32 (online), not %s", m->name, c->name, fmt,
                   dt_name(c->dtype));
    return REFIT_OK;
}

/* After every weight was seen: at least one, and not both kinds. */
static inline int e4m3_weights_done(const refit_host_v2 *h, const refit_fmt_module *m,
                                    const char *fmt, int n_weights, int n_e4m3, int n_float)
{
    if (n_weights == 0)
        return ERR(h, REFIT_EFORMAT, "module %s: format %s needs a W.weight", m->name, fmt);
    if (n_e4m3 && n_float)
        return ERR(h, REFIT_EMISMATCH, "module %s: weights mix f8_e4m3 and float dtypes",
                   m->name);
    return REFIT_OK;
}

#endif
