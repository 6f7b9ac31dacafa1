/* A ref4.py set delivered whole to a test world: every checkpoint tensor
 * of the set (a name not starting with "expect.", which marks numpy's
 * answers) is expected in one module and loaded in one transaction. Built
 * on tests/formats/common/qutil.c's descriptors, which tests/formats/meson.build
 * compiles too; f4util.[ch] stays free of it for the convert suite. */
#ifndef REFIT_TESTS_FORMATS4_F4SET_H
#define REFIT_TESTS_FORMATS4_F4SET_H

#include "core/safetensors.h"
#include "tests/core/testutil.h"
#include "tests/formats/common/qutil.h"

/* Expect every checkpoint tensor of the set in module; fn (may be NULL)
 * adjusts each spec, e.g. to shard it or name its target. Returns the
 * first failing status. */
typedef void (*f4_spec_fn)(const char *name, refit_ckpt_spec *spec, void *user);
int f4_expect_all(tw *w, const char *module, const st_set *s, f4_spec_fn fn, void *user);
/* f4_expect_all, then seal; the first failing status. */
int f4_expect_seal(tw *w, const char *module, const st_set *s, f4_spec_fn fn, void *user);
/* Deliver every checkpoint tensor of the set (refit_load); asserts OK. */
void f4_load_all(tw *w, refit_txn *t, const st_set *s);
/* begin, f4_load_all, finalize; asserts READY. */
void f4_update(tw *w, const st_set *s, const char *label);

/* A module of a formats4 suite for qutil's whole-world steps: delivered
 * by f4_update, versions made by `ref4.py cmd` (NULL where the caller
 * makes the set itself, as for q_assert_file_equals_linked). */
q_module f4_module(const refit_format_v2 *plugin,
                   int (*build)(tw *w, const st_set *s, const q_module *m), const void *arg,
                   const char *cmd);

#endif
