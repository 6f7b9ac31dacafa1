/* FP8's launcher: plans the launches of its device code
 * (plugins/fp8/quant_fp8.cu) for n pieces and enqueues them through a refit_pgpu
 * table (refit/sdk/pgpu.h), bit for bit kern_quant_fp8 on each piece:
 * piece i is x[i] (2-D, F32/F16/BF16) into q[i] (2-D, one-byte elements)
 * and its scales scale[i] (2-D F32, the shape kern_fp8_scale_shape gives),
 * any strides; scheme: kern_fp8_scheme. Per-tensor pieces whose scale
 * views start at the same element share one scale, the amax taken over
 * all of them. Every view device-readable. hw, flags: QF_HW to encode with
 * the hardware's cvt.rn.satfinite.e4m3x2.f32 instead of the integer
 * encoder (only where the conversion check, fp8_cvt_launch, found no
 * difference on this device); QF_RECIP for KERN_FP8_RECIPROCAL's
 * arithmetic, else KERN_FP8_DIVIDE's. One launch (per-tensor) or one a launch class present; never
 * waits: a NaN or infinity lowers g->status to the lowest such piece's
 * index (that piece's group keeps its old scale and bytes). Returns
 * REFIT_OK; REFIT_EUNSUPPORTED / EMISMATCH (dtypes, ranks; *bad the piece,
 * g->msg says why), REFIT_EINVAL, or the table's failure. */
#ifndef REFIT_PLUGINS_FP8_LAUNCH_H
#define REFIT_PLUGINS_FP8_LAUNCH_H

#include <refit/sdk/pgpu.h>
#include "plugins/fp8/fp8_gpu.h"

int fp8_launch(refit_pgpu *g, uint32_t n, const refit_view *q, const refit_view *scale,
               const refit_view *x, int scheme, int hw, int32_t *bad);

/* Enqueue the hardware conversion against the integer encoder on every
 * finite f32 (and the byte order of its pairs) into *res (device memory,
 * set to {0, 0xffffffff} by the caller): res->count differing inputs,
 * res->first the smallest (magnitude bits). A few milliseconds. */
int fp8_cvt_launch(refit_pgpu *g, qf_cvt_result *res);

#endif
