/* refit/sys: the NCCL transport seen from a bench (docs/abi.md: exported
 * and versioned like the API, but a counter may change meaning or go away
 * in a minor release, said in the release notes). */
#ifndef REFIT_SYS_TRANSPORT_H
#define REFIT_SYS_TRANSPORT_H

#include <stdint.h>

#include <refit/transport.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes r received straight into runtime tensors (DIRECT buckets, no
 * staging copy) in its last refit_receive; 0 for a NULL r. */
REFIT_API uint64_t refit_sys_receiver_direct_bytes(const refit_receiver *r);

#ifdef __cplusplus
}
#endif

#endif
