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
 * region of shared memory, sent and checked once per layout; each update
 * is a small frame naming it. Ordering across processes is by a CUDA IPC
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

#define REFIT_IPC_SEND_OPTS_VERSION 3
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
    /* version 2 */
    double spin_s;             /* busy-poll the socket this long for each vote
                                  and result before sleeping in poll (a
                                  wake-up of a sleeping process costs tens of
                                  microseconds); 0: 0.005; < 0: never */
    /* version 3 */
    const uint32_t *allow_uids;/* a worker listening as one of these uids is
                                  trusted too (copied at create); its own uid
                                  always is, any other is refused before a
                                  byte is sent (SO_PEERCRED) */
    uint32_t n_allow_uids;
} refit_ipc_send_opts;
#define REFIT_IPC_SEND_OPTS_INIT {REFIT_IPC_SEND_OPTS_VERSION, NULL, -1, 0, 0, 0, NULL, 0, NULL, 0}

typedef struct refit_ipc_sender refit_ipc_sender;

/* Connect to n_workers workers listening at paths (retrying until the
 * timeout: they may start later). A listener of another uid than this
 * process's (and not in allow_uids) is refused: REFIT_EIO naming its uid
 * and pid. Host memory is handed over read-only and sealed against
 * resizing (docs/ipc.md, "Trust model"). Errors on ctx. */
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
/* Add a patch of checkpoint tensor name for the next send only (docs/ipc.md
 * "Patches"): n flat indices (or run starts, counts[i] elements each;
 * counts NULL: single elements) in host memory and values, 1-D of the
 * checkpoint dtype, packed into a bucket as a PACK tensor is; the workers
 * apply it with refit_load_delta in their delta update (base_version).
 * All borrowed until that send returns; the send drops its patches.
 * REFIT_EINVAL for a negative index, a run under one element or a value
 * count that is not the elements'; REFIT_EEXIST for a name added before. */
REFIT_API int refit_ipc_sender_add_delta(refit_ipc_sender *s, const char *name, size_t n,
                                         const int64_t *indices, const int64_t *counts,
                                         const refit_tensor *values);
/* The version label of the next sends. REFIT_EINVAL past 1024 bytes. */
REFIT_API int refit_ipc_sender_set_label(refit_ipc_sender *s, const char *label);
/* One update to every worker: pack, record the event, send the index,
 * collect the votes, send the decision. REFIT_OK when every worker voted
 * prepared and was sent the commit (its reads of the trainer's memory are
 * over: the tensors may change); each worker's RESULT of a commit is read
 * at the next send (or dropped at destroy). Else the status that made the
 * group abort (out says which worker), after every worker's RESULT (a
 * worker POISONED by the abort: out->worker_status). Buffers and handles
 * are made at the first send and reused. out may be NULL. */
REFIT_API int refit_ipc_sender_send(refit_ipc_sender *s, refit_group_result *out);
/* Host memory (device -1) a trainer's tensor may live in to be shared
 * unpacked; freed with the sender. */
REFIT_API int refit_ipc_host_alloc(refit_ipc_sender *s, size_t bytes, void **out);

/* Where the last send spent its time: CLOCK_MONOTONIC in nanoseconds (the
 * clock every process of the machine shares, so a trainer's and a worker's
 * profile of one seq line up); 0: the phase did not happen. Taken at every
 * send (a clock read per phase). */
typedef struct refit_ipc_send_profile {
    uint64_t seq;              /* the update (the workers' profiles name it too) */
    uint64_t start_ns;         /* refit_ipc_sender_send called */
    uint64_t packed_ns;        /* packing queued, the event recorded */
    uint64_t encoded_ns;       /* the UPDATE frame encoded */
    uint64_t results_ns;       /* the previous commit's RESULTs read */
    uint64_t posted_ns;        /* every UPDATE written */
    uint64_t voted_ns;         /* the last vote read */
    uint64_t decided_ns;       /* every DECISION written */
    uint64_t end_ns;           /* the call returns */
} refit_ipc_send_profile;
REFIT_API int refit_ipc_sender_profile(const refit_ipc_sender *s, refit_ipc_send_profile *out);

/* ---- worker ---- */

#define REFIT_IPC_RECV_OPTS_VERSION 3
typedef struct refit_ipc_recv_opts {
    uint32_t version;          /* REFIT_IPC_RECV_OPTS_VERSION */
    double timeout_s;          /* each wait within an update; 0: 300 */
    double start_timeout_s;    /* the wait for a trainer and its update; 0: timeout_s */
    void *stream;              /* the engine's stream for the copies; NULL: default */
    uint64_t max_bucket_bytes; /* refuse larger buckets; 0: 64 GiB */
    refit_filter_fn filter;    /* NULL: every tensor sent is loaded */
    void *filter_user;
    /* version 2 */
    double spin_s;             /* busy-poll the socket this long for the UPDATE
                                  (once the call waits) and for the DECISION
                                  before sleeping in poll; 0: 0.002; < 0: never */
    int profile_gpu;           /* 1: CUDA events around the event wait and the
                                  copies (refit_ipc_recv_profile's GPU times;
                                  three event records per update) */
    /* version 3 */
    uint32_t socket_mode;      /* the socket file's permission bits; 0: 0600
                                  (this uid only, whatever the umask) */
    const uint32_t *allow_uids;/* trainers of these uids are accepted too
                                  (copied at create); this process's own uid
                                  always is, any other is refused at accept
                                  (SO_PEERCRED) and journaled */
    uint32_t n_allow_uids;
    double greet_timeout_s;    /* a connected peer's HELLO by then, or it is
                                  dropped and the next one accepted; 0: 1 */
} refit_ipc_recv_opts;
#define REFIT_IPC_RECV_OPTS_INIT {REFIT_IPC_RECV_OPTS_VERSION, 0, 0, NULL, 0, NULL, NULL, 0, 0, \
                                  0, NULL, 0, 0}

typedef struct refit_ipc_receiver refit_ipc_receiver;

/* Listen at path, the socket file 0600 unless opt->socket_mode says
 * otherwise. A stale socket file there (its listener gone) is replaced; a
 * live one is REFIT_EEXIST and left alone; destroy unlinks the path only
 * while it is still the file this receiver bound. */
REFIT_API int refit_ipc_receiver_create(refit_ipc_receiver **out, refit_model *model,
                                        const char *path, const refit_ipc_recv_opts *opt);
REFIT_API void refit_ipc_receiver_destroy(refit_ipc_receiver *r);
/* One whole update: accept a trainer if none is connected (a peer of
 * another uid, not in allow_uids, is refused and journaled; one silent past
 * greet_timeout_s dropped; either way the next is accepted by the same
 * deadline), take its memory
 * table (handles opened once, kept while unchanged), check the index
 * against the model (names, dtypes, shapes, placement: a refusal writes
 * nothing and begins nothing), begin (opts; the trainer's label when
 * opts->version_label is NULL), load, prepare, vote, commit or abort as
 * the trainer decides. Returns the group's decision (REFIT_OK: committed);
 * out->worker_status says what this worker holds after an abort. */
REFIT_API int refit_ipc_receive_update(refit_ipc_receiver *r, const refit_update_opts *opts,
                                       refit_group_result *out);

typedef struct refit_ipc_stats {
    uint64_t connections;      /* trainers accepted (greeted; a peer refused or
                                  dropped before counts in refused) */
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

/* Where the last update spent its time on this worker: CLOCK_MONOTONIC in
 * nanoseconds (see refit_ipc_send_profile); 0: the phase did not happen. */
typedef struct refit_ipc_recv_profile {
    uint64_t seq;
    uint64_t call_ns;          /* refit_ipc_receive_update called */
    uint64_t update_ns;        /* the UPDATE frame read whole and its framing checked */
    uint64_t checked_ns;       /* decoded, the index walked and checked against the model */
    uint64_t begun_ns;         /* refit_begin returned */
    uint64_t waited_ns;        /* the stream's wait on the trainer's event queued */
    uint64_t enqueued_ns;      /* every copy queued (refit_load_set returned) */
    uint64_t copies_done_ns;   /* profile_gpu: the copies' end on the GPU, as begun_ns
                                  plus the events' time from the first (recorded
                                  then) to the last; exact to the launch latency
                                  when the stream was idle at begun_ns (else later) */
    uint64_t prepared_ns;      /* refit_finalize_prepare returned (its host sync) */
    uint64_t voted_ns;         /* VOTE written */
    uint64_t decision_ns;      /* DECISION read */
    uint64_t committed_ns;     /* refit_commit (or the abort) returned */
    uint64_t result_ns;        /* RESULT written */
    double gpu_wait_ms;        /* profile_gpu: the stream's wait on the trainer's
                                  event, on the GPU; -1: not measured */
    double gpu_copy_ms;        /* profile_gpu: from the wait's end to the last copy
                                  on the worker's stream; -1: not measured */
} refit_ipc_recv_profile;
REFIT_API int refit_ipc_receiver_profile(const refit_ipc_receiver *r,
                                         refit_ipc_recv_profile *out);

/* ---- keeper (docs/restart.md, "The keeper") ----
 *
 * A long-lived process holding the latest committed state of a group of
 * workers of one plan signature, and serving restores of it over a socket
 * of its own: a restarting worker copies the keeper's runtime tensors
 * (device to device, or from a memfd on the host) with no post-load.
 *
 *   keeper                                      restarting worker
 *   refit_ipc_pool_create(&p, ctx, dev, bytes)  (registers and seals its model)
 *   runtime tensors from refit_ipc_pool_alloc   refit_ipc_restore(model, path, opts)
 *   seal, refit_ipc_keeper_create(&k, model, p, path, opts)
 *   refit_ipc_keeper_run(k, seconds)  ◀── restores ──
 *        ▲ one more receiver of the trainer's sends (opts->follow_path)
 */

/* Memory a keeper's runtime tensors live in, shared whole with the workers
 * that restore from it: host memory (device -1: a sealed memfd) or one
 * device allocation. */
typedef struct refit_ipc_pool refit_ipc_pool;
REFIT_API int refit_ipc_pool_create(refit_ipc_pool **out, refit_ctx *ctx, int32_t device,
                                    uint64_t bytes);
/* bytes of it, 256-byte aligned, for the pool's life. REFIT_ENOMEM when
 * it is full. */
REFIT_API int refit_ipc_pool_alloc(refit_ipc_pool *pool, uint64_t bytes, void **out);
/* After the keeper and the model using it are gone. */
REFIT_API void refit_ipc_pool_destroy(refit_ipc_pool *pool);

#define REFIT_IPC_KEEPER_OPTS_VERSION 1
typedef struct refit_ipc_keeper_opts {
    uint32_t version;          /* REFIT_IPC_KEEPER_OPTS_VERSION */
    const char *follow_path;   /* listen here for the trainer's sends (one more
                                  worker of its refit_ipc_sender: it votes, and
                                  commits only what the whole group commits);
                                  NULL: the embedder updates the model itself */
    const refit_ipc_recv_opts *follow; /* that receiver's options (its role is the
                                  keeper's); NULL: defaults */
    double timeout_s;          /* each wait of a restore it serves; 0: 60 */
    uint32_t socket_mode;      /* of the restore socket; 0: 0600 */
    const uint32_t *allow_uids;/* workers of these uids may restore too (copied);
                                  its own uid always may, any other is refused
                                  at accept and journaled */
    uint32_t n_allow_uids;
    double greet_timeout_s;    /* a connected peer's HELLO by then, or dropped; 0: 1 */
} refit_ipc_keeper_opts;
#define REFIT_IPC_KEEPER_OPTS_INIT {REFIT_IPC_KEEPER_OPTS_VERSION, NULL, NULL, 0, 0, NULL, 0, 0}

typedef struct refit_ipc_keeper refit_ipc_keeper;

/* Serve restores of model (sealed; every runtime tensor in pool, or, on a
 * device, in memory cuIpcGetMemHandle can share; pool may then be NULL)
 * at path. It serves only a committed state: READY, every module at one
 * version, and no update whose outcome it does not know (its vote taken,
 * then no decision: the group may have committed without it). */
REFIT_API int refit_ipc_keeper_create(refit_ipc_keeper **out, refit_model *model,
                                      refit_ipc_pool *pool, const char *path,
                                      const refit_ipc_keeper_opts *opts);
REFIT_API void refit_ipc_keeper_destroy(refit_ipc_keeper *k);
/* Serve restores and take the trainer's updates, one at a time, for
 * seconds (< 0: until an error of the keeper's own). A restore that fails
 * or a peer refused is counted and journaled, not returned. REFIT_OK when
 * the time is up. */
REFIT_API int refit_ipc_keeper_run(refit_ipc_keeper *k, double seconds);

typedef struct refit_ipc_keeper_stats {
    uint64_t restores_served;  /* confirmed to a worker that committed them */
    uint64_t restores_refused; /* refused by the keeper (nothing it may serve) or
                                  by the worker (signature, check, copy) */
    uint64_t peers_refused;    /* of another uid, silent, or not a restorer */
    uint64_t updates_committed;/* followed: the group committed */
    uint64_t updates_aborted;  /* followed: aborted, or no decision */
    int servable;              /* 1: a restore now would be offered */
    char why_not[256];         /* servable 0: why */
} refit_ipc_keeper_stats;
REFIT_API int refit_ipc_keeper_stats_get(refit_ipc_keeper *k, refit_ipc_keeper_stats *out);

#define REFIT_IPC_RESTORE_OPTS_VERSION 1
typedef struct refit_ipc_restore_opts {
    uint32_t version;          /* REFIT_IPC_RESTORE_OPTS_VERSION */
    int rollback;              /* 1: undo log; a failed restore puts the bytes back */
    double timeout_s;          /* connecting and each wait; 0: 60 */
    void *stream;              /* the engine's stream for the copies; NULL: default */
    const uint32_t *allow_uids;/* a keeper listening as one of these uids is
                                  trusted too; its own uid always is */
    uint32_t n_allow_uids;
    int verify;                /* 1: every module's fingerprint after the copies
                                  against the keeper's (one more read of the
                                  bytes on the worker); 0: the copies alone */
} refit_ipc_restore_opts;
#define REFIT_IPC_RESTORE_OPTS_INIT {REFIT_IPC_RESTORE_OPTS_VERSION, 1, 0, NULL, NULL, 0, 1}

/* Restore the sealed model from the keeper listening at keeper_path, as an
 * update: refused with nothing written when the keeper serves nothing
 * (REFIT_ESTATE, its reason) or the plan signatures differ
 * (REFIT_EMISMATCH naming the first difference: load the checkpoint
 * instead). Then every runtime tensor is copied DIRECT from the keeper's
 * memory, no post-load runs, every module's fingerprint is checked against
 * the keeper's (opts->verify), and the worker commits at the keeper's version once the
 * keeper confirms it outlived the copies (journaled with source
 * keeper://PATH). A keeper gone before it confirms, or any failure after
 * the first byte, aborts (rolled back, or POISONED without rollback). */
REFIT_API int refit_ipc_restore(refit_model *model, const char *keeper_path,
                                const refit_ipc_restore_opts *opts);

/* The keeper at keeper_path as the undo source of this READY worker's next
 * update (REFIT_UNDO_KEEPER, or REFIT_UNDO_AUTO when no files or snapshot
 * serve: no undo log; an abort copies the modules the update wrote back
 * from the keeper, then checks their fingerprints). Armed only when the
 * keeper's signature equals this worker's and it holds this worker's
 * version, every module's bytes fingerprinting as this worker's committed
 * ones; the next commit drops it, like every undo source. Nothing arms a
 * keeper but this call (a restore does not): an abort then waits for the
 * keeper, up to opts->timeout_s (gone or stalled: POISONED). A refit.ipc
 * worker whose update fails before its vote votes no first, so a keeper
 * following its own trainer rolls back and serves it (docs/restart.md
 * "As an undo source"). opts: the connection's. */
REFIT_API int refit_ipc_keeper_undo_arm(refit_model *model, const char *keeper_path,
                                        const refit_ipc_restore_opts *opts);

#ifdef __cplusplus
}
#endif
#endif /* REFIT_IPC_H */
