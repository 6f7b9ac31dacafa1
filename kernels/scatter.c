/* The scatter on the host (kernels/scatter.h). Same dtype: typed loads and
 * stores of 1, 2, 4 or 8 bytes, a memcpy per contiguous run; a cast goes
 * through float, as kern_copy's does. */
#include <stdbool.h>
#include <string.h>

#include <refit/refit.h>

#include "cast.h"
#include "copy.h"
#include "scatter.h"

static float load_f(const char *p, refit_dtype t)
{
    uint16_t h;
    float f;
    if (t.bits == 32) {
        memcpy(&f, p, 4);
        return f;
    }
    memcpy(&h, p, 2);
    return t.code == REFIT_DTYPE_BFLOAT ? kern_bf16_to_f32(h) : kern_f16_to_f32(h);
}

static void store_f(char *p, refit_dtype t, float f)
{
    uint16_t h;
    if (t.bits == 32) {
        memcpy(p, &f, 4);
        return;
    }
    h = t.code == REFIT_DTYPE_BFLOAT ? kern_f32_to_bf16(f) : kern_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* Element by element, no runs, same dtype of T: the patch path's hot loop. */
#define SCATTER_ELEMS(name, T)                                                        \
    static void name(const kern_scatter *s)                                           \
    {                                                                                 \
        T *dst = (T *)(void *)s->dst, *old = s->old;                                  \
        const T *v = s->values;                                                       \
        int64_t vs = s->values_stride;                                                \
        for (size_t i = 0; i < s->n; i++) {                                           \
            int64_t o = s->off[i];                                                    \
            if (o < 0)                                                                \
                continue;                                                             \
            if (old)                                                                  \
                old[i] = dst[o];                                                      \
            dst[o] = v[(int64_t)i * vs];                                              \
        }                                                                             \
    }
SCATTER_ELEMS(elems8, uint8_t)
SCATTER_ELEMS(elems16, uint16_t)
SCATTER_ELEMS(elems32, uint32_t)
SCATTER_ELEMS(elems64, uint64_t)

/* One element (or run element) j of the values into dst element o. */
static void put(const kern_scatter *s, int64_t o, int64_t j, size_t de, size_t ve, bool same)
{
    char *d = s->dst + o * (int64_t)de;
    const char *v = (const char *)s->values + j * s->values_stride * (int64_t)ve;
    if (s->old)
        memcpy((char *)s->old + j * (int64_t)de, d, de);
    if (same)
        memcpy(d, v, de);
    else
        store_f(d, s->dst_dtype, load_f(v, s->values_dtype));
}

int kern_scatter_host(const kern_scatter *s)
{
    if (!kern_can_cast(s->dst_dtype, s->values_dtype))
        return REFIT_EUNSUPPORTED;
    size_t de = kern_dtype_size(s->dst_dtype), ve = kern_dtype_size(s->values_dtype);
    bool same = kern_dtype_eq(s->dst_dtype, s->values_dtype);
    if (!s->counts) {
        if (same && s->values_stride >= 1) {
            switch (de) {
            case 1: elems8(s); return REFIT_OK;
            case 2: elems16(s); return REFIT_OK;
            case 4: elems32(s); return REFIT_OK;
            case 8: elems64(s); return REFIT_OK;
            default: break;
            }
        }
        for (size_t i = 0; i < s->n; i++)
            if (s->off[i] >= 0)
                put(s, s->off[i], (int64_t)i, de, ve, same);
        return REFIT_OK;
    }
    int64_t j = 0; /* the run's first value */
    for (size_t i = 0; i < s->n; j += s->counts[i], i++) {
        int64_t o = s->off[i], c = s->counts[i];
        if (o < 0)
            continue;
        if (same && s->run_stride == 1 && s->values_stride == 1) {
            char *d = s->dst + o * (int64_t)de;
            if (s->old)
                memcpy((char *)s->old + j * (int64_t)de, d, (size_t)c * de);
            memcpy(d, (const char *)s->values + j * (int64_t)ve, (size_t)c * de);
            continue;
        }
        for (int64_t k = 0; k < c; k++)
            put(s, o + k * s->run_stride, j + k, de, ve, same);
    }
    return REFIT_OK;
}
