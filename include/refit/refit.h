/*
 * refit: reload model weights into a live inference worker as a transaction.
 *
 * Lifecycle (every create has a destroy):
 *
 *   refit_open(&ctx)                      one per engine worker (rank)
 *     refit_model_create(&model, ctx)     one model per context
 *       refit_model_add_module / refit_module_bind_runtime / refit_model_expect
 *       refit_model_add_side
 *       refit_model_seal                  plan, validate, record signatures
 *       refit_begin(&txn, model, opts)    one update at a time
 *         refit_load / refit_load_part    any order, any batching
 *         refit_load_many / refit_load_set  many tensors per call
 *       refit_finalize(txn) | refit_abort(txn)   frees the txn either way
 *     refit_model_destroy(model)
 *   refit_close(ctx)
 *
 * Errors: every function returns a refit status (0 = REFIT_OK, negative =
 * error). A failing call leaves a message on the context, readable with
 * refit_errmsg() until the next call on that context.
 *
 * Tensors are borrowed: refit keeps the pointer to each refit_tensor the
 * engine registers (and to its shape/strides arrays) and reads it again at
 * every begin and after every finalize to verify that nothing moved. The
 * engine keeps them alive, unchanged, until refit_model_destroy().
 *
 * Threading: a context and everything created from it is used by one thread
 * at a time.
 */
#ifndef REFIT_REFIT_H
#define REFIT_REFIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REFIT_VERSION_MAJOR 0
#define REFIT_VERSION_MINOR 1
#define REFIT_VERSION_PATCH 0

#define REFIT_MAX_DIMS 8

/* The library is built with hidden visibility; what it exports says so. */
#ifndef REFIT_API
#define REFIT_API __attribute__((visibility("default")))
#endif

/* ---- status codes ------------------------------------------------------ */

/* X(NAME, value, description): the one table every status derives from. */
#define REFIT_STATUS_TABLE(X)                                                 \
    X(OK,          0,   "success")                                            \
    X(EINVAL,     -1,   "invalid argument")                                   \
    X(ENOMEM,     -2,   "out of memory")                                      \
    X(ESTATE,     -3,   "not allowed in the current state")                   \
    X(ENOTFOUND,  -4,   "no such name")                                       \
    X(EEXIST,     -5,   "name already registered")                            \
    X(EUNEXPECTED,-6,   "tensor not expected by the model")                   \
    X(EDUPLICATE, -7,   "tensor delivered twice")                             \
    X(EOVERLAP,   -8,   "overlapping ranges")                                 \
    X(EINCOMPLETE,-9,   "update incomplete")                                  \
    X(EMISMATCH,  -10,  "dtype, shape or layout mismatch")                    \
    X(EMOVED,     -11,  "registered tensor moved or changed")                 \
    X(EPOISONED,  -12,  "worker poisoned: serving refused")                   \
    X(EFORMAT,    -13,  "format error")                                       \
    X(EUNSUPPORTED,-14, "not supported")                                      \
    X(EIO,        -15,  "i/o error")                                          \
    X(EJOURNAL,   -16,  "journal error")                                      \
    X(ECORRUPT,   -17,  "corrupt or malformed input")                         \
    X(EBUDGET,    -18,  "staging memory budget exceeded")                     \
    X(EINTERNAL,  -19,  "internal error")                                     \
    X(ETIMEDOUT,  -20,  "deadline passed")                                    \
    X(EPEER,      -21,  "another rank of the group failed")

typedef enum refit_status {
#define REFIT_X_(name, value, desc) REFIT_##name = value,
    REFIT_STATUS_TABLE(REFIT_X_)
#undef REFIT_X_
} refit_status;

/* Human description of a status ("tensor delivered twice"). Never NULL. */
REFIT_API const char *refit_strerror(int status);
/* Symbolic name of a status ("REFIT_EDUPLICATE"). Never NULL. */
REFIT_API const char *refit_status_name(int status);

/* ---- tensors (DLPack DLTensor v1 layout) ------------------------------- */

/* Device types: the DLPack DLDeviceType values. */
enum {
    REFIT_DEVICE_CPU = 1,
    REFIT_DEVICE_CUDA = 2,
    REFIT_DEVICE_CUDA_HOST = 3, /* pinned host memory */
};

typedef struct refit_device {
    int32_t device_type; /* REFIT_DEVICE_* */
    int32_t device_id;
} refit_device;

/* Type codes: the DLPack DLDataTypeCode values. */
enum {
    REFIT_DTYPE_INT = 0,
    REFIT_DTYPE_UINT = 1,
    REFIT_DTYPE_FLOAT = 2,
    REFIT_DTYPE_BFLOAT = 4,
    REFIT_DTYPE_BOOL = 6,
    REFIT_DTYPE_FLOAT8_E4M3FN = 10,
    REFIT_DTYPE_FLOAT8_E5M2 = 12,
    REFIT_DTYPE_FLOAT8_E8M0FNU = 14,
    REFIT_DTYPE_FLOAT4_E2M1FN = 17,
};

typedef struct refit_dtype {
    uint8_t code;   /* REFIT_DTYPE_* */
    uint8_t bits;   /* bits per lane */
    uint16_t lanes; /* 1 */
} refit_dtype;

#define REFIT_F32  ((refit_dtype){REFIT_DTYPE_FLOAT, 32, 1})
#define REFIT_F16  ((refit_dtype){REFIT_DTYPE_FLOAT, 16, 1})
#define REFIT_BF16 ((refit_dtype){REFIT_DTYPE_BFLOAT, 16, 1})
#define REFIT_I32  ((refit_dtype){REFIT_DTYPE_INT, 32, 1})
#define REFIT_I8   ((refit_dtype){REFIT_DTYPE_INT, 8, 1})
#define REFIT_U8   ((refit_dtype){REFIT_DTYPE_UINT, 8, 1})

/* Same memory layout as DLPack's DLTensor, so a DLTensor* can be passed. */
typedef struct refit_tensor {
    void *data;
    refit_device device;
    int32_t ndim;
    refit_dtype dtype;
    int64_t *shape;      /* ndim entries */
    int64_t *strides;    /* ndim entries, in elements; NULL = row-major */
    uint64_t byte_offset;
} refit_tensor;

/* Short dtype name ("bf16", "f32", "i8" ...); "?" when unknown. */
REFIT_API const char *refit_dtype_name(refit_dtype dt);

/* ---- context ------------------------------------------------------------ */

typedef struct refit_ctx refit_ctx;
typedef struct refit_model refit_model;
typedef struct refit_txn refit_txn;

/* Where the library's messages go: level 0 error, 1 warning, 2 debug (debug
 * lines are produced only when REFIT_DEBUG is set or a log_fn is given). */
typedef void (*refit_log_fn)(void *user, int level, const char *msg);

#define REFIT_OPTIONS_VERSION 3
typedef struct refit_options {
    uint32_t version;          /* REFIT_OPTIONS_VERSION */
    const char *worker_id;     /* label in messages and the journal; NULL: "worker" */
    int32_t rank;              /* this worker's rank in its group */
    const char *journal_path;  /* NULL: $REFIT_JOURNAL if set; "": no journal */
    const char *plugin_dirs;   /* ':'-separated extra plugin directories, or NULL */
    uint64_t staging_budget;   /* bytes of staging memory; 0 = 1 GiB */
    /* 0 (journal=required): refit_begin refuses, touching nothing, when the
     * update cannot be recorded. 1 (best-effort): the update goes on and
     * the gap is recorded as soon as the journal works again. A journal
     * failure never fails a finalize or an abort. */
    int journal_best_effort;
    /* ---- version 2 ---- */
    /* Bytes of device memory the undo log of an update with rollback may
     * take (spare memory the engine grants); what does not fit goes to
     * pinned host memory. 0: host memory only. */
    uint64_t undo_device_budget;
    refit_log_fn log_fn;       /* NULL: lines on stderr, "refit: " first */
    void *log_user;            /* passed to log_fn */
    /* ---- version 3 ---- */
    /* Bytes of memory (on the staging device: device memory for a GPU
     * runtime) refit may keep as a copy of the checkpoint tensors of
     * online-quantized modules, so that a delta update can patch them
     * (docs/core.md "Delta updates"). Taken by the first full load of
     * each module, in load order, while it lasts. 0: none kept, and a
     * patch into such a module is refused. */
    uint64_t delta_master_budget;
} refit_options;
#define REFIT_OPTIONS_INIT {REFIT_OPTIONS_VERSION, NULL, 0, NULL, NULL, 0, 0, 0, NULL, NULL, 0}

/* Create a context. opt may be NULL for defaults. On failure *out is NULL
 * and the status says why (there is no context to hold a message). */
REFIT_API int refit_open(refit_ctx **out, const refit_options *opt);
/* Destroy a context; destroys its model if the caller did not. NULL is ok. */
REFIT_API void refit_close(refit_ctx *ctx);
/* The message of the last failing call on ctx (or ""), valid until the next
 * call on ctx. Says what, where (module, tensor) and why. */
REFIT_API const char *refit_errmsg(const refit_ctx *ctx);

/* ---- worker health ------------------------------------------------------ */

typedef enum refit_health {
    REFIT_HEALTH_EMPTY = 0,    /* sealed, some module never loaded: serving refused */
    REFIT_HEALTH_READY = 1,    /* every module holds the current version */
    REFIT_HEALTH_UPDATING = 2, /* a transaction is open */
    REFIT_HEALTH_POISONED = 3, /* an aborted update left bytes: serving refused */
} refit_health;

REFIT_API refit_health refit_worker_health(const refit_ctx *ctx);
REFIT_API const char *refit_health_name(refit_health h);
/* REFIT_OK when the worker may serve (READY), else REFIT_EPOISONED or
 * REFIT_ESTATE with a message saying why. */
REFIT_API int refit_check_serving(refit_ctx *ctx);
/* Version label the worker holds (READY), or NULL. Owned by the library.
 * When some module holds an older version (a partial update), the label
 * of the last commit followed by " (partial: K of N modules)". */
REFIT_API const char *refit_worker_version(const refit_ctx *ctx);
/* Version label of the commit that last delivered module (owned by the
 * library, valid until the next commit), or NULL: no such module, never
 * committed, or holding bytes of an aborted update. */
REFIT_API const char *refit_module_version(const refit_model *model, const char *module);

/* ---- model registration ------------------------------------------------- */

/* Create the context's model (one per context). */
REFIT_API int refit_model_create(refit_model **out, refit_ctx *ctx);
REFIT_API void refit_model_destroy(refit_model *model);

/* Add a module: the unit of completeness and post-load. format names a
 * registered format ("unquantized"); params is a flat YAML mapping of the
 * format's parameters ("cast: true"), or NULL. */
REFIT_API int refit_model_add_module(refit_model *model, const char *name,
                           const char *format, const char *params);

/* Bind a runtime tensor (engine-owned, graph-visible) to a module under a
 * name local to the module. t is borrowed (see the top of this file). */
REFIT_API int refit_module_bind_runtime(refit_model *model, const char *module,
                              const char *name, const refit_tensor *t);

/* Register a side tensor: graph-visible memory that is not a weight
 * (workspace, table, constant). Only its signature is checked. Borrowed. */
REFIT_API int refit_model_add_side(refit_model *model, const char *name,
                         const refit_tensor *t);

/* What a module expects of one checkpoint tensor, and where it goes. */
#define REFIT_CKPT_SPEC_VERSION 1
typedef struct refit_ckpt_spec {
    uint32_t version;          /* REFIT_CKPT_SPEC_VERSION */
    refit_dtype dtype;         /* dtype in the checkpoint */
    int32_t ndim;
    int64_t shape[REFIT_MAX_DIMS]; /* full (unsharded) checkpoint shape */
    const char *target;        /* runtime tensor (name in the module); NULL:
                                  the module's only runtime tensor */
    /* TP shard: this rank keeps slice shard_rank of shard_count along
     * shard_dim; sizes differ by at most one when uneven (lower ranks get
     * the extra rows). shard_count 1 (or 0) means no shard. */
    int32_t shard_dim;
    int32_t shard_rank;
    int32_t shard_count;
    /* Padding: the extent of shard_dim (dim 0 when not sharded) is padded
     * to pad_to before sharding; rows beyond the real extent are zeroed at
     * every load. 0 = no padding. */
    int64_t pad_to;
    /* Placement in the target: expert >= 0 selects index expert on the
     * target's dim 0 (a stacked [E, ...] tensor); dst_offset gives the
     * offset of the slice along each remaining target dim (fused qkv:
     * k at q's local rows). */
    int64_t expert;
    int64_t dst_offset[REFIT_MAX_DIMS];
    /* Tie: this checkpoint name is another name of tie_of (same storage,
     * written once). dtype/shape/placement come from tie_of. */
    const char *tie_of;
} refit_ckpt_spec;
#define REFIT_CKPT_SPEC_INIT {REFIT_CKPT_SPEC_VERSION, {0, 0, 0}, 0, {0}, NULL, \
                              0, 0, 1, 0, -1, {0}, NULL}

/* Declare that module expects checkpoint tensor ckpt_name. */
REFIT_API int refit_model_expect(refit_model *model, const char *module,
                       const char *ckpt_name, const refit_ckpt_spec *spec);

/* Add the modules, runtime-tensor declarations and checkpoint expectations
 * of a model manifest (schemas/model.schema.yaml; docs/plugins.md), as the
 * calls above would. The engine then binds each declared runtime tensor
 * with refit_module_bind_runtime, which refuses a dtype or shape other
 * than the declared one; seal refuses a declared tensor never bound. A
 * shard without a rank takes the context's rank. All or nothing: on
 * failure the model is as before and the message starts "file:line:col:".
 * REFIT_EIO (unreadable), REFIT_ECORRUPT (invalid manifest), REFIT_ENOTFOUND
 * (unknown format), REFIT_EEXIST (name taken), REFIT_EINVAL, REFIT_ESTATE
 * (sealed). */
REFIT_API int refit_model_load_manifest(refit_model *model, const char *yaml_path);

/* Build the plan: one route per checkpoint tensor; validate every mapping;
 * record the signature of every runtime and side tensor. Refuses with a
 * message and changes nothing on failure. After seal nothing can be added.
 * refit_model_seal_with(model, NULL): it also starts reserving the undo
 * log's memory (refit_seal_opts.undo_reserve). */
REFIT_API int refit_model_seal(refit_model *model);

#define REFIT_SEAL_OPTS_VERSION 1
typedef struct refit_seal_opts {
    uint32_t version;          /* REFIT_SEAL_OPTS_VERSION */
    /* 1: reserve the memory of an update's undo log now, on a thread of
     * its own (device memory within undo_device_budget, the rest host
     * memory, pinned on a GPU), so that the first update with rollback
     * allocates none. 0: reserve nothing (an engine that never updates
     * with rollback); the first update with rollback allocates it. */
    int undo_reserve;
} refit_seal_opts;
#define REFIT_SEAL_OPTS_INIT {REFIT_SEAL_OPTS_VERSION, 1}
/* refit_model_seal with options. NULL: the defaults, REFIT_SEAL_OPTS_INIT,
 * except that REFIT_UNDO_RESERVE=0 in the environment turns undo_reserve
 * off (a deployment's override of the default; given options win). An
 * unknown version or an undo_reserve other than 0 or 1 is REFIT_EINVAL,
 * naming it, and nothing is sealed. */
REFIT_API int refit_model_seal_with(refit_model *model, const refit_seal_opts *opts);

/* Plan statistics, for tools. */
typedef struct refit_model_stats {
    uint32_t modules, runtime_tensors, side_tensors, ckpt_tensors;
    uint32_t routes_direct, routes_staged, routes_view;
    uint64_t runtime_bytes;
} refit_model_stats;
REFIT_API int refit_model_stats_get(const refit_model *model, refit_model_stats *out);

/* 64-bit content fingerprint of a registered runtime tensor (logical
 * element order, so equal contents give equal fingerprints). */
REFIT_API int refit_runtime_fingerprint(refit_model *model, const char *module,
                              const char *name, uint64_t *out);
/* One fingerprint over every runtime tensor, in registration order. */
REFIT_API int refit_model_fingerprint(refit_model *model, uint64_t *out);

/* ---- transactions ------------------------------------------------------- */

#define REFIT_UPDATE_OPTS_VERSION 4
/* What refit_begin accepts (strlen, bytes); longer is REFIT_EINVAL naming
 * the member and its length: the journal records them and shows them. */
#define REFIT_SOURCE_URI_MAX 4096
#define REFIT_VERSION_LABEL_MAX 256
typedef struct refit_update_opts {
    uint32_t version;          /* REFIT_UPDATE_OPTS_VERSION (1 is accepted:
                                  the version 2 members then read as 0) */
    const char *version_label; /* the weights' version, e.g. "step-1200";
                                  at most REFIT_VERSION_LABEL_MAX bytes */
    const char *source_uri;    /* where the bytes come from, for the journal;
                                  at most REFIT_SOURCE_URI_MAX bytes. A
                                  file:// URI without source_digest: begin
                                  records the files' identity itself
                                  (refit_source_identity), else an update
                                  could not be replayed */
    int rollback;              /* 1: keep an undo log; abort restores bytes */
    const char *source_digest; /* SHA-256 hex of the source, for the journal
                                  (or refit_source_identity's text); at most
                                  REFIT_SOURCE_URI_MAX bytes */
    int fingerprint;           /* 1: journal each committed module's content
                                  fingerprint (reads every byte it wrote) */
    /* ---- version 2 ---- */
    /* The update's scope. 0: it delivers every module; finalize refuses,
     * naming what is missing, otherwise. 1: a delta (only what changed):
     * the modules delivered commit at version_label, the others keep
     * their bytes and version (refit_module_version), the journal records
     * the update as partial and refit_worker_version says so. */
    int partial;
    /* 0: a refused load (nothing written) fails the update: nothing more
     * is accepted and finalize aborts it. 1: the update stays open after a
     * refusal, for the caller to go on. */
    int keep_going;
    /* ---- version 3 ---- */
    /* A delta update (docs/core.md "Delta updates"): the version every
     * module must hold now, checked by refit_begin before anything is
     * written (the module that holds another is named). Patches
     * (refit_load_delta) are accepted only in a delta update. After the
     * commit every module holds version_label: the modules not delivered
     * are declared unchanged, so the update must say which it changes:
     * changed_modules (n_changed_modules names; a delivery to another
     * module is refused, and finalize refuses when one received nothing),
     * or others_unchanged 1 (whatever is delivered is what changed). NULL:
     * not a delta update; the members below are then ignored. */
    const char *base_version;
    const char *const *changed_modules;
    uint32_t n_changed_modules;
    int others_unchanged;
    /* ---- version 4 ---- */
    /* What puts the previous version back if the update aborts with
     * rollback (docs/core.md "Undo sources"): REFIT_UNDO_AUTO (0), an undo
     * source when one holds the committed version (the previous update's
     * files, else a snapshot of it), else the undo log; REFIT_UNDO_LOG,
     * always the undo log; REFIT_UNDO_FILES, REFIT_UNDO_SNAPSHOT: that
     * source, or refit_begin refuses (REFIT_EUNSUPPORTED, saying why,
     * nothing written); REFIT_UNDO_OFF: no rollback, as rollback = 0.
     * Ignored when rollback is 0. */
    int undo_source;
} refit_update_opts;
#define REFIT_UPDATE_OPTS_INIT {REFIT_UPDATE_OPTS_VERSION, NULL, NULL, 1, NULL, 0, 0, 0, \
                                NULL, NULL, 0, 0, REFIT_UNDO_AUTO}
/* refit_update_opts.undo_source */
#define REFIT_UNDO_AUTO 0
#define REFIT_UNDO_LOG 1
#define REFIT_UNDO_FILES 2
#define REFIT_UNDO_SNAPSHOT 3
#define REFIT_UNDO_OFF 4
#define REFIT_UNDO_KEEPER 5 /* a keeper holding the committed version, armed by
                               refit_ipc_keeper_undo_arm (include/refit/ipc.h); AUTO takes
                               it after the files and a snapshot */

/* Open an update. Verifies every signature first; refuses (changing
 * nothing) when the plan is stale or a tensor moved. Worker -> UPDATING. */
REFIT_API int refit_begin(refit_txn **out, refit_model *model,
                const refit_update_opts *opts);

/* Deliver one whole checkpoint tensor. src has the checkpoint's full shape
 * and dtype and any strides; it is read before the call returns. stream is
 * the caller's stream for device backends (NULL on the host). Every check
 * (name known, not yet delivered, dtype, shape) happens before any byte is
 * written. */
REFIT_API int refit_load(refit_txn *txn, const char *ckpt_name, const refit_tensor *src,
               void *stream);

/* Deliver part of a checkpoint tensor: src covers rows [offset, offset +
 * src->shape[d]) of split dim d (the shard dim, else dim 0) and the full
 * extent of every other dim. Parts may arrive in any order; overlapping
 * parts are refused. */
REFIT_API int refit_load_part(refit_txn *txn, const char *ckpt_name, int64_t offset,
                    const refit_tensor *src, void *stream);

/* Patch one checkpoint tensor of a delta update (base_version set): the
 * elements at flat indices[0, n) (row-major over the checkpoint's full
 * shape) take values[0, n), a 1-D tensor of n elements of the checkpoint
 * dtype on any device the target's backend reads; the other elements
 * keep what the base holds. Indices need not be sorted; one outside the
 * tensor, or given twice, refuses the call. The patch lands where
 * refit_load would put those elements (TP shard: only this rank's rows;
 * fused targets, stacked experts, tied names), and counts as the tensor's
 * delivery. A module quantized online at post-load takes the patch
 * through refit's master copy of its checkpoint tensors and rebuilds only
 * the quantization groups it touches (docs/core.md "Delta updates"); with
 * refit_options.delta_master_budget 0, or a format that declares no group,
 * it is refused (REFIT_EUNSUPPORTED), and with no master kept within the
 * budget REFIT_EBUDGET. With rollback the undo log saves only the
 * elements written (and the master's and rebuilt groups' bytes). Every check happens before any byte is written;
 * a refusal is refit_load's (the update fails closed unless keep_going). */
REFIT_API int refit_load_delta(refit_txn *txn, const char *ckpt_name, size_t n,
                               const int64_t *indices, const refit_tensor *values,
                               void *stream);
/* The run form, for dense patches (changed rows: start = row * row
 * elements): runs of counts[i] >= 1 elements from flat index starts[i];
 * values holds the runs' elements one run after another, in the order
 * given. Runs in any order, none overlapping another. */
REFIT_API int refit_load_delta_runs(refit_txn *txn, const char *ckpt_name, size_t n_runs,
                                    const int64_t *starts, const int64_t *counts,
                                    const refit_tensor *values, void *stream);

/* One row of a table of patches: refit_load_delta's arguments (counts
 * NULL) or refit_load_delta_runs' (indices are then the run starts). */
typedef struct refit_delta {
    const char *name;           /* checkpoint tensor */
    size_t n;                   /* indices (or runs) */
    const int64_t *indices;     /* flat element indices, or run starts */
    const int64_t *counts;      /* NULL: single elements; else run lengths */
    const refit_tensor *values; /* 1-D, the checkpoint dtype */
} refit_delta;
/* Patch n tensors in one call, each row as refit_load_delta(_runs) would.
 * Every row is checked before any byte is written (a tensor patched by
 * two rows is refused; a tied name whose other name an earlier row
 * patches is accepted and skipped); a refusal names the row ("row <i>
 * (<name>): ") and writes nothing. */
REFIT_API int refit_load_deltas(refit_txn *txn, size_t n, const refit_delta *rows,
                                void *stream);

/* Delta files (docs/delta-file.md): a delta update's patches in one
 * safetensors file, with its base version, its new version and a SHA-256
 * of each tensor's indices and values. refit_delta_file_write writes rows
 * (host memory; refit_load_deltas' rows) to path, through a temporary name
 * renamed into place; a bad row is refused naming it, nothing written. */
REFIT_API int refit_delta_file_write(refit_ctx *ctx, const char *path,
                                     const char *base_version, const char *version,
                                     size_t n, const refit_delta *rows);
/* Patch from a delta file in an open delta update whose base and version
 * label are the file's. A malformed or truncated file, another base or
 * version, or a tensor whose checksum differs is refused naming it, before
 * refit_load_deltas checks and writes the patches; any refusal writes
 * nothing and is refit_load's. Begin the update with source_uri
 * "file://PATH" and refit_replay replays a failed one from the file. */
REFIT_API int refit_load_delta_file(refit_txn *txn, const char *path, void *stream);

/* Check completeness (every module, or every touched one of a partial
 * update), run the checks, commit. Worker -> READY at the update's
 * version. On failure the update is aborted as refit_abort would
 * (rollback or POISONED) and the error returned. The txn is freed either
 * way; on a prepared txn, refit_finalize commits it as refit_commit does. */
REFIT_API int refit_finalize(refit_txn *txn);

/* Two-phase finalize, for a group of ranks that must commit together:
 * prepare runs every check of refit_finalize (queued copies done, every
 * touched module complete, signatures) and, on failure, aborts and frees
 * the txn as refit_finalize would. On success the txn stays open, the
 * worker UPDATING, and only the decision is left: refit_commit (frees the
 * txn; cannot fail once prepared) or refit_abort. */
REFIT_API int refit_finalize_prepare(refit_txn *txn);
REFIT_API int refit_commit(refit_txn *txn);

/* Abandon the update. With rollback, every written byte is restored and the
 * worker returns to its previous health; without, the worker is POISONED if
 * any byte was written. Frees the txn. Returns REFIT_OK when the worker is
 * back to its previous state, REFIT_EPOISONED when it is poisoned. */
REFIT_API int refit_abort(refit_txn *txn);
/* The same, with the reason recorded in the journal (a transport's
 * deadline, a peer's failure) instead of "aborted by the caller". */
REFIT_API int refit_abort_reason(refit_txn *txn, const char *why);

/* ---- checkpoint sources -------------------------------------------------- */

typedef struct refit_source refit_source;

/* Open a safetensors checkpoint: a .safetensors file, or a directory with
 * model.safetensors.index.json (or exactly one .safetensors file). Every
 * file is validated as the reference reader validates it and mapped, not
 * read. On failure *out is NULL and ctx's message names the file, the
 * tensor where there is one, and the rule broken. */
REFIT_API int refit_source_open(refit_source **out, refit_ctx *ctx, const char *path);
/* The same over one safetensors file held in memory (borrowed: buf must
 * outlive the source). Not durable: an update from it cannot be replayed. */
REFIT_API int refit_source_open_memory(refit_source **out, refit_ctx *ctx, const void *buf, size_t len,
                             const char *label);
REFIT_API void refit_source_close(refit_source *src);

/* A checkpoint tensor as the source holds it. Strings and shape are owned
 * by the source. */
typedef struct refit_source_tensor {
    const char *name;
    refit_dtype dtype;         /* code 0xff when refit has no such dtype */
    int32_t ndim;
    const int64_t *shape;
    uint64_t bytes;
    const char *file;
} refit_source_tensor;

REFIT_API size_t refit_source_count(const refit_source *src);
REFIT_API int refit_source_tensor_at(const refit_source *src, size_t i, refit_source_tensor *out);
/* "file:///abs/path" of the file or directory; owned by the source. */
REFIT_API const char *refit_source_uri(const refit_source *src);
/* 1 when the bytes can be found again by URI (files: yes), so an update
 * from this source can be replayed. */
REFIT_API int refit_source_is_durable(const refit_source *src);
/* SHA-256 of the source, lower-case hex: for one file, the file's (what the
 * hub publishes); for a directory, of the lines "<file name> <file sha256>\n"
 * in file-name order. Reads every byte on the first call, then cached. */
REFIT_API int refit_source_digest(refit_source *src, char hex[65]);
/* A cheap stand-in for the digest: "file-id:" and 64 hex digits over each
 * file's name, size, device, inode, mtime and ctime (no byte is read).
 * Recorded as an update's source_digest, replay accepts the source only
 * while its files are the very ones that were loaded (not rewritten,
 * touched or replaced); it does not vouch for the bytes as the SHA-256
 * does. REFIT_EUNSUPPORTED for a memory source. */
#define REFIT_SOURCE_ID_PREFIX "file-id:"
#define REFIT_SOURCE_ID_SIZE 73
REFIT_API int refit_source_identity(refit_source *src, char out[REFIT_SOURCE_ID_SIZE]);

/* Progress: called after each tensor with the running totals. */
typedef void (*refit_progress_fn)(void *user, uint64_t bytes, uint64_t tensors,
                                  const char *current);
/* Filter: return 1 to load the named tensor, 0 to skip it. */
typedef int (*refit_filter_fn)(void *user, const char *name);

/* Stream every tensor of src (in file and offset order) into the open
 * transaction, straight from the mapped files, each as refit_load would on
 * `stream` (the caller's cudaStream_t for a model on a device; NULL: the
 * legacy default stream). First re-checks that no file changed since it
 * was opened. A tensor the model does not expect is an error
 * (REFIT_EUNEXPECTED), as with refit_load; use a filter to skip. The
 * mapped bytes are consumed before the call returns: the source may be
 * closed at once. */
REFIT_API int refit_load_source(refit_txn *txn, refit_source *src, refit_progress_fn progress,
                                void *user, void *stream);
REFIT_API int refit_load_source_filtered(refit_txn *txn, refit_source *src, refit_filter_fn filter,
                                         void *filter_user, refit_progress_fn progress, void *user,
                                         void *stream);

/* ---- metrics -------------------------------------------------------------- */

/* The worker's metrics in the Prometheus text exposition format 0.0.4
 * (docs/operators.md "Metrics": names, labels, units), for an engine to
 * serve on its /metrics. *out: a NUL-terminated text the caller frees with
 * refit_metrics_free; *len (when not NULL) its strlen. REFIT_EINVAL (NULL
 * ctx or out), REFIT_ENOMEM; *out is NULL on failure. A call on ctx like
 * any other: a /metrics thread takes the lock the update thread holds. */
REFIT_API int refit_metrics_text(refit_ctx *ctx, char **out, size_t *len);
/* Free a text of refit_metrics_text. NULL is ok. */
REFIT_API void refit_metrics_free(char *text);

/* ---- journal and replay --------------------------------------------------- */

/* 1 while the journal lacks the end of an update that did end (its write
 * failed: disk full, I/O error, lock timeout): the record is kept and
 * written first by the next journal write (the next refit_begin, a health
 * change, refit_close); until then the journal shows that update unended
 * (loading or finalizing). 0 otherwise. */
REFIT_API int refit_journal_behind(const refit_ctx *ctx);

/* Id of the journal row of an open update (0 when there is no journal). */
REFIT_API int64_t refit_txn_journal_id(const refit_txn *txn);

#define REFIT_REPLAY_OPTS_VERSION 1
typedef struct refit_replay_opts {
    uint32_t version;          /* REFIT_REPLAY_OPTS_VERSION */
    int full;                  /* 1: send every module, not only the missing */
    int rollback;              /* undo log for the replay itself */
} refit_replay_opts;
#define REFIT_REPLAY_OPTS_INIT {REFIT_REPLAY_OPTS_VERSION, 0, 1}

/* Re-run a failed, aborted, rolled-back or interrupted update from its
 * journal record: reopen its durable source, check the source digest, send
 * the modules the journal does not show complete (and every module this
 * worker holds no committed bytes for; tensors of the source no module
 * expects are skipped), finalize. Journaled as a replay of
 * update_id. Ends READY, or fails with the reason and the worker as a
 * failed update leaves it. Device copies go on the legacy default stream
 * (recovery runs while the engine serves nothing). */
REFIT_API int refit_replay(refit_model *model, int64_t update_id, const refit_replay_opts *opts);

/* ---- snapshots and restore (docs/restart.md) ------------------------------ */

/* Write the committed state of a READY worker to the new directory path:
 * its runtime tensors as they are (post-processed bytes) in
 * path/runtime.safetensors, and path/manifest.json: the version, the
 * journal update that committed it, each module's fingerprint and the
 * plan signature. Built as path.tmp-<pid> and renamed once on disk, so a
 * crash leaves no directory at path. Journaled as an event. Refuses,
 * writing nothing: REFIT_EEXIST (path exists), REFIT_ESTATE (not READY,
 * or a partial update), REFIT_EUNSUPPORTED (a module whose format sets
 * REFIT_MODULE_NO_SNAPSHOT, named). */
REFIT_API int refit_snapshot_write(refit_model *model, const char *path);

#define REFIT_RESTORE_OPTS_VERSION 1
typedef struct refit_restore_opts {
    uint32_t version;          /* REFIT_RESTORE_OPTS_VERSION */
    int rollback;              /* 1: undo log; a failed restore puts the bytes back */
} refit_restore_opts;
#define REFIT_RESTORE_OPTS_INIT {REFIT_RESTORE_OPTS_VERSION, 1}

/* Restore snapshot path into the sealed model, as an update: refused,
 * nothing written, unless the manifest and file are intact (checksum,
 * each module's fingerprint recomputed from the file: REFIT_ECORRUPT) and
 * the plan signatures are equal (REFIT_EMISMATCH naming the first
 * difference). Then every runtime tensor is copied DIRECT, no post-load
 * runs, the runtime fingerprints are checked against the manifest, and
 * the worker commits at the snapshot's version, journaled with source
 * snapshot://path. A failure after the first byte aborts as refit_abort
 * would (rolled back, or POISONED without rollback). opts NULL: defaults. */
REFIT_API int refit_restore(refit_model *model, const char *path, const refit_restore_opts *opts);

/* Check snapshot path without a model: the manifest's checksum, the file,
 * and each module's fingerprint recomputed from the file's bytes. */
REFIT_API int refit_snapshot_verify(refit_ctx *ctx, const char *path);

/* Progress of an open transaction. */
typedef struct refit_txn_stats {
    uint64_t tensors_loaded, bytes_loaded;
    uint32_t modules_touched, modules_complete;
    /* Bytes the undo log saved so far: in device memory (within
     * refit_options.undo_device_budget) and in host memory. */
    uint64_t undo_device_bytes, undo_host_bytes;
} refit_txn_stats;
REFIT_API int refit_txn_stats_get(const refit_txn *txn, refit_txn_stats *out);

/* ---- many tensors per call --------------------------------------------- */

/* Deliver n whole checkpoint tensors in one call, names[i] from srcs[i],
 * each as refit_load would (the same checks, the same bytes), on one
 * stream. Every row is checked before any byte is written: name known, not
 * delivered earlier nor twice in this call (a name tied to another row's
 * is accepted and written once), dtype, shape, device, staging budget. A
 * refused row refuses the whole call, nothing written, the txn usable; the
 * message starts "row <i> (<name>): ". A failure once bytes move fails the
 * txn as refit_load's would. srcs are read as refit_load reads its src. */
REFIT_API int refit_load_many(refit_txn *txn, size_t n, const char *const *names,
                              const refit_tensor *srcs, void *stream);

/* A prepared source set: the same named buffers delivered at every update
 * (a trainer's parameters, a transport's receive buffers, a staging
 * arena), resolved and checked once, then loaded with one call. */
typedef struct refit_source_set refit_source_set;

/* Build a set of n rows, names[i] from srcs[i], for a sealed model: each
 * row checked as refit_load checks it, a name given twice refused ("row
 * <i> (<name>): "). Names and descriptors (shape, strides) are copied; the
 * memory they point at stays the caller's and must hold the update's bytes
 * when refit_load_set runs (device and pinned memory until the txn ends).
 * The set may outlive its model (then every load refuses it). */
REFIT_API int refit_source_set_create(refit_source_set **out, refit_model *model, size_t n,
                                      const char *const *names, const refit_tensor *srcs);
/* Point every row at new memory: data[i] replaces row i's data pointer
 * (its byte_offset kept). n is the set's row count. Each row is checked
 * again, all before any change: a refusal leaves the set as it was.
 * REFIT_ESTATE (no message: no context) when the model was destroyed. */
REFIT_API int refit_source_set_repoint(refit_source_set *set, size_t n, void *const *data);
/* Deliver every row of set into txn as refit_load_many would, without
 * resolving names or re-checking descriptors. Refuses with REFIT_ESTATE,
 * nothing written, a stale set: its model destroyed, or another model's. */
REFIT_API int refit_load_set(refit_txn *txn, refit_source_set *set, void *stream);
/* Rows of the set. */
REFIT_API size_t refit_source_set_count(const refit_source_set *set);
/* Free the set (before or after its model). NULL is ok. */
REFIT_API void refit_source_set_destroy(refit_source_set *set);

#ifdef __cplusplus
}
#endif
#endif /* REFIT_REFIT_H */
