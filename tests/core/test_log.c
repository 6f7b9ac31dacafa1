/* The library's messages: to refit_options.log_fn when one is given (and
 * nothing on stderr), else to stderr with "refit: " first; debug lines
 * (level 2) to a log_fn always, to stderr only under REFIT_DEBUG. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/ctx.h"
#include "testutil.h"

#define MAX_LINES 32

typedef struct collected {
    int n;
    int level[MAX_LINES];
    char line[MAX_LINES][1300];
} collected;

static void collect(void *user, int level, const char *msg)
{
    collected *c = user;
    if (c->n < MAX_LINES) {
        c->level[c->n] = level;
        snprintf(c->line[c->n], sizeof c->line[0], "%s", msg);
    }
    c->n++;
}

/* fd 2 into a temporary file for the length of a test. */
typedef struct captured {
    FILE *tmp;
    int saved;
    char text[4096];
} captured;

static void capture_begin(captured *cap)
{
    fflush(stderr);
    cap->tmp = tmpfile();
    assert_non_null(cap->tmp);
    cap->saved = dup(2);
    assert_true(cap->saved >= 0);
    assert_true(dup2(fileno(cap->tmp), 2) == 2);
}

static const char *capture_end(captured *cap)
{
    fflush(stderr);
    dup2(cap->saved, 2);
    close(cap->saved);
    rewind(cap->tmp);
    size_t n = fread(cap->text, 1, sizeof cap->text - 1, cap->tmp);
    cap->text[n] = '\0';
    fclose(cap->tmp);
    return cap->text;
}

static int find(const collected *c, int level, const char *needle)
{
    for (int i = 0; i < c->n && i < MAX_LINES; i++)
        if (c->level[i] == level && strstr(c->line[i], needle))
            return i;
    return -1;
}

static refit_ctx *open_ctx(const char *plugin_dirs, collected *c)
{
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    o.plugin_dirs = plugin_dirs;
    if (c) {
        o.log_fn = collect;
        o.log_user = c;
    }
    refit_ctx *ctx = NULL;
    assert_int_equal(refit_open(&ctx, &o), REFIT_OK);
    return ctx;
}

#define MISSING_DIR "/nonexistent/refit-test-log-dir"

static void test_warning_goes_to_the_callback_alone(void **state)
{
    (void)state;
    collected c = {0};
    captured cap;
    capture_begin(&cap);
    refit_ctx *ctx = open_ctx(MISSING_DIR, &c);
    refit_close(ctx);
    const char *err = capture_end(&cap);
    assert_string_equal(err, "");
    int i = find(&c, 1, MISSING_DIR);
    assert_true(i >= 0);
    assert_non_null(strstr(c.line[i], "is missing"));
    assert_null(strchr(c.line[i], '\n')); /* a line, without its newline */
    assert_null(strstr(c.line[i], "refit: "));
}

static void test_warning_goes_to_stderr_without_a_callback(void **state)
{
    (void)state;
    captured cap;
    capture_begin(&cap);
    refit_ctx *ctx = open_ctx(MISSING_DIR, NULL);
    refit_close(ctx);
    const char *err = capture_end(&cap);
    assert_non_null(strstr(err, "refit: plugin directory " MISSING_DIR));
    assert_non_null(strstr(err, "is missing\n"));
}

static void test_debug_lines_reach_the_callback(void **state)
{
    (void)state;
    unsetenv("REFIT_DEBUG");
    collected c = {0};
    captured cap;
    refit_ctx *ctx = open_ctx("", &c);
    int before = c.n;
    capture_begin(&cap);
    ctx->host.log(ctx, 2, "debug %d from %s", 7, "a format");
    ctx->host.log(ctx, 3, "finer than debug");
    ctx->host.log(ctx, 0, "an error");
    const char *err = capture_end(&cap);
    assert_string_equal(err, "");
    assert_int_equal(c.n, before + 2);
    assert_int_equal(c.level[before], 2);
    assert_string_equal(c.line[before], "debug 7 from a format");
    assert_int_equal(c.level[before + 1], 0);
    assert_string_equal(c.line[before + 1], "an error");
    refit_close(ctx);
}

static void test_debug_on_stderr_only_under_refit_debug(void **state)
{
    (void)state;
    captured cap;
    refit_ctx *ctx = open_ctx("", NULL);
    unsetenv("REFIT_DEBUG");
    capture_begin(&cap);
    ctx->host.log(ctx, 2, "quiet debug");
    assert_string_equal(capture_end(&cap), "");
    setenv("REFIT_DEBUG", "1", 1);
    capture_begin(&cap);
    ctx->host.log(ctx, 2, "loud debug");
    ctx->host.log(ctx, 3, "finer");
    const char *err = capture_end(&cap);
    unsetenv("REFIT_DEBUG");
    assert_string_equal(err, "refit: loud debug\nrefit: finer\n");
    refit_close(ctx);
}

static void test_long_line_is_cut_not_overrun(void **state)
{
    (void)state;
    collected c = {0};
    refit_ctx *ctx = open_ctx("", &c);
    int before = c.n;
    char big[4000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ctx->host.log(ctx, 1, "%s", big);
    assert_int_equal(c.n, before + 1);
    assert_true(strlen(c.line[before]) > 1000);
    assert_true(strlen(c.line[before]) < sizeof big - 1);
    refit_close(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warning_goes_to_the_callback_alone),
        cmocka_unit_test(test_warning_goes_to_stderr_without_a_callback),
        cmocka_unit_test(test_debug_lines_reach_the_callback),
        cmocka_unit_test(test_debug_on_stderr_only_under_refit_debug),
        cmocka_unit_test(test_long_line_is_cut_not_overrun),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
