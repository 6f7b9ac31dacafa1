/* NVFP4's launcher: plans the launches of its device code
 * (plugins/nvfp4/quant_nvfp4.cu) for n pieces and enqueues them through a
 * refit_pgpu table (refit/sdk/pgpu.h), bit for bit kern_quant_nvfp4
 * (online pieces) and kern_swizzle + kern_nvfp4_fuse (checkpoint pieces).
 * Every view device-readable. Checkpoint pieces go in one launch per
 * QN_BATCH pieces; online pieces in sets of about set_bytes of input
 * (<= 0: QN_SET_BYTES), one amax and one encode launch per set. Never
 * waits: a NaN or infinity in an online piece lowers g->status to the
 * lowest such piece's index (that piece's outputs unwritten, others'
 * written). Returns REFIT_OK; REFIT_EUNSUPPORTED / EMISMATCH / EINVAL
 * (views; *bad the piece, g->msg says why), or the table's failure. */
#ifndef REFIT_PLUGINS_NVFP4_LAUNCH_H
#define REFIT_PLUGINS_NVFP4_LAUNCH_H

#include <refit/sdk/pgpu.h>
#include "plugins/nvfp4/nvfp4_piece.h"

int nvfp4_launch(refit_pgpu *g, uint32_t n, const refit_nvfp4_piece *pieces, int64_t set_bytes,
                 int32_t *bad);

#endif
