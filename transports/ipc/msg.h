/*
 * The messages of the IPC control channel (docs/ipc.md), each the payload
 * of one frame (chan.h). The decoders take untrusted bytes and check every
 * field before anything is used. The index is the NCCL wire's
 * (transports/nccl/bucket.h: announce, then every bucket's header), one bucket
 * per region of shared memory; it travels in INDEX, once per layout, and
 * each UPDATE names it (so a steady update is a 32-byte frame and a label).
 *
 *   HELLO    u32 role (1 trainer, 2 worker), u32 pid, i32 rank, u32 workers
 *   MEMS     u32 epoch, u32 n, u32 flags (1: event handle follows), u32 0,
 *            [64-byte event handle], n x {u32 id, u32 generation, u16 kind,
 *            u16 0, i32 device, u64 bytes, 64-byte handle}; one descriptor
 *            passed per HOST_FD memory, in table order
 *   INDEX    u32 index id (> 0), u32 epoch (the memory table it lies in),
 *            u32 buckets, u32 0, buckets x {u32 memory id, u32 0, u64 offset
 *            of the bucket in the memory}, announce (128 bytes), index (the
 *            rest, exactly; the headers' version label empty: UPDATE has it)
 *   UPDATE   u64 seq, u32 epoch, u32 flags (1: wait on the trainer's event,
 *            2: checksums follow), u32 index id, u32 buckets, u16 label
 *            bytes, u16 0, u32 0, label, [buckets x u64 payload checksum]
 *   VOTE, DECISION, RESULT   u64 seq, i32 status, u16 message bytes, message
 */
#ifndef REFIT_CORE_IPC_MSG_H
#define REFIT_CORE_IPC_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transports/ipc/chan.h"
#include "transports/nccl/bucket.h"

#define IPC_HANDLE_BYTES 64
#define IPC_MAX_MEMS (1u << 20)
#define IPC_MEM_REC 88
#define IPC_REF_REC 16          /* an INDEX's bucket: memory id, 0, offset */
#define IPC_UPDATE_FIXED 32
#define IPC_MAX_MSG 1024

enum { IPC_ROLE_TRAINER = 1, IPC_ROLE_WORKER = 2 };
enum { IPC_MEM_CUDA = 1, IPC_MEM_HOST_FD = 2 };
#define IPC_MEMS_EVENT 0x1u
#define IPC_U_EVENT 0x1u
#define IPC_U_SUMS 0x2u

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
    uint32_t mem;
    uint64_t offset;
} ipc_ref;

typedef struct ipc_index {
    uint32_t id, epoch, n_buckets;
    ipc_ref *refs;              /* n_buckets, malloc'd by the decoder */
    bkt_announce an;
    const uint8_t *index;       /* the index, inside the frame's payload */
    uint64_t index_bytes;
} ipc_index;

typedef struct ipc_update {
    uint64_t seq;
    uint32_t epoch, flags, index_id, n_buckets;
    char label[BKT_MAX_LABEL + 1];
    const uint8_t *sums;        /* IPC_U_SUMS: n_buckets LE u64, in the frame; else NULL */
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

void ipc_index_encode(ipc_wbuf *w, const ipc_index *x, const uint8_t an[BKT_ANNOUNCE_BYTES]);
/* Decode the fixed part, the bucket map and the announce (max_bucket: the
 * largest bucket accepted); x->index points into f's payload. */
int ipc_index_decode(ipc_index *x, const ipc_frame *f, uint64_t max_bucket, char *err,
                     size_t errlen);
void ipc_index_free(ipc_index *x);

/* sums: n_buckets checksums when u->flags has IPC_U_SUMS. */
void ipc_update_encode(ipc_wbuf *w, const ipc_update *u, const uint64_t *sums);
/* Every field, the label (no NUL, at most BKT_MAX_LABEL) and the size
 * exactly; u->sums points into f's payload. */
int ipc_update_decode(ipc_update *u, const ipc_frame *f, char *err, size_t errlen);

void ipc_status_encode(ipc_wbuf *w, uint64_t seq, int32_t status, const char *msg);
int ipc_status_decode(ipc_status_msg *s, const ipc_frame *f, uint64_t want_seq, char *err,
                      size_t errlen);

#endif
