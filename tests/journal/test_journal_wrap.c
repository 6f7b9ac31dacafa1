/* C1 (issue 29): `refitctl journal show` wraps long fields (a source URI,
 * an error) with ctl_wrap; a wrap that scans the rest of the text for each
 * line is quadratic (a 4 MB URI took 6 s). The work is counted, not timed:
 * the text lies in pages kept unreadable but for the last few touched, and
 * a SIGSEGV handler opens each page touched and counts it. A linear wrap
 * touches each page a few times; a quadratic one every later page per line. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "jtest.h"
#include "tools/ctl/ctl_journal_int.h"

#define WINDOW 4 /* pages readable at once: an access may straddle two */

static char *region;
static size_t region_len, page;
static char *open_pages[WINDOW];
static size_t n_open;
static long faults;

static void on_fault(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    char *a = si->si_addr;
    if (a < region || a >= region + region_len) {
        signal(sig, SIG_DFL); /* not ours: crash as it would have */
        return;
    }
    char *pg = region + (size_t)(a - region) / page * page;
    if (open_pages[n_open % WINDOW])
        mprotect(open_pages[n_open % WINDOW], page, PROT_NONE);
    mprotect(pg, page, PROT_READ);
    open_pages[n_open++ % WINDOW] = pg;
    faults++;
}

/* Page faults of one ctl_wrap over a text of len bytes (c repeated). */
static long wrap_faults(size_t len, char c)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
    region_len = (len + 1 + page - 1) / page * page;
    region = mmap(NULL, region_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(region != MAP_FAILED);
    memset(region, c, len);
    region[len] = '\0';
    FILE *devnull = fopen("/dev/null", "w");
    assert_non_null(devnull);
    struct sigaction sa = {.sa_sigaction = on_fault, .sa_flags = SA_SIGINFO}, old_segv, old_bus;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    memset(open_pages, 0, sizeof open_pages);
    n_open = 0;
    faults = 0;
    assert_int_equal(mprotect(region, region_len, PROT_NONE), 0);
    ctl_wrap(devnull, region, 17);
    long n = faults;
    sigaction(SIGSEGV, &old_segv, NULL);
    sigaction(SIGBUS, &old_bus, NULL);
    fclose(devnull);
    munmap(region, region_len);
    return n;
}

static void test_wrap_is_linear(void **state)
{
    (void)state;
    size_t len = 256 * 1024; /* 64 pages of 4 KiB, about 3,100 lines */
    long uri = wrap_faults(len, 'a');     /* no space: lines break mid-word */
    long words = wrap_faults(len, ' ');   /* all blanks: skipped, not printed */
    long pages = (long)((len + page) / page);
    if (uri > 4 * pages + 16)
        fail_msg("wrapping %zu bytes touched pages %ld times (the text has %ld): "
                 "each line scans the rest of the text", len, uri, pages);
    if (words > 4 * pages + 16)
        fail_msg("skipping %zu blanks touched pages %ld times (%ld pages)", len, words, pages);
}

/* What the wrap prints: lines of at most 100 - col columns, broken at the
 * last space that fits (else mid-word), continuations indented, newlines
 * kept. */
static void test_wrap_output(void **state)
{
    (void)state;
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    assert_non_null(f);
    char text[300];
    memset(text, 'x', 200);
    text[200] = '\0';
    ctl_wrap(f, text, 90); /* room 10, raised to 20 */
    ctl_wrap(f, "one two\nthree", 10);
    ctl_wrap(f, NULL, 10);
    fclose(f);
    char want[4096];
    snprintf(want, sizeof want, "%.20s\n", text);
    for (int i = 1; i < 10; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%*s%.20s\n", 90, "", text);
    strcat(want, "one two\n          three\n-\n");
    assert_string_equal(out, want);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrap_output),
        cmocka_unit_test(test_wrap_is_linear),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
