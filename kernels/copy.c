/* Strided copy with casts on the host. Dimensions are first coalesced, so
 * contiguous tensors become one memcpy and row-strided ones one per row. */
#include <string.h>

#include "cast.h"
#include "copy.h"

static int is_float16ish(refit_dtype d)
{
    return d.lanes == 1 && ((d.code == REFIT_DTYPE_FLOAT && (d.bits == 16 || d.bits == 32)) ||
                            (d.code == REFIT_DTYPE_BFLOAT && d.bits == 16));
}

int kern_can_cast(refit_dtype dst, refit_dtype src)
{
    if (kern_dtype_eq(dst, src))
        return kern_dtype_size(dst) != 0;
    return is_float16ish(dst) && is_float16ish(src);
}

int64_t kern_view_numel(const refit_view *v)
{
    int64_t n = 1;
    for (int i = 0; i < v->ndim; i++)
        n *= v->shape[i];
    return n;
}

/* A walk over up to REFIT_MAX_DIMS dims for two views at once. */
typedef struct walk {
    int nd;
    int64_t shape[REFIT_MAX_DIMS];
    int64_t ds[REFIT_MAX_DIMS]; /* dst strides, bytes */
    int64_t ss[REFIT_MAX_DIMS]; /* src strides, bytes */
} walk;

/* Drop size-1 dims and merge dims that are contiguous in both views. */
static void walk_init(walk *w, const refit_view *dst, const refit_view *src,
                      size_t de, size_t se)
{
    w->nd = 0;
    for (int i = 0; i < dst->ndim; i++) {
        if (dst->shape[i] == 1)
            continue;
        int64_t d = dst->strides[i] * (int64_t)de;
        int64_t s = src ? src->strides[i] * (int64_t)se : 0;
        int k = w->nd - 1;
        if (k >= 0 && w->ds[k] == d * dst->shape[i] &&
            (!src || w->ss[k] == s * dst->shape[i])) {
            w->shape[k] *= dst->shape[i];
            w->ds[k] = d;
            w->ss[k] = s;
            continue;
        }
        w->shape[w->nd] = dst->shape[i];
        w->ds[w->nd] = d;
        w->ss[w->nd] = s;
        w->nd++;
    }
    if (w->nd == 0) { /* a scalar or all size-1 */
        w->nd = 1;
        w->shape[0] = 1;
        w->ds[0] = (int64_t)de;
        w->ss[0] = (int64_t)se;
    }
}

typedef void (*row_fn)(char *d, const char *s, int64_t n, int64_t ds, int64_t ss);

static void row_memcpy(char *d, const char *s, int64_t n, int64_t ds, int64_t ss)
{
    (void)ss;
    memcpy(d, s, (size_t)(n * ds));
}

#define ROW_STRIDED(name, T)                                                  \
    static void name(char *d, const char *s, int64_t n, int64_t ds, int64_t ss) \
    {                                                                         \
        for (int64_t i = 0; i < n; i++, d += ds, s += ss)                     \
            memcpy(d, s, sizeof(T));                                          \
    }
ROW_STRIDED(row_copy1, uint8_t)
ROW_STRIDED(row_copy2, uint16_t)
ROW_STRIDED(row_copy4, uint32_t)
ROW_STRIDED(row_copy8, uint64_t)

static float ld_f32(const char *p) { float f; memcpy(&f, p, 4); return f; }
static float ld_f16(const char *p) { uint16_t h; memcpy(&h, p, 2); return kern_f16_to_f32(h); }
static float ld_bf16(const char *p) { uint16_t h; memcpy(&h, p, 2); return kern_bf16_to_f32(h); }
static void st_f32(char *p, float f) { memcpy(p, &f, 4); }
static void st_f16(char *p, float f) { uint16_t h = kern_f32_to_f16(f); memcpy(p, &h, 2); }
static void st_bf16(char *p, float f) { uint16_t h = kern_f32_to_bf16(f); memcpy(p, &h, 2); }

#define ROW_CAST(name, LD, ST)                                                \
    static void name(char *d, const char *s, int64_t n, int64_t ds, int64_t ss) \
    {                                                                         \
        for (int64_t i = 0; i < n; i++, d += ds, s += ss)                     \
            ST(d, LD(s));                                                     \
    }
ROW_CAST(row_f32_f16, ld_f16, st_f32)
ROW_CAST(row_f32_bf16, ld_bf16, st_f32)
ROW_CAST(row_f16_f32, ld_f32, st_f16)
ROW_CAST(row_f16_bf16, ld_bf16, st_f16)
ROW_CAST(row_bf16_f32, ld_f32, st_bf16)
ROW_CAST(row_bf16_f16, ld_f16, st_bf16)

/* 0 = f32, 1 = f16, 2 = bf16 */
static int float_kind(refit_dtype d)
{
    if (d.code == REFIT_DTYPE_BFLOAT)
        return 2;
    return d.bits == 32 ? 0 : 1;
}

static row_fn pick_row(refit_dtype dst, refit_dtype src, const walk *w, size_t e)
{
    static const row_fn casts[3][3] = {
        {NULL, row_f32_f16, row_f32_bf16},
        {row_f16_f32, NULL, row_f16_bf16},
        {row_bf16_f32, row_bf16_f16, NULL},
    };
    if (!kern_dtype_eq(dst, src))
        return casts[float_kind(dst)][float_kind(src)];
    int inner = w->nd - 1;
    if (w->ds[inner] == (int64_t)e && w->ss[inner] == (int64_t)e)
        return row_memcpy;
    switch (e) {
    case 1: return row_copy1;
    case 2: return row_copy2;
    case 4: return row_copy4;
    case 8: return row_copy8;
    default: return NULL;
    }
}

/* Call fn for every innermost row, walking the outer dims odometer-style. */
static void walk_rows(const walk *w, char *d, const char *s, row_fn fn)
{
    int inner = w->nd - 1;
    int64_t idx[REFIT_MAX_DIMS] = {0};
    for (;;) {
        fn(d, s, w->shape[inner], w->ds[inner], w->ss[inner]);
        int k = inner - 1;
        for (; k >= 0; k--) {
            d += w->ds[k];
            s += w->ss[k];
            if (++idx[k] < w->shape[k])
                break;
            d -= w->ds[k] * w->shape[k];
            s -= w->ss[k] * w->shape[k];
            idx[k] = 0;
        }
        if (k < 0)
            return;
    }
}

/* Row-major with no gaps. */
static int is_contiguous(const refit_view *v)
{
    int64_t s = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[i] != 1 && v->strides[i] != s)
            return 0;
        s *= v->shape[i];
    }
    return 1;
}

int kern_copy(const refit_view *dst, const refit_view *src)
{
    if (dst->ndim != src->ndim)
        return REFIT_EMISMATCH;
    size_t de = kern_dtype_size(dst->dtype);
    if (de && kern_dtype_eq(dst->dtype, src->dtype) && is_contiguous(dst) &&
        is_contiguous(src)) { /* the common case: one memcpy */
        int64_t n = 1;
        for (int i = 0; i < dst->ndim; i++) {
            if (dst->shape[i] != src->shape[i])
                return REFIT_EMISMATCH;
            n *= dst->shape[i];
        }
        if (n > 0)
            memcpy(dst->data, src->data, (size_t)n * de);
        return REFIT_OK;
    }
    for (int i = 0; i < dst->ndim; i++)
        if (dst->shape[i] != src->shape[i])
            return REFIT_EMISMATCH;
    if (!kern_can_cast(dst->dtype, src->dtype))
        return REFIT_EUNSUPPORTED;
    if (kern_view_numel(dst) == 0)
        return REFIT_OK;
    size_t se = kern_dtype_size(src->dtype);
    walk w;
    walk_init(&w, dst, src, de, se);
    row_fn fn = pick_row(dst->dtype, src->dtype, &w, de);
    if (!fn)
        return REFIT_EUNSUPPORTED;
    walk_rows(&w, dst->data, src->data, fn);
    return REFIT_OK;
}

static void row_zero(char *d, const char *s, int64_t n, int64_t ds, int64_t ss)
{
    (void)s;
    (void)ss;
    memset(d, 0, (size_t)(n * ds));
}

/* Strided rows: the element size travels in ss, which a fill has no use for. */
static void row_zero_strided(char *d, const char *s, int64_t n, int64_t ds, int64_t es)
{
    (void)s;
    for (int64_t i = 0; i < n; i++, d += ds)
        memset(d, 0, (size_t)es);
}

int kern_zero(const refit_view *dst)
{
    size_t e = kern_dtype_size(dst->dtype);
    if (e == 0)
        return REFIT_EUNSUPPORTED;
    if (kern_view_numel(dst) == 0)
        return REFIT_OK;
    walk w;
    walk_init(&w, dst, NULL, e, 0);
    int inner = w.nd - 1;
    if (w.ds[inner] == (int64_t)e) {
        walk_rows(&w, dst->data, dst->data, row_zero); /* s unused */
    } else {
        w.ss[inner] = (int64_t)e;
        walk_rows(&w, dst->data, dst->data, row_zero_strided);
    }
    return REFIT_OK;
}
