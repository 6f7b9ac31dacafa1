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

/* Run `python tests/quant/SCRIPT OUT ARGS` with the venv's Python
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

#endif
