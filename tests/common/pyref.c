/* See pyref.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/common/pyref.h"

const char *pyref_python(void)
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

st_set *pyref_run(const char *script, const char *before, const char *after)
{
    const char *root = getenv("REFIT_SOURCE_ROOT");
    if (!root)
        fail_msg("REFIT_SOURCE_ROOT is not set: run the tests through meson");
    char out[] = "/tmp/refit-pyref-XXXXXX";
    int fd = mkstemp(out);
    assert_true(fd >= 0);
    close(fd);
    char line[8192];
    snprintf(line, sizeof line, "'%s' '%s/%s' %s '%s' %s", pyref_python(), root, script,
             before ? before : "", out, after ? after : "");
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

const st_tensor *pyref_get(const st_set *s, const char *name)
{
    const st_tensor *t = st_find(s, name);
    if (!t)
        fail_msg("reference data has no tensor %s", name);
    return t;
}
