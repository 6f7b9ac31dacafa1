/* Helpers shared by the 4-bit format tests and the convert suite:
 * reference data from ref4.py (numpy/ml_dtypes, through the venv), read
 * back with the project's safetensors reader, and compared. Delivering a
 * set to a test world is f4set.h's job. */
#ifndef REFIT_TESTS_FORMATS4_F4UTIL_H
#define REFIT_TESTS_FORMATS4_F4UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "core/safetensors.h"
#include "tests/core/testutil.h"

/* Run `ref4.py CMD OUT ARGS` and open OUT; fails the test clearly when the
 * venv ($REFIT_VENV, else $REFIT_BUILD_ROOT/venv) is missing. The file is
 * unlinked once mapped. Close with st_close. */
st_set *f4_ref(const char *cmd, const char *args);
/* A tensor of the set; fails the test when absent. */
const st_tensor *f4_get(const st_set *s, const char *name);

/* Suffix after the last '.'. */
const char *f4_suffix(const char *name);
/* Rows [lo, hi) of dim 0 and cols [c0, c1) of a row-major f32 [R, C]
 * matrix equal got (a [hi-lo, c1-c0] row-major matrix), bit for bit. */
void f4_assert_block_eq(const float *want, int64_t cols, int64_t lo, int64_t hi, int64_t c0,
                        int64_t c1, const float *got);

#endif
