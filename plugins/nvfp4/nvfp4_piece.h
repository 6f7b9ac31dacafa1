/* NVFP4's post-load pieces, as its launcher (nvfp4_launch.c), its CPU
 * path and the GPU suites' direct entry take them. */
#ifndef REFIT_PLUGINS_NVFP4_PIECE_H
#define REFIT_PLUGINS_NVFP4_PIECE_H

#include <refit/format.h>

/* One NVFP4 post-load job (plugins/nvfp4/quant_nvfp4.h has the
 * arithmetic). N, K: the weight's rows and columns; C = ceil(K/16). */
#define REFIT_NVFP4_ONLINE 0   /* quantize a float weight */
#define REFIT_NVFP4_MODELOPT 1 /* checkpoint: factors multiply */
#define REFIT_NVFP4_CT 2       /* checkpoint: compressed-tensors, factors divide */
typedef struct refit_nvfp4_piece {
    int32_t mode;              /* REFIT_NVFP4_* */
    const char *name;          /* the checkpoint tensor, for messages (may be NULL) */
    refit_view src;            /* online: F32/F16/BF16 [N, K]; checkpoint: the
                                  block scales, 8-bit [N, C]; any strides */
    refit_view packed;         /* OUT, online: 8-bit [N, ceil(K/2)], any strides */
    refit_view scale;          /* OUT: the swizzled block scales, 8-bit, contiguous,
                                  ceil(N/128)*128 * ceil(C/4)*4 elements */
    refit_view alpha;          /* OUT: F32, one element */
    refit_view input_scale_inv; /* OUT, checkpoint with an input factor: F32, one
                                  element; data NULL: not written */
    refit_view weight_factor;  /* checkpoint: F32, one element */
    refit_view input_factor;   /* checkpoint: F32, one element; data NULL: none */
} refit_nvfp4_piece;

#endif
