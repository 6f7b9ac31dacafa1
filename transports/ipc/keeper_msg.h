/*
 * The keeper's restore messages (docs/restart.md, "The keeper"), each the
 * payload of one control frame (chan.h). A restore on the keeper's socket:
 *
 *   worker  HELLO (role RESTORER)          keeper  HELLO (role KEEPER)
 *           ◀── MEMS (the memories holding its runtime tensors, + fds)
 *           ◀── K_OFFER (version, signature, fingerprints, where each tensor lies)
 *   checks, copies, checks ── K_DONE (0, or why not) ──▶
 *           ◀── K_CONFIRM (0: the keeper outlived the reads) ── commit
 *
 *   K_OFFER  i32 status, u16 message bytes, u16 0, message; when status is
 *            0: u32 modules, u32 runtime tensors, u32 signature bytes,
 *            u16 label bytes, u16 worker id bytes, i64 journal update id,
 *            u32 keeper pid, u32 0, label, worker id, signature (JSON
 *            text), modules x u64 fingerprint, runtime x {u32 memory id,
 *            u32 0, u64 offset of the first element, u64 offset of the
 *            lowest byte, u64 bytes spanned}
 *   K_DONE, K_CONFIRM  the status message of msg.h (seq 0)
 *
 * The decoder takes untrusted bytes and checks every count and length
 * against the frame before anything is used.
 */
#ifndef REFIT_CORE_IPC_KEEPER_MSG_H
#define REFIT_CORE_IPC_KEEPER_MSG_H

#include <stdint.h>

#include "transports/ipc/msg.h"

enum { IPC_ROLE_RESTORER = 3, IPC_ROLE_KEEPER = 4 };

#define IPC_K_MAX_SIG ((uint32_t)256 << 20)
#define IPC_K_MAX_ID 1024

typedef struct ipc_k_place {
    uint32_t mem;
    uint64_t data_off;          /* the tensor's first element, from the memory's base */
    uint64_t span_off;          /* its lowest byte */
    uint64_t span_bytes;        /* lowest to highest byte, inclusive */
} ipc_k_place;

typedef struct ipc_k_offer {
    int32_t status;             /* 0: what follows is served; else why not */
    char msg[IPC_MAX_MSG + 1];
    uint32_t n_modules, n_runtime;
    char label[BKT_MAX_LABEL + 1];
    char worker[IPC_K_MAX_ID + 1];
    int64_t update_id;
    uint32_t pid;
    const char *sig;            /* sig_bytes, inside the frame (not terminated) */
    uint32_t sig_bytes;
    const uint8_t *fps;         /* n_modules LE u64, inside the frame */
    ipc_k_place *places;        /* n_runtime, malloc'd by the decoder */
} ipc_k_offer;

/* A group member's HELLO to a trainer: a worker's, or a keeper's that
 * follows the group (the trainer sends it the DECISION last). */
int ipc_hello_decode_member(ipc_hello *h, const ipc_frame *f, char *err, size_t errlen);

/* A refusal (status != 0, msg) or the whole offer. */
void ipc_k_offer_encode(ipc_wbuf *w, const ipc_k_offer *o, const uint64_t *fps);
/* max_modules, max_runtime: the restoring model's counts (an offer of
 * more is refused before any table is taken). A refusal keeps nothing:
 * o->places is NULL. */
int ipc_k_offer_decode(ipc_k_offer *o, const ipc_frame *f, uint32_t max_modules,
                       uint32_t max_runtime, char *err, size_t errlen);
void ipc_k_offer_free(ipc_k_offer *o);
uint64_t ipc_k_offer_fp(const ipc_k_offer *o, uint32_t module);

#endif
