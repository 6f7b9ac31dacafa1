/* Leaf helpers (core/util.h). */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

char *xstrdup(const char *s)
{
    return s ? strdup(s) : NULL;
}

int grow_array(void **arr, uint32_t *cap, uint32_t n, size_t es)
{
    if (n < *cap)
        return REFIT_OK;
    if (*cap > UINT32_MAX / 2)
        return REFIT_ENOMEM;
    uint32_t nc = *cap ? *cap * 2 : 8;
    void *p = realloc(*arr, (size_t)nc * es);
    if (!p)
        return REFIT_ENOMEM;
    memset((char *)p + (size_t)*cap * es, 0, (size_t)(nc - *cap) * es);
    *arr = p;
    *cap = nc;
    return REFIT_OK;
}

size_t tensor_dtype_bytes(refit_dtype dt, int64_t numel)
{
    return (size_t)((numel * dt.bits + 7) / 8);
}
