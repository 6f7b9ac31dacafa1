/* Descriptor and spec checks (desc_check.h). Every product and sum of
 * numbers a caller gave is overflow-checked before it is used, so nothing
 * downstream (plan, copy, undo spans, messages) computes an overflow. */
#include <stdarg.h>
#include <stdio.h>

#include "core/desc_check.h"

static int fail(int status, char *msg, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(int status, char *msg, size_t n, const char *fmt, ...)
{
    if (msg && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, n, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* One past the highest address user memory can have: 2^57 on 64-bit
 * machines (x86-64 with 5-level paging; arm64 stops at 2^52), so a range
 * reaching beyond it cannot be a buffer, whatever the caller says. */
#if UINTPTR_MAX > 0xffffffffu
#define ADDR_END ((uintptr_t)1 << 57)
#else
#define ADDR_END UINTPTR_MAX
#endif

static bool dtype_eq(refit_dtype a, refit_dtype b)
{
    return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

/* Element reach of the descriptor: [lo, hi] element offsets from its first
 * element, overflow-checked; false on overflow. */
static bool elem_reach(const refit_tensor *t, int64_t *lo, int64_t *hi, int *bad_dim)
{
    int64_t l = 0, h = 0, row = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        int64_t stride = t->strides ? t->strides[i] : row;
        int64_t reach;
        *bad_dim = i;
        if (__builtin_mul_overflow(t->shape[i] - 1, stride, &reach))
            return false;
        if (reach < 0 ? __builtin_add_overflow(l, reach, &l) : __builtin_add_overflow(h, reach, &h))
            return false;
        if (!t->strides && t->shape[i] > 0 && __builtin_mul_overflow(row, t->shape[i], &row))
            return false;
    }
    *lo = l;
    *hi = h;
    return true;
}

static bool row_major(const refit_tensor *t)
{
    if (!t->strides)
        return true;
    int64_t want = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != want)
            return false;
        want *= t->shape[i];
    }
    return true;
}

/* "[4, 8]" of ndim values into buf. */
static const char *dims_text(const int64_t *v, int ndim, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "",
                                 (long long)v[i]);
    if (used < len)
        snprintf(buf + used, len - used, "]");
    return buf;
}

/* No two elements of a tensor refit writes may share memory, or a write to
 * one changes another and the engine reads values that are not the
 * checkpoint's. Dims of extent > 1 sorted by |stride|: each stride must
 * step past everything the dims inside it reach. Sufficient, not necessary:
 * an interleaving that never collides is refused too, as no engine lays
 * out a weight so. Called after elem_reach: no product overflows. */
static int check_no_alias(const refit_tensor *t, char *msg, size_t n)
{
    int order[REFIT_MAX_DIMS], k = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] <= 1)
            continue;
        int64_t s = t->strides[i] < 0 ? -t->strides[i] : t->strides[i];
        int j = k++;
        for (; j > 0; j--) {
            int64_t o = t->strides[order[j - 1]];
            if ((o < 0 ? -o : o) <= s)
                break;
            order[j] = order[j - 1];
        }
        order[j] = i;
    }
    int64_t reach = 0; /* element offsets the inner dims span, minus one */
    for (int j = 0; j < k; j++) {
        int d = order[j];
        int64_t s = t->strides[d] < 0 ? -t->strides[d] : t->strides[d];
        if (s <= reach) {
            char sh[REFIT_MAX_DIMS * 22 + 4], st[REFIT_MAX_DIMS * 22 + 4];
            return fail(REFIT_EINVAL, msg, n, "its elements overlap (shape %s, strides %s): "
                        "dim %d steps %lld elements, inside the %lld the dims within it span; "
                        "a tensor refit writes must not alias itself",
                        dims_text(t->shape, t->ndim, sh, sizeof sh),
                        dims_text(t->strides, t->ndim, st, sizeof st), d, (long long)s,
                        (long long)reach + 1);
        }
        if (__builtin_add_overflow(reach, (t->shape[d] - 1) * s, &reach))
            reach = INT64_MAX; /* |lo| + hi past int64: no stride steps past it */
    }
    return REFIT_OK;
}

int desc_check(const refit_tensor *t, const desc_expect *want, desc_extent *out, char *msg,
               size_t n)
{
    if (!t)
        return fail(REFIT_EINVAL, msg, n, "descriptor is NULL");
    if (t->ndim < 0 || t->ndim > REFIT_MAX_DIMS)
        return fail(REFIT_EINVAL, msg, n, "ndim %d (0..%d)", t->ndim, REFIT_MAX_DIMS);
    if (want && want->ndim >= 0 && t->ndim != want->ndim)
        return fail(REFIT_EMISMATCH, msg, n, "%d dims delivered, %d expected", t->ndim,
                    want->ndim);
    if (t->ndim > 0 && !t->shape)
        return fail(REFIT_EINVAL, msg, n, "shape is NULL (ndim %d)", t->ndim);
    if (t->dtype.bits == 0 || t->dtype.lanes != 1)
        return fail(REFIT_EINVAL, msg, n, "dtype with %u bits x %u lanes", t->dtype.bits,
                    t->dtype.lanes);
    if (want && want->dtype.bits && !dtype_eq(t->dtype, want->dtype))
        return fail(REFIT_EMISMATCH, msg, n, "dtype %s delivered, %s expected",
                    refit_dtype_name(t->dtype), refit_dtype_name(want->dtype));
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0)
            return fail(REFIT_EINVAL, msg, n, "negative extent %lld on dim %d",
                        (long long)t->shape[i], i);
        if (__builtin_mul_overflow(numel, t->shape[i], &numel))
            return fail(REFIT_EINVAL, msg, n, "the element count overflows at dim %d", i);
    }
    desc_extent ext = {numel, 0, 0};
    if (numel > 0) {
        int64_t lo, hi;
        int dim;
        if (!elem_reach(t, &lo, &hi, &dim))
            return fail(REFIT_EINVAL, msg, n, "extent %lld with stride %lld on dim %d reaches "
                        "beyond any buffer", (long long)t->shape[dim],
                        (long long)(t->strides ? t->strides[dim] : 0), dim);
        int64_t span; /* elements from the lowest to the highest, inclusive */
        if (t->dtype.bits % 8) { /* sub-byte: whole bytes of a row-major tensor */
            if (!row_major(t))
                return fail(REFIT_EINVAL, msg, n, "%u-bit elements must be row-major",
                            t->dtype.bits);
            if (__builtin_mul_overflow(numel, (int64_t)t->dtype.bits, &span) ||
                __builtin_add_overflow(span, 7, &span))
                return fail(REFIT_EINVAL, msg, n, "%lld elements of %u bits overflow a size",
                            (long long)numel, t->dtype.bits);
            ext.hi = span / 8;
        } else {
            int64_t e = t->dtype.bits / 8;
            if (__builtin_mul_overflow(lo, e, &ext.lo) ||
                __builtin_add_overflow(hi, 1, &span) || __builtin_mul_overflow(span, e, &ext.hi))
                return fail(REFIT_EINVAL, msg, n, "the strides reach beyond any buffer");
        }
    }
    if (!t->data && numel > 0 && !(want && want->data_optional))
        return fail(REFIT_EINVAL, msg, n, "data is NULL");
    /* where the bytes are: base = data + byte_offset, [base + lo, base + hi)
     * inside [data, data + limit) (DLPack: data is where the buffer starts),
     * and nothing wraps the address space */
    uintptr_t data = (uintptr_t)t->data;
    if (data >= ADDR_END)
        return fail(REFIT_EINVAL, msg, n, "data %p is beyond the address space", t->data);
    uint64_t limit = want && want->limit ? want->limit : ADDR_END - data;
    if (t->byte_offset > limit)
        return fail(REFIT_EINVAL, msg, n, "byte_offset %llu is beyond the %s",
                    (unsigned long long)t->byte_offset,
                    want && want->limit ? "buffer passed" : "address space");
    if (numel > 0) {
        /* lo <= 0 <= hi, and byte_offset <= limit: these cannot overflow */
        /* DLPack means data to be where the memory starts, but producers
         * (numpy's __dlpack__) hand a view with negative strides as its
         * first element with byte_offset 0. Below data is then the
         * caller's word, as the upper end of a raw pointer is; only a
         * buffer of known size (limit) and the address space bound it. */
        uint64_t below = (uint64_t)0 - (uint64_t)ext.lo;
        if (below > t->byte_offset && (want && want->limit))
            return fail(REFIT_EINVAL, msg, n, "negative strides reach %llu bytes below data + "
                        "byte_offset (%llu): before the buffer passed",
                        (unsigned long long)below, (unsigned long long)t->byte_offset);
        if (below > t->byte_offset && below - t->byte_offset > data)
            return fail(REFIT_EINVAL, msg, n, "negative strides reach %llu bytes below data + "
                        "byte_offset (%llu): below address 0", (unsigned long long)below,
                        (unsigned long long)t->byte_offset);
        if ((uint64_t)ext.hi > limit - t->byte_offset)
            return fail(REFIT_EINVAL, msg, n, "%lld bytes from byte_offset %llu are beyond "
                        "the %s", (long long)ext.hi, (unsigned long long)t->byte_offset,
                        want && want->limit ? "buffer passed" : "address space");
    }
    if (out)
        *out = ext;
    return REFIT_OK;
}

int desc_check_written(const refit_tensor *t, char *msg, size_t n)
{
    desc_extent e;
    int rc = desc_check(t, NULL, &e, msg, n);
    /* sub-byte tensors are row-major (desc_check): nothing to alias */
    if (rc || e.numel == 0 || !t->strides || t->dtype.bits % 8)
        return rc;
    return check_no_alias(t, msg, n);
}

int desc_check_spec(const refit_ckpt_spec *s, char *msg, size_t n)
{
    if (!s)
        return fail(REFIT_EINVAL, msg, n, "spec is NULL");
    if (s->version != REFIT_CKPT_SPEC_VERSION)
        return fail(REFIT_EINVAL, msg, n, "spec has unknown version %u", s->version);
    if (s->tie_of)
        return REFIT_OK;
    if (s->ndim < 0 || s->ndim > REFIT_MAX_DIMS)
        return fail(REFIT_EINVAL, msg, n, "ndim %d (0..%d)", s->ndim, REFIT_MAX_DIMS);
    if (s->dtype.bits == 0 || s->dtype.lanes != 1)
        return fail(REFIT_EINVAL, msg, n, "invalid dtype (%u bits x %u lanes)", s->dtype.bits,
                    s->dtype.lanes);
    if (s->shard_count < 0)
        return fail(REFIT_EINVAL, msg, n, "negative shard count");
    if (s->shard_count > 1 && (s->shard_dim < 0 || s->shard_dim >= s->ndim ||
                               s->shard_rank < 0 || s->shard_rank >= s->shard_count))
        return fail(REFIT_EINVAL, msg, n, "shard dim %d rank %d of %d is out of range",
                    s->shard_dim, s->shard_rank, s->shard_count);
    int pad_dim = s->shard_count > 1 ? s->shard_dim : 0;
    if (s->pad_to < 0 || (s->pad_to > 0 && s->ndim == 0))
        return fail(REFIT_EINVAL, msg, n, "pad_to %lld needs a dim to pad", (long long)s->pad_to);
    int64_t numel = 1, bits;
    for (int i = 0; i < s->ndim; i++) {
        int64_t ext = s->shape[i];
        if (ext < 0)
            return fail(REFIT_EINVAL, msg, n, "negative extent on dim %d", i);
        if (i == pad_dim && s->pad_to > ext)
            ext = s->pad_to;
        if (__builtin_mul_overflow(numel, ext, &numel))
            return fail(REFIT_EINVAL, msg, n, "the element count overflows at dim %d", i);
        if (s->dst_offset[i] < 0 || __builtin_add_overflow(s->dst_offset[i], ext, &(int64_t){0}))
            return fail(REFIT_EINVAL, msg, n, "dst_offset %lld on dim %d is out of range",
                        (long long)s->dst_offset[i], i);
    }
    if (__builtin_mul_overflow(numel, (int64_t)s->dtype.bits, &bits) ||
        __builtin_add_overflow(bits, 7, &bits))
        return fail(REFIT_EINVAL, msg, n, "%lld elements of %u bits overflow a size",
                    (long long)numel, s->dtype.bits);
    if (s->expert < -1)
        return fail(REFIT_EINVAL, msg, n, "expert %lld (-1: none)", (long long)s->expert);
    return REFIT_OK;
}
