/* The layout OCP MX's device code and its launcher share (C and CUDA):
 * the pieces as the general (k_mx) and dense (k_mxd) kernels read them,
 * the launches' parameter blocks (passed by value, __grid_constant__), and
 * the sizes the launcher plans with. plugins/mxfp8/quant_mx.cu says what
 * the kernels do; plugins/mxfp8/mx_launch.c plans and launches them. */
#ifndef REFIT_PLUGINS_MX_GPU_H
#define REFIT_PLUGINS_MX_GPU_H

#include <stdint.h>

#define MX_THREADS 256
#define MX_WARPS (MX_THREADS / 32)
#define MX_TASK 8               /* blocks of 32 a warp takes at once */
#define MX_BATCH 184            /* pieces per launch */
#define MX_SMALL 8              /* pieces of a launch with a short parameter block */
#define MX_CTAS_PER_SM 4        /* resident at 64 registers: one wave */
#define MX_FINITE_MAX 0x7f7fffffu
#define MX_NONE 0xffffffffu     /* status word: no piece failed */
/* Segments a warp of k_mxd has in flight: 8 (128 bytes a lane) where
 * registers allow (MXFP8 by the conversion instruction: 48 of them with
 * 4), else 4; a unit is 8 blocks a segment. */
#define MXD_SEGS(MODE) (((MODE) & 4) ? 8 : 4)

/* x / d for x < 2^31 by a multiply (Granlund-Montgomery, round-up
 * multiplier with p = 31 + ceil(log2 d)). */
typedef struct mx_div {
    uint32_t d, mul, shift;
} mx_div;

typedef struct mx_piece {
    const char *x;
    unsigned char *q, *s;
    int64_t xs0, xs1, xsm;      /* x strides in elements: row, column, matrix */
    int64_t qs0, qs1, qsm;      /* q strides in bytes */
    int64_t ss0, ss1, ssm;      /* scale strides in bytes */
    int64_t k;                  /* columns */
    int64_t first;              /* its first task in the launch */
    uint32_t n, nb, blocks;     /* rows, blocks of a row, blocks in all (< 2^31) */
    mx_div div_nb, div_n;
    int32_t idx;                /* call index of its first matrix */
    uint8_t kind;               /* x: 0 f32, 1 f16, 2 bf16 */
    uint8_t vx, vq;             /* contiguous, aligned rows: vector loads, stores */
} mx_piece;

/* A launch's parameters, MX_BATCH pieces or MX_SMALL (a call of few
 * pieces, one weight as post-load calls per module: the driver copies a
 * launch's whole parameter block, ~1.4 KB instead of ~30 KB). */
#define MX_BATCH_FIELDS                                                          \
    int32_t np;                                                                  \
    int32_t hw;                 /* E4M3 with the hardware conversion */          \
    int64_t end;                /* tasks of the launch */
typedef struct mx_batch {
    MX_BATCH_FIELDS
    mx_piece p[MX_BATCH];
} mx_batch;
typedef struct mx_batch_small {
    MX_BATCH_FIELDS
    mx_piece p[MX_SMALL];
} mx_batch_small;

typedef struct mxd_piece {
    const char *x;
    unsigned char *q, *s;
    int64_t xp, qp, sp;           /* line pitch in bytes: x, q, scales */
    int64_t first;                /* its first unit in the launch */
    uint32_t len;                 /* blocks of a line */
    uint32_t upl;                 /* units of a line */
    uint32_t bpm;                 /* blocks of a matrix (the status names the matrix) */
    uint32_t units;               /* units of the piece (host side) */
    int32_t idx;                  /* call index of its first matrix */
    mx_div div_upl;
} mxd_piece;

#define MXD_BATCH_FIELDS                                                         \
    int32_t np;                                                                  \
    int64_t end;                  /* units of the launch */                      \
    int64_t chunk;                /* units of a warp */
typedef struct mxd_batch {
    MXD_BATCH_FIELDS
    mxd_piece p[MX_BATCH];
} mxd_batch;
typedef struct mxd_batch_small {
    MXD_BATCH_FIELDS
    mxd_piece p[MX_SMALL];
} mxd_batch_small;

#ifdef __cplusplus
static_assert(sizeof(mx_batch) <= 32764, "mx_batch must fit the kernel parameters");
static_assert(sizeof(mxd_batch) <= 32764, "mxd_batch must fit the kernel parameters");
/* A kernel's parameter block by its MODE (bit 1: the short one). */
template <int SHORT> struct mx_params_sel { typedef mx_batch general; typedef mxd_batch dense; };
template <> struct mx_params_sel<1> { typedef mx_batch_small general; typedef mxd_batch_small dense; };
#define MX_PARAMS(MODE) typename mx_params_sel<((MODE) & 2) ? 1 : 0>::general
#define MXD_PARAMS(MODE) typename mx_params_sel<((MODE) & 2) ? 1 : 0>::dense
#else
_Static_assert(sizeof(mx_batch) <= 32764, "mx_batch must fit the kernel parameters");
_Static_assert(sizeof(mxd_batch) <= 32764, "mxd_batch must fit the kernel parameters");
#endif

#endif
