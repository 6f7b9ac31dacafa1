/* Host reference kernels for strided copies, casts and fills. The CUDA
 * versions (kernels/ *.cu files) keep these names with a _cuda suffix. */
#ifndef REFIT_KERNELS_COPY_H
#define REFIT_KERNELS_COPY_H

#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>

/* Bytes of one element, or 0 when the dtype is not a whole number of bytes.
 * Inline: called for every tensor on the reload path. */
static inline size_t kern_dtype_size(refit_dtype dt)
{
    if (dt.bits == 0 || dt.bits % 8 != 0 || dt.lanes != 1)
        return 0;
    return dt.bits / 8u;
}

/* 1 when the dtypes are equal. */
static inline int kern_dtype_eq(refit_dtype a, refit_dtype b)
{
    return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}
/* 1 when kern_copy can cast from src to dst (equal, or both F32/F16/BF16). */
int kern_can_cast(refit_dtype dst, refit_dtype src);

/* dst <- src, same shape, any strides, casting as kern_can_cast allows.
 * Returns REFIT_OK, REFIT_EMISMATCH (shapes differ) or REFIT_EUNSUPPORTED. */
int kern_copy(const refit_view *dst, const refit_view *src);
/* Every element of dst set to all-zero bytes. */
int kern_zero(const refit_view *dst);
/* Number of elements of a view (shapes are validated non-negative). */
int64_t kern_view_numel(const refit_view *v);

#endif
