/* Every in-tree plugin that runs device code declares, in its exported
 * struct, the least compute capability its kernels were built for (the
 * build's least -Dcuda-arch, WANT_MIN_CC; 0 without CUDA), and one without
 * device code declares none: the host refuses a device below it at seal
 * (tests/core/test_min_cc.c). */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include <refit/format.h>

static uint32_t declared(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/refit-fmt-%s.so", PLUGIN_DIR, name);
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so)
        fail_msg("%s: %s", path, dlerror());
    const refit_format_v2 *f = dlsym(so, REFIT_FORMAT_PLUGIN_SYMBOL);
    assert_non_null(f);
    assert_true(REFIT_STRUCT_HAS(f, refit_format_v2, min_compute_capability));
    uint32_t cc = f->min_compute_capability;
    dlclose(so);
    return cc;
}

static void test_device_code_declares_the_build_s_least_arch(void **state)
{
    (void)state;
    static const char *const with_kernels[] = {"fp8", "int4", "mxfp8", "mxfp4", "nvfp4"};
    for (size_t i = 0; i < sizeof with_kernels / sizeof *with_kernels; i++) {
        uint32_t cc = declared(with_kernels[i]);
        if (cc != WANT_MIN_CC)
            fail_msg("%s declares %u, the build's least arch is %u", with_kernels[i], cc,
                     (unsigned)WANT_MIN_CC);
    }
    assert_int_equal(declared("unquantized"), 0);
    assert_int_equal(declared("int8"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_code_declares_the_build_s_least_arch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
