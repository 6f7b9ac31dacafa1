/* refitctl convert --format int8 (W8A8, compressed-tensors naming), both
 * schemes, from BF16, F16 and F32 weights: the converted file equals
 * quant_ref.py's numpy quantization (compressed-tensors' symmetric rule)
 * bit for bit, and the int8 plugin loads it into exactly those bytes. The
 * plugin has no online path to compare with (docs/convert.md): here the
 * numpy reference is what the kernel is checked against. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/convert/cvutil.h"
#include "tests/formats/common/qutil.h"
#include "tests/common/pyref.h"

extern const refit_format_v2 refit_format_plugin_v2;

static const char *const schemes[2] = {"per_tensor", "per_channel"};

static void int8_scheme(const char *dir, int sch)
{
    st_set *ref[3] = {
        q_ref("quant_ref.py", "--n 70 --k 90 --specials --seed 7 --prefix a"),
        q_ref("quant_ref.py", "--n 33 --k 64 --dtype f16 --seed 8 --prefix b"),
        q_ref("quant_ref.py", "--n 8 --k 5 --dtype f32 --specials --seed 9 --prefix c"),
    };
    static const char *const id[3] = {"a", "b", "c"};
    static const char *const w[3] = {"layers.0.q_proj.weight", "layers.0.up_proj.weight",
                                     "layers.1.o_proj.weight"};
    static const char *const s[3] = {"layers.0.q_proj.weight_scale",
                                     "layers.0.up_proj.weight_scale",
                                     "layers.1.o_proj.weight_scale"};
    char in[4200], out[4200], param[64], name[96];
    st_out_tensor t[3];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s.x", id[i]);
        t[i] = cv_from(w[i], q_get(ref[i], name));
    }
    cv_write(cv_join(in, sizeof in, dir, "in.safetensors"), t, 3, NULL, 0);
    snprintf(param, sizeof param, "scheme=%s", schemes[sch]);
    cv_convert_ok("int8", param, in, cv_join(out, sizeof out, dir, "out.safetensors"));
    st_set *conv = cv_open(out);
    cv_pair p[3];
    for (int i = 0; i < 3; i++) {
        const st_tensor *cq = cv_get(conv, w[i]), *cs = cv_get(conv, s[i]);
        snprintf(name, sizeof name, "%s.int8.%s.q", id[i], schemes[sch]);
        cv_assert_same(q_get(ref[i], name), cq);
        snprintf(name, sizeof name, "%s.int8.%s.s", id[i], schemes[sch]);
        const st_tensor *rs = q_get(ref[i], name);
        assert_int_equal(cs->dtype, ST_F32);
        assert_int_equal(cs->ndim, sch ? 2 : 1); /* [N, 1] or [1] */
        assert_int_equal(rs->nbytes, cs->nbytes);
        q_assert_bytes(rs->data, cs->data, (size_t)rs->nbytes, s[i]);
        p[i] = (cv_pair){w[i], w[i], s[i], sch ? "scheme: per_channel" : "scheme: per_tensor",
                         NULL};
    }
    cv_same_kernels(&refit_format_plugin_v2, conv, NULL, p, 3);
    st_close(conv);
    for (int i = 0; i < 3; i++)
        st_close(ref[i]);
}

static void int8_per_tensor(void **state)
{
    int8_scheme(*state, 0);
}

static void int8_per_channel(void **state)
{
    int8_scheme(*state, 1);
}

/* per_channel is the default, llm-compressor's W8A8 */
static void int8_default(void **state)
{
    char in[4200], out[4200];
    st_set *ref = q_ref("quant_ref.py", "--n 4 --k 40 --seed 3 --prefix a");
    st_out_tensor t = cv_from("l.weight", q_get(ref, "a.x"));
    cv_write(cv_join(in, sizeof in, *state, "in.safetensors"), &t, 1, NULL, 0);
    cv_convert_ok("int8", NULL, in, cv_join(out, sizeof out, *state, "out.safetensors"));
    st_set *conv = cv_open(out);
    cv_assert_same(q_get(ref, "a.int8.per_channel.q"), cv_get(conv, "l.weight"));
    assert_int_equal(cv_get(conv, "l.weight_scale")->shape[0], 4);
    assert_string_equal(st_metadata_get(conv, 0, "quantization_params"),
                        "scheme=per_channel;skip=embed,lm_head,norm,.gate.weight");
    st_close(conv);
    st_close(ref);
}

int main(void)
{
    pyref_skip_without_venv();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(int8_per_tensor, cv_setup, cv_teardown),
        cmocka_unit_test_setup_teardown(int8_per_channel, cv_setup, cv_teardown),
        cmocka_unit_test_setup_teardown(int8_default, cv_setup, cv_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
