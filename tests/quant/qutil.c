/* See qutil.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/quant/qutil.h"

static const char *python(void)
{
    static char path[4096];
    const char *venv = getenv("REFIT_VENV"), *build = getenv("REFIT_BUILD_ROOT");
    if (venv && *venv)
        snprintf(path, sizeof path, "%s/bin/python", venv);
    else if (build && *build)
        snprintf(path, sizeof path, "%s/venv/bin/python", build);
    else
        fail_msg("neither REFIT_VENV nor REFIT_BUILD_ROOT is set: run the tests through "
                 "meson (make test), after scripts/deps.sh BUILD_DIR");
    if (access(path, X_OK))
        fail_msg("no Python venv at %s: run scripts/deps.sh BUILD_DIR (`make test` does; it "
                 "creates BUILD_DIR/venv with numpy, ml_dtypes and safetensors)", path);
    return path;
}

st_set *q_ref(const char *script, const char *args)
{
    const char *root = getenv("REFIT_SOURCE_ROOT");
    if (!root)
        fail_msg("REFIT_SOURCE_ROOT is not set: run the tests through meson");
    char out[] = "/tmp/refit-quant-XXXXXX";
    int fd = mkstemp(out);
    assert_true(fd >= 0);
    close(fd);
    char line[8192];
    snprintf(line, sizeof line, "'%s' '%s/tests/quant/%s' '%s' %s", python(), root, script,
             out, args ? args : "");
    int st = system(line);
    if (st != 0) {
        unlink(out);
        fail_msg("reference script failed (%d): %s", st, line);
    }
    st_set *s = NULL;
    st_error err;
    int rc = st_open(&s, out, &err);
    unlink(out);
    if (rc) {
        char buf[2048];
        fail_msg("open reference data: %s", st_error_line(&err, buf, sizeof buf));
    }
    return s;
}

const st_tensor *q_get(const st_set *s, const char *name)
{
    const st_tensor *t = st_find(s, name);
    if (!t)
        fail_msg("reference data has no tensor %s", name);
    return t;
}

refit_view q_view(const st_tensor *t)
{
    refit_view v;
    memset(&v, 0, sizeof v);
    v.data = (void *)t->data;
    v.device.device_type = REFIT_DEVICE_CPU;
    v.dtype = st_dtype_to_refit(t->dtype);
    v.ndim = t->ndim;
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        v.shape[i] = t->shape[i];
        v.strides[i] = s;
        s *= t->shape[i];
    }
    return v;
}

refit_tensor q_desc(const st_tensor *t)
{
    refit_tensor d;
    memset(&d, 0, sizeof d);
    d.data = (void *)t->data;
    d.device.device_type = REFIT_DEVICE_CPU;
    d.ndim = t->ndim;
    d.dtype = st_dtype_to_refit(t->dtype);
    d.shape = (int64_t *)t->shape;
    return d;
}

refit_view q_buf_view(void *data, refit_dtype dt, int64_t rows, int64_t cols)
{
    refit_view v;
    memset(&v, 0, sizeof v);
    v.data = data;
    v.device.device_type = REFIT_DEVICE_CPU;
    v.dtype = dt;
    v.ndim = 2;
    v.shape[0] = rows;
    v.shape[1] = cols;
    v.strides[0] = cols;
    v.strides[1] = 1;
    return v;
}

void q_assert_bytes_(const void *want, const void *got, size_t n, const char *what,
                     const char *file, int line)
{
    const unsigned char *a = want, *b = got;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            fail_msg("%s:%d: %s: byte %zu: want 0x%02x, got 0x%02x", file, line, what, i,
                     a[i], b[i]);
}

void q_shard(int64_t n, int tp, int rank, int64_t *lo, int64_t *hi)
{
    int64_t base = n / tp, extra = n % tp;
    *lo = rank * base + (rank < extra ? rank : extra);
    *hi = *lo + base + (rank < extra ? 1 : 0);
}
