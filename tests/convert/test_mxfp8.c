/* refitctl convert --format mxfp8 from BF16, F16 and F32 weights (ragged
 * 32-blocks included): the converted file equals quant_ref.py's numpy/
 * ml_dtypes MX quantization bit for bit, and the mxfp8 plugin loads it
 * (serialized, DIRECT) into exactly the bytes its online path (STAGED,
 * post-load) makes from the original checkpoint. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/convert/cvutil.h"
#include "tests/formats/common/qutil.h"
#include "tests/common/pyref.h"

extern const refit_format_v2 refit_format_plugin_v2;

static void mxfp8_same_kernels(void **state)
{
    st_set *ref[3] = {
        q_ref("quant_ref.py", "--n 40 --k 330 --specials --seed 4 --prefix a"),
        q_ref("quant_ref.py", "--n 17 --k 200 --dtype f16 --seed 5 --prefix b"),
        q_ref("quant_ref.py", "--n 64 --k 96 --dtype f32 --specials --seed 6 --prefix c"),
    };
    static const char *const id[3] = {"a", "b", "c"};
    static const char *const w[3] = {"m.layers.0.self_attn.qkv_proj.weight",
                                     "m.layers.0.mlp.gate_up_proj.weight",
                                     "m.layers.0.mlp.down_proj.weight"};
    static const char *const s[3] = {"m.layers.0.self_attn.qkv_proj.weight_scale_inv",
                                     "m.layers.0.mlp.gate_up_proj.weight_scale_inv",
                                     "m.layers.0.mlp.down_proj.weight_scale_inv"};
    /* a ragged K needs the unsharded K declared (formats-fp8.md) */
    static const char *const ser[3] = {"in_features: 330", "in_features: 200", NULL};
    char in[4200], out[4200], name[96];
    st_out_tensor t[3];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s.x", id[i]);
        t[i] = cv_from(w[i], q_get(ref[i], name));
    }
    cv_write(cv_join(in, sizeof in, *state, "in.safetensors"), t, 3, NULL, 0);
    cv_convert_ok("mxfp8", NULL, in, cv_join(out, sizeof out, *state, "out.safetensors"));
    st_set *orig = cv_open(in), *conv = cv_open(out);
    assert_int_equal(st_count(conv), 6);
    cv_pair p[3];
    for (int i = 0; i < 3; i++) {
        const st_tensor *cq = cv_get(conv, w[i]), *cs = cv_get(conv, s[i]);
        assert_int_equal(cq->dtype, ST_F8_E4M3);
        assert_int_equal(cs->dtype, ST_U8);
        snprintf(name, sizeof name, "%s.mxfp8.q", id[i]);
        const st_tensor *rq = q_get(ref[i], name);
        assert_int_equal(rq->nbytes, cq->nbytes);
        q_assert_bytes(rq->data, cq->data, (size_t)rq->nbytes, w[i]);
        snprintf(name, sizeof name, "%s.mxfp8.s", id[i]);
        cv_assert_same(q_get(ref[i], name), cs);
        p[i] = (cv_pair){w[i], w[i], s[i], ser[i], NULL};
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
        cmocka_unit_test_setup_teardown(mxfp8_same_kernels, cv_setup, cv_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
