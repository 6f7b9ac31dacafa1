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
/* Runs `python <root>/<script> <before> <out> <after>`; returns the set it
 * wrote to <out> (the file is already unlinked). */
st_set *pyref_run(const char *script, const char *before, const char *after);
/* A tensor of the reference data, or a failed test. */
const st_tensor *pyref_get(const st_set *s, const char *name);

#endif
