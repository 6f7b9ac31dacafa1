/*
 * refit over CUDA IPC: a colocated trainer hands weights to the engine
 * workers on the same machine (docs/ipc.md). The trainer exports its
 * tensors once, either its own parameter storage (REFIT_IPC_SHARE: no
 * copy) or packed into flat buckets refit allocates (REFIT_IPC_PACK);
 * each worker opens the handles once, caches them, and takes every update
 * into an open transaction straight from the trainer's memory.
 *
 *   trainer                                     each worker (listens)
 *   refit_ipc_sender_create(&s, ctx, paths)     refit_ipc_receiver_create(&r, model, path)
 *   refit_ipc_sender_add(s, name, t, how) ...
 *   refit_ipc_sender_send(s, &res)  ── UPDATE ─▶ refit_ipc_receive_update(r, opts, &res)
 *        (collects the votes,       ◀── VOTE ──      begin, wait on the trainer's event,
 *         decides for all)          ── DECISION ▶    load, prepare, vote, commit | abort
 *
 * Control: one Unix domain socket per worker, framed and versioned; every
 * frame is checked before use and every wait has a deadline. The index is
 * the NCCL wire's (docs/nccl.md): an announce and one bucket header per
 * region of shared memory. Ordering across processes is by a CUDA IPC
 * event the worker's stream waits on (no host round trip per bucket).
 *
 * Two-phase commit: the trainer is the coordinator. Every worker prepares
 * (refit_finalize_prepare) and votes; the trainer sends commit only when
 * every vote is OK, else abort. A worker that does not hear the decision
 * by its deadline (the trainer died or stalled) aborts (rolled back, or
 * POISONED without rollback), journals why, drops the connection and
 * serves the next trainer that connects.
 *
 * Without a device (device -1) the same protocol runs over host memory
 * (memfd passed on the socket): what tests and CPU workers use.
 *
 * Threading: a sender or receiver belongs to one thread at a time. Errors:
 * refit statuses, the message on the context; a deadline is
 * REFIT_ETIMEDOUT, a peer gone or the socket failing REFIT_EIO, a refused
 * frame REFIT_ECORRUPT.
 */
#ifndef REFIT_IPC_H
#define REFIT_IPC_H

#include <refit/transport.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How a tensor is exported. */
enum {
    REFIT_IPC_SHARE = 0, /* its own storage: contiguous, in device memory from
                            cudaMalloc (PyTorch's caching allocator without
                            expandable segments) or refit_ipc_host_alloc */
    REFIT_IPC_PACK = 1,  /* copied at each send into a flat bucket refit holds */
};

/* ---- trainer ---- */

#define REFIT_IPC_SEND_OPTS_VERSION 1
typedef struct refit_ipc_send_opts {
    uint32_t version;          /* REFIT_IPC_SEND_OPTS_VERSION */
    const char *version_label; /* NULL: "unnamed"; see refit_ipc_sender_set_label */
    int32_t device;            /* CUDA device of the tensors; -1: host memory */
    uint64_t bucket_bytes;     /* payload of one packed bucket at most; 0: 1 GiB
                                  (a larger tensor gets a bucket of its own) */
    int checksum;              /* 1: a checksum of every bucket in the index,
                                  verified by the worker before it writes
                                  (one extra read on each side) */
    double timeout_s;          /* connecting and each wait; 0: 300 */
    void *stream;              /* the trainer's stream: packing copies, and the
                                  event the workers wait on; NULL: default */
} refit_ipc_send_opts;
#define REFIT_IPC_SEND_OPTS_INIT {REFIT_IPC_SEND_OPTS_VERSION, NULL, -1, 0, 0, 0, NULL}

typedef struct refit_ipc_sender refit_ipc_sender;

/* Connect to n_workers workers listening at paths (retrying until the
 * timeout: they may start later). Errors on ctx. */
REFIT_API int refit_ipc_sender_create(refit_ipc_sender **out, refit_ctx *ctx,
                                      const char *const *paths, int n_workers,
                                      const refit_ipc_send_opts *opt);
REFIT_API void refit_ipc_sender_destroy(refit_ipc_sender *s);
/* Add a tensor under its checkpoint name, exported as how says. t (and its
 * shape/strides) is borrowed until destroy; it is read again at each send
 * (a SHARE tensor whose storage moved is exported again and the workers
 * told). */
REFIT_API int refit_ipc_sender_add(refit_ipc_sender *s, const char *name, const refit_tensor *t,
                                   int how);
/* The version label of the next sends. REFIT_EINVAL past 1024 bytes. */
REFIT_API int refit_ipc_sender_set_label(refit_ipc_sender *s, const char *label);
/* One update to every worker: pack, record the event, send the index,
 * collect the votes, send the decision, collect the results. REFIT_OK when
 * every worker committed; else the status that made the group abort (out
 * says which worker). Buffers and handles are made at the first send and
 * reused. out may be NULL. */
REFIT_API int refit_ipc_sender_send(refit_ipc_sender *s, refit_group_result *out);
/* Host memory (device -1) a trainer's tensor may live in to be shared
 * unpacked; freed with the sender. */
REFIT_API int refit_ipc_host_alloc(refit_ipc_sender *s, size_t bytes, void **out);

/* ---- worker ---- */

#define REFIT_IPC_RECV_OPTS_VERSION 1
typedef struct refit_ipc_recv_opts {
    uint32_t version;          /* REFIT_IPC_RECV_OPTS_VERSION */
    double timeout_s;          /* each wait within an update; 0: 300 */
    double start_timeout_s;    /* the wait for a trainer and its update; 0: timeout_s */
    void *stream;              /* the engine's stream for the copies; NULL: default */
    uint64_t max_bucket_bytes; /* refuse larger buckets; 0: 64 GiB */
    refit_filter_fn filter;    /* NULL: every tensor sent is loaded */
    void *filter_user;
} refit_ipc_recv_opts;
#define REFIT_IPC_RECV_OPTS_INIT {REFIT_IPC_RECV_OPTS_VERSION, 0, 0, NULL, 0, NULL, NULL}

typedef struct refit_ipc_receiver refit_ipc_receiver;

/* Listen at path (a socket file already there is replaced). */
REFIT_API int refit_ipc_receiver_create(refit_ipc_receiver **out, refit_model *model,
                                        const char *path, const refit_ipc_recv_opts *opt);
REFIT_API void refit_ipc_receiver_destroy(refit_ipc_receiver *r);
/* One whole update: accept a trainer if none is connected, take its memory
 * table (handles opened once, kept while unchanged), check the index
 * against the model (names, dtypes, shapes, placement: a refusal writes
 * nothing and begins nothing), begin (opts; the trainer's label when
 * opts->version_label is NULL), load, prepare, vote, commit or abort as
 * the trainer decides. Returns the group's decision (REFIT_OK: committed);
 * out->worker_status says what this worker holds after an abort. */
REFIT_API int refit_ipc_receive_update(refit_ipc_receiver *r, const refit_update_opts *opts,
                                       refit_group_result *out);

typedef struct refit_ipc_stats {
    uint64_t connections;      /* trainers accepted */
    uint64_t updates;          /* UPDATE frames taken (committed or not) */
    uint64_t handles_opened;   /* memories mapped (cuIpcOpenMemHandle / mmap) */
    uint64_t handles_closed;
    uint64_t handles_cached;   /* memories reused from an earlier update */
    uint64_t events_opened;
    uint64_t refused;          /* frames or updates refused */
    uint64_t source_sets_built;/* prepared sets of the index's whole tensors
                                  (rebuilt only when the layout changed) */
} refit_ipc_stats;
REFIT_API int refit_ipc_receiver_stats(const refit_ipc_receiver *r, refit_ipc_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* REFIT_IPC_H */
