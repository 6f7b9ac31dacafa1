/* The format SDK's post_load_many loop (include/refit/sdk/group.h) on a
 * fake host: modules in call order, a group taking its later modules of
 * the same key, skipped modules untouched, the first failure ending the
 * call, done[] from host memory only when n > 1, and an allocation failure
 * naming the first module. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <refit/sdk/group.h>

static int allocs, frees, fail_alloc;
static char msg[128], trace[128];

static void *fake_alloc(void *host, size_t size)
{
    (void)host;
    allocs++;
    return fail_alloc ? NULL : test_malloc(size);
}

static void fake_free(void *host, void *p)
{
    (void)host;
    frees += p != NULL;
    test_free(p);
}

static int fake_error(void *host, int status, const char *fmt, ...)
{
    (void)host;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return status;
}

/* A module's state is its kind: '-' no post-load, 'o' alone, 'x' alone
 * and failing, a capital a group key. */
static int where(const refit_fmt_module *m, void *arg)
{
    char kind = *(const char *)m->state;
    (void)arg;
    return kind == '-' ? REFIT_SDK_GROUP_SKIP
           : kind >= 'A' && kind <= 'Z' ? REFIT_SDK_GROUP_LEAD : REFIT_SDK_GROUP_ONE;
}

static void note(const char *s)
{
    strncat(trace, s, sizeof trace - strlen(trace) - 1);
}

static int group(const refit_host_v2 *h, const refit_fmt_module *const *mods, uint32_t n,
                 uint32_t lead, unsigned char *done, void *stream, void *arg)
{
    (void)h, (void)stream;
    char kind = *(const char *)mods[lead]->state;
    note(kind == 'F' ? "!" : "[");
    for (uint32_t k = lead; k < n; k++)
        if (!done[k] && *(const char *)mods[k]->state == kind) {
            done[k] = 1;
            note(mods[k]->name);
        }
    note("]");
    ++*(int *)arg;
    return kind == 'F' ? REFIT_ECORRUPT : REFIT_OK;
}

static int one(const refit_host_v2 *h, const refit_fmt_module *m, void *stream, void *arg)
{
    (void)h, (void)stream, (void)arg;
    note(m->name);
    return *(const char *)m->state == 'x' ? REFIT_ECORRUPT : REFIT_OK;
}

static const refit_sdk_group_ops ops = {where, group, one};

/* post_load_many over modules of these kinds, named a, b, c ... */
static int run(const char *kinds, int *groups)
{
    static refit_fmt_module m[16];
    static const char *const names[] = {"a", "b", "c", "d", "e", "f", "g", "h",
                                        "i", "j", "k", "l", "m", "n", "o", "p"};
    const refit_fmt_module *mods[16];
    refit_host_v2 h;
    memset(&h, 0, sizeof h);
    h.error = fake_error;
    h.mem_alloc = fake_alloc;
    h.mem_free = fake_free;
    uint32_t n = (uint32_t)strlen(kinds);
    for (uint32_t i = 0; i < n; i++) {
        memset(&m[i], 0, sizeof m[i]);
        m[i].name = names[i];
        m[i].state = (void *)(kinds + i);
        mods[i] = &m[i];
    }
    allocs = frees = 0;
    msg[0] = trace[0] = 0;
    *groups = 0;
    return refit_sdk_post_load_groups(&h, mods, n, NULL, &ops, groups);
}

static void groups_in_call_order(void **state)
{
    (void)state;
    int groups;
    assert_int_equal(run("AoB-AoBA", &groups), REFIT_OK);
    assert_string_equal(trace, "[aeh]b[cg]f");
    assert_int_equal(groups, 2);
    assert_int_equal(allocs, 1);
    assert_int_equal(frees, 1);
}

static void first_failure_ends_the_call(void **state)
{
    (void)state;
    int groups;
    assert_int_equal(run("AxBA", &groups), REFIT_ECORRUPT);
    assert_string_equal(trace, "[ad]b");
    assert_int_equal(run("oFAF", &groups), REFIT_ECORRUPT);
    assert_string_equal(trace, "a!bd]");
    assert_int_equal(groups, 1);
    assert_int_equal(frees, 1);
}

static void one_module_takes_no_memory(void **state)
{
    (void)state;
    int groups;
    fail_alloc = 1;
    assert_int_equal(run("A", &groups), REFIT_OK);
    assert_string_equal(trace, "[a]");
    assert_int_equal(run("", &groups), REFIT_OK);
    assert_int_equal(allocs, 0);
    assert_int_equal(run("-o", &groups), REFIT_ENOMEM);
    assert_string_equal(msg, "module a: out of memory");
    assert_string_equal(trace, "");
    assert_int_equal(frees, 0);
    fail_alloc = 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(groups_in_call_order),
        cmocka_unit_test(first_failure_ends_the_call),
        cmocka_unit_test(one_module_takes_no_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
