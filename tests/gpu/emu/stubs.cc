/* What the emulated test links in place of the CUDA backend: one device,
 * and the backend's encoder choice made as the backend makes it. */
#include <stdint.h>
#include <stdio.h>

static char err[256];
extern "C" const char *kern_cuda_last_error(void) { return err; }
extern "C" void kern_cuda_set_error(const char *m) { snprintf(err, sizeof err, "%s", m); }
extern "C" int backend_cuda_device_count(void) { return 1; }
extern "C" const char *backend_cuda_unavailable(void) { return ""; }
extern "C" int kern_fp8_cvt_check_cuda(uint64_t *mismatches, uint32_t *first, void *stream);
extern "C" int backend_cuda_fp8_encoder(int dev, uint64_t *mismatches, void *stream)
{
    uint64_t bad = 0;
    uint32_t first = 0;
    (void)dev;
    if (kern_fp8_cvt_check_cuda(&bad, &first, stream))
        return -1;
    if (mismatches)
        *mismatches = bad;
    return bad == 0;
}
