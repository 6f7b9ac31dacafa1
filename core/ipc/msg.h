/*
 * The messages of the IPC control channel (docs/ipc.md), each the payload
 * of one frame (chan.h). The decoders take untrusted bytes and check every
 * field before anything is used; the update's index is the NCCL wire's
 * (core/nccl/bucket.h: announce, then every bucket's header), one bucket
 * per region of shared memory.
 *
 *   HELLO    u32 role (1 trainer, 2 worker), u32 pid, i32 rank, u32 workers
 *   MEMS     u32 epoch, u32 n, u32 flags (1: event handle follows), u32 0,
 *            [64-byte event handle], n x {u32 id, u32 generation, u16 kind,
 *            u16 0, i32 device, u64 bytes, 64-byte handle}; one descriptor
 *            passed per HOST_FD memory, in table order
 *   UPDATE   u64 seq, u32 epoch, u32 flags (1: wait on the trainer's event),
 *            u32 buckets, u32 0, buckets x {u32 memory id, u32 flags (1: sum
 *            holds the payload's checksum), u64 offset of the bucket in the
 *            memory, u64 sum}, announce (128 bytes), index (the rest, exactly)
 *   VOTE, DECISION, RESULT   u64 seq, i32 status, u16 message bytes, message
 */
#ifndef REFIT_CORE_IPC_MSG_H
#define REFIT_CORE_IPC_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/ipc/chan.h"
#include "core/nccl/bucket.h"

#define IPC_HANDLE_BYTES 64
#define IPC_MAX_MEMS (1u << 20)
#define IPC_MEM_REC 88
#define IPC_REF_REC 24
#define IPC_MAX_MSG 1024

enum { IPC_ROLE_TRAINER = 1, IPC_ROLE_WORKER = 2 };
enum { IPC_MEM_CUDA = 1, IPC_MEM_HOST_FD = 2 };
#define IPC_MEMS_EVENT 0x1u
#define IPC_U_EVENT 0x1u
#define IPC_B_SUM 0x1u

typedef struct ipc_hello {
    uint32_t role, pid;
    int32_t rank;
    uint32_t workers;
} ipc_hello;

typedef struct ipc_mem_desc {
    uint32_t id, gen;
    uint16_t kind;              /* IPC_MEM_* */
    int32_t device;
    uint64_t bytes;
    uint8_t handle[IPC_HANDLE_BYTES]; /* CUDA: cudaIpcMemHandle_t; HOST_FD: zeros */
    int fd;                     /* HOST_FD: the descriptor (owned by the table), else -1 */
} ipc_mem_desc;

typedef struct ipc_mems {
    uint32_t epoch, n;
    ipc_mem_desc *m;
    bool has_event;
    uint8_t event[IPC_HANDLE_BYTES]; /* cudaIpcEventHandle_t */
} ipc_mems;

typedef struct ipc_ref {
    uint32_t mem, flags;
    uint64_t offset, sum;
} ipc_ref;

typedef struct ipc_update {
    uint64_t seq;
    uint32_t epoch, flags, n_buckets;
    ipc_ref *refs;              /* n_buckets, malloc'd */
    bkt_announce an;
    const uint8_t *index;       /* the index, inside the frame's payload */
    uint64_t index_bytes;
} ipc_update;

typedef struct ipc_status_msg {
    uint64_t seq;
    int32_t status;
    char msg[IPC_MAX_MSG + 1];
} ipc_status_msg;

void ipc_hello_encode(ipc_wbuf *w, const ipc_hello *h);
int ipc_hello_decode(ipc_hello *h, const ipc_frame *f, uint32_t want_role, char *err,
                     size_t errlen);

/* fds of HOST_FD memories go with the frame (ipc_mems_fds lists them). */
void ipc_mems_encode(ipc_wbuf *w, const ipc_mems *t);
uint16_t ipc_mems_fds(const ipc_mems *t, int *fds, uint16_t cap);
/* Decode; takes the frame's descriptors into the table (the frame's are
 * set to -1). Ids unique, kinds known, sizes > 0, one descriptor per
 * HOST_FD memory. */
int ipc_mems_decode(ipc_mems *t, ipc_frame *f, char *err, size_t errlen);
/* Closes the descriptors the table owns, frees it. */
void ipc_mems_free(ipc_mems *t);

void ipc_update_encode(ipc_wbuf *w, const ipc_update *u, const uint8_t an[BKT_ANNOUNCE_BYTES]);
/* Decode the fixed part, the bucket map and the announce (max_bucket: the
 * largest bucket accepted); u->index points into f's payload. */
int ipc_update_decode(ipc_update *u, const ipc_frame *f, uint64_t max_bucket, char *err,
                      size_t errlen);
void ipc_update_free(ipc_update *u);

void ipc_status_encode(ipc_wbuf *w, uint64_t seq, int32_t status, const char *msg);
int ipc_status_decode(ipc_status_msg *s, const ipc_frame *f, uint64_t want_seq, char *err,
                      size_t errlen);

#endif
