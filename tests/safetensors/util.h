/* Helpers shared by the safetensors tests: temp dirs, file writers, and the
 * Python cross-check runner. Failures abort the test through cmocka. */
#ifndef REFIT_TESTS_ST_UTIL_H
#define REFIT_TESTS_ST_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* A fresh directory under $TMPDIR (or /tmp); free with tu_rmtree + free. */
char *tu_tmpdir(void);
/* Removes dir and everything below it. */
void tu_rmtree(const char *dir);
/* dir + "/" + name, malloc'd. */
char *tu_path(const char *dir, const char *name);
/* Writes n bytes to path, replacing it. */
void tu_write(const char *path, const void *buf, size_t n);
/* A safetensors file: 8-byte LE length of header, header as given, then
 * data_len bytes of a fixed pattern (byte i = i * 31 + 7). */
void tu_write_st(const char *path, const char *header, size_t data_len);
/* Same, with an explicit (possibly lying) length field. */
void tu_write_st_len(const char *path, uint64_t len_field, const char *header,
                     size_t data_len);
/* Same bytes as tu_write_st, in a malloc'd buffer (*n: its size). */
uint8_t *tu_build_st(const char *header, size_t data_len, size_t *n);

/* $REFIT_SOURCE_ROOT, or "." when unset. */
const char *tu_source_root(void);
/* The cross-check interpreter: $REFIT_VENV/bin/python, else
 * $REFIT_BUILD_ROOT/venv/bin/python, when it can import safetensors;
 * NULL otherwise (tests then skip). */
const char *tu_python(void);
/* Runs "python crosscheck.py ARGS" and returns its stdout (malloc'd);
 * fails the test when it exits non-zero. */
char *tu_crosscheck(const char *args);
/* Runs a shell command; returns stdout (malloc'd), exit status in *status,
 * stderr (malloc'd) in *err when err is not NULL. */
char *tu_run(const char *cmd, int *status, char **err);

#endif
