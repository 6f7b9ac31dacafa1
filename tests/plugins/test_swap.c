/* P1 (issue 29): a plugin is vetted by descriptor; the file dlopen maps must
 * be that one, whatever the path names by then. -Wl,--wrap=dlopen renames
 * another plugin over the vetted path just before each dlopen the loader
 * makes, as a member of a group-writable plugin directory could. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/plugin_loader.h"
#include "putil.h"

void *__real_dlopen(const char *file, int flags);

static const char *swap_src, *swap_dst; /* armed when both are set */
static int swaps;

/* The swap: a fresh inode renamed over the path, as `mv` would. */
void *__wrap_dlopen(const char *file, int flags)
{
    if (swap_src && swap_dst && !(flags & RTLD_NOLOAD)) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", swap_dst);
        pt_copy(swap_src, tmp, 0755);
        if (rename(tmp, swap_dst) != 0)
            fail_msg("rename %s: %m", tmp);
        swaps++;
    }
    return __real_dlopen(file, flags);
}

static void test_swapped_file_is_not_loaded(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    char src[4096], dst[4096];
    pt_stage_fake(dir, "fakedirect", PT_DECL_DIRECT);
    snprintf(src, sizeof src, "%s/refit-fmt-swapin.so", pt_env("REFIT_TEST_FAKE_DIR"));
    snprintf(dst, sizeof dst, "%s/refit-fmt-fakedirect.so", dir);
    unsetenv("REFIT_TEST_CONSTRUCTOR_RAN");
    swap_src = src;
    swap_dst = dst;
    plugin_set *ps = NULL;
    assert_int_equal(plugins_open(&ps, dir, PLUGINS_ONLY_NAMED, NULL, NULL), REFIT_OK);
    swap_src = swap_dst = NULL;
    assert_int_equal(swaps, 1);
    const char *ran = getenv("REFIT_TEST_CONSTRUCTOR_RAN");
    if (ran)
        fail_msg("dlopen mapped the file renamed over the vetted one (its constructor ran: %s)",
                 ran);
    assert_int_equal(ps->n, 1);
    if (ps->e[0].state != PLUGIN_LOADED)
        fail_msg("the vetted plugin was not loaded: %s", ps->e[0].reason);
    assert_string_equal(ps->e[0].fmt->name, "fakedirect");
    /* the mapping is the vetted inode, not the one at the path now */
    Dl_info info;
    struct stat now;
    assert_true(dladdr(ps->e[0].fmt, &info) != 0);
    assert_int_equal(stat(dst, &now), 0);
    struct stat mapped;
    assert_int_equal(stat(info.dli_fname, &mapped), 0);
    assert_true(mapped.st_ino != now.st_ino);
    plugins_close_set(ps);
    pt_rmtree(dir);
}

/* Two plugins of one set: each is loaded by its own descriptor, and the
 * second is not handed the first's object by a reused /proc/self/fd name. */
static void test_two_plugins_two_objects(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    pt_stage_fake(dir, "fakedirect", PT_DECL_DIRECT);
    pt_stage_fake(dir, "fakestaged", PT_DECL_STAGED);
    plugin_set *ps = NULL;
    assert_int_equal(plugins_open(&ps, dir, PLUGINS_ONLY_NAMED, NULL, NULL), REFIT_OK);
    assert_int_equal(plugins_count(ps, PLUGIN_LOADED), 2);
    assert_true(ps->e[0].dl != ps->e[1].dl);
    plugins_close_set(ps);
    pt_rmtree(dir);
}

/* A plugin another set still maps keeps the /proc/self/fd name it was
 * first loaded under after that set closed the descriptor: a plugin vetted
 * under the same number later must not be handed that object. */
static void test_stale_name_not_reused(void **state)
{
    (void)state;
    char *da = pt_tmpdir(), *dc = pt_tmpdir();
    pt_stage_fake(da, "fakedirect", PT_DECL_DIRECT);
    pt_stage_fake(dc, "fakestaged", PT_DECL_STAGED);
    plugin_set *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(plugins_open(&a, da, PLUGINS_ONLY_NAMED, NULL, NULL), REFIT_OK);
    assert_int_equal(plugins_open(&b, da, PLUGINS_ONLY_NAMED, NULL, NULL), REFIT_OK);
    assert_true(a->e[0].dl == b->e[0].dl); /* one object, two names */
    int freed = a->e[0].fd;
    plugins_close_set(a); /* b keeps the object mapped */
    assert_int_equal(plugins_open(&c, dc, PLUGINS_ONLY_NAMED, NULL, NULL), REFIT_OK);
    assert_int_equal(c->n, 1);
    if (c->e[0].state != PLUGIN_LOADED)
        fail_msg("fakestaged refused: %s (descriptor %d was fakedirect's)", c->e[0].reason,
                 freed);
    assert_string_equal(c->e[0].fmt->name, "fakestaged");
    plugins_close_set(c);
    plugins_close_set(b);
    pt_rmtree(da);
    pt_rmtree(dc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_swapped_file_is_not_loaded),
        cmocka_unit_test(test_two_plugins_two_objects),
        cmocka_unit_test(test_stale_name_not_reused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
