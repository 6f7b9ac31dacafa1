/* The format conformance kit (refit-format-conformance, docs/conformance.md):
 * worlds built from a conformance case (a model manifest whose modules use
 * the format under test), deterministic checkpoint versions, deliveries
 * whole or in cuts, and snapshots of every runtime byte. kit_checks.c holds
 * the checks; refit-format-conformance.c the command line and TAP. With
 * --device cuda every world's runtime tensors and sources live on the
 * device and a host twin of the world takes every update too: their bytes
 * must agree (the plugin's kernels against its CPU path). */
#ifndef REFIT_CONFORMANCE_KIT_H
#define REFIT_CONFORMANCE_KIT_H

#include <stddef.h>
#include <stdint.h>

#include <refit/refit.h>

#include "schemas/format_decl.h"
#include "schemas/model_doc.h"

/* What every world of a run shares. */
typedef struct kit_env {
    const char *plugin_dir;  /* private directory holding the staged plugin */
    const char *format;      /* the format under test (its declaration's name) */
    const fdecl *decl;
    const char *case_path;
    const mdoc *doc;         /* the case */
    int tp;                  /* shard count of the case's sharded entries (1: none) */
    const char *fault;       /* --self-test-fault: what to break (refusal, twin), or NULL */
    refit_device device;     /* where runtime tensors and sources live (--device) */
    const char *reference;   /* --reference: the author's reference command, or NULL */
} kit_env;

/* One runtime tensor of a world: a buffer the kit owns. */
typedef struct kit_rt {
    const char *module, *name;
    refit_tensor t;
    int64_t shape[REFIT_MAX_DIMS];
    void *buf;               /* on env->device */
    size_t bytes;
} kit_rt;

/* How a world declares the case's sharded checkpoint tensors. */
typedef enum kit_layout {
    KIT_SHARDED = 0,  /* as the case says: rank `rank` of each shard */
    KIT_SLICED = 1,   /* each sharded tensor declared unsharded, with the
                         shape of rank `rank`'s slice (the TP twin) */
} kit_layout;

typedef struct kit_world kit_world;
struct kit_world {
    const kit_env *env;
    refit_ctx *ctx;
    refit_model *m;
    int rank;
    kit_layout layout;
    kit_rt *rt;
    size_t n_rt;
    kit_world *twin;         /* on a device: the same world in host memory */
    void **keep;             /* device sources of the open update */
    size_t n_keep;
};

/* How an update delivers each checkpoint tensor. */
typedef struct kit_delivery {
    uint64_t version;
    int cuts;             /* 0: whole; >0: refit_load_part in that many cuts
                             along each tensor's split dim */
    int poison_others;    /* sharded tensors: rows of other ranks hold NaN
                             (floats) or other bits, which must not matter */
    const char *nan_in;   /* this tensor gets one NaN (element 0) */
    const char *skip;     /* this tensor is not delivered */
    int many;             /* every tensor in one refit_load_many (cuts ignored):
                             the post-loads of its modules run at its end, in
                             one post_load_many a format where it has one */
} kit_delivery;

/* Open a world at rank, every runtime byte set to junk, sealed. Returns
 * REFIT_OK, or a status with why (what failed and refit's message). */
int kit_world_open(kit_world *w, const kit_env *env, int rank, kit_layout layout,
                   unsigned char junk, char *why, size_t n);
void kit_world_close(kit_world *w);

/* begin (rollback on), deliver, finalize. REFIT_OK, or the first failing
 * status with why (which call, which tensor, refit's message). A world on
 * a device runs the update on its host twin too: when one commits and the
 * other does not, or their bytes differ, REFIT_EMISMATCH naming the first
 * differing byte. */
int kit_update(kit_world *w, const kit_delivery *d, const char *label, char *why, size_t n);
/* Deliver d into an open txn (what kit_update does between begin and
 * finalize); the first failing status, the txn left open. */
int kit_deliver(kit_world *w, refit_txn *t, const kit_delivery *d, char *why, size_t n);

/* Every runtime byte, concatenated in binding order (malloc'd; NULL when
 * out of memory or a device copy failed). */
void *kit_snapshot(const kit_world *w, size_t *bytes);
/* Flip the first runtime byte (--self-test-fault). */
void kit_flip_first_byte(kit_world *w);
/* Free the device sources kept for the update that ended. */
void kit_release_sources(kit_world *w);
/* Where two snapshots of w first differ, as "module/tensor byte k", into
 * buf; "" when equal. */
const char *kit_diff(const kit_world *w, const void *a, const void *b, char *buf, size_t n);

/* Checkpoint tensor contents: element i of (name, version) in dtype dt,
 * finite for float dtypes, written at p (nan_in puts its NaN at element 0). */
void kit_value(void *p, refit_dtype dt, const char *name, uint64_t version, int64_t i);
/* The rows [lo, hi) of dim that rank holds of entry ck (the core's split,
 * after padding); 0 when the entry is not sharded (lo 0, hi the extent). */
int kit_slice(const mdoc_ck *ck, int rank, int64_t *lo, int64_t *hi);
/* 1 when dt is a float dtype a NaN can be written in. */
int kit_has_nan(refit_dtype dt);
/* The checkpoint entry (not a tie) of the case, or NULL. */
const mdoc_ck *kit_entry(const mdoc *doc, const char *name, const mdoc_mod **mod);

#endif
