/* Helpers shared by the 4-bit format tests: reference data from ref4.py
 * (numpy/ml_dtypes, through the venv), read back with the project's
 * safetensors reader, and delivered to a test world (tests/core/testutil.h). */
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
/* A borrowed descriptor of a set's tensor (valid while the set is open). */
refit_tensor f4_desc(const st_tensor *t);
/* Its refit dtype. */
refit_dtype f4_dtype(const st_tensor *t);

/* Expect every checkpoint tensor of the set (names not starting with
 * "expect.") in module; fn (may be NULL) adjusts each spec, e.g. to shard
 * it or name its target. Returns the first failing status. */
typedef void (*f4_spec_fn)(const char *name, refit_ckpt_spec *spec, void *user);
int f4_expect_all(tw *w, const char *module, const st_set *s, f4_spec_fn fn, void *user);
/* f4_expect_all, then seal; the first failing status. */
int f4_expect_seal(tw *w, const char *module, const st_set *s, f4_spec_fn fn, void *user);
/* Deliver every checkpoint tensor of the set (refit_load); asserts OK. */
void f4_load_all(tw *w, refit_txn *t, const st_set *s);
/* begin, f4_load_all, finalize; asserts READY. */
void f4_update(tw *w, const st_set *s, const char *label);

/* Suffix after the last '.'. */
const char *f4_suffix(const char *name);
/* Rows [lo, hi) of dim 0 and cols [c0, c1) of a row-major f32 [R, C]
 * matrix equal got (a [hi-lo, c1-c0] row-major matrix), bit for bit. */
void f4_assert_block_eq(const float *want, int64_t cols, int64_t lo, int64_t hi, int64_t c0,
                        int64_t c1, const float *got);

#endif
