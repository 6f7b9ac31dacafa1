/* kern_quant_mx_cuda (mx_direct.h): the launcher and embedded device code
 * over the CUDA runtime (sdk/pgpu_cudart.h). Test-only. */
#include <stdio.h>

#include "sdk/pgpu_cudart.h"
#include "plugins/mxfp8/mx_direct.h"
#include "plugins/mxfp8/mx_launch.h"

extern const unsigned char mx_image[];

int kern_quant_mx_cuda(uint32_t n, const refit_view *q, const refit_view *scales,
                       const refit_view *x, int elem_bits, int hw, int32_t *bad, void *stream)
{
    static const char fn[] = "kern_quant_mx_cuda";
    *bad = -1;
    if ((elem_bits != 8 && elem_bits != 4) || n > 0x7fffffffu) {
        kern_cuda_set_error("kern_quant_mx_cuda: elem_bits must be 8 (MXFP8) or 4 (MXFP4), "
                            "pieces < 2^31");
        return REFIT_EINVAL;
    }
    if (n == 0)
        return REFIT_OK;
    pgpu_cudart p;
    int rc = pgpu_cudart_begin(&p, fn, mx_image, stream);
    if (rc)
        return rc;
    rc = mx_launch(&p.g, n, q, scales, x, elem_bits, hw, bad);
    uint32_t word;
    rc = pgpu_cudart_end(&p, fn, rc, 1, &word);
    if (!rc && word != REFIT_STATUS_NONE) {
        *bad = (int32_t)word;
        char m[128];
        snprintf(m, sizeof m, "%s: piece %u: NaN or infinity in the weight", fn, word);
        kern_cuda_set_error(m);
        rc = REFIT_ECORRUPT;
    }
    return rc;
}
