/*
 * copy_paths: where the time of a reload goes on one GPU, measured without
 * refit's bookkeeping, to tell a gap in `refit-bench gpu` that is refit's
 * from one that is the machine's. Standalone (nvcc, static runtime):
 *
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I. -Iinclude \
 *        bench/probes/copy_paths.cu kernels/copy.cu -o copy_paths -lpthread
 *   ./copy_paths [DIR]          (DIR: where to write a 2.2 GB scratch file)
 *
 * Prints one JSON object. Device-to-device, for the 201 tensors of the
 * TinyLlama-1.1B-shaped model refit-bench uses (2.2 GB BF16):
 *   memcpy_one        one cudaMemcpyAsync of the whole arena (the ceiling)
 *   memcpy_each       one cudaMemcpyAsync per tensor
 *   memcpy_batch      one cudaMemcpyBatchAsync of all tensors
 *   refit_batch_<kb>  refit's batch kernel (kernels/copy.cu), rows of <kb> KB,
 *                     table in device memory, one launch
 *   flat_<grid>       a plain grid-stride 16-byte copy of the whole arena
 * Host side, from a page-cached file (mmap) of the same bytes:
 *   h2d_pinned        one pinned cudaMemcpy (the H2D ceiling)
 *   host_copy_<t>     t threads memcpy the mapping into pinned memory, no DMA
 *   host_copy_dma     8 threads copying while the copy engine reads another
 *                     pinned buffer: both rates
 *   register_<mb>     cudaHostRegister(read-only) of the mapping in <mb> MB
 *                     pieces, then H2D straight from it, then unregister
 */
#include <cuda_runtime.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

extern "C" int kern_copy_batch_cuda(const void *rows, uint32_t n, void *stream);

struct row { uint64_t src, dst, bytes; };

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define REPS 9
static double med(double *v) { qsort(v, REPS, sizeof *v, cmpd); return v[REPS / 2]; }

static size_t sizes[256];
static int ntensors;

static void shapes(void)
{
    const size_t h = 2048, inter = 5632, vocab = 32000, kv = 256;
    int n = 0;
    sizes[n++] = vocab * h * 2;
    for (int l = 0; l < 22; l++) {
        sizes[n++] = h * h * 2;
        sizes[n++] = kv * h * 2;
        sizes[n++] = kv * h * 2;
        sizes[n++] = h * h * 2;
        sizes[n++] = inter * h * 2;
        sizes[n++] = inter * h * 2;
        sizes[n++] = h * inter * 2;
        sizes[n++] = h * 2;
        sizes[n++] = h * 2;
    }
    sizes[n++] = h * 2;
    sizes[n++] = vocab * h * 2;
    ntensors = n;
}

static size_t offs[256], total;

__global__ void k_flat(uint4 *d, const uint4 *s, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = s[i], b = s[i + stride], c = s[i + 2 * stride], e = s[i + 3 * stride];
        d[i] = a; d[i + stride] = b; d[i + 2 * stride] = c; d[i + 3 * stride] = e;
    }
    for (; i < n; i += stride)
        d[i] = s[i];
}

typedef void (*op_fn)(void *);

static double time_gpu(op_fn f, void *arg)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    double v[REPS];
    f(arg); /* warm */
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < REPS; r++) {
        double t0 = now();
        f(arg);
        CK(cudaStreamSynchronize(0));
        v[r] = now() - t0;
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return med(v);
}

static char *dsrc, *ddst;
static row *drows;
static uint32_t nrows;
static int flat_grid;
static void *const *bdst;
static const void *const *bsrc;

static void op_memcpy_one(void *) { CK(cudaMemcpyAsync(ddst, dsrc, total, cudaMemcpyDeviceToDevice, 0)); }
static void op_memcpy_each(void *)
{
    for (int i = 0; i < ntensors; i++)
        CK(cudaMemcpyAsync(ddst + offs[i], dsrc + offs[i], sizes[i], cudaMemcpyDeviceToDevice, 0));
}
static cudaStream_t bstream;
static void op_memcpy_batch(void *)
{
    cudaMemcpyAttributes at;
    memset(&at, 0, sizeof at);
    at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t idx = 0;
    CK(cudaMemcpyBatchAsync((void **)bdst, (const void **)bsrc, sizes, (size_t)ntensors, &at, &idx, 1,
                            bstream));
    CK(cudaStreamSynchronize(bstream));
}
static void op_refit(void *)
{
    if (kern_copy_batch_cuda(drows, nrows, 0)) { fprintf(stderr, "batch failed\n"); exit(1); }
}
static void op_flat(void *) { k_flat<<<flat_grid, 512>>>((uint4 *)ddst, (const uint4 *)dsrc, total / 16); }


/* ---- Hopper bulk copies (TMA): one thread of a block moves a row through
 * shared memory in STAGE-byte pieces, NST pieces in flight ---- */
template <int STAGE, int NST>
__global__ void __launch_bounds__(32) k_tma(const row *rows, uint32_t n)
{
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ __align__(8) uint64_t bar[NST];
    if (threadIdx.x != 0)
        return;
    for (int k = 0; k < NST; k++) {
        unsigned a = (unsigned)__cvta_generic_to_shared(&bar[k]);
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(a));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    unsigned phase[NST];
    for (int k = 0; k < NST; k++)
        phase[k] = 0;
    unsigned long long issued = 0;
    for (uint32_t r = blockIdx.x; r < n; r += gridDim.x) {
        row x = rows[r];
        uint64_t pieces = (x.bytes + STAGE - 1) / STAGE;
        for (uint64_t p = 0; p < pieces; p += NST) {
            int m = pieces - p < NST ? (int)(pieces - p) : NST;
            /* stages are free once earlier stores have read them */
            asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            for (int k = 0; k < m; k++) {
                uint64_t off = (p + k) * STAGE;
                unsigned len = (unsigned)(x.bytes - off < STAGE ? x.bytes - off : STAGE);
                unsigned b = (unsigned)__cvta_generic_to_shared(&bar[k]);
                unsigned d = (unsigned)__cvta_generic_to_shared(sm + k * STAGE);
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(len) : "memory");
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                             :: "r"(d), "l"(x.src + off), "r"(len), "r"(b) : "memory");
            }
            for (int k = 0; k < m; k++) {
                uint64_t off = (p + k) * STAGE;
                unsigned len = (unsigned)(x.bytes - off < STAGE ? x.bytes - off : STAGE);
                unsigned b = (unsigned)__cvta_generic_to_shared(&bar[k]);
                unsigned ok = 0;
                while (!ok)
                    asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                                 : "=r"(ok) : "r"(b), "r"(phase[k]) : "memory");
                phase[k] ^= 1;
                unsigned sp = (unsigned)__cvta_generic_to_shared(sm + k * STAGE);
                asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                             :: "l"(x.dst + off), "r"(sp), "r"(len) : "memory");
            }
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            issued++;
        }
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    (void)issued;
}

static int tma_variant;
static void op_tma(void *)
{
    int sms = 132;
    switch (tma_variant) {
    case 0: k_tma<16384, 4><<<sms * 3, 32, 16384 * 4>>>(drows, nrows); break;
    case 1: k_tma<32768, 2><<<sms * 3, 32, 32768 * 2>>>(drows, nrows); break;
    case 2: k_tma<8192, 8><<<sms * 3, 32, 8192 * 8>>>(drows, nrows); break;
    default: k_tma<16384, 2><<<sms * 6, 32, 16384 * 2>>>(drows, nrows); break;
    }
}

static uint32_t make_rows(size_t row_max, row **host_out)
{
    uint32_t n = 0;
    for (int i = 0; i < ntensors; i++)
        n += (uint32_t)((sizes[i] + row_max - 1) / row_max);
    row *r = (row *)malloc(n * sizeof *r);
    n = 0;
    for (int i = 0; i < ntensors; i++)
        for (size_t o = 0; o < sizes[i]; o += row_max) {
            size_t b = sizes[i] - o < row_max ? sizes[i] - o : row_max;
            r[n].src = (uint64_t)(dsrc + offs[i] + o);
            r[n].dst = (uint64_t)(ddst + offs[i] + o);
            r[n].bytes = b;
            n++;
        }
    *host_out = r;
    return n;
}

/* ---- host side ---- */

struct cpjob { char *dst; const char *src; size_t n; };
static void *cp_thread(void *p)
{
    cpjob *j = (cpjob *)p;
    memcpy(j->dst, j->src, j->n);
    return NULL;
}

static double host_copy(char *dst, const char *src, size_t n, int threads)
{
    pthread_t th[32];
    cpjob jb[32];
    size_t per = (n / threads + 4095) & ~(size_t)4095;
    double t0 = now();
    for (int t = 0; t < threads; t++) {
        size_t o = per * t;
        jb[t].dst = dst + o;
        jb[t].src = src + o;
        jb[t].n = o >= n ? 0 : (n - o < per ? n - o : per);
        pthread_create(&th[t], NULL, cp_thread, &jb[t]);
    }
    for (int t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    return now() - t0;
}


/* register -> DMA -> unregister, pipelined: `threads` workers register pieces in
 * order of an atomic counter; the main thread issues each piece's H2D as soon as
 * it is registered; the same workers unregister a piece once its event passed. */
struct pipe_state {
    char *map, *dev;
    size_t total, piece;
    int npieces;
    volatile int next_reg, next_unreg;
    volatile int *ready;   /* 1 registered, -1 failed */
    volatile int *issued;  /* event recorded */
    cudaEvent_t *ev;
    pthread_mutex_t mu;
};

static void *pipe_worker(void *p)
{
    pipe_state *s = (pipe_state *)p;
    for (;;) {
        int i = __sync_fetch_and_add(&s->next_reg, 1);
        if (i >= s->npieces)
            break;
        size_t o = (size_t)i * s->piece, n = s->total - o < s->piece ? s->total - o : s->piece;
        cudaError_t e = cudaHostRegister(s->map + o, n, cudaHostRegisterReadOnly);
        __sync_synchronize();
        s->ready[i] = e == cudaSuccess ? 1 : -1;
    }
    for (;;) {
        int i = __sync_fetch_and_add(&s->next_unreg, 1);
        if (i >= s->npieces)
            break;
        while (!s->issued[i])
            ;
        cudaEventSynchronize(s->ev[i]);
        if (s->ready[i] == 1)
            cudaHostUnregister(s->map + (size_t)i * s->piece);
    }
    return NULL;
}

static double pipeline(char *map, char *dev, size_t total, size_t piece, int threads, int *ok)
{
    pipe_state s;
    memset(&s, 0, sizeof s);
    s.map = map; s.dev = dev; s.total = total; s.piece = piece;
    s.npieces = (int)((total + piece - 1) / piece);
    s.ready = (volatile int *)calloc(s.npieces, sizeof(int));
    s.issued = (volatile int *)calloc(s.npieces, sizeof(int));
    s.ev = (cudaEvent_t *)calloc(s.npieces, sizeof(cudaEvent_t));
    for (int i = 0; i < s.npieces; i++)
        CK(cudaEventCreateWithFlags(&s.ev[i], cudaEventDisableTiming | cudaEventBlockingSync));
    pthread_t th[32];
    double t0 = now();
    for (int t = 0; t < threads; t++)
        pthread_create(&th[t], NULL, pipe_worker, &s);
    *ok = 1;
    for (int i = 0; i < s.npieces; i++) {
        while (!s.ready[i])
            ;
        size_t o = (size_t)i * piece, n = total - o < piece ? total - o : piece;
        if (s.ready[i] == 1)
            CK(cudaMemcpyAsync(dev + o, map + o, n, cudaMemcpyHostToDevice, 0));
        else
            *ok = 0;
        CK(cudaEventRecord(s.ev[i], 0));
        __sync_synchronize();
        s.issued[i] = 1;
    }
    CK(cudaStreamSynchronize(0));
    double t_dma = now() - t0;
    for (int t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    double t_all = now() - t0;
    for (int i = 0; i < s.npieces; i++)
        cudaEventDestroy(s.ev[i]);
    free((void *)s.ready);
    free((void *)s.issued);
    free(s.ev);
    (void)t_dma;
    return t_all;
}


struct prjob { int fd; char *dst; size_t off, n; };
static void *pr_thread(void *p)
{
    prjob *j = (prjob *)p;
    size_t done = 0;
    while (done < j->n) {
        ssize_t r = pread(j->fd, j->dst + done, j->n - done, (off_t)(j->off + done));
        if (r <= 0)
            break;
        done += (size_t)r;
    }
    return NULL;
}

static double pread_copy(int fd, char *dst, size_t n, int threads)
{
    pthread_t th[32];
    prjob jb[32];
    size_t per = (n / threads + 4095) & ~(size_t)4095;
    double t0 = now();
    for (int t = 0; t < threads; t++) {
        size_t o = per * t;
        jb[t].fd = fd;
        jb[t].dst = dst + o;
        jb[t].off = o;
        jb[t].n = o >= n ? 0 : (n - o < per ? n - o : per);
        pthread_create(&th[t], NULL, pr_thread, &jb[t]);
    }
    for (int t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    return now() - t0;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    shapes();
    for (int i = 0; i < ntensors; i++) {
        offs[i] = total;
        total += (sizes[i] + 255) & ~(size_t)255;
    }
    CK(cudaMalloc(&dsrc, total));
    CK(cudaMalloc(&ddst, total));
    CK(cudaMemset(dsrc, 0x5a, total));
    CK(cudaMemset(ddst, 0, total));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaFuncSetAttribute(k_tma<16384, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
    CK(cudaFuncSetAttribute(k_tma<32768, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
    CK(cudaFuncSetAttribute(k_tma<8192, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
    CK(cudaFuncSetAttribute(k_tma<16384, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 32768));
    printf("{\n \"bytes\": %zu, \"tensors\": %d, \"sms\": %d,\n", total, ntensors, sms);
    double ceil = time_gpu(op_memcpy_one, NULL);
    printf(" \"memcpy_one_ms\": %.4f,\n", ceil * 1e3);
    printf(" \"memcpy_each_ms\": %.4f,\n", time_gpu(op_memcpy_each, NULL) * 1e3);
    {
        void **d = (void **)malloc(ntensors * sizeof *d);
        const void **s = (const void **)malloc(ntensors * sizeof *s);
        for (int i = 0; i < ntensors; i++) { d[i] = ddst + offs[i]; s[i] = dsrc + offs[i]; }
        bdst = d;
        bsrc = s;
        cudaMemcpyAttributes at;
        memset(&at, 0, sizeof at);
        at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        size_t idx = 0;
        CK(cudaStreamCreateWithFlags(&bstream, cudaStreamNonBlocking));
        cudaError_t be = cudaMemcpyBatchAsync(d, s, sizes, (size_t)ntensors, &at, &idx, 1, bstream);
        if (be == cudaSuccess) {
            CK(cudaDeviceSynchronize());
            printf(" \"memcpy_batch_ms\": %.4f,\n", time_gpu(op_memcpy_batch, NULL) * 1e3);
        } else {
            printf(" \"memcpy_batch_error\": \"%s\",\n", cudaGetErrorString(be));
            cudaGetLastError();
        }
    }
    size_t rkb[] = {64, 256, 1024, 4096, 16384};
    for (int k = 0; k < 5; k++) {
        row *h;
        nrows = make_rows(rkb[k] << 10, &h);
        CK(cudaMalloc(&drows, nrows * sizeof *h));
        CK(cudaMemcpy(drows, h, nrows * sizeof *h, cudaMemcpyHostToDevice));
        printf(" \"refit_batch_%zu_ms\": %.4f, \"refit_batch_%zu_rows\": %u,\n", rkb[k],
               time_gpu(op_refit, NULL) * 1e3, rkb[k], nrows);
        for (tma_variant = 0; tma_variant < 4; tma_variant++) {
            CK(cudaMemset(ddst, 0, total));
            printf(" \"tma%d_rows%zu_ms\": %.4f,", tma_variant, rkb[k], time_gpu(op_tma, NULL) * 1e3);
            char *hb = (char *)malloc(total);
            CK(cudaMemcpy(hb, ddst, total, cudaMemcpyDeviceToHost));
            size_t badb = 0;
            for (size_t i = 0; i < total; i += 4096)
                badb += hb[i] != 0x5a && hb[i] != 0;
            long zero = 0;
            for (int t = 0; t < ntensors; t++) {
                zero += hb[offs[t] + sizes[t] - 1] != 0x5a;
                for (size_t i = 0; i < sizes[t]; i += 4096)
                    zero += hb[offs[t] + i] != 0x5a;
            }
            printf(" \"tma%d_rows%zu_bad\": %ld,\n", tma_variant, rkb[k], zero + (long)badb);
            free(hb);
        }
        CK(cudaFree(drows));
        if (rkb[k] <= 1024) { /* the table read in place from pinned host memory */
            row *ph;
            CK(cudaHostAlloc((void **)&ph, nrows * sizeof *h, cudaHostAllocMapped));
            memcpy(ph, h, nrows * sizeof *h);
            drows = ph;
            printf(" \"refit_batch_%zu_pinned_table_ms\": %.4f,\n", rkb[k], time_gpu(op_refit, NULL) * 1e3);
            CK(cudaFreeHost(ph));
        }
        free(h);
    }
    { /* tensors >= 16 MB by cudaMemcpyAsync on a second stream, the rest by the batch kernel */
        cudaStream_t s2;
        cudaEvent_t e1, e2;
        CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
        size_t rm = 64 << 10, big = 16 << 20;
        uint32_t n = 0;
        row *h = (row *)malloc(sizeof(row) * 40000);
        for (int i = 0; i < ntensors; i++)
            if (sizes[i] < big)
                for (size_t o = 0; o < sizes[i]; o += rm) {
                    h[n].src = (uint64_t)(dsrc + offs[i] + o);
                    h[n].dst = (uint64_t)(ddst + offs[i] + o);
                    h[n].bytes = sizes[i] - o < rm ? sizes[i] - o : rm;
                    n++;
                }
        CK(cudaMalloc(&drows, n * sizeof *h));
        CK(cudaMemcpy(drows, h, n * sizeof *h, cudaMemcpyHostToDevice));
        double v[REPS];
        for (int r = -1; r < REPS; r++) {
            CK(cudaDeviceSynchronize());
            double t0 = now();
            CK(cudaEventRecord(e1, 0));
            CK(cudaStreamWaitEvent(s2, e1, 0));
            for (int i = 0; i < ntensors; i++)
                if (sizes[i] >= big)
                    CK(cudaMemcpyAsync(ddst + offs[i], dsrc + offs[i], sizes[i], cudaMemcpyDeviceToDevice, s2));
            kern_copy_batch_cuda(drows, n, 0);
            CK(cudaEventRecord(e2, s2));
            CK(cudaStreamWaitEvent(0, e2, 0));
            CK(cudaStreamSynchronize(0));
            if (r >= 0)
                v[r] = now() - t0;
        }
        printf(" \"split_memcpy_big_kernel_small_ms\": %.4f,\n", med(v) * 1e3);
        CK(cudaFree(drows));
        free(h);
    }
    int grids[] = {sms, 2 * sms, 4 * sms, 8 * sms};
    for (int g = 0; g < 4; g++) {
        flat_grid = grids[g];
        printf(" \"flat_%d_ms\": %.4f,\n", grids[g], time_gpu(op_flat, NULL) * 1e3);
    }
    /* check the last copy */
    {
        char *h = (char *)malloc(1 << 20);
        CK(cudaMemcpy(h, ddst + total - (1 << 20), 1 << 20, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int i = 0; i < (1 << 20); i++)
            bad |= h[i] != 0x5a;
        printf(" \"d2d_check\": %s,\n", bad ? "false" : "true");
        free(h);
    }

    /* ---- host side ---- */
    char path[512];
    snprintf(path, sizeof path, "%s/copy_paths.bin", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) { perror(path); return 1; }
    {
        char *buf = (char *)malloc(64 << 20);
        memset(buf, 0x3c, 64 << 20);
        for (size_t o = 0; o < total; o += 64 << 20) {
            size_t n = total - o < (64u << 20) ? total - o : (64u << 20);
            if (write(fd, buf, n) != (ssize_t)n) { perror("write"); return 1; }
        }
        free(buf);
    }
    char *map = (char *)mmap(NULL, total, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) { perror("mmap"); return 1; }
    char *pin, *pin2;
    CK(cudaHostAlloc((void **)&pin, total, cudaHostAllocDefault));
    CK(cudaHostAlloc((void **)&pin2, total, cudaHostAllocDefault));
    memset(pin2, 1, total);
    double v[REPS];
    host_copy(pin, map, total, 8); /* warm the page cache and the mapping */
    for (int r = 0; r < REPS; r++) {
        double t0 = now();
        CK(cudaMemcpy(ddst, pin2, total, cudaMemcpyHostToDevice));
        v[r] = now() - t0;
    }
    double h2d = med(v);
    printf(" \"h2d_pinned_ms\": %.3f,\n", h2d * 1e3);
    int thr[] = {1, 4, 8, 15};
    for (int k = 0; k < 4; k++) {
        for (int r = 0; r < REPS; r++)
            v[r] = host_copy(pin, map, total, thr[k]);
        printf(" \"host_copy_%d_ms\": %.3f,\n", thr[k], med(v) * 1e3);
    }
    {
        /* both at once: DMA from pin2 while 8 threads copy map -> pin */
        double tc[REPS], td[REPS];
        for (int r = 0; r < REPS; r++) {
            cudaEvent_t e;
            CK(cudaEventCreate(&e));
            double t0 = now();
            CK(cudaMemcpyAsync(ddst, pin2, total, cudaMemcpyHostToDevice, 0));
            CK(cudaEventRecord(e, 0));
            tc[r] = host_copy(pin, map, total, 8);
            CK(cudaEventSynchronize(e));
            td[r] = now() - t0;
            CK(cudaEventDestroy(e));
        }
        printf(" \"host_copy_8_with_dma_ms\": %.3f, \"dma_with_host_copy_ms\": %.3f,\n",
               med(tc) * 1e3, med(td) * 1e3);
    }
    {
        int pt[] = {4, 8, 15};
        for (int k = 0; k < 3; k++) {
            for (int r = 0; r < REPS; r++)
                v[r] = pread_copy(fd, pin, total, pt[k]);
            printf(" \"pread_%d_ms\": %.3f,\n", pt[k], med(v) * 1e3);
        }
        double tc[REPS], td[REPS];
        for (int r = 0; r < REPS; r++) {
            cudaEvent_t e;
            CK(cudaEventCreate(&e));
            double t0 = now();
            CK(cudaMemcpyAsync(ddst, pin2, total, cudaMemcpyHostToDevice, 0));
            CK(cudaEventRecord(e, 0));
            tc[r] = pread_copy(fd, pin, total, 8);
            CK(cudaEventSynchronize(e));
            td[r] = now() - t0;
            CK(cudaEventDestroy(e));
        }
        printf(" \"pread_8_with_dma_ms\": %.3f, \"dma_with_pread_ms\": %.3f,\n", med(tc) * 1e3, med(td) * 1e3);
        for (int r = 0; r < REPS; r++) { /* a fresh mapping each time, as a new checkpoint gets */
            char *m2 = (char *)mmap(NULL, total, PROT_READ, MAP_SHARED, fd, 0);
            v[r] = host_copy(pin, m2, total, 8);
            munmap(m2, total);
        }
        printf(" \"host_copy_8_fresh_map_ms\": %.3f,\n", med(v) * 1e3);
    }
    size_t rmb[] = {64, 1024};
    for (int k = 0; k < 2; k++) {
        size_t piece = rmb[k] << 20;
        double treg[3], th2d[3], tun[3];
        int ok = 1;
        for (int r = 0; r < 3 && ok; r++) {
            double t0 = now();
            for (size_t o = 0; o < total && ok; o += piece) {
                size_t n = total - o < piece ? total - o : piece;
                cudaError_t e = cudaHostRegister(map + o, n, cudaHostRegisterReadOnly);
                if (e != cudaSuccess) {
                    printf(" \"register_%zu_error\": \"%s\",\n", rmb[k], cudaGetErrorString(e));
                    cudaGetLastError();
                    ok = 0;
                }
            }
            if (!ok)
                break;
            double t1 = now();
            for (size_t o = 0; o < total; o += piece)
                CK(cudaMemcpyAsync(ddst + o, map + o, total - o < piece ? total - o : piece,
                                   cudaMemcpyHostToDevice, 0));
            CK(cudaStreamSynchronize(0));
            double t2 = now();
            for (size_t o = 0; o < total; o += piece)
                CK(cudaHostUnregister(map + o));
            double t3 = now();
            treg[r] = t1 - t0;
            th2d[r] = t2 - t1;
            tun[r] = t3 - t2;
        }
        if (ok) {
            qsort(treg, 3, sizeof(double), cmpd);
            qsort(th2d, 3, sizeof(double), cmpd);
            qsort(tun, 3, sizeof(double), cmpd);
            printf(" \"register_%zu_ms\": %.3f, \"h2d_from_registered_%zu_ms\": %.3f, "
                   "\"unregister_%zu_ms\": %.3f,\n", rmb[k], treg[1] * 1e3, rmb[k], th2d[1] * 1e3,
                   rmb[k], tun[1] * 1e3);
        }
    }
    {
        int pthr[] = {1, 4, 8, 15};
        size_t pmb[] = {16, 64};
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 2; b++) {
                double pv[5];
                int ok = 1;
                for (int r = 0; r < 5; r++)
                    pv[r] = pipeline(map, ddst, total, pmb[b] << 20, pthr[a], &ok);
                qsort(pv, 5, sizeof(double), cmpd);
                printf(" \"pipeline_t%d_%zumb_ms\": %.3f,%s\n", pthr[a], pmb[b], pv[2] * 1e3,
                       ok ? "" : " \"pipeline_failed\": true,");
            }
    }
    {
        for (int r = 0; r < 3; r++) {
            double t0 = now();
            CK(cudaMemcpy(ddst, map, total, cudaMemcpyHostToDevice));
            v[r] = now() - t0;
        }
        qsort(v, 3, sizeof(double), cmpd);
        printf(" \"h2d_pageable_ms\": %.3f,\n", v[1] * 1e3);
    }
    printf(" \"done\": true\n}\n");
    munmap(map, total);
    close(fd);
    unlink(path);
    return 0;
}
