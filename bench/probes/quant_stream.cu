/*
 * quant_stream: what a quantization pass can cost on this GPU when it does
 * nothing but the work itself, to tell the gap of `refit-bench gpu --only
 * quant` that is our kernels' from the one that is the machine's.
 * Standalone (nvcc, static runtime):
 *
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 \
 *        bench/probes/quant_stream.cu -o quant_stream
 *   ./quant_stream [MiB of BF16 input, default 1848 (the bench model)]
 *
 * Prints one JSON object. Every figure is "min bytes / time" against the
 * bytes read plus written per second of one cudaMemcpy D2D of the input,
 * the same ratio as the bench's ratio_to_d2d. The kernels are not refit's
 * and not bit-exact with anything: one flat contiguous BF16 array, no
 * pieces, no strides, no NaN policy.
 *   read_max_u<U>    max of the magnitude bits, U 16-byte loads a lane in
 *                    flight (read only: min bytes = the input)
 *   mx_u<U>          MXFP8-shaped: amax of 32 elements over 4 lanes (two
 *                    shuffles), a power-of-two scale, E4M3 by the
 *                    conversion instruction, U 512-byte warp segments in
 *                    flight; writes 1 byte an element + 1 a block
 *   tensor_2pass     per-tensor FP8: read_max_u4, then an encode pass that
 *                    reads the input again (min bytes: 3 an element)
 */
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                            \
    do {                                                                                 \
        cudaError_t e_ = (x);                                                            \
        if (e_ != cudaSuccess) {                                                         \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                     \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static __device__ __forceinline__ uint32_t amax8(uint4 v)
{
    uint32_t a = __vmaxu2(v.x & 0x7fff7fffu, v.y & 0x7fff7fffu);
    uint32_t b = __vmaxu2(v.z & 0x7fff7fffu, v.w & 0x7fff7fffu);
    return __vmaxu2(a, b);
}

template <int U> __global__ void __launch_bounds__(256) k_read_max(const uint4 *x, size_t n16,
                                                                   unsigned *out)
{
    size_t stride = (size_t)gridDim.x * blockDim.x * U;
    uint32_t m = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x * U + threadIdx.x; i < n16; i += stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            v[u] = i + (size_t)u * blockDim.x < n16 ? x[i + (size_t)u * blockDim.x] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; u++)
            m = __vmaxu2(m, amax8(v[u]));
    }
    m = max(m & 0xffffu, m >> 16);
    for (int o = 16; o; o >>= 1)
        m = max(m, __shfl_xor_sync(~0u, m, o));
    if ((threadIdx.x & 31) == 0)
        atomicMax(out, m);
}

static __device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
static __device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

static __device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d)
{
    __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return (uint32_t)lo | ((uint32_t)hi << 16);
}

static __device__ __forceinline__ uint2 enc8(uint4 v, float r)
{
    return make_uint2(e4m3x4(bf_lo(v.x) * r, bf_hi(v.x) * r, bf_lo(v.y) * r, bf_hi(v.y) * r),
                      e4m3x4(bf_lo(v.z) * r, bf_hi(v.z) * r, bf_lo(v.w) * r, bf_hi(v.w) * r));
}

/* A warp segment: 32 lanes x 16 bytes = 256 elements = 8 blocks of 32. */
template <int U> __global__ void __launch_bounds__(256) k_mx(const uint4 *x, size_t nseg, uint2 *q,
                                                             uint8_t *s)
{
    unsigned lane = threadIdx.x & 31;
    size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    size_t nw = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t g = w * U; g < nseg; g += nw * U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            v[u] = g + u < nseg ? x[(g + u) * 32 + lane] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (g + u >= nseg)
                break;
            uint32_t m = amax8(v[u]);
            m = max(m & 0xffffu, m >> 16);
            m = max(m, __shfl_xor_sync(~0u, m, 1));
            m = max(m, __shfl_xor_sync(~0u, m, 2));
            int e = (int)(m >> 7) - 127 - 8; /* floor(log2 amax) - emax(E4M3) */
            e = e < -127 ? -127 : e;
            float r = __uint_as_float((uint32_t)(127 - e) << 23);
            q[(g + u) * 32 + lane] = enc8(v[u], r);
            if ((lane & 3) == 0)
                s[(g + u) * 8 + lane / 4] = (uint8_t)(e + 127);
        }
    }
}

__global__ void __launch_bounds__(256) k_tensor_encode(const uint4 *x, size_t n16, uint2 *q,
                                                       const unsigned *amax)
{
    float r = 448.0f / bf_lo(*amax);
    size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    for (size_t i = (size_t)blockIdx.x * blockDim.x * 4 + threadIdx.x; i < n16; i += stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            v[u] = i + (size_t)u * blockDim.x < n16 ? x[i + (size_t)u * blockDim.x] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (i + (size_t)u * blockDim.x < n16)
                q[i + (size_t)u * blockDim.x] = enc8(v[u], r);
    }
}

static cudaEvent_t e0, e1;

static float elapsed(void)
{
    float ms;
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms;
}

#define TIME(ms_out, launch)                                                             \
    do {                                                                                 \
        float best_ = 1e30f;                                                             \
        for (int r_ = 0; r_ < 6; r_++) {                                                 \
            CK(cudaEventRecord(e0));                                                     \
            launch;                                                                      \
            CK(cudaEventRecord(e1));                                                     \
            float t_ = elapsed();                                                        \
            if (r_ && t_ < best_)                                                        \
                best_ = t_;                                                              \
        }                                                                                \
        CK(cudaGetLastError());                                                          \
        ms_out = best_;                                                                  \
    } while (0)

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 1848;
    size_t n = mib << 19; /* BF16 elements */
    n &= ~(size_t)255;
    size_t bytes = n * 2, n16 = bytes / 16, nseg = n / 256;
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    char *x, *y;
    unsigned *m;
    CK(cudaMalloc(&x, bytes));
    CK(cudaMalloc(&y, bytes + n / 32));
    CK(cudaMalloc(&m, 4));
    CK(cudaMemset(x, 0x3c, bytes));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float t_copy;
    TIME(t_copy, CK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice)));
    double copy_Bps = 2.0 * bytes / (t_copy * 1e-3);
    printf("{\n  \"bf16_bytes\": %zu,\n  \"memcpy_d2d_ms\": %.4f,\n  \"copy_GBps\": %.1f", bytes,
           t_copy, copy_Bps / 1e9);
#define RATIO(minb, ms) ((double)(minb) / ((ms) * 1e-3) / copy_Bps)
    float t;
    int grids[] = {sms * 4, sms * 8, sms * 16};
    for (int gi = 0; gi < 3; gi++) {
        int gr = grids[gi];
        TIME(t, (k_read_max<2><<<gr, 256>>>((const uint4 *)x, n16, m)));
        printf(",\n  \"read_max_u2_g%d\": %.3f", gr / sms, RATIO(bytes, t));
        TIME(t, (k_read_max<4><<<gr, 256>>>((const uint4 *)x, n16, m)));
        printf(",\n  \"read_max_u4_g%d\": %.3f", gr / sms, RATIO(bytes, t));
        TIME(t, (k_read_max<8><<<gr, 256>>>((const uint4 *)x, n16, m)));
        printf(",\n  \"read_max_u8_g%d\": %.3f", gr / sms, RATIO(bytes, t));
        uint2 *q = (uint2 *)y;
        uint8_t *s = (uint8_t *)y + n;
        size_t minb = bytes + n + n / 32;
        TIME(t, (k_mx<1><<<gr, 256>>>((const uint4 *)x, nseg, q, s)));
        printf(",\n  \"mx_u1_g%d\": %.3f", gr / sms, RATIO(minb, t));
        TIME(t, (k_mx<2><<<gr, 256>>>((const uint4 *)x, nseg, q, s)));
        printf(",\n  \"mx_u2_g%d\": %.3f", gr / sms, RATIO(minb, t));
        TIME(t, (k_mx<4><<<gr, 256>>>((const uint4 *)x, nseg, q, s)));
        printf(",\n  \"mx_u4_g%d\": %.3f", gr / sms, RATIO(minb, t));
        TIME(t, (k_mx<8><<<gr, 256>>>((const uint4 *)x, nseg, q, s)));
        printf(",\n  \"mx_u8_g%d\": %.3f", gr / sms, RATIO(minb, t));
        TIME(t, (cudaMemsetAsync(m, 0, 4), k_read_max<4><<<gr, 256>>>((const uint4 *)x, n16, m),
                 k_tensor_encode<<<gr, 256>>>((const uint4 *)x, n16, q, m)));
        printf(",\n  \"tensor_2pass_g%d\": %.3f", gr / sms, RATIO(bytes + n, t));
    }
    printf("\n}\n");
    return 0;
}
