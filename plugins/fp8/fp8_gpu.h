/* The layout FP8's device code and its launcher share (C and CUDA): a
 * piece as the kernels read it, the per-tensor group words, the table's
 * head, and the sizes the launcher plans with. plugins/fp8/quant_fp8.cu
 * says what the kernels do; plugins/fp8/fp8_launch.c plans and launches
 * them. */
#ifndef REFIT_PLUGINS_FP8_GPU_H
#define REFIT_PLUGINS_FP8_GPU_H

#include <stdint.h>

#define QF_THREADS 256
#define QF_WARPS (QF_THREADS / 32)
#define QF_SLOTS 8                     /* groups a thread holds: per-tensor chunk, 16-bit tile */
#define QF_CHUNK (QF_THREADS * QF_SLOTS) /* groups of a per-tensor chunk */
#define QF_ROW_CH_MAX 24               /* groups a lane holds of a per-channel row */
#define QF_SHORT_ROW (8 * 32)          /* per-channel: groups of a short row (its own launch) */
#define QF_ROUND 64                    /* per-tensor: chunks a round (REFIT_CUDA_FP8_ROUND) */
#define QF_LAG 2                       /* per-tensor: least lag in rounds (REFIT_CUDA_FP8_LAG) */
#define QF_FINITE_MAX 0x7f7fffffu      /* magnitude bits of FLT_MAX */
#define QF_NONE 0xffffffffu            /* status word: no piece failed */
#define QF_DENSE_CH 8                  /* dense: 16-byte loads a lane keeps in flight */
/* per-channel dense launch classes (quant_fp8.cu, k_rows_dense): threads
 * of a row's team, groups a lane */
#define QF_TEAM_T(c) ((c) == 0 ? 32 : (c) == 1 ? 64 : (c) < 4 ? 128 : 256)
#define QF_TEAM_CH(c) ((c) == 2 ? 6 : 8)
#define QF_CVT_GRID (132 * 8)          /* blocks of the conversion check */
/* The kernels' flags word (their `hw` argument) */
#define QF_HW 1                        /* encode with cvt.rn.satfinite.e4m3x2.f32 */
#define QF_RECIP 2                     /* KERN_FP8_RECIPROCAL: x * (1 / scale), clamped */

/* Piece i of a call as the kernels read it (the device table). */
typedef struct qf_piece {
    const char *x;
    unsigned char *q;
    float *s;                   /* the scale grid (per-tensor: the group's scale) */
    int64_t n, k;               /* rows, columns (a contiguous per-tensor piece: 1, n*k) */
    int64_t xs0, xs1, qs0, qs1, ss0, ss1; /* strides, in elements */
    int64_t first;              /* its first row, tile or chunk in the call */
    int64_t gpr;                /* groups a row: ceil(k / elements a group) */
    int64_t gfirst, gend;       /* per-tensor: its group's chunks */
    int32_t gpiece;             /* per-tensor: its group's first piece */
    uint32_t group;             /* per-tensor: its group */
    int32_t idx;                /* its index in the call */
    uint8_t kind;               /* x: 0 f32, 1 f16, 2 bf16 */
    uint8_t shift;              /* log2 of the elements a group: 2 (f32) or 3 */
    uint8_t vx, vq;             /* rows of x (q) are 16 (8) byte aligned and contiguous */
    uint8_t leader;             /* per-tensor: writes the group's scale */
    uint8_t onekind;            /* per-tensor: every piece of its group has its dtype */
    uint8_t dense;              /* takes the dense fast path (qf_dense_ok) */
} qf_piece;

/* Per-tensor group words: the amax bits, the amax chunks done, and how
 * many there are. */
typedef struct qf_group {
    unsigned int amax, done, need, pad;
} qf_group;

/* The head of the device table: the ticket counter of the per-tensor
 * kernel (zero when uploaded). */
typedef struct qf_head {
    unsigned int status, pad;   /* unused: the module's status word is apart */
    unsigned long long ticket;
} qf_head;

/* The conversion check's result (qf_cvt_check): differing inputs, the
 * smallest (0xffffffff when none). */
typedef struct qf_cvt_result {
    unsigned long long count;
    unsigned int first, pad;
} qf_cvt_result;

#endif
