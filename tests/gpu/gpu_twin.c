/* The GPU tests' shared helpers (gpu_twin.h), moved from the tests as they
 * were. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "gpu_twin.h"
#include "kernels/cast.h"

static uint64_t rng_state;

uint64_t twin_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void twin_seed(uint64_t seed)
{
    rng_state = seed;
}

uint64_t twin_rnd(void)
{
    return twin_mix(rng_state += 0x9e3779b97f4a7c15ull);
}

float twin_uniform(void)
{
    return (float)((double)(twin_rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

twin twin_new(size_t bytes)
{
    twin t = {malloc(bytes ? bytes : 1), NULL, bytes};
    assert_non_null(t.h);
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t r = twin_rnd();
        memcpy(t.h + i, &r, bytes - i < 8 ? bytes - i : 8);
    }
    CU(cudaMalloc((void **)&t.d, bytes ? bytes : 1));
    CU(cudaMemcpy(t.d, t.h, bytes, cudaMemcpyHostToDevice));
    return t;
}

void twin_push(const twin *t)
{
    CU(cudaMemcpy(t->d, t->h, t->bytes, cudaMemcpyHostToDevice));
}

void twin_free(twin *t)
{
    free(t->h);
    cudaFree(t->d);
}

void twin_check(const twin *t, const char *what)
{
    unsigned char *back = malloc(t->bytes ? t->bytes : 1);
    assert_non_null(back);
    CU(cudaMemcpy(back, t->d, t->bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < t->bytes; i++)
        if (back[i] != (unsigned char)t->h[i]) {
            unsigned a = back[i], b = (unsigned char)t->h[i];
            free(back);
            fail_msg("%s: byte %zu of %zu differs: device %02x, host %02x", what, i, t->bytes,
                     a, b);
        }
    free(back);
}

char *twin_save(const twin *t)
{
    char *saved = malloc(t->bytes ? t->bytes : 1);
    assert_non_null(saved);
    memcpy(saved, t->h, t->bytes);
    return saved;
}

void twin_restore(const twin *t, const char *saved)
{
    CU(cudaMemcpy(t->d, saved, t->bytes, cudaMemcpyHostToDevice));
}

refit_view vw_nd(char *base, refit_dtype dt, int nd, const int64_t *shape,
                 const int64_t *strides, int64_t first)
{
    refit_view v;
    memset(&v, 0, sizeof v);
    v.data = base + first * (int64_t)(dt.bits / 8);
    v.device = (refit_device){REFIT_DEVICE_CUDA, 0};
    v.dtype = dt;
    v.ndim = nd;
    for (int i = 0; i < nd; i++) {
        v.shape[i] = shape[i];
        v.strides[i] = strides[i];
    }
    return v;
}

refit_view vw(char *base, refit_dtype dt, int nd, int64_t n, int64_t k, int64_t s0, int64_t s1,
              int64_t first)
{
    /* a 1-D view keeps shape[1] and strides[1] as given, as it always did */
    int64_t shape[2] = {n, k}, strides[2] = {s0, s1};
    refit_view v = vw_nd(base, dt, 2, shape, strides, first);
    v.ndim = nd;
    return v;
}

refit_view on_host(refit_view v, const twin *t)
{
    if (!v.data)
        return v;
    v.data = t->h + ((char *)v.data - t->d);
    v.device = (refit_device){REFIT_DEVICE_CPU, 0};
    return v;
}

lay layout(int kind, int64_t n, int64_t k)
{
    lay l = {k, 1, 0, n * k};
    if (kind == 1) {
        l.s0 = k + 3;
        l.elems = n * (k + 3);
    } else if (kind == 2) {
        l.s0 = 1;
        l.s1 = n;
    } else if (kind == 3) {
        l.first = 1;
    }
    l.elems += l.first + 1;
    return l;
}

void view_put(const refit_view *x, int64_t i, int64_t j, float f, uint16_t raw16, int use_raw)
{
    char *p = (char *)x->data + (i * x->strides[0] + j * x->strides[1]) * (x->dtype.bits / 8);
    if (x->dtype.bits == 32) {
        memcpy(p, &f, 4);
        return;
    }
    uint16_t h = use_raw ? raw16
                 : x->dtype.code == REFIT_DTYPE_BFLOAT ? kern_f32_to_bf16(f) : kern_f32_to_f16(f);
    memcpy(p, &h, 2);
}

int twin_skip_suite_without_device(void)
{
    if (backend_cuda_device_count() != 0)
        return 0;
    printf("1..0 # SKIP no CUDA device: %s\n", backend_cuda_unavailable());
    return 1;
}
