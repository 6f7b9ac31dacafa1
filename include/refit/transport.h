/*
 * refit transports: weights from a trainer to the workers of an engine over
 * NCCL, in buckets, with a cross-rank commit (docs/nccl.md; wire version 5
 * adds patches, refit_sender_add_delta; version 4:
 * an announce and an index of every bucket come first, so every rank queues
 * the next broadcasts behind the current one; large contiguous tensors go
 * unpacked, from the trainer's tensor into the runtime tensor where the
 * route allows; payload checksums are summed on the device on both sides
 * and compared once, before the vote).
 *
 *   trainer (root)                              every worker rank
 *   ─────────────                               ─────────────────
 *   refit_transport_nccl(&x, ctx, opts)         refit_transport_nccl(&x, ctx, opts)
 *   refit_sender_create(&s, x, opts)            refit_receiver_create(&r, model, x, opts)
 *   refit_sender_add(s, name, tensor) ...
 *   refit_sender_send(s, &res)  ── buckets ──▶  refit_receive_update(r, opts, &res)
 *                               ◀── vote ────▶     (begin, receive, prepare, vote,
 *                                                   commit or abort)
 *
 * Every rank of the communicator takes part in every update: the root
 * sends, the others receive, and all vote once. The vote is an all-reduce
 * of each rank's status: the group commits only when every rank prepared
 * (refit_finalize_prepare) successfully; otherwise every rank aborts
 * (rollback, or POISONED without it).
 *
 * Deadlines: every wait has one (timeout_s). Past it, the communicator is
 * aborted (ncclCommAbort; a borrowed one only with abort_borrowed), the
 * update is aborted, the error says what was awaited, and the journal gets
 * a "transport" event. An aborted transport fails every later call: make a
 * new one.
 *
 * NCCL is not linked: it is looked up at run time, first among the
 * libraries already loaded (so refit and PyTorch share one NCCL), then as
 * libnccl.so.2 on the library path, or at $REFIT_NCCL_LIBRARY. The CUDA
 * driver (libcuda.so.1) likewise.
 *
 * Ranks that load their own tensors (no sender) commit as a group with
 * refit_group_finalize alone.
 *
 * Threading: a transport, and the sender or receiver using it, belong to
 * one thread at a time. Status codes are refit's (refit.h); a receiver's
 * deadline is REFIT_ETIMEDOUT, any other transport failure REFIT_EIO.
 */
#ifndef REFIT_TRANSPORT_H
#define REFIT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include <refit/refit.h>

#ifdef __cplusplus
extern "C" {
#endif

/* librefit.so is built with hidden visibility: what it exports must say
 * so (the version script only narrows what is visible). refit.h may define
 * this for the whole API; until then this header does, for its own. */
#ifndef REFIT_API
#define REFIT_API __attribute__((visibility("default")))
#endif

typedef struct refit_transport refit_transport;

/* ---- NCCL ---------------------------------------------------------------- */

#define REFIT_NCCL_ID_BYTES 128
/* An ncclUniqueId, passed between processes by the caller. */
typedef struct refit_nccl_id {
    uint8_t bytes[REFIT_NCCL_ID_BYTES];
} refit_nccl_id;

/* REFIT_OK when NCCL and the CUDA driver can be resolved in this process;
 * else REFIT_EUNSUPPORTED, and ctx's message says what was tried. On
 * success the message names the library found and its version. */
REFIT_API int refit_nccl_probe(refit_ctx *ctx);

/* ncclGetUniqueId: on one rank, then handed to every rank by the caller. */
REFIT_API int refit_nccl_unique_id(refit_ctx *ctx, refit_nccl_id *out);

#define REFIT_NCCL_OPTS_VERSION 1
typedef struct refit_nccl_opts {
    uint32_t version;          /* REFIT_NCCL_OPTS_VERSION */
    void *comm;                /* the caller's ncclComm_t (borrowed), or NULL:
                                  refit creates one from id/nranks/rank */
    const refit_nccl_id *id;
    int32_t nranks, rank;
    int32_t device;            /* this rank's CUDA device */
    void *stream;              /* cudaStream_t of refit's collectives; NULL:
                                  refit creates a non-blocking stream */
    double timeout_s;          /* communicator creation and each wait; 0: 300 */
    int abort_borrowed;        /* 1: on a deadline, ncclCommAbort the caller's
                                  comm too (it is stuck anyway; the caller must
                                  not use or destroy it after) */
} refit_nccl_opts;
#define REFIT_NCCL_OPTS_INIT {REFIT_NCCL_OPTS_VERSION, NULL, NULL, 0, 0, 0, NULL, 0, 0}

/* Open a transport over NCCL. Communicator creation waits up to the
 * timeout for every rank (non-blocking init, polled). Errors on ctx. */
REFIT_API int refit_transport_nccl(refit_transport **out, refit_ctx *ctx, const refit_nccl_opts *opt);

/* ---- loopback (in-process, for tests and single-process setups) --------- */

typedef struct refit_loopback refit_loopback;

/* A group of nranks endpoints in one process, one thread each. */
REFIT_API int refit_loopback_create(refit_loopback **out, int nranks);
/* After every endpoint is closed. NULL is ok. */
REFIT_API void refit_loopback_destroy(refit_loopback *g);
/* The endpoint of rank in g; messages on ctx; timeout_s 0: 300. */
REFIT_API int refit_transport_loopback(refit_transport **out, refit_ctx *ctx, refit_loopback *g, int rank,
                             double timeout_s);

/* ---- any transport --------------------------------------------------------- */

REFIT_API int refit_transport_rank(const refit_transport *x);
REFIT_API int refit_transport_nranks(const refit_transport *x);
/* 1 once a deadline or an error aborted it. */
REFIT_API int refit_transport_aborted(const refit_transport *x);
/* Close; a communicator refit created is destroyed (aborted if it was
 * stuck), a borrowed one is left to its owner. NULL is ok. */
REFIT_API void refit_transport_close(refit_transport *x);

/* What an update came to, on this rank. */
typedef struct refit_group_result {
    int decision;              /* REFIT_OK: the group committed; else the
                                  status that made it abort */
    int local_status;          /* this rank's own vote */
    int failed_rank;           /* a rank that voted the decision, -1: none */
    int vote_taken;            /* 0: the vote itself failed (deadline or a
                                  dead peer): this rank aborted on its own */
    int worker_status;         /* the abort's result on this rank:
                                  REFIT_OK (rolled back or nothing written),
                                  REFIT_EPOISONED; REFIT_OK after a commit */
    uint32_t buckets;
    uint64_t tensors, bytes;   /* pieces and payload bytes sent/received */
    double seconds;            /* first byte to decision */
    char version_label[128];   /* the sender's label (truncated) */
} refit_group_result;

/* ---- sender (trainer side) ---------------------------------------------- */

#define REFIT_SEND_OPTS_VERSION 2
typedef struct refit_send_opts {
    uint32_t version;          /* REFIT_SEND_OPTS_VERSION (1: without
                                  direct_min_bytes, which is then the default) */
    const char *version_label; /* in every bucket header; NULL: "unnamed" */
    uint64_t bucket_bytes;     /* payload per bucket at most; 0: 1 GiB. The
                                  first and last buckets are smaller (ramp).
                                  Each rank holds 2 to 8 buckets in flight
                                  (as many as fit 512 MiB) */
    int root;                  /* the sending rank */
    int checksum_payload;      /* 1: checksum every payload (one extra read
                                  of the bytes on each side, on the device
                                  beside the broadcasts; no host wait per
                                  bucket: receivers compare every bucket's
                                  once, before the vote, and a mismatch
                                  aborts the update on every rank) */
    double timeout_s;          /* each wait; 0: the transport's */
    void *stream;              /* stream for the packing copies (device
                                  tensors), NULL: the default stream */
    uint64_t direct_min_bytes; /* a tensor of at least this many bytes whose
                                  bytes are contiguous in the transport's
                                  memory (on the communicator's device) is
                                  broadcast from itself, unpacked, in
                                  buckets of its own (receivers take them
                                  straight into the runtime tensor where
                                  its route allows); 0 (the default):
                                  never, every byte is packed (measured
                                  faster on 2 x H200; 16 MiB is a good
                                  value where the receiver's memory
                                  traffic matters more) */
} refit_send_opts;
#define REFIT_SEND_OPTS_INIT {REFIT_SEND_OPTS_VERSION, NULL, 0, 0, 1, 0, NULL, 0}

typedef struct refit_sender refit_sender;

REFIT_API int refit_sender_create(refit_sender **out, refit_transport *x, const refit_send_opts *opt);
REFIT_API void refit_sender_destroy(refit_sender *s);
/* Add a tensor under its checkpoint name. t (and its shape/strides) is
 * borrowed until refit_sender_destroy or refit_sender_clear; its bytes are
 * read during each refit_sender_send. */
REFIT_API int refit_sender_add(refit_sender *s, const char *name, const refit_tensor *t);
/* Add a patch of checkpoint tensor name, for a delta update on the
 * receivers (refit_load_delta there; docs/nccl.md "Patches"): n flat
 * indices (or run starts, counts[i] elements each; counts NULL: single
 * elements) in host memory, and values, 1-D of the checkpoint dtype, one
 * a patched element. All borrowed as refit_sender_add's tensors. A patch
 * travels in one bucket (one larger than bucket_bytes fails the send). A
 * name is added once, whole or patched. REFIT_EINVAL for a negative
 * index, a run under one element or a value count that is not the
 * elements'; the receiving model checks the rest. */
REFIT_API int refit_sender_add_delta(refit_sender *s, const char *name, size_t n,
                                     const int64_t *indices, const int64_t *counts,
                                     const refit_tensor *values);
REFIT_API void refit_sender_clear(refit_sender *s);
/* The version label of the next sends (a trainer keeps one sender across
 * steps: its slots and buffers are reused). REFIT_EINVAL when longer than
 * 1024 bytes. */
REFIT_API int refit_sender_set_label(refit_sender *s, const char *label);
/* Send every tensor added (one update), then take part in the vote.
 * REFIT_OK when every rank committed; else the decision's status (see
 * out), REFIT_EIO when the transport failed. A tensor that cannot be
 * packed cancels the update: every planned bucket is still sent (stamped
 * CANCEL, so the receivers' queued broadcasts match), and every rank votes
 * that status. out may be NULL. */
REFIT_API int refit_sender_send(refit_sender *s, refit_group_result *out);

/* ---- receiver (worker side) ---------------------------------------------- */

#define REFIT_RECV_OPTS_VERSION 1
typedef struct refit_recv_opts {
    uint32_t version;          /* REFIT_RECV_OPTS_VERSION */
    int root;                  /* the sending rank */
    double timeout_s;          /* each wait within an update; 0: the transport's */
    double start_timeout_s;    /* the wait for an update to start; 0: timeout_s */
    void *stream;              /* the engine's stream for the copies into
                                  runtime tensors; NULL: default stream */
    uint64_t max_bucket_bytes; /* refuse larger buckets; 0: 4 GiB */
    refit_filter_fn filter;    /* NULL: every tensor sent is loaded */
    void *filter_user;
} refit_recv_opts;
#define REFIT_RECV_OPTS_INIT {REFIT_RECV_OPTS_VERSION, 0, 0, 0, NULL, 0, NULL, NULL}

typedef struct refit_receiver refit_receiver;

/* A receiver for model's worker. x must be on the model's context. */
REFIT_API int refit_receiver_create(refit_receiver **out, refit_model *model, refit_transport *x,
                          const refit_recv_opts *opt);
REFIT_API void refit_receiver_destroy(refit_receiver *r);

/* One whole update: wait for it, begin (opts; version label from the
 * sender when opts->version_label is NULL), receive every bucket into the
 * transaction, then refit_group_finalize. Returns as refit_group_finalize;
 * REFIT_ETIMEDOUT when a wait passed its deadline (the transport is then
 * aborted and the update aborted on this rank). */
REFIT_API int refit_receive_update(refit_receiver *r, const refit_update_opts *opts,
                         refit_group_result *out);

/* The receiving part alone, into a transaction the caller began: every
 * bucket of one update. A load that fails does not stop the receiving (the
 * other ranks go on broadcasting): the rest is drained, and the first
 * error is returned for the vote. REFIT_EIO or REFIT_ETIMEDOUT: the
 * transport failed (it is aborted, and the caller should refit_abort). */
REFIT_API int refit_receive(refit_receiver *r, refit_txn *txn, refit_progress_fn progress, void *user);

/* Cross-rank commit, on every rank of x but the sender (which votes in
 * refit_sender_send):
 *   1. local_status == REFIT_OK: refit_finalize_prepare(txn) (every check;
 *      on failure it aborts the txn); else refit_abort(txn) at once;
 *   2. all-reduce(min) of the statuses, with the deadline;
 *   3. every vote OK: refit_commit (cannot fail); else refit_abort.
 * No rank commits before every rank prepared. A vote that fails (deadline,
 * dead peer) aborts: never commit without it. txn may be NULL (begin
 * failed; local_status says why). The txn is freed in every case. */
REFIT_API int refit_group_finalize(refit_transport *x, refit_txn *txn, int local_status,
                         refit_group_result *out);

#ifdef __cplusplus
}
#endif
#endif /* REFIT_TRANSPORT_H */
