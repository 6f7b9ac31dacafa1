/* Allocation failure at every allocation `refitctl convert` makes (its
 * own, the safetensors reader's and writer's; jansson and libc allocate
 * outside the wrap): each run must be refused with exit 1 and one line,
 * write no OUT, and free all it took (LeakSanitizer checks that in the
 * sanitized build). Failures are injected with -Wl,--wrap and armed only
 * around the converter call. The input is the sharded tiny-llama fixture
 * of tests/data. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/convert/cvutil.h"
#include "tools/refitctl.h"

static long fail_at = -1; /* the allocation to fail, counted from 1; -1: none */
static long calls;

static int fail_now(void)
{
    return fail_at > 0 && ++calls == fail_at;
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t k);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t k);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);

void *__wrap_malloc(size_t n) { return fail_now() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t k) { return fail_now() ? NULL : __real_calloc(n, k); }
void *__wrap_realloc(void *p, size_t n) { return fail_now() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s) { return fail_now() ? NULL : __real_strdup(s); }

/* ctl_convert with stdout to /dev/null and stderr to err (a file, so that
 * nothing here allocates while armed). */
static int run(int argc, char **argv, int err)
{
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    assert_true(null >= 0);
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    assert_true(so >= 0 && se >= 0);
    assert_true(dup2(null, 1) >= 0 && dup2(err, 2) >= 0);
    calls = 0;
    int rc = ctl_convert(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    close(null);
    return rc;
}

/* Fail allocation 1, 2, ... until a run completes without reaching the
 * failure; returns how many allocations that run made. */
static long sweep(char **argv, const char *out)
{
    for (long n = 1;; n++) {
        FILE *err = tmpfile();
        char line[2048] = "";
        struct stat st;
        assert_non_null(err);
        unlink(out);
        fail_at = n;
        int rc = run(7, argv, fileno(err));
        long made = calls;
        fail_at = -1;
        rewind(err);
        if (!fgets(line, sizeof line, err))
            line[0] = '\0';
        int lines = line[0] != '\0' && fgetc(err) == EOF;
        fclose(err);
        if (made < n) { /* the failure was never reached: a clean run */
            assert_int_equal(rc, 0);
            return made;
        }
        if (rc != 1 || !lines || !stat(out, &st))
            fail_msg("allocation %ld of %ld failed: exit %d, OUT %s, stderr: %s", n, made, rc,
                     stat(out, &st) ? "absent" : "written", line);
    }
}

static void sweep_format(const char *dir, const char *format, const char *param, size_t quantized)
{
    const char *root = getenv("REFIT_SOURCE_ROOT");
    char in[4200], out[4200];
    if (!root)
        fail_msg("REFIT_SOURCE_ROOT is not set: run the tests through meson");
    snprintf(in, sizeof in, "%s/tests/data/hf-tiny-llama-sharded", root);
    cv_join(out, sizeof out, dir, "out.safetensors");
    char *argv[] = {"convert", "--format", (char *)format, "--param", (char *)param, in, out,
                    NULL};
    long made = sweep(argv, out);
    print_message("# convert --format %s %s: %ld allocations, each failed once\n", format,
                  param, made);
    assert_true(made > 20);
    st_set *s = cv_open(out);
    assert_int_equal(st_count(s), 21 + quantized); /* each quantized weight gains scales */
    st_close(s);
}

static void alloc_fp8(void **state)
{
    sweep_format(*state, "fp8", "scheme=block128", 14);
}

static void alloc_mxfp4(void **state)
{
    sweep_format(*state, "mxfp4", "skip=embed,norm", 15); /* lm_head too */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(alloc_fp8, cv_setup, cv_teardown),
        cmocka_unit_test_setup_teardown(alloc_mxfp4, cv_setup, cv_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
