/* The layout INT4's device code and its launcher share (C and CUDA): the
 * pieces as the general and dense kernels read them, the launches'
 * parameter blocks (passed by value, __grid_constant__), and the sizes the
 * launcher plans with. plugins/int4/quant_int4.cu says what the kernels
 * do; plugins/int4/int4_launch.c plans and launches them. */
#ifndef REFIT_PLUGINS_INT4_GPU_H
#define REFIT_PLUGINS_INT4_GPU_H

#include <stdint.h>

#define Q4_THREADS 256
#define Q4_BATCH 256             /* pieces per launch */
#define Q4_BLOCKS_MAX 4096       /* grid-stride beyond this */
#define Q4_FINITE 0x7f800000u    /* magnitude bits at and past infinity */
#define Q4_NONE 0xffffffffu      /* status word: no piece failed */
#define Q4_SMALL 8               /* pieces of a launch with a short parameter block */
#define Q4_SHORT 64              /* kernel template flag: the short parameter block */
#define Q4D_LOADS 4              /* 16-byte loads a lane per tile */
#define Q4D_BLOCKS_PER_SM 4      /* resident blocks an SM at <= 64 registers */

typedef struct q4_piece {
    const char *x;
    char *q;                     /* the I32 words, checkpoint layout */
    char *s;                     /* the scales [n, groups] */
    int64_t n, k, words, groups;
    int64_t xs0, xs1, qs0, qs1, ss0, ss1; /* strides, in elements */
    int64_t first;               /* its first unit in the launch */
    int32_t idx;                 /* its index in the call */
    uint8_t kind, skind;         /* x and scale dtypes: 0 f32, 1 f16, 2 bf16 */
    uint8_t vx;                  /* rows of x contiguous and 16-byte aligned */
    uint8_t colmajor;            /* units walk rows fastest */
} q4_piece;

/* A launch's parameters, Q4_BATCH pieces or Q4_SMALL (a launch of few
 * pieces, as post-load makes: the driver copies a launch's whole
 * parameter block, ~1.4 KB instead of ~31 KB). */
#define Q4_BATCH_FIELDS                                                            \
    int32_t np;                                                                    \
    int32_t pad;                                                                   \
    int64_t g_len;               /* columns per group, > 0 (k_q4_rows: 0 = k) */   \
    int64_t end;                 /* units of the launch */
typedef struct q4_batch {
    Q4_BATCH_FIELDS
    q4_piece p[Q4_BATCH];
} q4_batch;
typedef struct q4_batch_small {
    Q4_BATCH_FIELDS
    q4_piece p[Q4_SMALL];
} q4_batch_small;

typedef struct q4d_piece {
    const char *x;
    char *q;                     /* the I32 words */
    char *s;                     /* the 16-bit scales */
    int64_t first;               /* its first tile in the launch */
    int64_t xs0;                 /* x's row pitch in bytes */
    int64_t qs;                  /* q's stride in elements along the other dim: qs1 (GPTQ), qs0 (u8) */
    int64_t ss0, ss1;            /* scale strides, elements */
    int32_t n, groups, nrt;      /* rows, groups a row, row tiles */
    int32_t idx;                 /* its index in the call */
    uint8_t kind, skind;         /* 1 f16, 2 bf16 */
    uint8_t colmajor;            /* words along N: stored through the shared tile */
} q4d_piece;

#define Q4D_BATCH_FIELDS                                                           \
    int32_t np;                                                                    \
    int32_t pad;                                                                   \
    int64_t end;                 /* tiles of the launch */                         \
    int64_t per_warp;            /* tiles a warp takes, a contiguous run */
typedef struct q4d_batch {
    Q4D_BATCH_FIELDS
    q4d_piece p[Q4_BATCH];
} q4d_batch;
typedef struct q4d_batch_small {
    Q4D_BATCH_FIELDS
    q4d_piece p[Q4_SMALL];
} q4d_batch_small;

#ifdef __cplusplus
static_assert(sizeof(q4_batch) <= 32000, "q4_batch must fit the kernel parameters");
static_assert(sizeof(q4d_batch) <= 32000, "q4d_batch must fit the kernel parameters");
/* A kernel's parameter block by its template flag (Q4_SHORT: the short
 * one). */
template <int SHORT> struct q4_params_sel { typedef q4_batch general; typedef q4d_batch dense; };
template <> struct q4_params_sel<1> { typedef q4_batch_small general; typedef q4d_batch_small dense; };
#define Q4_PARAMS(F) typename q4_params_sel<((F) & Q4_SHORT) ? 1 : 0>::general
#define Q4D_PARAMS(F) typename q4_params_sel<((F) & Q4_SHORT) ? 1 : 0>::dense
#else
_Static_assert(sizeof(q4_batch) <= 32000, "q4_batch must fit the kernel parameters");
_Static_assert(sizeof(q4d_batch) <= 32000, "q4d_batch must fit the kernel parameters");
#endif

#endif
