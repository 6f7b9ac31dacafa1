/* The GPU tests' shared helpers (the kernel tests test_gpu_quant.c, _mx,
 * _nvfp4, _int4, _kernels; the checks and the skip of every GPU test): a
 * seeded random stream, a host buffer with its device twin, views into
 * them and the layouts the tests sweep. Also built into the emulator runs
 * (tests/gpu/emu/run*.sh), where cudaMalloc and friends are the
 * emulator's. Include after <cmocka.h>. */
#ifndef REFIT_TESTS_GPU_TWIN_H
#define REFIT_TESTS_GPU_TWIN_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include <refit/format.h>
#include <refit/refit.h>

#include "core/cuda/backend_cuda.h"

#define F32 ((refit_dtype){REFIT_DTYPE_FLOAT, 32, 1})
#define F16 ((refit_dtype){REFIT_DTYPE_FLOAT, 16, 1})
#define BF16 ((refit_dtype){REFIT_DTYPE_BFLOAT, 16, 1})

/* A CUDA runtime call that must succeed (a test failure naming it). */
#define CU(call)                                                              \
    do {                                                                      \
        cudaError_t e_ = (call);                                              \
        if (e_ != cudaSuccess)                                                \
            fail_msg("%s: %s", #call, cudaGetErrorString(e_));                \
    } while (0)

/* A refit call on world w (anything with a ctx) that must succeed: a test
 * failure naming it, its status, the context's message and the backend's. */
#define OK(w, call)                                                           \
    do {                                                                      \
        int rc_ = (call);                                                     \
        if (rc_ != REFIT_OK)                                                  \
            fail_msg("%s: %s: %s [%s]", #call, refit_status_name(rc_),        \
                     refit_errmsg((w)->ctx), backend_cuda_last_error());      \
    } while (0)

/* A case that needs the device skips without one, saying why. */
#define SKIP_WITHOUT_DEVICE()                                                 \
    do {                                                                      \
        if (backend_cuda_device_count() == 0) {                               \
            print_message("# no CUDA device: %s\n", backend_cuda_unavailable()); \
            skip();                                                           \
        }                                                                     \
    } while (0)

/* For main, before its cases: without a CUDA device, prints the whole
 * suite as one skipped TAP plan ("1..0 # SKIP" and why) and returns 1.
 * cmocka's TAP output writes a skipped case as "not ok ... # SKIP", which
 * TAP consumers count as a failure. */
int twin_skip_suite_without_device(void);

/* splitmix64: twin_mix is its finalizer, twin_rnd the stream. Each test
 * program seeds it once with its own seed so its cases keep their inputs. */
uint64_t twin_mix(uint64_t z);
void twin_seed(uint64_t seed);
uint64_t twin_rnd(void);
/* Uniform in [-1, 1), from the stream. */
float twin_uniform(void);

/* A host allocation and its device twin, same junk. */
typedef struct twin {
    char *h, *d;
    size_t bytes;
} twin;

twin twin_new(size_t bytes);
/* Host bytes to the device (after the host side wrote the inputs). */
void twin_push(const twin *t);
void twin_free(twin *t);
/* The device bytes equal the host's, or a failure naming what and where. */
void twin_check(const twin *t, const char *what);
/* A copy of the twin's host bytes (malloc'd): the junk, kept so that each
 * of several device runs starts over the same junk (twin_restore). */
char *twin_save(const twin *t);
/* Saved bytes back on the device. */
void twin_restore(const twin *t, const char *saved);

/* A device view at element offset first of base, of nd dims. */
refit_view vw_nd(char *base, refit_dtype dt, int nd, const int64_t *shape,
                 const int64_t *strides, int64_t first);
/* The same of ndim 1 or 2. */
refit_view vw(char *base, refit_dtype dt, int nd, int64_t n, int64_t k, int64_t s0, int64_t s1,
              int64_t first);

/* A 2-D device view at element offset first of base. */
static inline refit_view v2(char *base, refit_dtype dt, int64_t n, int64_t k, int64_t s0,
                            int64_t s1, int64_t first)
{
    return vw(base, dt, 2, n, k, s0, s1, first);
}

/* The same view over the twin's host bytes (a NULL view stays NULL). */
refit_view on_host(refit_view v, const twin *t);

/* Layouts of an [n, k] view: 0 row-major, 1 padded rows, 2 transposed
 * (column-major; the GPTQ layout's words and scales), 3 row-major one
 * element past an aligned start. elems: what a twin must hold. */
typedef struct lay {
    int64_t s0, s1, first, elems;
} lay;

lay layout(int kind, int64_t n, int64_t k);

/* Element (i, j) of view x (F32, F16 or BF16 in host memory) set to f, or,
 * for a 16-bit dtype with use_raw, to the bits raw16. */
void view_put(const refit_view *x, int64_t i, int64_t j, float f, uint16_t raw16, int use_raw);

#endif
