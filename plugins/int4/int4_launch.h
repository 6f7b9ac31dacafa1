/* INT4's launcher: plans the launches of its device code
 * (plugins/int4/quant_int4.cu) for n pieces and enqueues them through a
 * refit_pgpu table (refit/sdk/pgpu.h), bit for bit kern_quant_int4 on each:
 * piece i is x[i] (2-D [n_i, k_i], F32/F16/BF16) into q[i] (I32
 * [n_i, ceil(k_i/8)], checkpoint layout) and scale[i] ([n_i,
 * ceil(k_i/group)], [n_i, 1] for group 0; F32/F16/BF16), any strides,
 * every view device-readable. The dense pieces, then the rest, Q4_BATCH a
 * launch. Never waits: a NaN or infinity, or a scale past the scale
 * dtype's range, lowers g->status to the lowest such piece's index (that
 * group unwritten, the rest written). Returns REFIT_OK; REFIT_EUNSUPPORTED
 * / EMISMATCH (views; *bad the piece, g->msg says why), REFIT_EINVAL
 * (group < 0), or the table's failure. */
#ifndef REFIT_PLUGINS_INT4_LAUNCH_H
#define REFIT_PLUGINS_INT4_LAUNCH_H

#include <refit/sdk/pgpu.h>

int int4_launch(refit_pgpu *g, uint32_t n, const refit_view *q, const refit_view *scale,
                const refit_view *x, int64_t group, int32_t *bad);

#endif
