/* The device code of the example format: out = 2 * in over n contiguous
 * floats; a NaN or infinity lowers *status to piece (atomicMin), the
 * host's status word, read once at finalize. extern "C" so the plugin
 * finds it by name (host->gpu_kernel). The SDK's headers serve device
 * code too (meson.build passes nvcc their -I): minifloat.h's E4M3, E8M0,
 * BF16 ... conversions are what a quantizing format's kernels round with. */
#include <refit/sdk/minifloat.h>

extern "C" __global__ void scale2_f32(float *out, const float *in, long long n,
                                      unsigned int piece, unsigned int *status)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = in[i];
        if (!isfinite(v)) {
            atomicMin(status, piece);
            return;
        }
        out[i] = 2.0f * v;
    }
}
