/* Test helpers for the safetensors tests; see util.h. */
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

char *tu_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char *dir = tu_path(base && *base ? base : "/tmp", "refit-st-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return dir;
}

static int tu_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void tu_rmtree(const char *dir)
{
    if (dir)
        nftw(dir, tu_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

char *tu_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    assert_non_null(p);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

void tu_write(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static uint8_t *tu_build(uint64_t len_field, const char *header, size_t data_len, size_t *n)
{
    size_t hl = strlen(header);
    *n = 8 + hl + data_len;
    uint8_t *buf = malloc(*n ? *n : 1);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(len_field >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + hl + i] = (uint8_t)(i * 31 + 7);
    return buf;
}

uint8_t *tu_build_st(const char *header, size_t data_len, size_t *n)
{
    return tu_build(strlen(header), header, data_len, n);
}

void tu_write_st_len(const char *path, uint64_t len_field, const char *header, size_t data_len)
{
    size_t n;
    uint8_t *buf = tu_build(len_field, header, data_len, &n);
    tu_write(path, buf, n);
    free(buf);
}

void tu_write_st(const char *path, const char *header, size_t data_len)
{
    tu_write_st_len(path, strlen(header), header, data_len);
}

const char *tu_source_root(void)
{
    const char *r = getenv("REFIT_SOURCE_ROOT");
    return r && *r ? r : ".";
}

static char *tu_read_stream(FILE *f)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (size_t r; (r = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (cap - n < 2) {
            buf = realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
    }
    buf[n] = '\0';
    return buf;
}

char *tu_run(const char *cmd, int *status, char **err)
{
    char errpath[] = "/tmp/refit-st-err-XXXXXX";
    int fd = mkstemp(errpath);
    assert_true(fd >= 0);
    close(fd);
    size_t n = strlen(cmd) + strlen(errpath) + 8;
    char *full = malloc(n);
    assert_non_null(full);
    snprintf(full, n, "%s 2>%s", cmd, errpath);
    FILE *p = popen(full, "r");
    assert_non_null(p);
    char *out = tu_read_stream(p);
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    if (err) {
        FILE *e = fopen(errpath, "r");
        assert_non_null(e);
        *err = tu_read_stream(e);
        fclose(e);
    }
    unlink(errpath);
    free(full);
    return out;
}

static int tu_usable(const char *python)
{
    if (access(python, X_OK))
        return 0;
    size_t n = strlen(python) + 64;
    char *cmd = malloc(n);
    assert_non_null(cmd);
    snprintf(cmd, n, "'%s' -c 'import safetensors' >/dev/null 2>&1", python);
    int ok = system(cmd) == 0;
    free(cmd);
    return ok;
}

const char *tu_python(void)
{
    static char path[4096];
    static int state; /* 0 unknown, 1 found, -1 absent */
    if (state)
        return state > 0 ? path : NULL;
    const char *venv = getenv("REFIT_VENV"), *build = getenv("REFIT_BUILD_ROOT");
    state = -1;
    if (venv && *venv)
        snprintf(path, sizeof path, "%s/bin/python", venv);
    else if (build && *build)
        snprintf(path, sizeof path, "%s/venv/bin/python", build);
    else
        return NULL;
    if (tu_usable(path))
        state = 1;
    return state > 0 ? path : NULL;
}

char *tu_crosscheck(const char *args)
{
    const char *py = tu_python();
    assert_non_null(py);
    size_t n = strlen(py) + strlen(tu_source_root()) + strlen(args) + 64;
    char *cmd = malloc(n);
    assert_non_null(cmd);
    snprintf(cmd, n, "'%s' '%s/tests/safetensors/crosscheck.py' %s", py, tu_source_root(), args);
    int status;
    char *out = tu_run(cmd, &status, NULL);
    free(cmd);
    assert_int_equal(status, 0);
    return out;
}
