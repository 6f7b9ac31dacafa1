/* The emulator's cooperative launches and bulk copies (emu.h), on small
 * kernels of their own: blocks that wait on each other, a ring of bulk
 * copies through dynamic shared memory, what cudaLaunchKernelEx refuses,
 * and the misuses emu.h must stop, each run in a child process that must
 * abort with its message. Built and run first by run.sh; prints TAP. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_runtime.h"

static int tests, failed;

static void check(bool ok, const char *what)
{
    tests++;
    failed += !ok;
    printf("%sok %d - %s\n", ok ? "" : "not ", tests, what);
}

/* ---- kernels ---- */

/* Thread 0 of each block raises its flag, then spins until the other
 * block's is up: only a launch with both blocks resident finishes. Every
 * thread also sums its warp's thread numbers in the grid through the
 * shuffles. */
__global__ void k_flags(volatile unsigned *flag, unsigned *seen, unsigned *out)
{
    unsigned b = blockIdx.x, t = threadIdx.x;
    if (t == 0) {
        flag[b] = 1;
        while (flag[1 - b] == 0)
            __nanosleep(32);
        seen[b] = flag[1 - b];
    }
    __syncthreads();
    uint32_t v = b * blockDim.x + t; /* differs from block to block */
    for (int m = 16; m > 0; m /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    out[b * blockDim.x + t] = v;
}

/* Both blocks wait for a flag nobody raises. */
__global__ void k_wait_forever(volatile unsigned *flag)
{
    if (threadIdx.x == 0)
        while (flag[0] == 0)
            __nanosleep(32);
    __syncthreads();
}

#define RING_SLOTS 3
#define RING_ITEM 256 /* bytes */
#define RING_SMEM (RING_SLOTS * RING_ITEM + RING_SLOTS * 8)

/* Block b sums the words of items b, b + grid, ... of src (items of
 * RING_ITEM bytes, the last `last` bytes long) through a ring of slots:
 * thread 0 issues a copy into a slot once every thread has read the item
 * it held; each slot's barrier says when its copy landed. */
__global__ void k_ring(const unsigned *src, int items, uint32_t last, unsigned long long *sum,
                       uintptr_t *where)
{
    unsigned char *smem = (unsigned char *)emu_dyn_smem();
    uint64_t *bar = (uint64_t *)(smem + RING_SLOTS * RING_ITEM);
    unsigned b = blockIdx.x, g = gridDim.x;
    int mine = (int)((items - (int)b + (int)g - 1) / (int)g);
    auto issue = [&](int k) {
        int it = (int)b + k * (int)g;
        uint32_t bytes = it == items - 1 ? last : RING_ITEM;
        emu_bulk_load(smem + (k % RING_SLOTS) * RING_ITEM,
                      (const unsigned char *)src + (size_t)it * RING_ITEM, bytes,
                      &bar[k % RING_SLOTS]);
    };
    if (threadIdx.x == 0) {
        where[b] = (uintptr_t)smem;
        for (int s = 0; s < RING_SLOTS; s++)
            emu_mbar_init(&bar[s]);
        for (int k = 0; k < mine && k < RING_SLOTS; k++)
            issue(k);
    }
    __syncthreads();
    unsigned long long acc = 0;
    for (int k = 0; k < mine; k++) {
        emu_mbar_wait(&bar[k % RING_SLOTS], (uint32_t)(k / RING_SLOTS) & 1u);
        int it = (int)b + k * (int)g;
        uint32_t words = (it == items - 1 ? last : RING_ITEM) / 4;
        const unsigned *w = (const unsigned *)(smem + (k % RING_SLOTS) * RING_ITEM);
        for (uint32_t j = threadIdx.x; j < words; j += blockDim.x)
            acc += w[j];
        __syncthreads(); /* the slot is read: it may take the next copy */
        if (threadIdx.x == 0 && k + RING_SLOTS < mine)
            issue(k + RING_SLOTS);
    }
    atomicAdd(&sum[b], acc);
}

/* Thread 0 waits before the block's last thread issues the copy (no
 * barrier between): on a GPU the wait spins until the bytes land. */
__global__ void k_wait_then_issue(const unsigned *src, unsigned *out)
{
    unsigned char *smem = (unsigned char *)emu_dyn_smem();
    uint64_t *bar = (uint64_t *)(smem + 64);
    if (threadIdx.x == 0)
        emu_mbar_init(bar);
    __syncthreads();
    if (threadIdx.x == 0) {
        emu_mbar_wait(bar, 0);
        out[0] = ((const unsigned *)smem)[3];
    }
    if (threadIdx.x == blockDim.x - 1)
        emu_bulk_load(smem, src, 16, bar);
}

/* The first word of the block's dynamic shared memory, never written. */
__global__ void k_read_junk(unsigned *out)
{
    if (threadIdx.x == 0)
        out[blockIdx.x] = *(const unsigned *)emu_dyn_smem();
}

/* Misuses, one a mode: 0 a wait on a copy never issued, 1 a copy of 24
 * bytes, 2 a misaligned source, 3 a copy past the dynamic shared memory,
 * 4 a second copy before anyone waited on the first, 5 a barrier never
 * initialised. */
__global__ void k_misuse(const unsigned char *src, int mode)
{
    unsigned char *smem = (unsigned char *)emu_dyn_smem();
    uint64_t *bar = (uint64_t *)(smem + 512);
    if (threadIdx.x != 0)
        return;
    if (mode != 5)
        emu_mbar_init(bar);
    switch (mode) {
    case 0:
        emu_bulk_load(smem, src, 16, bar);
        emu_mbar_wait(bar, 0);
        emu_mbar_wait(bar, 1); /* the second phase: no copy completes it */
        break;
    case 1:
        emu_bulk_load(smem, src, 24, bar);
        break;
    case 2:
        emu_bulk_load(smem, src + 8, 16, bar);
        break;
    case 3:
        emu_bulk_load(smem + 512, src, 256, bar); /* 512 + 256 > 640 */
        break;
    case 4:
        emu_bulk_load(smem, src, 16, bar);
        emu_bulk_load(smem + 16, src, 16, bar);
        break;
    case 5:
        emu_bulk_load(smem, src, 16, bar);
        break;
    }
}

/* ---- the checks ---- */

/* Run f in a child; 1 if it died of SIGABRT with `want` in its stderr. */
template <class F> static bool aborts_with(const char *want, F f)
{
    int fd[2];
    fflush(stdout);
    if (pipe(fd))
        return false;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        f();
        _exit(0); /* did not abort */
    }
    close(fd[1]);
    static char buf[8192];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(fd[0], buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)r;
    buf[n] = 0;
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    bool ok = WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(buf, want);
    if (!ok)
        printf("# wanted an abort with \"%s\"; got status %d, stderr: %s\n", want, st, buf);
    return ok;
}

static cudaLaunchConfig_t config(unsigned grid, unsigned threads, size_t smem,
                                 cudaLaunchAttribute *at)
{
    cudaLaunchConfig_t c;
    memset(&c, 0, sizeof c);
    memset(at, 0, sizeof *at);
    at->id = cudaLaunchAttributeCooperative;
    at->val.cooperative = 1;
    c.gridDim = dim3(grid, 1, 1);
    c.blockDim = dim3(threads, 1, 1);
    c.dynamicSmemBytes = smem;
    c.attrs = at;
    c.numAttrs = 1;
    return c;
}

static void test_blocks_wait_on_each_other()
{
    unsigned flag[2] = {0, 0}, seen[2] = {0, 0}, out[128];
    cudaLaunchAttribute at;
    cudaLaunchConfig_t c = config(2, 64, 0, &at);
    check(cudaLaunchKernelEx(&c, k_flags, flag, seen, out) == cudaSuccess &&
              seen[0] == 1 && seen[1] == 1,
          "cooperative: two blocks wait on each other's flag");
    bool sums = true;
    for (unsigned b = 0; b < 2; b++)
        for (unsigned t = 0; t < 64; t++) {
            unsigned first = b * 64 + t / 32 * 32, want = 32 * first + 496; /* + 0 + .. + 31 */
            sums &= out[b * 64 + t] == want;
        }
    check(sums, "cooperative: blockIdx per thread, shuffles per warp of each block");
    unsigned f2[2] = {0, 0};
    check(aborts_with("a spin wait on work no earlier block did",
                      [&] { EMU_LAUNCH(2, 64, k_flags, f2, seen, out); }),
          "ordinary launch: the same kernel aborts at its spin wait");
    unsigned never = 0;
    check(aborts_with("cooperative launch deadlocked", [&] {
              cudaLaunchKernelEx(&c, k_wait_forever, &never);
          }),
          "cooperative: a flag nobody raises is a deadlock, reported");
}

static void test_ring_of_bulk_copies()
{
    /* 2 blocks, 17 items (the last 48 bytes): 9 and 8 items through 3
     * slots, each barrier through several phases of both parities */
    const int items = 17;
    const uint32_t last = 48;
    std::vector<unsigned> src((size_t)items * RING_ITEM / 4);
    unsigned long long want[2] = {0, 0}, sum[2] = {0, 0};
    for (size_t i = 0; i < src.size(); i++) {
        src[i] = (unsigned)(i * 2654435761u);
        size_t it = i * 4 / RING_ITEM;
        if (it < (size_t)items - 1 || i * 4 % RING_ITEM < last)
            want[it % 2] += src[i];
    }
    uintptr_t where[2] = {0, 0};
    cudaLaunchAttribute at;
    cudaLaunchConfig_t c = config(2, 64, RING_SMEM, &at);
    check(cudaLaunchKernelEx(&c, k_ring, src.data(), items, last, sum, where) == cudaSuccess &&
              sum[0] == want[0] && sum[1] == want[1],
          "cooperative: a ring of bulk copies through mbarrier phases sums every item");
    check(where[0] != where[1] && where[0] % 16 == 0 && where[1] % 16 == 0 &&
              (where[0] > where[1] ? where[0] - where[1] : where[1] - where[0]) >= RING_SMEM,
          "each block has its own dynamic shared memory, 16-byte aligned");
    at.val.cooperative = 0;
    sum[0] = sum[1] = 0;
    check(cudaLaunchKernelEx(&c, k_ring, src.data(), items, last, sum, where) == cudaSuccess &&
              sum[0] == want[0] && sum[1] == want[1],
          "ordinary cudaLaunchKernelEx: the same ring, blocks in turn");
    unsigned junk[2] = {0, 0};
    at.val.cooperative = 1;
    c.dynamicSmemBytes = 16;
    check(cudaLaunchKernelEx(&c, k_read_junk, junk) == cudaSuccess && junk[0] == 0xffffffffu &&
              junk[1] == 0xffffffffu,
          "dynamic shared memory starts as 0xff junk");
    unsigned one[4] = {1, 2, 3, 0xc0ffee}, got = 0;
    c = config(1, 64, 128, &at);
    check(cudaLaunchKernelEx(&c, k_wait_then_issue, one, &got) == cudaSuccess && got == 0xc0ffee,
          "a wait before the block's other thread issues the copy waits for it");
}

static void test_refusals()
{
    unsigned flag[4] = {0, 0, 0, 0}, seen[4], out[256];
    cudaLaunchAttribute at;
    cudaLaunchConfig_t c = config(3, 64, 0, &at);
    check(cudaLaunchKernelEx(&c, k_flags, flag, seen, out) == cudaErrorCooperativeLaunchTooLarge,
          "cooperative: 3 blocks on 2 SMs of one block each are refused");
    int per = -1;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k_ring, 512, 227 * 1024) ==
                  cudaSuccess &&
              per == 1 &&
              cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k_ring, 512,
                                                            227 * 1024 + 1) == cudaSuccess &&
              per == 0,
          "occupancy: 1 block an SM up to 227 KB of shared memory, else 0");
    int coop = 0;
    check(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0) == cudaSuccess &&
              coop == 1,
          "the device says it launches cooperatively");
    unsigned junk[2];
    c = config(2, 64, 100 * 1024, &at);
    bool refused = cudaLaunchKernelEx(&c, k_read_junk, junk) == cudaErrorInvalidValue;
    bool set = cudaFuncSetAttribute(k_read_junk, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    100 * 1024) == cudaSuccess;
    bool ran = cudaLaunchKernelEx(&c, k_read_junk, junk) == cudaSuccess;
    bool too_big = cudaFuncSetAttribute(k_read_junk, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        228 * 1024) == cudaErrorInvalidValue;
    check(refused && set && ran && too_big,
          "over 48 KB of dynamic shared memory only once the kernel's attribute allows it");
}

static void test_misuses_abort()
{
    static unsigned char src[64] __attribute__((aligned(16)));
    static const struct {
        const char *want, *what;
    } m[] = {
        {"wait on a bulk copy never issued", "a wait on a copy never issued aborts"},
        {"a bulk copy of 24 bytes", "a copy not a multiple of 16 bytes aborts"},
        {"both 16-byte aligned", "a misaligned copy aborts"},
        {"outside the block's dynamic shared memory", "a copy past the shared memory aborts"},
        {"nobody waited for", "a copy over a phase nobody waited for aborts"},
        {"before emu_mbar_init", "a barrier never initialised aborts"},
    };
    for (int mode = 0; mode < 6; mode++)
        check(aborts_with(m[mode].want,
                          [&] {
                              cudaLaunchAttribute at;
                              cudaLaunchConfig_t c = config(2, 64, 640, &at);
                              cudaLaunchKernelEx(&c, k_misuse, (const unsigned char *)src, mode);
                          }),
              m[mode].what);
}

int main()
{
    test_blocks_wait_on_each_other();
    test_ring_of_bulk_copies();
    test_refusals();
    test_misuses_abort();
    printf("1..%d\n", tests);
    if (failed)
        printf("# %d of %d failed\n", failed, tests);
    return failed != 0;
}
