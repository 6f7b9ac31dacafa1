/* The CUDA backend's ring trace (core/cuda/ring_trace.c), on the CPU: off
 * unless REFIT_CUDA_RING_TRACE is set, and then a file per process ("%p":
 * its pid) written at exit, one line per record with the thread that made
 * it and its CPU time. Each case runs in a child process, since the trace
 * reads the variable once and writes at exit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <pthread.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/cuda/ring_trace.h"

static char dir[] = "/tmp/refit-ring-trace-XXXXXX";

static int setup(void **state)
{
    (void)state;
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void *other_thread(void *arg)
{
    (void)arg;
    ring_trace_add(RT_ISSUE, 30, 40, 7, 1 << 20, 2, 0); /* who stays -1 */
    return NULL;
}

/* Exit status 0 when the child saw what it should; the file is the
 * parent's to read. */
static int child(const char *env)
{
    if (env)
        setenv("REFIT_CUDA_RING_TRACE", env, 1);
    else
        unsetenv("REFIT_CUDA_RING_TRACE");
    ring_trace_init();
    ring_trace_init(); /* idempotent */
    if (ring_trace_on != (env != NULL))
        return 1;
    ring_trace_worker(3);
    uint64_t c0 = ring_trace_cpu_ns();
    volatile uint64_t spin = 0;
    for (int i = 0; i < 20000000; i++)
        spin += (uint64_t)i;
    uint64_t cpu = ring_trace_cpu_ns() - c0;
    if (spin == 0)
        return 4;
    if (env ? cpu == 0 : (c0 != 0 || cpu != 0))
        return 2;
    ring_trace_add(RT_FILL, 10, 20, 5, 2 << 20, 123, cpu);
    pthread_t t;
    if (pthread_create(&t, NULL, other_thread, NULL) || pthread_join(t, NULL))
        return 3;
    return 0;
}

static pid_t run_child(const char *env)
{
    fflush(NULL);
    pid_t p = fork();
    if (p == 0)
        exit(child(env));
    assert_true(p > 0);
    int st = 0;
    assert_int_equal(waitpid(p, &st, 0), p);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    return p;
}

static void test_off_without_the_variable(void **state)
{
    (void)state;
    pid_t p = run_child(NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/t_%ld.txt", dir, (long)p);
    assert_int_equal(access(path, F_OK), -1);
}

static void test_records_written_at_exit_one_file_a_process(void **state)
{
    (void)state;
    char env[256], path[256], line[512];
    snprintf(env, sizeof env, "%s/t_%%p.txt", dir);
    pid_t p = run_child(env);
    snprintf(path, sizeof path, "%s/t_%ld.txt", dir, (long)p);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof line, f));
    assert_non_null(strstr(line, "2 records, 0 dropped"));
    unsigned kind[2];
    int who[2];
    unsigned long long t0[2], t1[2], a[2], b[2], c[2], cpu[2];
    for (int i = 0; i < 2; i++) {
        assert_non_null(fgets(line, sizeof line, f));
        assert_int_equal(sscanf(line, "%u %d %llu %llu %llu %llu %llu %llu", &kind[i], &who[i],
                                &t0[i], &t1[i], &a[i], &b[i], &c[i], &cpu[i]),
                         8);
    }
    assert_null(fgets(line, sizeof line, f));
    fclose(f);
    /* the fill, from worker 3, with its CPU time */
    assert_int_equal(kind[0], RT_FILL);
    assert_int_equal(who[0], 3);
    assert_int_equal(t0[0], 10);
    assert_int_equal(t1[0], 20);
    assert_int_equal(a[0], 5);
    assert_int_equal(b[0], 2 << 20);
    assert_int_equal(c[0], 123);
    assert_true(cpu[0] > 0);
    /* the issue, from a thread that is no worker */
    assert_int_equal(kind[1], RT_ISSUE);
    assert_int_equal(who[1], -1);
    assert_int_equal(a[1], 7);
    assert_int_equal(c[1], 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off_without_the_variable),
        cmocka_unit_test(test_records_written_at_exit_one_file_a_process),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
