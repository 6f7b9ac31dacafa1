/* The paired-world harness of the GPU model tests (test_gpu_fp8.c, _mx,
 * _nvfp4, _int4): one model registered twice, its runtime tensors in
 * device memory (the "device" world) and in host memory (the CPU
 * reference); every update goes to both and their bytes and fingerprints
 * must agree. What differs between formats is a pair_format: the model's
 * modules and tensors (build), how a checkpoint tensor's bytes are made at
 * a version, with or without a defect (ckpt_bytes), and the environment
 * switch that puts the "device" world in host memory, to check a test
 * where there is no GPU. Include after <cmocka.h>. */
#ifndef REFIT_TESTS_GPU_PAIR_H
#define REFIT_TESTS_GPU_PAIR_H

#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>
#include <refit/refit.h>

#include "core/cuda/backend_cuda.h"
#include "gpu_twin.h" /* OK, CU, the dtypes */

enum { PAIR_MAX_RT = 24, PAIR_MAX_CK = 40 };

/* A runtime tensor a module binds; name is "module/tensor", for messages. */
typedef struct pair_rt {
    refit_tensor t;
    int64_t shape[3];
    void *data;
    size_t bytes;
    char name[48];
} pair_rt;

/* A checkpoint tensor the model expects; kind and aux are the format's
 * (what its values are, e.g. int4's weight_shape (N, K)). */
typedef struct pair_ck {
    char name[64];
    char module[32];
    int kind;
    refit_dtype dtype;
    int ndim;
    int64_t shape[3];
    int64_t aux[2];
} pair_ck;

typedef struct pair_world {
    refit_ctx *ctx;
    refit_model *m;
    int device;
    pair_rt rt[PAIR_MAX_RT];
    int n_rt;
    pair_ck ck[PAIR_MAX_CK];
    int n_ck;
} pair_world;

typedef struct pair_format {
    const char *on_host_env; /* e.g. REFIT_GPU_FP8_ON_HOST: set (not "0"), no device used */
    const char *worker;      /* worker ids "gpu-<worker>" and "host-<worker>" */
    void (*build)(pair_world *w); /* modules, bindings, expectations; the harness seals */
    /* Contiguous host bytes (malloc'd) of tensor c at version v; defect 0:
     * none, else the format's own (1 is a NaN in the tests below). */
    void *(*ckpt_bytes)(const pair_ck *c, int v, int defect, size_t *bytes);
} pair_format;

/* The random seed of checkpoint tensor c at version v (its name and v
 * hashed): element i's random word is twin_mix(seed + i). */
uint64_t pair_seed(const pair_ck *c, int v);
/* Element i of contiguous F32, F16 or BF16 bytes at b set to f (rounded
 * to nearest even). */
void pair_store_float(void *b, size_t i, refit_dtype dt, float f);
/* A float checkpoint weight (F32, F16 or BF16, any ndim, rows along the
 * last dim) of version v, contiguous host bytes (malloc'd): finite values
 * over a wide range of magnitudes, with zero rows, rows of subnormals and
 * rows near the dtype's largest value. nan_at >= 0: a NaN at that element. */
void *pair_float_bytes(const pair_ck *c, int v, int64_t nan_at, size_t *bytes);
/* The same as a pair_format's ckpt_bytes: defect 1 is a NaN at element 37. */
void *pair_float_ckpt(const pair_ck *c, int v, int defect, size_t *bytes);

/* Selects the format and reads its switch; returns whether the "device"
 * world lives in host memory. Call first in main. */
int pair_use(const pair_format *f);
int pair_on_host_only(void);

/* Memory of a world: device (1) or host (0). */
void *pair_mem_alloc(int device, size_t bytes);
void pair_mem_free(int device, void *p);
void pair_mem_put(int device, void *dst, const void *src, size_t n);
void pair_mem_get(int device, void *dst, const void *src, size_t n);

/* For build: bind a runtime tensor (filled with junk) / expect a
 * checkpoint tensor (returned, to set kind and aux). */
pair_rt *pair_bind(pair_world *w, const char *module, const char *name, refit_dtype dt, int nd,
                   const int64_t *shape);
pair_ck *pair_expect(pair_world *w, const char *module, const char *name, refit_dtype dt,
                     int nd, const int64_t *shape, const char *target, int64_t dst_row,
                     int64_t expert);

void pair_open(pair_world *w, int device);
void pair_close(pair_world *w);

enum src_kind { SRC_PAGEABLE, SRC_PINNED, SRC_DEVICE };

typedef struct pair_src {
    refit_tensor t;
    int64_t shape[3];
    void *buf;
    enum src_kind kind;
} pair_src;

/* Load every checkpoint tensor of version v from `kind` memory into t;
 * tensor defect_at gets `defect`. Returns the first failing status (the
 * txn is the caller's then); keep (PAIR_MAX_CK, zeroed) holds the sources
 * until pair_keep_free. */
int pair_deliver(pair_world *w, refit_txn *t, int v, enum src_kind kind, void *stream,
                 pair_src *keep, int defect_at, int defect);
void pair_keep_free(pair_world *w, pair_src *keep);
/* A whole update with rollback, labelled "v<v>", that must succeed. */
void pair_update(pair_world *w, int v, enum src_kind kind, void *stream);

/* Every runtime byte, in binding order (malloc'd). */
char *pair_snapshot(pair_world *w, size_t *bytes);
void pair_assert_snap(pair_world *w, const char *a, const char *b, size_t n, const char *what);
/* Device and host bytes and fingerprints equal. */
void pair_assert_same(pair_world *d, pair_world *h, const char *what);

/* Group or case setup: state is two worlds (device, host), or NULL
 * without a device (the case then skips through WORLDS). */
int pair_setup(void **state);
int pair_teardown(void **state);

#define WORLDS(state, d, h)                                                   \
    if (!*(state)) {                                                          \
        print_message("# no CUDA device: %s\n", backend_cuda_unavailable());  \
        skip();                                                               \
    }                                                                         \
    pair_world *d = &((pair_world *)*(state))[0], *h = &((pair_world *)*(state))[1]

/* Version v loaded twice (from device sources) leaves the same bytes;
 * returns them (malloc'd, n bytes). */
char *pair_reload_same(pair_world *d, int v, size_t *n);

/* The shared cases. */
/* Versions 1..3 from device, pinned and pageable sources equal the host's. */
void pair_check_matches_host(void **state);
/* Reloading the same weights leaves the same bytes; A, B, A again equals
 * A; B over A equals a cold start on B (with fingerprints: theirs equal). */
void pair_check_reload_equals_cold(void **state, int fingerprints);
/* Updates on a caller's non-blocking stream, from device and pageable. */
void pair_check_user_stream(void **state);
/* pair_check_reload_equals_cold as cases: fingerprints compared, or not. */
void pair_case_reload_equals_cold(void **state);
void pair_case_reload_bytes_equal_cold(void **state);
/* The three shared model cases as a suite lists them (cmocka cases named
 * test_model_matches_host, test_model_reload_equals_cold with reload, one
 * of the two above, and test_model_user_stream), each with setup and
 * teardown (pair_setup, pair_teardown: fresh worlds; NULL: the group's). */
#define PAIR_MODEL_CASES(reload, setup, teardown)                             \
    {"test_model_matches_host", pair_check_matches_host, setup, teardown, NULL}, \
    {"test_model_reload_equals_cold", reload, setup, teardown, NULL},         \
    {"test_model_user_stream", pair_check_user_stream, setup, teardown, NULL}
/* An update of version 32 with `defect` in tensor `at` is refused
 * (REFIT_ECORRUPT, the message naming module, tensor and `reason`), health
 * is READY and every byte equals `before`. */
void pair_check_refused(pair_world *d, int at, int defect, const char *reason,
                        const char *before, size_t n, const char *what);
/* Version 33 delivered whole (every post-load ran), then aborted with
 * rollback: every byte equals `before`. */
void pair_check_abort_restores(pair_world *d, const char *before, size_t n);
/* Version 31 on both; a NaN in each tensor of bads[] refused in turn; the
 * abort; both still equal. */
void pair_check_nan_and_abort(void **state, const int *bads, int n_bads);
/* Post-load without a wait, on both worlds: a NaN (defect 1) in tensors
 * first and second (different modules, first delivered earlier): every
 * load is accepted, finalize fails naming first's module and tensor and
 * `reason` (the first failure wins), the bytes are kept, and a clean
 * update then commits (the status is reset). */
void pair_check_status_at_finalize(void **state, int first, int second, const char *reason);

#endif
