#include <string.h>

#include "copy.h"
#include "fingerprint.h"

#define FP_GOLDEN 0x9e3779b97f4a7c15ull

/* The splitmix64 finaliser: a cheap bijective mixer. */
static uint64_t fp_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t load_le64(const uint8_t *p)
{
    uint64_t w = 0;
    for (int i = 7; i >= 0; i--)
        w = (w << 8) | p[i];
    return w;
}

void kern_fp_init(kern_fp *fp)
{
    memset(fp, 0, sizeof *fp);
}

static void fp_word(kern_fp *fp, uint64_t w)
{
    uint64_t i = fp->nbytes / 8;
    fp->acc += fp_mix(w ^ (i * FP_GOLDEN));
    fp->nbytes += 8;
}

void kern_fp_update(kern_fp *fp, const void *data, size_t n)
{
    const uint8_t *p = data;
    while (n > 0 && fp->nbuf > 0) {
        fp->buf[fp->nbuf++] = *p++;
        n--;
        if (fp->nbuf == 8) {
            fp->nbuf = 0;
            fp_word(fp, load_le64(fp->buf));
        }
    }
    for (; n >= 8; n -= 8, p += 8)
        fp_word(fp, load_le64(p));
    while (n-- > 0)
        fp->buf[fp->nbuf++] = *p++;
}

uint64_t kern_fp_final(const kern_fp *fp)
{
    uint64_t acc = fp->acc, nbytes = fp->nbytes;
    if (fp->nbuf > 0) {
        uint8_t tail[8] = {0};
        memcpy(tail, fp->buf, fp->nbuf);
        acc += fp_mix(load_le64(tail) ^ ((nbytes / 8) * FP_GOLDEN));
        nbytes += fp->nbuf;
    }
    return fp_mix(acc ^ nbytes);
}

uint64_t kern_fp_combine(uint64_t h, uint64_t fp)
{
    return fp_mix(h * FP_GOLDEN + fp);
}

/* Feed each innermost row of v (dims taken outer to inner). */
static void fp_rows(kern_fp *fp, const refit_view *v, size_t e)
{
    int nd = v->ndim;
    int64_t idx[REFIT_MAX_DIMS] = {0};
    const char *base = v->data;
    int64_t inner_n = nd ? v->shape[nd - 1] : 1;
    int64_t inner_s = nd ? v->strides[nd - 1] : 1;
    for (;;) {
        const char *p = base;
        for (int k = 0; k < nd - 1; k++)
            p += idx[k] * v->strides[k] * (int64_t)e;
        if (inner_s == 1) {
            kern_fp_update(fp, p, (size_t)inner_n * e);
        } else {
            for (int64_t i = 0; i < inner_n; i++)
                kern_fp_update(fp, p + i * inner_s * (int64_t)e, e);
        }
        int k = nd - 2;
        for (; k >= 0; k--) {
            if (++idx[k] < v->shape[k])
                break;
            idx[k] = 0;
        }
        if (k < 0)
            return;
    }
}

uint64_t kern_fingerprint_view(const refit_view *v)
{
    kern_fp fp;
    kern_fp_init(&fp);
    size_t e = kern_dtype_size(v->dtype);
    if (e == 0) {
        /* sub-byte dtypes: only whole, contiguous views are fingerprinted */
        int64_t bits = kern_view_numel(v) * v->dtype.bits;
        kern_fp_update(&fp, v->data, (size_t)((bits + 7) / 8));
    } else if (kern_view_numel(v) > 0) {
        fp_rows(&fp, v, e);
    }
    return kern_fp_final(&fp);
}
