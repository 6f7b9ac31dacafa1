/* OCP MX's launcher (MXFP8 and MXFP4): plans the launches of its device
 * code (plugins/mxfp8/quant_mx.cu) for n pieces and enqueues them through
 * a refit_pgpu table (refit/sdk/pgpu.h), bit for bit kern_quant_mxfp8
 * (elem_bits 8: q[i] [n_i, k_i] E4M3, any strides) or kern_quant_mxfp4
 * (elem_bits 4: q[i] [n_i, ceil(k_i/2)] packed E2M1, rows contiguous) on
 * each: x[i] 2-D F32/F16/BF16, scales[i] 8-bit [n_i, ceil(k_i/32)], any
 * strides, every view device-readable. hw (MXFP8 only): E4M3 by
 * cvt.rn.satfinite.e4m3x2.f32; pass 1 only where the conversion check
 * (plugins/fp8/fp8_cvt_host.h) found it equal to the encoder. Evenly
 * spaced pieces of one shape merge into one; the dense pieces, then the
 * rest, MX_BATCH a launch. Never waits: a NaN or infinity lowers g->status
 * to the lowest such piece's index (its blocks holding one unwritten, the
 * rest written). Returns REFIT_OK; REFIT_EUNSUPPORTED / EMISMATCH (views;
 * *bad the piece, g->msg says why), REFIT_EINVAL, or the table's failure. */
#ifndef REFIT_PLUGINS_MX_LAUNCH_H
#define REFIT_PLUGINS_MX_LAUNCH_H

#include <refit/sdk/pgpu.h>

int mx_launch(refit_pgpu *g, uint32_t n, const refit_view *q, const refit_view *scales,
              const refit_view *x, int elem_bits, int hw, int32_t *bad);

#endif
