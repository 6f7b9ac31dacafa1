/* The layout NVFP4's device code and its launcher share (C and CUDA):
 * a piece as the kernel reads it, a launch's parameters, and the sizes the
 * launcher plans with. plugins/nvfp4/quant_nvfp4.cu says what the kernel
 * does; plugins/nvfp4/nvfp4_launch.c plans and launches it. */
#ifndef REFIT_PLUGINS_NVFP4_GPU_H
#define REFIT_PLUGINS_NVFP4_GPU_H

#include <stdint.h>

#define QN_THREADS 256
#define QN_BATCH 20                    /* entries per launch (parameters < 4 KB) */
#define QN_BLOCKS_MAX 8192             /* blocks per piece and launch */
#define QN_ITEMS_PER_THREAD 2          /* items (blocks of 16) a thread, before striding */
#ifndef QN_SET_BYTES /* tests/gpu/emu/run_nvfp4.sh makes it small: many sets */
#define QN_SET_BYTES ((int64_t)96 << 20) /* measured best (docs/cuda.md, "Set size") */
#endif
#define QN_FINITE_MAX 0x7f7fffffu      /* magnitude bits of FLT_MAX */
#define QN_UNIT_BLOCKS 64          /* dense: blocks of a warp unit */
#define QN_UNITS_PER_WARP 2        /* dense: units a warp encodes (CTAs sized by it) */
#ifndef QN_SMALL_CTAS /* run_nvfp4.sh makes it small, so both sizings run */
#define QN_SMALL_CTAS 264          /* fewer CTAs than this: one unit a warp (2 an SM on an H200) */
#endif

typedef struct qn_piece {
    const char *x;              /* online: the weight; checkpoint: the staged scales */
    unsigned char *q;           /* online: packed output */
    unsigned char *s;           /* the swizzled scales */
    float *alpha, *inv;         /* inv: NULL when not written */
    const float *wf, *in;       /* checkpoint factors; in NULL when absent */
    unsigned int *amax;         /* online: the piece's amax bits */
    int64_t n, k;               /* online: rows, columns; checkpoint: rows, blocks */
    int64_t xs0, xs1, qs0, qs1; /* strides, in elements */
    int64_t cb, cp;             /* blocks of a row, padded blocks */
    int64_t items;              /* rows padded to 128, times cp */
    int64_t first;              /* its first block in the launch */
    int32_t idx;                /* its index in the call */
    uint8_t mode;               /* REFIT_NVFP4_* */
    uint8_t pass;               /* in a launch: 0 amax, 1 encode (or swizzle) */
    uint8_t kind;               /* online x: 0 f32, 1 f16, 2 bf16 */
    uint8_t vx, vq;             /* rows of x (q) are 16 (8) byte aligned and contiguous */
    uint32_t nblk;              /* dense pieces (below): blocks of 16; 0: the general path */
    uint32_t dmul, dshift;      /* dense: division by cb (qn_swz) */
} qn_piece;

/* A launch's entries: encode (and checkpoint) entries [0, ne), then
 * amax entries [ne, np); a piece's `first` counts within its stream. */
typedef struct qn_batch {
    int32_t np, ne;
    int64_t end;                /* blocks of the launch */
    int64_t na;                 /* of them, amax blocks */
    qn_piece p[QN_BATCH];
} qn_batch;
#ifdef __cplusplus
static_assert(sizeof(qn_batch) <= 4000, "qn_batch must fit the kernel parameters");
#else
_Static_assert(sizeof(qn_batch) <= 4000, "qn_batch must fit the kernel parameters");
#endif

#endif
