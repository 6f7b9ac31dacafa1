/* Helpers shared by the `refitctl convert` tests: a scratch directory per
 * test, checkpoints written with core/safetensors_write.h, the converter
 * run in-process (ctl_convert) with its output captured, and the
 * "same kernels" comparison: a module loading the converted (serialized)
 * tensors against a module quantizing the original (online, STAGED). */
#ifndef REFIT_TESTS_CONVERT_CVUTIL_H
#define REFIT_TESTS_CONVERT_CVUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "core/safetensors.h"
#include "core/safetensors_write.h"
#include "tests/core/testutil.h"

/* A fresh directory under $REFIT_BUILD_ROOT/tests/convert (the build
 * tree, not /tmp); cmocka setup/teardown: *state is its path (malloc'd),
 * removed with the files in it. */
int cv_setup(void **state);
int cv_teardown(void **state);
/* dir + "/" + name into buf (asserts it fits); returns buf. */
char *cv_join(char *buf, size_t n, const char *dir, const char *name);

/* Write a safetensors file (asserts success). meta: n_meta key/value
 * pairs. */
void cv_write(const char *path, const st_out_tensor *t, size_t n, const char *const *meta,
              size_t n_meta);
/* An output tensor named name over a set's tensor (same dtype, shape,
 * bytes). */
st_out_tensor cv_from(const char *name, const st_tensor *t);
/* Open a checkpoint (asserts success; close with st_close). */
st_set *cv_open(const char *path);
/* A tensor of the set; fails the test when absent. */
const st_tensor *cv_get(const st_set *s, const char *name);
/* Same dtype, shape and bytes. */
void cv_assert_same(const st_tensor *want, const st_tensor *got);

/* Run `refitctl convert ARGS...` (NULL-terminated) in this process.
 * Returns the exit status; *err (malloc'd, may be NULL) gets what it
 * wrote on stderr. Its stdout is discarded (it would break TAP). */
int cv_convert(char **err, ...);
/* Same, asserting exit status 0. */
void cv_convert_ok(const char *format, const char *param, const char *in, const char *out);
/* Exactly one line of stderr, containing every given substring. */
void cv_assert_line_(const char *err, const char *file, int line, ...);
#define cv_assert_line(err, ...) \
    cv_assert_line_((err), __FILE__, __LINE__, __VA_ARGS__, (const char *)NULL)

/* ---- serialized vs online ---- */

/* A borrowed CPU descriptor of a set's tensor. */
refit_tensor cv_desc(const st_tensor *t);
/* One update of w loading the listed tensors of set (checkpoint name =
 * tensor name); asserts success and READY. */
void cv_update(tw *w, const st_set *set, const char *const *names, int n);

/* One weight of a converted checkpoint: the module that loads it. */
typedef struct cv_pair {
    const char *weight;       /* original W.weight (BF16/F16/F32) */
    const char *values;       /* converted values tensor */
    const char *scales;       /* converted scales tensor */
    const char *ser_params;   /* params of the serialized module */
    const char *onl_params;   /* params of the online module */
} cv_pair;

/* World ser loads the converted set into modules "m<i>" of the plugin's
 * format (registered from its source, linked into the test), runtime
 * weight and weight_scale shaped as the converted tensors; world onl (when
 * orig is not NULL) loads the original weight into the same shapes,
 * quantized at post-load. Asserts both updates succeed, that the
 * serialized runtime holds exactly the converted bytes, and that both
 * worlds hold the same bytes. */
void cv_same_kernels(const refit_format_v2 *plugin, const st_set *conv, const st_set *orig,
                     const cv_pair *p, int n);

#endif
