/* Leaf helpers every core unit uses: strings, growing arrays, tensor
 * sizes. They call nothing of the core's. */
#ifndef REFIT_CORE_UTIL_H
#define REFIT_CORE_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <refit/refit.h>

/* strdup that passes NULL through (NULL also on no memory). */
char *xstrdup(const char *s);
/* Grow *arr (element size es) to hold n+1 items; new items are zeroed. */
int grow_array(void **arr, uint32_t *cap, uint32_t n, size_t es);
/* Bytes of numel packed elements of dt (sub-byte types rounded up). */
size_t tensor_dtype_bytes(refit_dtype dt, int64_t numel);
/* fn(arg, part, lo, hi) over [0, n) cut in parts of at least min_part
 * items, up to 8 parts on as many threads (this one runs part 0; a thread
 * that cannot start runs its part here too); returns the parts used.
 * For passes over large host arrays: a patch's indices. */
uint32_t util_parallel(size_t n, size_t min_part, void *arg,
                       void (*fn)(void *arg, uint32_t part, size_t lo, size_t hi));

#endif
