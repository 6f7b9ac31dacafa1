/* Reference data from Python (numpy, ml_dtypes, safetensors in the venv
 * scripts/deps.sh makes): run a script of the source tree that writes a
 * safetensors file, and read it back. Fails the test, clearly, when the
 * venv or the script is missing or the script fails. */
#ifndef REFIT_TESTS_COMMON_PYREF_H
#define REFIT_TESTS_COMMON_PYREF_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "core/safetensors.h"

/* The venv's python ($REFIT_VENV, else $REFIT_BUILD_ROOT/venv). */
const char *pyref_python(void);
/* For a suite's main, before any test: without a usable venv, print a
 * skipped TAP plan ("1..0 # SKIP" and what to run) and exit 0, which meson
 * counts as a skipped suite. (Under meson's TAP protocol an exit status of
 * 77 counts as an error; the skipped plan is TAP's way of saying the same.) */
void pyref_skip_without_venv(void);
/* Runs `python <root>/<script> <before> <out> <after>`; returns the set it
 * wrote to <out> (the file is already unlinked). */
st_set *pyref_run(const char *script, const char *before, const char *after);
/* A tensor of the reference data, or a failed test. */
const st_tensor *pyref_get(const st_set *s, const char *name);

#endif
