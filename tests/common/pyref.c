/* See pyref.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/common/pyref.h"

/* The venv's python into path, or 0 with why it is not usable. */
static int find_python(char *path, size_t n, char *why, size_t wn)
{
    const char *venv = getenv("REFIT_VENV"), *build = getenv("REFIT_BUILD_ROOT");
    if (venv && *venv)
        snprintf(path, n, "%s/bin/python", venv);
    else if (build && *build)
        snprintf(path, n, "%s/venv/bin/python", build);
    else {
        snprintf(why, wn, "neither REFIT_VENV nor REFIT_BUILD_ROOT is set: run the tests "
                          "through meson (make test), after scripts/deps.sh BUILD_DIR");
        return 0;
    }
    if (access(path, X_OK)) {
        snprintf(why, wn, "no Python venv at %s: run scripts/deps.sh BUILD_DIR (`make test` "
                          "does; it creates BUILD_DIR/venv from scripts/requirements.txt)", path);
        return 0;
    }
    return 1;
}

const char *pyref_python(void)
{
    static char path[4096];
    char why[4200];
    if (!find_python(path, sizeof path, why, sizeof why))
        fail_msg("%s", why);
    return path;
}

void pyref_skip_without_venv(void)
{
    char path[4096], why[4200], line[4400];
    if (!getenv("REFIT_SOURCE_ROOT")) {
        printf("1..0 # SKIP REFIT_SOURCE_ROOT is not set: run the tests through meson "
               "(make test)\n");
        exit(0);
    }
    if (!find_python(path, sizeof path, why, sizeof why)) {
        printf("1..0 # SKIP %s\n", why);
        exit(0);
    }
    snprintf(line, sizeof line, "'%s' -c 'import numpy, ml_dtypes, safetensors' 2>/dev/null",
             path);
    if (system(line) != 0) {
        printf("1..0 # SKIP the venv at %s lacks numpy, ml_dtypes or safetensors: run "
               "scripts/deps.sh BUILD_DIR (`make test` does)\n", path);
        exit(0);
    }
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
