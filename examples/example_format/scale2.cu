/* The device code of the example format: out = 2 * in over n contiguous
 * floats; a NaN or infinity lowers *status_at to (piece, element) (or,
 * from a host without status_word_at, *status to piece), atomicMin: the
 * host's status word, read once at finalize. extern "C" so the plugin
 * finds it by name (host->gpu_kernel). refit's headers serve device code
 * too (meson.build passes nvcc their -I): refit/format.h here, and
 * refit/sdk/minifloat.h's E4M3, E8M0, BF16 ... conversions for a
 * quantizing format's kernels. */
#include <refit/format.h>

extern "C" __global__ void scale2_f32(float *out, const float *in, long long n,
                                      unsigned int piece, unsigned int *status,
                                      unsigned long long *status_at)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = in[i];
        if (!isfinite(v)) {
            /* the host's key names the element too; an older host's word
             * only the piece */
            if (status_at)
                atomicMin(status_at, REFIT_STATUS_AT(piece, i));
            else
                atomicMin(status, piece);
            return;
        }
        out[i] = 2.0f * v;
    }
}
