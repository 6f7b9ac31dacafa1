/*
 * The CUDA backend's pageable sources (docs/cuda.md): where its worker
 * threads run and its pinned ring lives, the workers that copy pageable
 * bytes into the ring, the ring's chunks, the deferred reads that let the
 * copy engine drain one slice while the workers fill the next, and the
 * timing of the ring's copies.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/cuda/backend_cuda.h"
#include "core/cuda/backend_cuda_internal.h"
#include "core/cuda/kern_cuda.h"
#include "core/cuda/placement.h"
#include "core/cuda/ring_trace.h"
#include "kernels/copy.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

/* ---- where the workers run and the pinned ring lives ----
 *
 * Decided once, when the first pageable copy needs the ring or the
 * threads (G.mu held), for the device of that copy: its PCI bus id gives
 * its local CPUs and NUMA node in sysfs (placement.h says when that pins
 * anything). Pinned, the workers keep to those CPUs and the ring's pages
 * are bound to that node before they are pinned, so neither the copies
 * into the ring nor the DMA that reads it cross between nodes. Absent
 * sysfs entries, one node, or REFIT_CUDA_NUMA=0: as before. */

static struct {
    bool decided;
    placement p;                /* written before the first worker starts */
} PL;

static void place_once(int dev)
{
    if (PL.decided)
        return;
    PL.decided = true;
    char bus[32] = "";
    cpu_set_t local, allowed;
    int node = -1;
    bool have = cudaDeviceGetPCIBusId(bus, (int)sizeof bus, dev) == cudaSuccess;
    if (!have)
        (void)cudaGetLastError();
    have = have && placement_device_read("/sys", bus, &local, &node);
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        CPU_ZERO(&allowed); /* then nothing is pinned */
    const char *threads = getenv("REFIT_CUDA_COPY_THREADS");
    placement_in in = {.mode = (int)env_size("REFIT_CUDA_NUMA", 1, 1, 0, 2),
                       .cpus = getenv("REFIT_CUDA_CPUS"),
                       .local = have ? &local : NULL,
                       .node = node,
                       .allowed = &allowed,
                       .threads = G.cfg.threads,
                       .threads_explicit = threads && *threads};
    placement_plan(&in, &PL.p);
    G.cfg.threads = PL.p.threads;
    if (env_size("REFIT_CUDA_NUMA_LOG", 0, 1, 0, 1))
        fprintf(stderr, "refit: CUDA device %d (%s): %s\n", dev, *bus ? bus : "no bus id",
                PL.p.why);
}

/* ---- worker threads for large host copies ---- */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t go;
    int started;
    int sleeping;               /* workers waiting on go */
    unsigned gen;               /* a new job; read without the lock by spinning workers */
    char *d;
    const char *s;
    size_t n, slice, n_slices, next;
    size_t finished;            /* slices done; the caller spins on it */
} P = {.mu = PTHREAD_MUTEX_INITIALIZER, .go = PTHREAD_COND_INITIALIZER};

/* memcpy with non-temporal stores: the pinned destination is not read for
 * ownership first (a third less memory traffic) and does not evict the
 * source from the caches. */
static void nt_memcpy(void *dst, const void *src, size_t n)
{
#if defined(__SSE2__)
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > n)
        head = n;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t body = n & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    _mm_sfence();
    memcpy(d + body, s + body, n - body);
#else
    memcpy(dst, src, n);
#endif
}

/* memcpy from a pageable source; a mapped file's pages are first faulted
 * in with one madvise (cheaper than a fault every few pages). Returns the
 * nanoseconds the madvise took. */
static uint64_t host_read(void *d, const void *s, size_t n)
{
    uint64_t dt = 0;
    if (G.cfg.populate && n >= 256 * KIB) {
        uintptr_t a = (uintptr_t)s & ~(uintptr_t)4095, e = (uintptr_t)s + n;
        uint64_t t0 = now_ns();
        (void)madvise((void *)a, e - a, MADV_POPULATE_READ); /* a hint: errors ignored */
        dt = now_ns() - t0;
        __atomic_fetch_add(&G.stats.prefault_ns, dt, __ATOMIC_RELAXED);
    }
    if (G.cfg.nt_stores && n >= 64 * KIB)
        nt_memcpy(d, s, n);
    else
        memcpy(d, s, n);
    return dt;
}

/* Take slices of the current job until none is left (P.mu held). Job
 * fields change only under P.mu and only once every slice of the job before
 * is finished, so whatever job a worker finds here is whole. */
static void pool_work(void)
{
    while (P.next < P.n_slices) {
        size_t i = P.next++;
        size_t off = i * P.slice, len = P.n - off < P.slice ? P.n - off : P.slice;
        char *d = P.d + off;
        const char *s = P.s + off;
        pthread_mutex_unlock(&P.mu);
        host_read(d, s, len);
        pthread_mutex_lock(&P.mu);
        __atomic_add_fetch(&P.finished, 1, __ATOMIC_RELEASE);
    }
}

/* ---- deferred pageable reads ----
 *
 * Between hold(stream, 1) and hold(stream, 0) (refit_load_source around its
 * loop: the mapped file outlives both) a contiguous pageable copy on that
 * stream only queues slices: (dst, src, a place in the stream's pinned
 * ring). The worker threads copy slices into the ring in any order (they
 * are woken whenever a chunk's slices are published and before the caller
 * waits); the calling thread issues each filled slice's cudaMemcpyAsync in
 * order (after pending undo saves, like any immediate work), whenever it
 * enters the backend. It copies slices itself only with no worker thread,
 * or REFIT_CUDA_CALLER_COPIES=1: a slice it copies is 0.4 ms it issues
 * nothing. So the copy engine drains slice k while the workers fill
 * k+1.., across tensors, with no barrier per piece. hold(stream, 0) returns once every slice is filled and issued:
 * the source is consumed. Any other work on the backend first settles the
 * slices (copy of another kind, flush, sync, zero, fingerprint, kernels),
 * so stream order is what the caller asked for. One stream at a time. */

struct cuda_defer D;

/* Take and copy slices while some wait. Any thread. */
static bool defer_work(void)
{
    bool did = false;
    for (;;) {
        uint64_t n = __atomic_load_n(&D.next_fill, __ATOMIC_RELAXED);
        if (n >= __atomic_load_n(&D.head, __ATOMIC_ACQUIRE))
            return did;
        if (!__atomic_compare_exchange_n(&D.next_fill, &n, n + 1, false, __ATOMIC_ACQ_REL,
                                         __ATOMIC_RELAXED))
            continue;
        dslice *x = &D.s[n % DEFER_CAP];
        uint64_t c0 = ring_trace_cpu_ns(), t0 = now_ns(), pf = 0;
        if (x->bytes)
            pf = host_read(x->pin, x->src, x->bytes);
        uint64_t t1 = now_ns();
        __atomic_fetch_add(&G.stats.host_copy_ns, t1 - t0, __ATOMIC_RELAXED);
        if (ring_trace_on)
            ring_trace_add(RT_FILL, t0, t1, n, x->bytes, pf, ring_trace_cpu_ns() - c0);
        __atomic_store_n(&x->filled, SL_FILLED, __ATOMIC_RELEASE);
        did = true;
    }
}

/* Workers spin a while on the job counter before sleeping: a sleeping
 * thread (an idle vCPU in a VM) can take a tenth of a millisecond to wake,
 * which would stall every chunk of a pageable load. */
#define POOL_SPIN_NS 3000000u

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() ((void)0)
#endif

static void *pool_main(void *arg)
{
    static int workers;
    unsigned seen = 0;
    (void)arg;
    ring_trace_worker(__atomic_fetch_add(&workers, 1, __ATOMIC_RELAXED));
    if (PL.p.pin) /* a hint: unpinned, the worker still copies */
        (void)pthread_setaffinity_np(pthread_self(), sizeof PL.p.cpus, &PL.p.cpus);
    for (;;) {
        uint64_t t0 = now_ns(), last = t0;
        while (__atomic_load_n(&P.gen, __ATOMIC_ACQUIRE) == seen) {
            if (defer_work()) {
                t0 = last = now_ns();
                continue;
            }
            uint64_t t = now_ns();
            if (ring_trace_on && t - last > 500000)
                ring_trace_add(RT_GAP, last, t, 0, 0, 0, 0);
            last = t;
            if (t - t0 < POOL_SPIN_NS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&P.mu);
            P.sleeping++;
            while (P.gen == seen && __atomic_load_n(&D.next_fill, __ATOMIC_RELAXED) >=
                                        __atomic_load_n(&D.head, __ATOMIC_ACQUIRE))
                pthread_cond_wait(&P.go, &P.mu);
            P.sleeping--;
            pthread_mutex_unlock(&P.mu);
            t0 = last = now_ns();
        }
        pthread_mutex_lock(&P.mu);
        seen = P.gen;
        pool_work();
        pthread_mutex_unlock(&P.mu);
    }
    return NULL;
}

static void pool_start(void)
{
    for (; P.started < G.cfg.threads; P.started++) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &a, pool_main, NULL);
        pthread_attr_destroy(&a);
        if (rc)
            break; /* fewer helpers: slower, still correct */
    }
}

/* memcpy, split over the worker threads when large. Called under G.mu, so
 * one job at a time. */
void par_memcpy(void *d, const void *s, size_t n)
{
    if (n < 2 * MIB || G.cfg.threads == 0) {
        host_read(d, s, n);
        return;
    }
    pthread_mutex_lock(&P.mu);
    pool_start();
    size_t parts = (size_t)P.started + 1, by_size = n / MIB;
    parts = parts < by_size ? parts : by_size;
    P.d = d;
    P.s = s;
    P.n = n;
    P.slice = ((n + parts - 1) / parts + 4095) & ~(size_t)4095;
    P.n_slices = (n + P.slice - 1) / P.slice;
    P.next = 0;
    __atomic_store_n(&P.finished, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&P.gen, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&P.go);
    pool_work();
    size_t total = P.n_slices;
    pthread_mutex_unlock(&P.mu);
    while (__atomic_load_n(&P.finished, __ATOMIC_ACQUIRE) < total)
        cpu_relax();
}

/* ---- the pinned ring for pageable sources ---- */

/* A chunk's pages on the placed node: mapped, bound, then pinned (the
 * pinning faults them in under the binding). false: use cudaHostAlloc. */
static bool chunk_alloc_placed(pchunk *c, size_t bytes)
{
    if (PL.p.ring_node < 0)
        return false;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return false;
    if (placement_bind_preferred(p, bytes, PL.p.ring_node) != 0 ||
        cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        munmap(p, bytes);
        return false;
    }
    c->p = p;
    c->mapped = bytes;
    return true;
}

int chunk_init(cq *q, pchunk *c)
{
    place_once(q->device);
    cudaError_t e = cudaSuccess;
    if (!chunk_alloc_placed(c, G.cfg.ring_chunk_bytes))
        e = cudaHostAlloc((void **)&c->p, G.cfg.ring_chunk_bytes,
                          cudaHostAllocPortable | cudaHostAllocMapped);
    if (e == cudaSuccess)
        e = cudaHostGetDevicePointer((void **)&c->dev, c->p, 0);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&c->ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        if (c->p)
            chunk_release(c);
        return cu_fail(e, "allocating a pinned staging chunk");
    }
    G.allocs.ring_chunks++;
    return REFIT_OK;
}

/* want bytes of pinned memory whose address is congruent to align_to mod
 * 16 (so the batch kernel copies 16-byte words); want <= chunk size. */
int ring_take(cq *q, size_t want, uint64_t align_to, pchunk **oc, char **op)
{
    size_t mis = (size_t)(align_to & 15);
    pchunk *c = &q->ring[q->ring_cur];
    size_t off = ((c->used + 15) & ~(size_t)15) + mis;
    if (!c->p || off + want > G.cfg.ring_chunk_bytes) {
        q->ring_cur = (q->ring_cur + 1) % G.cfg.ring_chunks;
        c = &q->ring[q->ring_cur];
        int rc = c->p ? REFIT_OK : chunk_init(q, c);
        if (!rc && c->in_table)
            rc = queue_flush(q);
        if (rc)
            return rc;
        if (c->recorded) {
            G.stats.ring_waits++;
            uint64_t t0 = now_ns();
            cudaError_t e = cudaEventSynchronize(c->ev);
            uint64_t dt = now_ns() - t0;
            G.stats.ring_wait_ns += dt;
            G.stats.ring_drain_ns += dt;
            if (e != cudaSuccess)
                return cu_fail(e, "waiting for a pinned staging chunk");
            c->recorded = false;
        }
        off = mis;
    }
    c->used = off + want;
    *oc = c;
    *op = c->p + off;
    return REFIT_OK;
}

int chunk_mark(pchunk *c, cudaStream_t st)
{
    cudaError_t e = cudaEventRecord(c->ev, st);
    if (e != cudaSuccess)
        return cu_fail(e, "recording a pinned chunk's event");
    c->recorded = true;
    return REFIT_OK;
}

/* ---- deferred pageable reads: the caller's side (G.mu held) ---- */

/* Wake sleeping workers after publishing slices. */
void defer_wake(void)
{
    pthread_mutex_lock(&P.mu);
    if (P.sleeping)
        pthread_cond_broadcast(&P.go);
    pthread_mutex_unlock(&P.mu);
}

/* ---- timing the ring's copies (REFIT_CUDA_TIME_DMA=1, for benches) ----
 * An event pair around each issued copy; resolved (waited for) when the
 * table is full and when the counters are read. G.mu held. */

#define DMA_TIMED_CAP 1024u

static struct {
    cudaEvent_t a[DMA_TIMED_CAP], b[DMA_TIMED_CAP];
    size_t bytes[DMA_TIMED_CAP];
    uint32_t made, n;
} T;

void dma_timing_resolve(void)
{
    for (uint32_t i = 0; i < T.n; i++) {
        float ms = 0;
        if (cudaEventSynchronize(T.b[i]) == cudaSuccess &&
            cudaEventElapsedTime(&ms, T.a[i], T.b[i]) == cudaSuccess) {
            G.stats.ring_dma_ns += (uint64_t)((double)ms * 1e6);
            G.stats.ring_dma_bytes += T.bytes[i];
        }
        (void)cudaGetLastError();
    }
    T.n = 0;
}

/* The pair slot for the next timed copy, or -1 (not timing, or no event). */
static int dma_timing_slot(void)
{
    if (!G.cfg.time_dma)
        return -1;
    if (T.n == DMA_TIMED_CAP)
        dma_timing_resolve();
    if (T.n == T.made) {
        if (cudaEventCreate(&T.a[T.made]) != cudaSuccess) {
            (void)cudaGetLastError();
            return -1;
        }
        if (cudaEventCreate(&T.b[T.made]) != cudaSuccess) {
            cudaEventDestroy(T.a[T.made]);
            (void)cudaGetLastError();
            return -1;
        }
        T.made++;
    }
    return (int)T.n;
}

static int slice_state(const dslice *x)
{
    return __atomic_load_n(&x->filled, __ATOMIC_ACQUIRE);
}

/* Issue slice i, a filled one, with the filled slices after it that are
 * adjacent in both the chunk and the destination: one cudaMemcpyAsync.
 * Returns the index past the run. */
static uint64_t issue_run(cq *q, uint64_t i)
{
    dslice *x = &D.s[i % DEFER_CAP];
    uint64_t end = i + 1;
    size_t bytes = x->bytes;
    while (!x->cast && end < D.head) {
        dslice *y = &D.s[end % DEFER_CAP];
        if (slice_state(y) != SL_FILLED || y->wait || y->cast || y->call != x->call ||
            y->chunk != x->chunk || y->pin != x->pin + bytes || y->dst != x->dst + bytes)
            break;
        bytes += y->bytes;
        end++;
    }
    if (!D.err) {
        uint64_t t0 = ring_trace_on ? now_ns() : 0;
        int slot = dma_timing_slot();
        if (slot >= 0)
            (void)cudaEventRecord(T.a[slot], (cudaStream_t)q->stream);
        pchunk *c = &q->ring[x->chunk];
        int rc;
        if (x->cast) {
            /* converted by the copy kernel, read from the mapped chunk */
            refit_view dv = x->strided ? x->dv
                            : (refit_view){.data = x->dst, .device = {REFIT_DEVICE_CUDA, q->device},
                                           .dtype = x->ddt, .ndim = 1,
                                           .shape = {(int64_t)(bytes / kern_dtype_size(x->sdt))},
                                           .strides = {1}};
            refit_view sv = dv; /* the piece's bytes in dv's shape, row-major */
            int64_t step = 1;
            for (int d = sv.ndim - 1; d >= 0; step *= sv.shape[d--])
                sv.strides[d] = step;
            sv.data = c->dev + (x->pin - c->p);
            sv.device = (refit_device){REFIT_DEVICE_CUDA_HOST, 0};
            sv.dtype = x->sdt;
            rc = kernel_now(q, &dv, &sv);
        } else {
            rc = memcpy_now(q, x->dst, x->pin, bytes);
        }
        if (!rc && !x->cast && slot >= 0 &&
            cudaEventRecord(T.b[slot], (cudaStream_t)q->stream) == cudaSuccess) {
            T.bytes[slot] = bytes;
            T.n++;
        }
        if (!rc)
            rc = chunk_mark(c, (cudaStream_t)q->stream);
        if (rc)
            D.err = rc;
        if (ring_trace_on)
            ring_trace_add(RT_ISSUE, t0, now_ns(), i, bytes, end - i, 0);
    }
    for (uint64_t k = i; k < end; k++) {
        dslice *y = &D.s[k % DEFER_CAP];
        D.pending[y->chunk]--;
        y->filled = SL_QUEUED;
    }
    return end;
}

/* Issue the filled slices at the front, in order: one cudaMemcpyAsync per
 * run of slices adjacent in both the chunk and the destination. Returns
 * true when it issued any. */
static bool defer_issue(void)
{
    cq *q = D.q;
    bool any = false;
    while (D.issued < D.head) {
        dslice *x = &D.s[D.issued % DEFER_CAP];
        if (slice_state(x) != SL_FILLED)
            break;
        if (x->wait) { /* a save's marker: what follows waits for the save */
            cudaError_t e = cudaStreamWaitEvent((cudaStream_t)q->stream, x->wait, 0);
            if (e != cudaSuccess && !D.err)
                D.err = cu_fail(e, "waiting for an undo save");
            x->wait = NULL;
            x->filled = SL_QUEUED;
            D.issued++;
        } else {
            D.issued = issue_run(q, D.issued);
        }
        any = true;
    }
    return any;
}

/* The caller copies slices while it waits only when told to, or when no
 * worker thread runs: a slice it takes is one it cannot issue past. */
static bool caller_work(void)
{
    return (G.cfg.caller_copies || D.workers == 0) && defer_work();
}

/* Issue, and copy slices here too, until slice index `upto` is issued. */
void defer_wait_issued(uint64_t upto)
{
    if (D.issued < upto)
        defer_wake(); /* none may sleep through what this waits for */
    while (D.issued < upto) {
        if (!defer_issue() && !caller_work())
            cpu_relax();
    }
}

/* Everything queued is copied and issued; D is free for another stream. */
static int defer_settle(void)
{
    if (!D.q)
        return REFIT_OK;
    uint64_t t0 = now_ns(), c0 = ring_trace_cpu_ns();
    defer_wait_issued(D.head);
    if (ring_trace_on)
        ring_trace_add(RT_SETTLE, t0, now_ns(), D.head, 0, 0, ring_trace_cpu_ns() - c0);
    int rc = D.err;
    D.q = NULL;
    D.err = 0;
    return rc;
}

/* The next ring chunk, once nothing placed in it waits to be issued and
 * the copies that read it are done. */
static int defer_next_chunk(cq *q)
{
    uint32_t nc = (D.cur + 1) % G.cfg.ring_chunks;
    pchunk *c = &q->ring[nc];
    int rc = c->p ? REFIT_OK : chunk_init(q, c);
    if (rc)
        return rc;
    if (D.pending[nc]) {
        uint64_t t0 = now_ns(), c0 = ring_trace_cpu_ns();
        while (D.pending[nc])
            if (!defer_issue() && !caller_work())
                cpu_relax();
        uint64_t t1 = now_ns();
        G.stats.ring_wait_ns += t1 - t0;
        G.stats.ring_fill_wait_ns += t1 - t0;
        if (ring_trace_on)
            ring_trace_add(RT_FILL_WAIT, t0, t1, nc, 0, 0, ring_trace_cpu_ns() - c0);
    }
    if (c->in_table && (rc = queue_flush(q)))
        return rc;
    if (c->recorded) {
        G.stats.ring_waits++;
        uint64_t t0 = now_ns(), c0 = ring_trace_cpu_ns();
        cudaError_t e;
        if (G.cfg.drain_poll) {
            /* keep the copy engine fed: issue what the workers filled
             * since while this chunk's copies run */
            while ((e = cudaEventQuery(c->ev)) == cudaErrorNotReady)
                if (!defer_issue() && !caller_work())
                    cpu_relax();
        } else {
            e = cudaEventSynchronize(c->ev);
        }
        uint64_t t1 = now_ns();
        G.stats.ring_wait_ns += t1 - t0;
        G.stats.ring_drain_ns += t1 - t0;
        if (ring_trace_on)
            ring_trace_add(RT_DRAIN_WAIT, t0, t1, nc, 0, 0, ring_trace_cpu_ns() - c0);
        if (e != cudaSuccess)
            return cu_fail(e, "waiting for a pinned staging chunk");
        c->recorded = false;
    }
    c->used = 0;
    D.cur = nc;
    D.used = 0;
    return REFIT_OK;
}

/* Queue a contiguous pageable copy as slices (q is D.q or becomes it).
 * cast (NULL: none) = {source dtype, destination dtype}: a small piece the
 * copy kernel converts when it is issued (a BF16 scale into an F32 runtime
 * scale), queued as one slice in one chunk, so that a cast does not settle
 * the pipeline as the synchronous path would; the caller keeps its bytes
 * within a slice and a chunk. dview (NULL: dst is contiguous): with cast,
 * a strided destination the kernel writes through (a transposed runtime
 * view), the source being bytes in dview's shape, row-major. */
int defer_queue(cq *q, char *dst, const char *src, size_t bytes, const refit_dtype *cast,
                const refit_view *dview)
{
    uint64_t t_in = ring_trace_on ? now_ns() : 0, c_in = ring_trace_cpu_ns();
    if (D.q != q) {
        int rc = defer_settle();
        if (rc)
            return rc;
        D.q = q;
        D.cur = q->ring_cur;
        D.used = G.cfg.ring_chunk_bytes; /* start on a fresh chunk */
        place_once(q->device);
        pthread_mutex_lock(&P.mu);
        pool_start();
        D.workers = P.started;
        pthread_mutex_unlock(&P.mu);
    }
    if (D.err)
        return D.err;
    size_t cap = G.cfg.ring_chunk_bytes;
    uint32_t call = ++D.calls;
    for (size_t off = 0; off < bytes;) {
        D.used = (D.used + 63) & ~(size_t)63;
        if (D.used >= cap || (cast && cap - D.used < bytes)) {
            /* the chunk's slices announced before any wait for the next
             * one: no worker sleeps through a long tensor, leaving the
             * caller to copy it alone at a twelfth of the speed */
            defer_wake();
            int rc = defer_next_chunk(q);
            if (rc)
                return D.err = rc;
        }
        if (D.head - D.issued == DEFER_CAP)
            defer_wait_issued(D.head - DEFER_CAP + 1);
        size_t n = bytes - off;
        if (n > G.cfg.defer_slice)
            n = G.cfg.defer_slice;
        if (n > cap - D.used)
            n = cap - D.used;
        pchunk *c = &q->ring[D.cur];
        dslice *x = &D.s[D.head % DEFER_CAP];
        *x = (dslice){.dst = dst + off, .src = src + off, .pin = c->p + D.used, .bytes = n,
                      .chunk = D.cur, .call = call, .cast = cast != NULL,
                      .sdt = cast ? cast[0] : (refit_dtype){0},
                      .ddt = cast ? cast[1] : (refit_dtype){0}, .strided = cast && dview};
        if (x->strided)
            x->dv = *dview;
        D.pending[D.cur]++;
        D.used += n;
        off += n;
        __atomic_store_n(&D.head, D.head + 1, __ATOMIC_RELEASE);
        G.stats.pageable_bytes += n;
    }
    defer_wake();
    defer_issue();
    if (ring_trace_on)
        ring_trace_add(RT_COPY, t_in, now_ns(), call, bytes, 0, ring_trace_cpu_ns() - c_in);
    return REFIT_OK;
}

/* The ring as the synchronous path finds it after deferred use. */
static void defer_leave_ring(cq *q)
{
    q->ring_cur = D.cur;
    q->ring[D.cur].used = G.cfg.ring_chunk_bytes; /* the next take moves on */
}

void defer_settle_all(void)
{
    cq *q = D.q;
    if (!q)
        return;
    devg g;
    int rc = dev_enter(&g, q->device);
    if (!rc) {
        rc = defer_settle();
        defer_leave_ring(q);
        dev_leave(&g);
    }
    if (rc && !G.defer_err)
        G.defer_err = rc;
}

int cuda_hold_host_sources(void *stream, int on)
{
    lock_raw();
    int rc = REFIT_OK;
    if (on && G.cfg.defer && !D.held) {
        D.held = true;
        D.hold = stream;
    } else if (!on && D.held && D.hold == stream) {
        defer_settle_all();
        D.held = false;
        D.hold = NULL;
        rc = G.defer_err;
        G.defer_err = 0;
    }
    unlock();
    return rc;
}
