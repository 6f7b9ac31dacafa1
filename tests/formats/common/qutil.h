/* Helpers shared by the quantization tests: reference data from the
 * Python scripts beside this file (numpy + ml_dtypes, through the venv
 * that scripts/deps.sh creates), read back with the project's safetensors
 * reader, and views and descriptors over it. */
#ifndef REFIT_TESTS_QUANT_QUTIL_H
#define REFIT_TESTS_QUANT_QUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "core/safetensors.h"
#include "tests/core/testutil.h"

/* Run `python tests/formats/common/SCRIPT OUT ARGS` with the venv's Python
 * ($REFIT_VENV, else $REFIT_BUILD_ROOT/venv) and open OUT (unlinked once
 * mapped). Fails the test with a clear message when the venv is missing.
 * Close with st_close. */
st_set *q_ref(const char *script, const char *args);
/* A tensor of the set; fails the test when absent. */
const st_tensor *q_get(const st_set *s, const char *name);
/* Row-major view / borrowed descriptor of a set's tensor (CPU). */
refit_view q_view(const st_tensor *t);
refit_tensor q_desc(const st_tensor *t);
/* Row-major view over a buffer. */
refit_view q_buf_view(void *data, refit_dtype dt, int64_t rows, int64_t cols);
/* Assert n bytes equal; on failure name the first differing index. */
void q_assert_bytes_(const void *want, const void *got, size_t n, const char *what,
                     const char *file, int line);
#define q_assert_bytes(w, g, n, what) q_assert_bytes_((w), (g), (n), (what), __FILE__, __LINE__)
/* Shard rows [lo, hi) of n over tp ranks, as the core splits. */
void q_shard(int64_t n, int tp, int rank, int64_t *lo, int64_t *hi);

/* ---- a test module built from reference tensors ---- */

#define Q_E4M3 ((refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1})
#define Q_E8M0 ((refit_dtype){REFIT_DTYPE_FLOAT8_E8M0FNU, 8, 1})

/* One checkpoint tensor of a test module: rows [row0, row0 + rows) of a
 * tensor of the reference set (rows 0: all), maybe delivered as E4M3 or E8M0
 * (the set stores codes as u8: as 1 or 2) or flattened to 1-D. */
typedef struct q_ent {
    const char *name;
    const char *src;
    const char *target;
    int as, flat;         /* as: 1 E4M3, 2 E8M0, 0 the set's dtype */
    int shard_dim;        /* -1: not sharded */
    int64_t row0, rows;
    int64_t dst_row;      /* dst_offset[0] in the target */
    int64_t expert;       /* -1: none */
} q_ent;

/* TP rank of tp for the entries with a shard_dim. */
typedef struct q_tp {
    int tp, rank;
} q_tp;

/* The descriptor of an entry's full (unsharded) checkpoint tensor; shape
 * has REFIT_MAX_DIMS room and backs d.shape. */
refit_tensor q_ent_desc(const st_set *s, const q_ent *e, int64_t *shape);
/* refit_model_expect every entry (tw_expect); the first failing status. */
int q_expect(tw *w, const char *mod, const st_set *s, const q_ent *e, int n, const q_tp *tp);
/* begin, load every entry, finalize; the first failure (aborted). */
int q_try_update(tw *w, const st_set *s, const q_ent *e, int n, const char *label);
/* Same, asserting success and READY. */
void q_update(tw *w, const st_set *s, const q_ent *e, int n, const char *label);
/* The first bytes of runtime mod/name equal want. */
void q_assert_rt(tw *w, const char *mod, const char *name, const void *want, size_t bytes);

/* Expecting e and sealing must be refused, with a message naming mod and
 * holding msg; what names the case in the failure. */
void q_assert_seal_refused(tw *w, const char *mod, const st_set *s, const q_ent *e, int n,
                           const char *what, const char *msg);
/* bad, delivered as mod's online weight name in a new transaction, must
 * fail with REFIT_ECORRUPT naming both and "NaN or infinity", at that load
 * or at finalize (post-load runs when the module completes); the aborted
 * update leaves bytes and health as they were. */
void q_assert_nonfinite_refused(tw *w, const char *mod, const char *name,
                                const refit_tensor *bad);

/* ---- steps every format suite repeats ----
 * Used by every suite of tests/formats: tests/formats/meson.build
 * compiles this file too. Nothing here names a plugin symbol, so the
 * convert suites and the kernel suite, which link no plugin, link it as
 * before. */

/* Open a world. plugin: register that linked-in format; NULL: register
 * nothing, so the loader finds the built plugin file (refit-fmt-NAME.so
 * on the build's plugin path) and checks its declaration at seal. */
void q_world(tw *w, const refit_format_v2 *plugin);

/* Seal after expecting every entry; the first failing status. */
int q_expect_seal(tw *w, const char *mod, const st_set *s, const q_ent *e, int n,
                  const q_tp *tp);

/* One module of a suite, as the whole-world steps below build it. */
typedef struct q_module q_module;
struct q_module {
    const refit_format_v2 *plugin; /* linked-in format of the suite */
    /* Add the module to a fresh world, expect s's tensors for it and
     * seal; returns the first failing status. */
    int (*build)(tw *w, const st_set *s, const q_module *m);
    /* Deliver s in one transaction, asserting success and READY.
     * NULL: q_update over e[0, n). */
    void (*update)(tw *w, const st_set *s, const char *label);
    q_ent *e;                      /* an 8-bit suite module's entries: */
    int n;                         /* build may fill them, update loads them */
    const void *arg;               /* the suite's description for build */
    /* Makes a version of the checkpoint: ref(ref_cmd, args), i.e. q_ref
     * with a script of tests/formats/common or f4_ref with a ref4.py command. */
    st_set *(*ref)(const char *cmd, const char *args);
    const char *ref_cmd;
};

/* A module of an 8-bit suite (fp8, int8, mxfp8): entries e[0, n) delivered by q_update,
 * versions made by quant_ref.py. */
q_module q_entries_module(const refit_format_v2 *plugin,
                          int (*build)(tw *w, const st_set *s, const q_module *m), q_ent *e,
                          int n, const void *arg);

/* Reload equals a cold start, with versions A and B made by m->ref from
 * args_a and args_b: a cold world takes B; a hot one takes A, then B, and
 * must end with the cold one's fingerprint; B once more on the hot one
 * must leave every byte (post-load reads staged checkpoint bytes only,
 * never what it wrote). fp (NULL: not wanted) gets the hot fingerprints
 * after A and after B, for suites that also check the versions differ. */
void q_assert_reload_equals_cold(const q_module *m, const char *args_a, const char *args_b,
                                 uint64_t fp[2]);

/* The built plugin file and its declaration make the plans the linked-in
 * plugin makes: file_m built in file (format from the loader; a refused
 * seal fails with "<what> through the plugin file: <message>"), linked_m
 * (usually file_m again) in linked (its plugin registered), s loaded into
 * both, equal fingerprints. Both worlds are left open for further checks;
 * the caller closes them. */
void q_assert_file_equals_linked(tw *file, tw *linked, const q_module *file_m,
                                 const q_module *linked_m, const st_set *s, const char *what);

/* What an update must leave as it was (a refused one, or one delivering
 * the weights already there): every runtime byte and the worker's health. */
typedef struct q_kept {
    void *bytes;
    size_t n;
    refit_health health;
} q_kept;
q_kept q_keep(tw *w);
/* Assert w's bytes and health equal k's; frees k. */
void q_assert_kept(tw *w, q_kept *k);

#endif
