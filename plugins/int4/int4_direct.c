/* kern_quant_int4_cuda (int4_direct.h): the plugin's launcher and
 * embedded device code over the CUDA runtime (sdk/pgpu_cudart.h).
 * Test-only. */
#include <stdio.h>

#include "sdk/pgpu_cudart.h"
#include "plugins/int4/int4_direct.h"
#include "plugins/int4/int4_launch.h"

extern const unsigned char int4_image[];

int kern_quant_int4_cuda(uint32_t n, const refit_view *q, const refit_view *scale,
                         const refit_view *x, int64_t group, int32_t *bad, void *stream)
{
    static const char fn[] = "kern_quant_int4_cuda";
    *bad = -1;
    if (group < 0 || n > 0x7fffffffu) {
        kern_cuda_set_error("kern_quant_int4_cuda: group must be >= 0, pieces < 2^31");
        return REFIT_EINVAL;
    }
    if (n == 0)
        return REFIT_OK;
    pgpu_cudart p;
    int rc = pgpu_cudart_begin(&p, fn, int4_image, stream);
    if (rc)
        return rc;
    rc = int4_launch(&p.g, n, q, scale, x, group, bad);
    uint32_t word;
    rc = pgpu_cudart_end(&p, fn, rc, 1, &word);
    if (!rc && word != REFIT_STATUS_NONE) {
        *bad = (int32_t)word;
        char m[160];
        snprintf(m, sizeof m, "%s: piece %u: NaN or infinity in the weight, or a scale past "
                 "the scale dtype's range", fn, word);
        kern_cuda_set_error(m);
        rc = REFIT_ECORRUPT;
    }
    return rc;
}
