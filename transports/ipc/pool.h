/* Shareable memory for a keeper's runtime tensors (pool.c): one memfd on
 * the host, one cuMemAlloc on a device, handed out in 256-byte-aligned
 * pieces and exported whole (docs/restart.md, "The keeper"). */
#ifndef REFIT_CORE_IPC_POOL_H
#define REFIT_CORE_IPC_POOL_H

#include <refit/ipc.h>

#include "transports/ipc/mem.h"

struct refit_ipc_pool {
    refit_ctx *ctx;
    ipc_mem_desc d;             /* d.fd: the read-only descriptor (host) */
    uint8_t *base;              /* host address, or the device pointer */
    uint64_t used;
    ipc_cuda cu;                /* device pools */
    char err[512];
};

/* Whether [p, p + n) lies inside the pool; *off: p's offset from its base. */
int ipc_pool_holds(const refit_ipc_pool *pool, const void *p, uint64_t n, uint64_t *off);

#endif
