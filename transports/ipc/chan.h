/*
 * The control channel of the CUDA IPC transport (docs/ipc.md): frames on a
 * Unix domain stream socket, every read and write under a deadline.
 *
 * A frame is a 32-byte header and a payload:
 *
 *   0  u32 magic "RTIC"        16  u64 payload checksum
 *   4  u16 protocol version    24  u64 header checksum (of bytes 0..23)
 *   6  u16 type
 *   8  u32 payload bytes
 *  12  u16 descriptors passed with the frame (SCM_RIGHTS), u16 flags (0)
 *
 * Integers are little-endian; checksums are bkt_checksum (transports/nccl's).
 * The header is checked (magic, version, its checksum, type, size against
 * the limit, flags, descriptors) before the payload is read or any memory
 * is taken for it; the payload's checksum before it is handed on. Anything
 * off is REFIT_ECORRUPT with a message; the peer's close is REFIT_EIO, a
 * passed deadline REFIT_ETIMEDOUT. After any of them the channel cannot be
 * trusted to be at a frame boundary: close it.
 */
#ifndef REFIT_CORE_IPC_CHAN_H
#define REFIT_CORE_IPC_CHAN_H

#include <stddef.h>
#include <stdint.h>

#define IPC_MAGIC 0x43495452u          /* "RTIC" */
#define IPC_PROTO_VERSION 2
#define IPC_FRAME_HEADER 32
#define IPC_MAX_PAYLOAD ((uint32_t)512 << 20)
#define IPC_MAX_FDS 64                 /* descriptors one frame may pass */

typedef enum ipc_type {
    IPC_HELLO = 1,      /* both ways, once per connection */
    IPC_MEMS = 2,       /* trainer: the table of shared memories (+ fds) */
    IPC_UPDATE = 3,     /* trainer: one update: its index's id, label, checksums */
    IPC_VOTE = 4,       /* worker: prepared (0) or why not */
    IPC_DECISION = 5,   /* trainer: commit (0) or abort, for every worker */
    IPC_RESULT = 6,     /* worker: what the decision came to */
    IPC_INDEX = 7,      /* trainer, when its layout changed: bucket map, announce, index */
    IPC_TYPE_MAX = 7,
    /* a keeper's restores (transports/ipc/keeper*.c, docs/restart.md), numbered
     * apart so the trainer's range can grow */
    IPC_K_OFFER = 32,   /* keeper: what it holds (or why it serves nothing) */
    IPC_K_DONE = 33,    /* restoring worker: copied and checked (0), or why not */
    IPC_K_CONFIRM = 34, /* keeper: it outlived the worker's reads */
    IPC_K_FIRST = IPC_K_OFFER,
    IPC_K_LAST = IPC_K_CONFIRM,
} ipc_type;

typedef struct ipc_frame {
    uint16_t type;
    uint32_t len;
    uint8_t *payload;           /* malloc'd, len bytes (NULL when 0) */
    int fds[IPC_MAX_FDS];
    uint16_t n_fds;
} ipc_frame;

/* src into dst (n bytes), cut where it does not fit; always terminated. */
void ipc_copy_str(char *dst, size_t n, const char *src);

/* Seconds on CLOCK_MONOTONIC. */
double ipc_now(void);
/* CLOCK_MONOTONIC in nanoseconds (the profiles' clock). */
uint64_t ipc_now_ns(void);

/* Send one frame (fds passed with it, n_fds <= IPC_MAX_FDS) by deadline
 * (an ipc_now() value). REFIT_EIO / REFIT_ETIMEDOUT with err. */
int ipc_send(int fd, uint16_t type, const void *payload, uint32_t len, const int *fds,
             uint16_t n_fds, double deadline, char *err, size_t errlen);
/* Busy-poll fd (poll with no timeout) until it is readable (1) or until
 * passes (0): a reply expected soon is then read without the wake-up of a
 * process asleep in poll. */
int ipc_spin_readable(int fd, double until);
/* Receive one frame by deadline into f (free with ipc_frame_free): whole,
 * checked, or an error (fds received with a refused frame are closed).
 * max_len: the largest payload accepted (<= IPC_MAX_PAYLOAD). */
int ipc_recv(int fd, ipc_frame *f, uint32_t max_len, double deadline, char *err, size_t errlen);
/* Frees the payload and closes descriptors not taken (set to -1). */
void ipc_frame_free(ipc_frame *f);

/* The 32-byte header of a frame, and its check (for ipc_recv and tests). */
void ipc_header_encode(uint8_t out[IPC_FRAME_HEADER], uint16_t type, uint32_t len,
                       uint16_t n_fds, uint64_t payload_sum);
int ipc_header_decode(const uint8_t in[IPC_FRAME_HEADER], uint16_t *type, uint32_t *len,
                      uint16_t *n_fds, uint64_t *payload_sum, uint32_t max_len, char *err,
                      size_t errlen);
const char *ipc_type_name(uint16_t type);

/* Sockets. Listen on path with the socket file's mode (its permission
 * bits; checked before listen, so no peer connects before they hold):
 * a socket file whose listener is gone (connect refused) is replaced, a
 * live one is REFIT_EEXIST, anything else there REFIT_EINVAL. *id: the
 * file bound (st_dev, st_ino), for ipc_unlink_own. */
typedef struct ipc_sock_id {
    uint64_t dev, ino;
} ipc_sock_id;
int ipc_listen(const char *path, uint32_t mode, int *out, ipc_sock_id *id, char *err,
               size_t errlen);
/* Unlink path when it is still the socket file id names (not one another
 * listener bound there since). */
void ipc_unlink_own(const char *path, const ipc_sock_id *id);
/* Accept one connection by deadline; connect to path retrying until
 * deadline (the peer may not listen yet). */
int ipc_accept(int lfd, double deadline, int *out, char *err, size_t errlen);
int ipc_connect(const char *path, double deadline, int *out, char *err, size_t errlen);

/* The peer of a connected socket (SO_PEERCRED: its credentials when it
 * connected or listened). REFIT_EIO with err. */
int ipc_peer_cred(int fd, uint32_t *uid, int32_t *pid, char *err, size_t errlen);
/* Whether a peer of uid may talk to this process: its own effective uid,
 * or one of allow[0..n). */
int ipc_uid_allowed(uint32_t uid, const uint32_t *allow, uint32_t n);

/* Bounded little-endian writer and reader for payloads. */
typedef struct ipc_wbuf {
    uint8_t *p;
    size_t len, cap;
    int failed;                 /* out of memory: the frame is not sent */
} ipc_wbuf;
void ipc_w_bytes(ipc_wbuf *w, const void *p, size_t n);
void ipc_w16(ipc_wbuf *w, uint16_t v);
void ipc_w32(ipc_wbuf *w, uint32_t v);
void ipc_w64(ipc_wbuf *w, uint64_t v);
void ipc_wbuf_free(ipc_wbuf *w);

typedef struct ipc_rbuf {
    const uint8_t *p;
    size_t len, at;
    int short_read;             /* a read past the end happened: refuse */
} ipc_rbuf;
const uint8_t *ipc_r_bytes(ipc_rbuf *r, size_t n);
uint16_t ipc_r16(ipc_rbuf *r);
uint32_t ipc_r32(ipc_rbuf *r);
uint64_t ipc_r64(ipc_rbuf *r);

#endif
