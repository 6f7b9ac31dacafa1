/* refitctl convert --format mxfp4 from BF16, F16 and F32 weights (ragged
 * 32-blocks and an odd K included): the converted W.weight_packed and
 * W.weight_scale equal ref4.py's numpy/ml_dtypes OCP MX quantization bit
 * for bit, and the mxfp4 plugin loads them (serialized, DIRECT) into
 * exactly the bytes its online path (STAGED, post-load) makes from the
 * original checkpoint. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/convert/cvutil.h"
#include "tests/formats/common/f4util.h"
#include "tests/common/pyref.h"

extern const refit_format_v2 refit_format_plugin_v2;

static void mxfp4_same_kernels(void **state)
{
    st_set *ref[3] = {
        f4_ref("mxfp4-online", "--n 6 --k 70 --dtype bf16 --seed 4"),
        f4_ref("mxfp4-online", "--n 5 --k 33 --dtype f16 --seed 5"),
        f4_ref("mxfp4-online", "--n 4 --k 64 --dtype f32 --seed 6"),
    };
    static const char *const pfx[3] = {"l.0.q_proj", "l.0.down_proj", "l.1.up_proj"};
    /* a ragged K needs the unsharded K declared (formats-4bit.md) */
    static const char *const ser[3] = {"in_features: 70", "in_features: 33", NULL};
    char in[4200], out[4200], w[3][64], v[3][64], s[3][64];
    st_out_tensor t[3];
    for (int i = 0; i < 3; i++) {
        snprintf(w[i], sizeof w[i], "%s.weight", pfx[i]);
        snprintf(v[i], sizeof v[i], "%s.weight_packed", pfx[i]);
        snprintf(s[i], sizeof s[i], "%s.weight_scale", pfx[i]);
        t[i] = cv_from(w[i], f4_get(ref[i], "W.weight"));
    }
    cv_write(cv_join(in, sizeof in, *state, "in.safetensors"), t, 3, NULL, 0);
    cv_convert_ok("mxfp4", NULL, in, cv_join(out, sizeof out, *state, "out.safetensors"));
    st_set *orig = cv_open(in), *conv = cv_open(out);
    assert_int_equal(st_count(conv), 6);
    cv_pair p[3];
    for (int i = 0; i < 3; i++) {
        assert_null(st_find(conv, w[i])); /* renamed: W.weight_packed */
        cv_assert_same(f4_get(ref[i], "expect.packed"), cv_get(conv, v[i]));
        cv_assert_same(f4_get(ref[i], "expect.scale"), cv_get(conv, s[i]));
        p[i] = (cv_pair){w[i], v[i], s[i], ser[i], NULL};
    }
    cv_same_kernels(&refit_format_plugin_v2, conv, orig, p, 3);
    st_close(conv);
    st_close(orig);
    for (int i = 0; i < 3; i++)
        st_close(ref[i]);
}

int main(void)
{
    pyref_skip_without_venv();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(mxfp4_same_kernels, cv_setup, cv_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
