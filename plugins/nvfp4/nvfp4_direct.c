/* kern_quant_nvfp4_cuda (nvfp4_direct.h) for the GPU suites and
 * refit-bench: the plugin's launcher and embedded device code over the
 * CUDA runtime (sdk/pgpu_cudart.h). Test-only. */
#include <stdio.h>

#include "sdk/pgpu_cudart.h"
#include "plugins/nvfp4/nvfp4_direct.h"
#include "plugins/nvfp4/nvfp4_launch.h"

extern const unsigned char nvfp4_image[];

static int64_t set_bytes; /* 0: the launcher's default */

void kern_quant_nvfp4_set_bytes(int64_t bytes)
{
    set_bytes = bytes > 0 ? bytes : 0;
}

int kern_quant_nvfp4_cuda(uint32_t n, const refit_nvfp4_piece *pieces, int32_t *bad,
                          void *stream)
{
    static const char fn[] = "kern_quant_nvfp4_cuda";
    *bad = -1;
    if (n == 0)
        return REFIT_OK;
    pgpu_cudart p;
    int rc = pgpu_cudart_begin(&p, fn, nvfp4_image, stream);
    if (rc)
        return rc;
    int online = 0;
    for (uint32_t i = 0; pieces && i < n; i++)
        online |= pieces[i].mode == REFIT_NVFP4_ONLINE;
    rc = nvfp4_launch(&p.g, n, pieces, set_bytes, bad);
    uint32_t word;
    /* checkpoint pieces alone: nothing to report, no wait */
    rc = pgpu_cudart_end(&p, fn, rc, online, &word);
    if (!rc && word != REFIT_STATUS_NONE) {
        *bad = (int32_t)word;
        char m[128];
        snprintf(m, sizeof m, "%s: piece %u: NaN or infinity in the weight", fn, word);
        kern_cuda_set_error(m);
        rc = REFIT_ECORRUPT;
    }
    return rc;
}
