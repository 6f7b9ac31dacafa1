/* The integration suites' shared worker (three_modules.h). */
#include <stdio.h>

#include "tests/integration/three_modules.h"

const char *three_modules_name(int i)
{
    static const char *names[N_MOD] = {"model.a.weight", "model.b.weight", "model.c.weight"};
    return names[i];
}

int three_modules_add(refit_model *model, float rt[N_MOD][ROWS * COLS], int64_t shape[2],
                      refit_tensor desc[N_MOD])
{
    shape[0] = ROWS;
    shape[1] = COLS;
    for (int i = 0; i < N_MOD; i++) {
        char mod[16];
        snprintf(mod, sizeof mod, "m%d", i);
        desc[i] = (refit_tensor){.data = rt[i], .device = {REFIT_DEVICE_CPU, 0}, .ndim = 2,
                                 .dtype = REFIT_F32, .shape = shape};
        refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
        s.dtype = REFIT_F32;
        s.ndim = 2;
        s.shape[0] = ROWS;
        s.shape[1] = COLS;
        int rc;
        if ((rc = refit_model_add_module(model, mod, "unquantized", NULL)) ||
            (rc = refit_module_bind_runtime(model, mod, "w", &desc[i])) ||
            (rc = refit_model_expect(model, mod, three_modules_name(i), &s)))
            return rc;
    }
    return REFIT_OK;
}
