/* Checks of the tensor descriptors and checkpoint specs callers hand in,
 * before any member is used: one place, pure functions, so every load path
 * (refit_load, refit_load_part, batched loads, registration) refuses the
 * same things with the same words. */
#ifndef REFIT_CORE_DESC_CHECK_H
#define REFIT_CORE_DESC_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <refit/refit.h>

/* What the caller expects of a descriptor. */
typedef struct desc_expect {
    int32_t ndim;          /* dims required; -1: any of 0..REFIT_MAX_DIMS */
    refit_dtype dtype;     /* dtype required; bits 0: any valid dtype */
    bool data_optional;    /* data may be NULL (its bytes come later) */
    uint64_t limit;        /* bytes from data the tensor may reach; 0: the
                              address space (below 2^57) is the only bound:
                              a raw pointer's buffer size is the caller's word */
} desc_expect;

/* The memory a valid descriptor covers, in bytes from data + byte_offset:
 * [lo, hi); lo <= 0 (negative strides), hi == lo when it is empty. */
typedef struct desc_extent {
    int64_t numel;
    int64_t lo, hi;
} desc_extent;

/* REFIT_OK, or a status and msg ("shape is NULL (ndim 2)"; no prefix):
 * REFIT_EINVAL for a malformed descriptor (NULL member, ndim out of
 * range, negative extent, a stride, extent or byte_offset whose reach
 * overflows or leaves [data, data + limit)), REFIT_EMISMATCH when it
 * differs from want in ndim or dtype. out may be NULL. */
int desc_check(const refit_tensor *t, const desc_expect *want, desc_extent *out, char *msg,
               size_t n);

/* desc_check(t, NULL, ...) of a tensor refit writes (a runtime tensor),
 * and no two of its elements may share memory (stride 0, rows closer than
 * their length): REFIT_EINVAL naming the shape and strides. Tensors refit
 * only reads (sources, side tensors) may alias: a broadcast reads fine. */
int desc_check_written(const refit_tensor *t, char *msg, size_t n);

/* A checkpoint spec's own sanity (version, ndim, extents, shard, pad, the
 * byte size overflow-checked, placement offsets): REFIT_OK or
 * REFIT_EINVAL and msg. A tie (tie_of set) is checked for its version
 * only: the rest comes from the tensor it is tied to. */
int desc_check_spec(const refit_ckpt_spec *s, char *msg, size_t n);

#endif
