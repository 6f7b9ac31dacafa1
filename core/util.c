/* Leaf helpers (core/util.h). */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

#define PARALLEL_MAX 8

typedef struct par_part {
    void *arg;
    void (*fn)(void *arg, uint32_t part, size_t lo, size_t hi);
    uint32_t part;
    size_t lo, hi;
} par_part;

static void *par_main(void *a)
{
    par_part *p = a;
    p->fn(p->arg, p->part, p->lo, p->hi);
    return NULL;
}

uint32_t util_parallel(size_t n, size_t min_part, void *arg,
                       void (*fn)(void *arg, uint32_t part, size_t lo, size_t hi))
{
    static long cpus;
    if (!cpus)
        cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t k = min_part ? n / min_part : 1;
    if (k > PARALLEL_MAX)
        k = PARALLEL_MAX;
    if (cpus > 0 && k > (size_t)cpus)
        k = (size_t)cpus;
    if (k < 2) {
        fn(arg, 0, 0, n);
        return 1;
    }
    par_part parts[PARALLEL_MAX];
    pthread_t th[PARALLEL_MAX];
    bool started[PARALLEL_MAX] = {false};
    for (size_t i = 0; i < k; i++) {
        parts[i] = (par_part){arg, fn, (uint32_t)i, n / k * i, i + 1 == k ? n : n / k * (i + 1)};
        if (i)
            started[i] = pthread_create(&th[i], NULL, par_main, &parts[i]) == 0;
    }
    fn(arg, 0, parts[0].lo, parts[0].hi);
    for (size_t i = 1; i < k; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            fn(arg, (uint32_t)i, parts[i].lo, parts[i].hi);
    }
    return (uint32_t)k;
}
