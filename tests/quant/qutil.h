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

#endif
