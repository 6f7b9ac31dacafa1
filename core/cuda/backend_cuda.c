/*
 * The CUDA backend: moves checkpoint bytes into device memory on the
 * caller's stream, inside a PyTorch (or any CUDA) process.
 *
 * Data paths of copy(dst, src, stream), dst always device memory:
 *
 *   src on the device, contiguous, same dtype   -> a row of the batch table
 *                                                  (peer device: cudaMemcpyPeerAsync)
 *   src pinned, contiguous, >= h2d_min bytes    -> cudaMemcpyAsync (copy engine)
 *   src pinned, contiguous, smaller             -> a row of the batch table
 *   src device or pinned, strided or cast       -> the strided-copy kernel
 *   src pageable (CPU)                          -> memcpy into a pinned chunk of
 *                                                  the stream's ring (worker threads
 *                                                  for large pieces), then as pinned
 *   src pageable, contiguous, cast, <= a slice  -> the same, converted from the
 *                                                  ring by the copy kernel (deferred:
 *                                                  a BF16 scale does not stall the ring)
 *
 * Batched rows (src, dst, bytes) collect in a pinned table per stream and go
 * out as ONE kernel launch at flush (or when the table fills): the table is
 * copied to the device and the kernel copies every row, one block a row.
 * Each stream has two pinned tables used in turn, so a flush never rewrites
 * a table whose upload may still be in flight.
 *
 * Undo saves into device memory (the context's budget), of any size, and
 * saves into pinned memory smaller than save_min are rows of a separate
 * save table whose pending rows launch before the copy rows of the same
 * flush; larger pinned saves are one cudaMemcpyAsync each, issued at once
 * on the queue's save stream beside it (save_side), so the PCIe link
 * carries a save to the host while the copy of the tensor before it comes
 * in: the save stream first waits for the stream's work before the
 * update's first save, and the stream waits for each save's event before
 * anything issued after it (a marker among the deferred slices, when
 * slices of earlier tensors still wait to be issued).
 * Any copy the backend issues at once (memcpy, kernel, memset) first
 * launches the pending save rows (launch_saves: no table switch, no wait),
 * so a save always reads the bytes before the txn's first write to them.
 *
 * Contract (backend.h): a pageable src is consumed before copy() returns; a
 * device or pinned src must stay valid until the stream's flush + sync
 * (refit_finalize / refit_abort). Nothing here synchronizes the device:
 * only sync() waits, for one stream, and a host wait on an event happens
 * only when a pinned chunk or table is reused.
 *
 * Memory held: per stream a device table and two pinned tables
 * (2 x 2 x table_rows x 24 bytes), and, once a pageable source is seen,
 * ring_chunks x ring_chunk_bytes of pinned memory (on the device's NUMA
 * node when placed, below). Device staging blocks and
 * pinned undo chunks are kept for reuse up to staging_cache / undo_cache
 * bytes; beyond that they are freed. Staging in use is bounded by the
 * context's staging budget (the transaction checks it before allocating).
 *
 * The backend table has no context argument, so its state is one
 * process-wide object guarded by one mutex (the only global mutable state
 * in librefit; see docs/cuda.md).
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
#include "core/cuda/kern_cuda.h"
#include "core/cuda/placement.h"
#include "core/cuda/ring_trace.h"
#include "core/cuda/scatter.h"
#include "kernels/copy.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define MAX_QUEUES 64
#define MAX_DEVICES 64
#define MAX_RING 16
#define SAVE_EVENTS 64

/* ---- tunables (environment, read once) ---- */

#define D2D_MEMCPY_MIN (128 * MIB) /* device pieces and saves this large: cudaMemcpyAsync */

typedef struct cuda_cfg {
    uint32_t table_rows;        /* REFIT_CUDA_TABLE_ROWS */
    size_t row_max;             /* REFIT_CUDA_ROW_KB: a batched piece is split into rows */
    size_t h2d_min;             /* REFIT_CUDA_H2D_MIN_KB: pinned pieces to the copy engine */
    size_t d2d_memcpy_min;      /* REFIT_CUDA_D2D_MEMCPY_MIN_KB: 0 = always batch D2D */
    size_t save_min;            /* REFIT_CUDA_SAVE_MIN_KB: smaller saves are batched */
    size_t save_dev_memcpy_min; /* REFIT_CUDA_SAVE_DEV_MEMCPY_MIN_KB: 0 = batch every device save */
    int save_side;              /* REFIT_CUDA_SAVE_SIDE: large pinned saves on a stream beside */
    uint32_t ring_chunks;       /* REFIT_CUDA_RING_CHUNKS */
    size_t ring_chunk_bytes;    /* REFIT_CUDA_RING_CHUNK_MB */
    size_t staging_cache;       /* REFIT_CUDA_STAGING_CACHE_MB */
    size_t undo_cache;          /* REFIT_CUDA_UNDO_CACHE_MB */
    int threads;                /* REFIT_CUDA_COPY_THREADS */
    int populate;               /* REFIT_CUDA_POPULATE: prefault pageable sources */
    int batch_variant;          /* REFIT_CUDA_BATCH_VARIANT: batch kernel code path */
    int batch_grid;             /* REFIT_CUDA_BATCH_GRID: blocks of a batch launch, 0 = a row each */
    int table_upload;           /* REFIT_CUDA_TABLE_UPLOAD: copy tables to the device first */
    size_t flush_bytes;         /* REFIT_CUDA_FLUSH_MB: launch once this much is queued */
    uint64_t flush_growth;      /* REFIT_CUDA_FLUSH_GROWTH: and growth x what went before */
    int nt_stores;              /* REFIT_CUDA_NT_STORES: stream into pinned chunks */
    int defer;                  /* REFIT_CUDA_DEFER: read held sources after copy() returns */
    size_t defer_slice;         /* REFIT_CUDA_DEFER_SLICE_KB: a worker's unit of work */
    int time_dma;               /* REFIT_CUDA_TIME_DMA: time the ring's H2D copies (a bench's) */
    int drain_poll;             /* REFIT_CUDA_DRAIN_POLL: issue while a chunk drains */
    int caller_copies;          /* REFIT_CUDA_CALLER_COPIES: the caller copies slices too */
} cuda_cfg;

static size_t env_size(const char *name, size_t def, size_t unit, size_t lo, size_t hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || x > hi / unit || x * unit < lo)
        return def;
    return (size_t)x * unit;
}

static void cfg_load(cuda_cfg *c)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    /* MEASURED.md (16-core H200 VM): page cache -> pinned peaks at 12
     * threads (29-34 GB/s; 8: 26-29, 15: 24-37) */
    size_t def_threads = ncpu >= 14 ? 12 : ncpu > 2 ? (size_t)(ncpu > 9 ? 8 : ncpu - 1) : 1;
    c->table_rows = (uint32_t)env_size("REFIT_CUDA_TABLE_ROWS", 65536, 1, 64, 1u << 22);
    c->row_max = env_size("REFIT_CUDA_ROW_KB", 64 * KIB, KIB, 4 * KIB, 64 * MIB);
    c->h2d_min = env_size("REFIT_CUDA_H2D_MIN_KB", 64 * KIB, KIB, 0, SIZE_MAX / 2);
    /* a device piece this large goes to cudaMemcpyAsync, the driver's D2D copy
     * (~7% faster than the batch kernel: 1.40 against 1.51 ms for 3 GB), which
     * costs a gap of ~3 us a call: worth it from ~75 MB (docs/cuda.md) */
    c->d2d_memcpy_min = env_size("REFIT_CUDA_D2D_MEMCPY_MIN_KB", D2D_MEMCPY_MIN, KIB, 0,
                                 SIZE_MAX / 2);
    c->save_min = env_size("REFIT_CUDA_SAVE_MIN_KB", 64 * KIB, KIB, 0, SIZE_MAX / 2);
    c->save_dev_memcpy_min = env_size("REFIT_CUDA_SAVE_DEV_MEMCPY_MIN_KB", D2D_MEMCPY_MIN,
                                      KIB, 0, SIZE_MAX / 2);
    c->save_side = (int)env_size("REFIT_CUDA_SAVE_SIDE", 1, 1, 0, 1);
    c->ring_chunks = (uint32_t)env_size("REFIT_CUDA_RING_CHUNKS", 8, 1, 2, MAX_RING);
    c->ring_chunk_bytes = env_size("REFIT_CUDA_RING_CHUNK_MB", 16 * MIB, MIB, MIB, 4096 * MIB);
    c->staging_cache = env_size("REFIT_CUDA_STAGING_CACHE_MB", 1024 * MIB, MIB, 0, SIZE_MAX / 2);
    c->undo_cache = env_size("REFIT_CUDA_UNDO_CACHE_MB", 0, MIB, 0, SIZE_MAX / 2);
    c->threads = (int)env_size("REFIT_CUDA_COPY_THREADS", def_threads, 1, 0, 64);
    c->populate = (int)env_size("REFIT_CUDA_POPULATE", 1, 1, 0, 1);
    c->batch_variant = (int)env_size("REFIT_CUDA_BATCH_VARIANT", 1, 1, 0, 3);
    c->batch_grid = (int)env_size("REFIT_CUDA_BATCH_GRID", 0, 1, 0, 1 << 20);
    c->table_upload = (int)env_size("REFIT_CUDA_TABLE_UPLOAD", 0, 1, 0, 1);
    c->flush_bytes = env_size("REFIT_CUDA_FLUSH_MB", 64 * MIB, MIB, MIB, SIZE_MAX / 2);
    c->flush_growth = env_size("REFIT_CUDA_FLUSH_GROWTH", 2, 1, 1, 16);
    c->nt_stores = (int)env_size("REFIT_CUDA_NT_STORES", 0, 1, 0, 1);
    c->defer = (int)env_size("REFIT_CUDA_DEFER", 1, 1, 0, 1);
    c->defer_slice = env_size("REFIT_CUDA_DEFER_SLICE_KB", 2 * MIB, KIB, 64 * KIB, 64 * MIB);
    c->time_dma = (int)env_size("REFIT_CUDA_TIME_DMA", 0, 1, 0, 1);
    c->drain_poll = (int)env_size("REFIT_CUDA_DRAIN_POLL", 1, 1, 0, 1);
    c->caller_copies = (int)env_size("REFIT_CUDA_CALLER_COPIES", 0, 1, 0, 1);
    kern_copy_batch_variant(c->batch_variant, c->batch_grid);
    ring_trace_init();
    c->row_max &= ~(size_t)15; /* rows keep their pointers' alignment */
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- errors ---- */

static _Thread_local char last_error[512];

const char *backend_cuda_last_error(void)
{
    return last_error;
}

static int cu_fail(cudaError_t e, const char *what)
{
    snprintf(last_error, sizeof last_error, "CUDA backend: %s: %s (%s)", what,
             cudaGetErrorString(e), cudaGetErrorName(e));
    return e == cudaErrorMemoryAllocation ? REFIT_ENOMEM : REFIT_EINTERNAL;
}

/* A kernel wrapper failed: keep its message. */
static int kern_fail(int rc)
{
    snprintf(last_error, sizeof last_error, "CUDA backend: %s", kern_cuda_last_error());
    return rc;
}

static int fail(int rc, const char *what)
{
    snprintf(last_error, sizeof last_error, "CUDA backend: %s", what);
    return rc;
}

/* ---- process-wide state ---- */

/* A pinned chunk of a stream's ring, for pageable sources. */
typedef struct pchunk {
    char *p;                    /* host pointer */
    size_t mapped;              /* mmap'd and registered (placed ring); 0: cudaHostAlloc */
    char *dev;                  /* the same memory as the device addresses it */
    size_t used;
    cudaEvent_t ev;             /* after the last work that reads the chunk */
    bool recorded;
    bool in_table;              /* rows reading it wait in the current table */
} pchunk;

/* One of a stream's two pinned tables: save rows then copy rows. */
typedef struct table {
    kern_batch_row *rows;       /* 2 * table_rows: saves at 0, copies at table_rows */
    kern_batch_row *dev;        /* the same pinned memory, as the device reads it */
    uint32_t n_save, n_copy;
    uint32_t save_launched;     /* save rows [0, this) are launched already */
    uint64_t copy_bytes;        /* bytes the copy rows move */
    cudaEvent_t done;           /* after the kernels that read this table */
    bool recorded;
} table;

typedef struct cq {
    void *stream;
    int device;
    table tb[2];
    int cur;
    kern_batch_row *dev_rows;   /* the device copy of a table (table_upload) */
    pchunk ring[MAX_RING];
    uint32_t ring_cur;
    uint64_t launched;          /* copy bytes launched since the last sync */
    cudaStream_t side;          /* large pinned undo saves (save_side), or NULL */
    cudaEvent_t fork;           /* the stream's work before the first save */
    bool forked;                /*   is what side waits for, until the next sync */
    cudaEvent_t save_ev[SAVE_EVENTS]; /* after a save on side */
    uint64_t save_mark[SAVE_EVENTS];  /* its marker's slice index + 1 (0: waited) */
    uint32_t save_next;
} cq;

/* A cached allocation (device staging or pinned undo). */
typedef struct blk {
    struct blk *next;
    void *p;
    size_t size;
    int device;
    bool busy;
} blk;

typedef struct pool {
    blk *list;
    size_t cached;              /* bytes of blocks not busy */
    bool pinned;
} pool;

static struct {
    pthread_once_t once;
    pthread_mutex_t mu;
    cuda_cfg cfg;
    int ndev;
    bool host_ptr_is_dev;       /* pinned host memory has the same device address */
    char why[384];              /* why no device can be used */
    cq *q[MAX_QUEUES];
    int nq;
    pool staging, undo;
    backend_cuda_stats stats;
    backend_cuda_allocs allocs;
    int defer_err;              /* a deferred slice failed; flush/sync/hold report it */
} G = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER,
       .undo = {.pinned = true}};

static void probe(void)
{
    cfg_load(&G.cfg);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(G.why, sizeof G.why, "the CUDA runtime found no usable device: %s (%s)",
                 cudaGetErrorString(e), cudaGetErrorName(e));
        (void)cudaGetLastError();
        return;
    }
    if (n == 0) {
        snprintf(G.why, sizeof G.why, "the CUDA runtime found no device");
        return;
    }
    int uva = 0, reg = 0;
    if (cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&reg, cudaDevAttrCanUseHostPointerForRegisteredMem, 0) !=
            cudaSuccess)
        (void)cudaGetLastError();
    G.host_ptr_is_dev = uva != 0;
    G.ndev = n;
}

const backend *backend_cuda_get(void)
{
    pthread_once(&G.once, probe);
    return G.ndev > 0 ? &backend_cuda : NULL;
}

const char *backend_cuda_unavailable(void)
{
    pthread_once(&G.once, probe);
    return G.why;
}

int backend_cuda_device_count(void)
{
    pthread_once(&G.once, probe);
    return G.ndev;
}

static void dma_timing_resolve(void);

void backend_cuda_allocs_get(backend_cuda_allocs *out)
{
    pthread_mutex_lock(&G.mu);
    *out = G.allocs;
    pthread_mutex_unlock(&G.mu);
}

void backend_cuda_stats_get(backend_cuda_stats *out)
{
    pthread_mutex_lock(&G.mu);
    dma_timing_resolve();
    *out = G.stats;
    out->queues = (uint64_t)G.nq;
    pthread_mutex_unlock(&G.mu);
}

static void defer_settle_all(void);

static void lock_raw(void)
{
    pthread_once(&G.once, probe);
    pthread_mutex_lock(&G.mu);
}

/* Every entry point but a deferrable copy: deferred slices go out first,
 * so the caller's stream order holds. */
static void lock(void)
{
    lock_raw();
    defer_settle_all();
}

static void unlock(void)
{
    pthread_mutex_unlock(&G.mu);
}

/* ---- current device ---- */

typedef struct devg {
    int prev;
    bool changed;
} devg;

static int dev_enter(devg *g, int dev)
{
    g->changed = false;
    cudaError_t e = cudaGetDevice(&g->prev);
    if (e == cudaSuccess && g->prev != dev) {
        e = cudaSetDevice(dev);
        g->changed = e == cudaSuccess;
    }
    return e == cudaSuccess ? REFIT_OK : cu_fail(e, "selecting the device");
}

static void dev_leave(const devg *g)
{
    if (g->changed)
        (void)cudaSetDevice(g->prev);
}

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

typedef struct dslice {
    char *dst;
    const char *src;
    char *pin;
    size_t bytes;
    uint32_t chunk;
    uint32_t call;              /* the copy() it came from: runs never join two calls,
                                 * whose destinations may be separate allocations */
    bool cast;                  /* the whole piece, converted from sdt to ddt on the device */
    refit_dtype sdt, ddt;
    int filled;                 /* SL_*: FILLED set by the worker that copied it (release) */
    cudaEvent_t wait;           /* a marker (no bytes): the stream waits for this
                                 * save's event here, in slice order */
} dslice;

#define DEFER_CAP 4096u

/* A slice's state: published (again once issued: its slot is free), or
 * copied into the ring by a worker (a marker too, with nothing to copy). */
#define SL_QUEUED 0
#define SL_FILLED 1

static struct {
    void *hold;                 /* the stream held (G.mu) */
    bool held;
    cq *q;                      /* the queue whose slices are in flight (G.mu) */
    dslice s[DEFER_CAP];
    uint64_t head;              /* slices published (written by the caller, read by workers) */
    uint64_t next_fill;         /* next slice a worker takes (CAS) */
    uint64_t issued;            /* slices issued (caller only) */
    uint32_t cur;               /* ring chunk being filled, and its fill mark */
    size_t used;
    uint32_t pending[MAX_RING]; /* slices placed in a chunk and not issued yet */
    uint32_t calls;             /* copy() calls deferred */
    int workers;                /* worker threads running */
    int err;                    /* the first failure; the rest is drained, not issued */
} D;

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
static void par_memcpy(void *d, const void *s, size_t n)
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

/* ---- queues: per (stream, device) ---- */

static void chunk_release(pchunk *c)
{
    if (c->mapped) {
        cudaHostUnregister(c->p);
        munmap(c->p, c->mapped);
    } else {
        cudaFreeHost(c->p);
    }
    c->p = NULL;
    c->mapped = 0;
}

static void queue_free(cq *q)
{
    if (q->side) {
        cudaStreamDestroy(q->side);
        cudaEventDestroy(q->fork);
        for (uint32_t i = 0; i < SAVE_EVENTS; i++)
            if (q->save_ev[i])
                cudaEventDestroy(q->save_ev[i]);
    }
    for (int i = 0; i < 2; i++) {
        if (q->tb[i].rows)
            cudaFreeHost(q->tb[i].rows);
        if (q->tb[i].done)
            cudaEventDestroy(q->tb[i].done);
    }
    if (q->dev_rows)
        cudaFree(q->dev_rows);
    for (uint32_t i = 0; i < MAX_RING; i++) {
        if (q->ring[i].p)
            chunk_release(&q->ring[i]);
        if (q->ring[i].ev)
            cudaEventDestroy(q->ring[i].ev);
    }
    free(q);
}

static int queue_new(cq **out, void *stream, int device)
{
    size_t bytes = (size_t)G.cfg.table_rows * 2 * sizeof(kern_batch_row);
    cq *q = calloc(1, sizeof *q);
    if (!q)
        return fail(REFIT_ENOMEM, "out of memory for a stream queue");
    q->stream = stream;
    q->device = device;
    cudaError_t e = G.cfg.table_upload ? cudaMalloc((void **)&q->dev_rows, bytes) : cudaSuccess;
    for (int i = 0; i < 2 && e == cudaSuccess; i++) {
        e = cudaHostAlloc((void **)&q->tb[i].rows, bytes,
                          cudaHostAllocPortable | cudaHostAllocMapped);
        if (e == cudaSuccess)
            e = cudaHostGetDevicePointer((void **)&q->tb[i].dev, q->tb[i].rows, 0);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&q->tb[i].done, cudaEventDisableTiming);
    }
    if (e != cudaSuccess) {
        queue_free(q);
        return cu_fail(e, "allocating the batch tables of a stream");
    }
    G.allocs.queues++;
    *out = q;
    return REFIT_OK;
}

/* The queue of (stream, device), created on first use (G.mu held). */
static int queue_get(cq **out, void *stream, int device)
{
    for (int i = 0; i < G.nq; i++)
        if (G.q[i]->stream == stream && G.q[i]->device == device) {
            *out = G.q[i];
            return REFIT_OK;
        }
    if (G.nq == MAX_QUEUES)
        return fail(REFIT_EBUDGET, "more than 64 (stream, device) pairs used");
    int rc = queue_new(out, stream, device);
    if (!rc)
        G.q[G.nq++] = *out;
    return rc;
}

/* The device a save or restore on stream works for: the device of a queue
 * already on that stream, else the current one. */
static int stream_device(void *stream)
{
    for (int i = 0; i < G.nq; i++)
        if (G.q[i]->stream == stream)
            return G.q[i]->device;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess)
        (void)cudaGetLastError();
    return dev;
}

/* Launch the save rows of the current table not launched yet, as one
 * kernel, without switching tables: rows appended later go past them, so
 * nothing rewrites what this launch reads. The caller has made q's device
 * current. */
static int launch_saves(cq *q)
{
    table *t = &q->tb[q->cur];
    uint32_t from = t->save_launched, n = t->n_save - from;
    if (n == 0)
        return REFIT_OK;
    t->save_launched = t->n_save; /* a failed launch is reported once, not retried */
    cudaStream_t st = (cudaStream_t)q->stream;
    const kern_batch_row *rows = t->dev + from;
    if (G.cfg.table_upload) {
        rows = q->dev_rows + from;
        cudaError_t e = cudaMemcpyAsync(q->dev_rows + from, t->rows + from, n * sizeof *t->rows,
                                        cudaMemcpyHostToDevice, st);
        if (e != cudaSuccess)
            return cu_fail(e, "uploading a batch table");
    }
    int rc = kern_copy_batch_cuda(rows, n, st);
    if (rc)
        return kern_fail(rc);
    G.stats.batch_launches++;
    G.stats.batch_rows += n;
    return REFIT_OK;
}

/* Launch what the current table holds: saves first (those not launched
 * yet), then copies. The kernels read the rows straight from the pinned
 * table (or, with table_upload, from a device copy of it). The caller has
 * made q's device current. */
static int queue_flush(cq *q)
{
    table *t = &q->tb[q->cur];
    if (t->n_save == 0 && t->n_copy == 0)
        return REFIT_OK;
    cudaStream_t st = (cudaStream_t)q->stream;
    uint32_t cap = G.cfg.table_rows, n_copy = t->n_copy;
    int rc = launch_saves(q);
    t->n_save = t->save_launched = t->n_copy = 0; /* a failure is reported once */
    q->launched += t->copy_bytes;
    t->copy_bytes = 0;
    if (rc)
        return rc;
    const kern_batch_row *rows = t->dev;
    cudaError_t e = cudaSuccess;
    if (G.cfg.table_upload) {
        rows = q->dev_rows;
        if (n_copy)
            e = cudaMemcpyAsync(q->dev_rows + cap, t->rows + cap, n_copy * sizeof *t->rows,
                                cudaMemcpyHostToDevice, st);
        if (e != cudaSuccess)
            return cu_fail(e, "uploading a batch table");
    }
    rc = kern_copy_batch_cuda(rows + cap, n_copy, st);
    if (rc)
        return kern_fail(rc);
    if ((e = cudaEventRecord(t->done, st)) != cudaSuccess)
        return cu_fail(e, "recording a batch table's event");
    t->recorded = true;
    G.stats.batch_launches += n_copy > 0;
    G.stats.batch_rows += n_copy;
    for (uint32_t i = 0; i < G.cfg.ring_chunks; i++) {
        pchunk *c = &q->ring[i];
        if (!c->in_table)
            continue;
        if ((e = cudaEventRecord(c->ev, st)) != cudaSuccess)
            return cu_fail(e, "recording a pinned chunk's event");
        c->in_table = false;
        c->recorded = true;
    }
    /* the other table is next: the kernels that read it must be done */
    q->cur ^= 1;
    table *n = &q->tb[q->cur];
    if (n->recorded && (e = cudaEventSynchronize(n->done)) != cudaSuccess)
        return cu_fail(e, "waiting for a batch table");
    n->recorded = false;
    return REFIT_OK;
}

/* Work issued now (not batched) must come after pending saves: they go
 * out as one launch, the copy rows stay queued and the table stays. */
static int before_immediate(cq *q)
{
    return launch_saves(q);
}

/* Append rows for a contiguous piece, split at row_max. */
static int queue_rows(cq *q, bool save, uint64_t dst, uint64_t src, uint64_t bytes)
{
    uint32_t cap = G.cfg.table_rows;
    for (uint64_t off = 0; off < bytes; off += G.cfg.row_max) {
        table *t = &q->tb[q->cur];
        uint32_t *n = save ? &t->n_save : &t->n_copy;
        if (*n == cap) {
            int rc = queue_flush(q);
            if (rc)
                return rc;
            t = &q->tb[q->cur];
            n = save ? &t->n_save : &t->n_copy;
        }
        uint64_t len = bytes - off < G.cfg.row_max ? bytes - off : G.cfg.row_max;
        t->rows[(save ? 0 : cap) + (*n)++] = (kern_batch_row){src + off, dst + off, len};
        if (!save && (t->copy_bytes += len) >= G.cfg.flush_bytes &&
            t->copy_bytes >= q->launched * G.cfg.flush_growth) {
            /* the device starts on the first flush_bytes while the host goes
             * on routing; each launch after that is flush_growth times as
             * large as all before it, so launches stay few (each one's tail
             * leaves SMs idle) and each fills the device */
            int rc = queue_flush(q);
            if (rc)
                return rc;
        }
    }
    return REFIT_OK;
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

static int chunk_init(cq *q, pchunk *c)
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
static int ring_take(cq *q, size_t want, uint64_t align_to, pchunk **oc, char **op)
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

static int chunk_mark(pchunk *c, cudaStream_t st)
{
    cudaError_t e = cudaEventRecord(c->ev, st);
    if (e != cudaSuccess)
        return cu_fail(e, "recording a pinned chunk's event");
    c->recorded = true;
    return REFIT_OK;
}

/* ---- deferred pageable reads: the caller's side (G.mu held) ---- */

static int memcpy_now(cq *q, void *dst, const void *src, size_t n);
static int kernel_now(cq *q, const refit_view *dst, const refit_view *src);

/* Wake sleeping workers after publishing slices. */
static void defer_wake(void)
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

static void dma_timing_resolve(void)
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
            refit_view dv = {.data = x->dst, .device = {REFIT_DEVICE_CUDA, q->device},
                             .dtype = x->ddt, .ndim = 1,
                             .shape = {(int64_t)(bytes / kern_dtype_size(x->sdt))},
                             .strides = {1}};
            refit_view sv = dv;
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
static void defer_wait_issued(uint64_t upto)
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
 * within a slice and a chunk. */
static int defer_queue(cq *q, char *dst, const char *src, size_t bytes, const refit_dtype *cast)
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
        *x = (dslice){dst + off, src + off, c->p + D.used, n, D.cur, call, cast != NULL,
                      cast ? cast[0] : (refit_dtype){0}, cast ? cast[1] : (refit_dtype){0}, 0,
                      NULL};
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

static void defer_settle_all(void)
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

static int cuda_hold_host_sources(void *stream, int on)
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

/* ---- views ---- */

/* 1 when v's elements are one contiguous run (row-major, no gaps). */
static bool view_contiguous(const refit_view *v)
{
    int64_t expect = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[i] != 1 && v->strides[i] != expect)
            return false;
        expect *= v->shape[i];
    }
    return true;
}

/* The device address of pinned host memory, or NULL when p is not pinned
 * (then it is treated as pageable). */
static void *pinned_dev(const void *p)
{
    void *d = NULL;
    if (cudaHostGetDevicePointer(&d, (void *)p, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return d;
}

/* ---- copy ---- */

static int check_pair(const refit_view *dst, const refit_view *src)
{
    char m[160];
    if (dst->device.device_type != REFIT_DEVICE_CUDA) {
        snprintf(m, sizeof m, "destination on device type %d is not device memory",
                 dst->device.device_type);
        return fail(REFIT_EUNSUPPORTED, m);
    }
    if (dst->ndim != src->ndim)
        return fail(REFIT_EMISMATCH, "copy between views of different ranks");
    for (int i = 0; i < dst->ndim; i++)
        if (dst->shape[i] != src->shape[i])
            return fail(REFIT_EMISMATCH, "copy between views of different shapes");
    if (!kern_can_cast(dst->dtype, src->dtype)) {
        snprintf(m, sizeof m, "no copy from %s to %s", refit_dtype_name(src->dtype),
                 refit_dtype_name(dst->dtype));
        return fail(REFIT_EUNSUPPORTED, m);
    }
    return REFIT_OK;
}

static int memcpy_now(cq *q, void *dst, const void *src, size_t n)
{
    int rc = before_immediate(q);
    if (rc)
        return rc;
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, (cudaStream_t)q->stream);
    if (e != cudaSuccess)
        return cu_fail(e, "cudaMemcpyAsync");
    G.stats.memcpy_calls++;
    return REFIT_OK;
}

static int kernel_now(cq *q, const refit_view *dst, const refit_view *src)
{
    int rc = before_immediate(q);
    if (!rc && (rc = kern_copy_cuda(dst, src, q->stream)))
        return kern_fail(rc);
    G.stats.kernel_copies++;
    return rc;
}

/* src is readable by the device at sdev (device memory or mapped pinned). */
static int copy_direct(cq *q, const refit_view *dst, const refit_view *src, void *sdev)
{
    if (!kern_dtype_eq(dst->dtype, src->dtype) || !view_contiguous(dst) ||
        !view_contiguous(src)) {
        refit_view s = *src;
        s.data = sdev;
        return kernel_now(q, dst, &s);
    }
    size_t bytes = (size_t)kern_view_numel(dst) * kern_dtype_size(dst->dtype);
    bool host = src->device.device_type != REFIT_DEVICE_CUDA;
    if (!host && src->device.device_id != dst->device.device_id) {
        int rc = before_immediate(q);
        cudaError_t e = rc ? cudaSuccess
                           : cudaMemcpyPeerAsync(dst->data, dst->device.device_id, src->data,
                                                 src->device.device_id, bytes,
                                                 (cudaStream_t)q->stream);
        if (e != cudaSuccess)
            return cu_fail(e, "cudaMemcpyPeerAsync");
        G.stats.memcpy_calls += !rc;
        return rc;
    }
    if (host ? bytes >= G.cfg.h2d_min : G.cfg.d2d_memcpy_min && bytes >= G.cfg.d2d_memcpy_min)
        return memcpy_now(q, dst->data, host ? src->data : sdev, bytes);
    return queue_rows(q, false, (uint64_t)(uintptr_t)dst->data, (uint64_t)(uintptr_t)sdev,
                      bytes);
}

/* A contiguous pageable piece: through the ring, pipelined chunk by chunk
 * (the host fills chunk k+1 while the copy engine drains chunk k). */
static int pageable_contig(cq *q, char *dst, const char *src, size_t bytes)
{
    size_t most = G.cfg.ring_chunk_bytes - 16;
    for (size_t off = 0; off < bytes;) {
        size_t piece = bytes - off < most ? bytes - off : most;
        pchunk *c;
        char *p;
        int rc = ring_take(q, piece, (uint64_t)(uintptr_t)(dst + off), &c, &p);
        if (rc)
            return rc;
        uint64_t t0 = now_ns();
        par_memcpy(p, src + off, piece);
        G.stats.host_copy_ns += now_ns() - t0;
        G.stats.pageable_bytes += piece;
        if (piece >= G.cfg.h2d_min) {
            rc = memcpy_now(q, dst + off, p, piece);
            if (!rc)
                rc = chunk_mark(c, (cudaStream_t)q->stream);
        } else {
            c->in_table = true; /* before the rows: queue_rows may flush */
            rc = queue_rows(q, false, (uint64_t)(uintptr_t)(dst + off),
                            (uint64_t)(uintptr_t)(c->dev + (p - c->p)), piece);
        }
        if (rc)
            return rc;
        off += piece;
    }
    return REFIT_OK;
}

/* One tile of a strided or cast pageable copy: gathered into a pinned
 * chunk on the host, then copied (and cast) from there on the device. */
static int pageable_tile(cq *q, const refit_view *dst, const refit_view *src)
{
    size_t bytes = (size_t)kern_view_numel(src) * kern_dtype_size(src->dtype);
    pchunk *c;
    char *p;
    int rc = ring_take(q, bytes, 0, &c, &p);
    if (rc)
        return rc;
    refit_view ph = *src;
    ph.data = p;
    ph.device = (refit_device){REFIT_DEVICE_CPU, 0};
    int64_t s = 1;
    for (int i = src->ndim - 1; i >= 0; i--) {
        ph.strides[i] = s;
        s *= src->shape[i];
    }
    if (view_contiguous(src))
        par_memcpy(p, src->data, bytes);
    else if ((rc = kern_copy(&ph, src)))
        return fail(rc, "gathering a pageable tile");
    G.stats.pageable_bytes += bytes;
    ph.data = c->dev + (p - c->p);
    ph.device = (refit_device){REFIT_DEVICE_CUDA_HOST, 0};
    rc = kernel_now(q, dst, &ph);
    return rc ? rc : chunk_mark(c, (cudaStream_t)q->stream);
}

/* A sub-view: dims [k, nd) of v at outer index idx[0..k) and rows
 * [j, j + rows) of dim k. */
static refit_view sub_view(const refit_view *v, const int64_t *idx, int k, int64_t j,
                           int64_t rows)
{
    refit_view t = *v;
    int64_t off = j * v->strides[k];
    for (int i = 0; i < k; i++)
        off += idx[i] * v->strides[i];
    t.data = (char *)v->data + off * (int64_t)kern_dtype_size(v->dtype);
    t.ndim = v->ndim - k;
    for (int i = k; i < v->ndim; i++) {
        t.shape[i - k] = v->shape[i];
        t.strides[i - k] = v->strides[i];
    }
    t.shape[0] = rows;
    return t;
}

/* Split a strided/cast pageable copy into tiles that fit a chunk: whole
 * inner dims, blocks of rows of the first dim that fits. */
static int pageable_tiles(cq *q, const refit_view *dst, const refit_view *src)
{
    int nd = dst->ndim;
    if (nd == 0)
        return pageable_tile(q, dst, src);
    size_t se = kern_dtype_size(src->dtype), cap = G.cfg.ring_chunk_bytes - 16;
    int k = 0;
    int64_t inner = kern_view_numel(src) / src->shape[0];
    while ((size_t)inner * se > cap) { /* k < nd - 1 here: one element fits */
        k++;
        inner /= src->shape[k];
    }
    int64_t rows = (int64_t)(cap / ((size_t)inner * se));
    int64_t idx[REFIT_MAX_DIMS] = {0};
    for (;;) {
        for (int64_t j = 0; j < dst->shape[k]; j += rows) {
            int64_t r = dst->shape[k] - j < rows ? dst->shape[k] - j : rows;
            refit_view dt = sub_view(dst, idx, k, j, r), st = sub_view(src, idx, k, j, r);
            int rc = pageable_tile(q, &dt, &st);
            if (rc)
                return rc;
        }
        int i = k - 1;
        for (; i >= 0; i--) {
            if (++idx[i] < dst->shape[i])
                break;
            idx[i] = 0;
        }
        if (i < 0)
            return REFIT_OK;
    }
}

static int copy_pageable(cq *q, const refit_view *dst, const refit_view *src)
{
    if (kern_dtype_eq(dst->dtype, src->dtype) && view_contiguous(dst) && view_contiguous(src))
        return pageable_contig(q, dst->data, src->data,
                               (size_t)kern_view_numel(dst) * kern_dtype_size(dst->dtype));
    return pageable_tiles(q, dst, src);
}

static int cuda_copy(const refit_view *dst, const refit_view *src, void *stream)
{
    int rc = check_pair(dst, src);
    if (rc || kern_view_numel(dst) == 0)
        return rc;
    lock_raw(); /* a deferrable copy must not settle the slices before it */
    devg g;
    cq *q;
    rc = dev_enter(&g, dst->device.device_id);
    if (!rc) {
        rc = queue_get(&q, stream, dst->device.device_id);
        if (!rc) {
            void *sdev = NULL;
            if (src->device.device_type == REFIT_DEVICE_CUDA)
                sdev = src->data;
            else if (src->device.device_type == REFIT_DEVICE_CUDA_HOST)
                sdev = pinned_dev(src->data); /* NULL: not pinned after all */
            /* a contiguous pageable piece inside a hold joins the ring; a
             * cast one too when it fits one slice of one chunk */
            bool ring = !sdev && D.held && D.hold == stream && (!D.q || D.q == q) &&
                        view_contiguous(dst) && view_contiguous(src);
            bool same = kern_dtype_eq(dst->dtype, src->dtype);
            size_t sbytes = (size_t)kern_view_numel(src) * kern_dtype_size(src->dtype);
            if (ring && same)
                rc = defer_queue(q, dst->data, src->data, sbytes, NULL);
            else if (ring && sbytes <= G.cfg.defer_slice && sbytes + 64 <= G.cfg.ring_chunk_bytes)
                rc = defer_queue(q, dst->data, src->data, sbytes,
                                 (refit_dtype[2]){src->dtype, dst->dtype});
            else {
                defer_settle_all();
                rc = sdev ? copy_direct(q, dst, src, sdev) : copy_pageable(q, dst, src);
            }
        }
        dev_leave(&g);
    }
    unlock();
    return rc;
}

static int cuda_can_read(refit_device src)
{
    return src.device_type == REFIT_DEVICE_CUDA || src.device_type == REFIT_DEVICE_CUDA_HOST ||
           src.device_type == REFIT_DEVICE_CPU;
}

/* ---- flush, sync ---- */

/* Flush (and with wait, synchronize) every queue on stream. */
static int streams_drain(void *stream, bool wait)
{
    int first = REFIT_OK;
    bool any = false;
    lock();
    for (int i = 0; i < G.nq; i++) {
        cq *q = G.q[i];
        if (q->stream != stream)
            continue;
        any = true;
        devg g;
        int rc = dev_enter(&g, q->device);
        if (!rc) {
            rc = queue_flush(q);
            cudaError_t e = wait ? cudaStreamSynchronize((cudaStream_t)stream) : cudaSuccess;
            if (wait) {
                q->launched = 0;
                q->forked = false; /* the stream waited for every save */
            }
            if (!rc && e != cudaSuccess)
                rc = cu_fail(e, "cudaStreamSynchronize");
            dev_leave(&g);
        }
        if (rc && !first)
            first = rc;
    }
    if (!any && wait) {
        cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
        if (e != cudaSuccess)
            first = cu_fail(e, "cudaStreamSynchronize");
    }
    if (G.defer_err && !first)
        first = G.defer_err;
    G.defer_err = 0;
    unlock();
    return first;
}

static int cuda_flush(void *stream)
{
    return streams_drain(stream, false);
}

static int cuda_sync(void *stream)
{
    return streams_drain(stream, true);
}

/* ---- zero, fingerprint ---- */

static int cuda_zero(const refit_view *dst, void *stream)
{
    if (dst->device.device_type != REFIT_DEVICE_CUDA)
        return fail(REFIT_EUNSUPPORTED, "zero: destination is not device memory");
    if (kern_view_numel(dst) == 0)
        return REFIT_OK;
    lock();
    devg g;
    cq *q;
    int rc = dev_enter(&g, dst->device.device_id);
    if (!rc) {
        rc = queue_get(&q, stream, dst->device.device_id);
        if (!rc)
            rc = before_immediate(q);
        if (!rc && (rc = kern_zero_cuda(dst, stream)))
            rc = kern_fail(rc);
        dev_leave(&g);
    }
    unlock();
    return rc;
}

static int cuda_fingerprint(const refit_view *v, uint64_t *out, void *stream)
{
    lock();
    devg g;
    int rc = dev_enter(&g, v->device.device_id);
    if (!rc) {
        for (int i = 0; i < G.nq && !rc; i++)
            if (G.q[i]->stream == stream && G.q[i]->device == v->device.device_id)
                rc = queue_flush(G.q[i]); /* queued copies land first */
        if (!rc && (rc = kern_fingerprint_view_cuda(v, out, stream)))
            rc = kern_fail(rc);
        dev_leave(&g);
    }
    unlock();
    return rc;
}

/* ---- the GPU service's device work ---- */

/* Device work of the GPU service (core/cuda/gpu_service.c) on device dev,
 * ordered on stream after the staged copies and undo saves queued there. */
int backend_cuda_run(int dev, void *stream, int (*launch)(void *arg, void *stream), void *arg)
{
    if (dev < 0 || dev >= MAX_DEVICES)
        return fail(REFIT_EINVAL, "no such device");
    lock();
    devg g;
    cq *qq;
    int rc = dev_enter(&g, dev);
    if (!rc) {
        rc = queue_get(&qq, stream, dev);
        if (!rc)
            rc = queue_flush(qq);
        if (!rc && (rc = launch(arg, stream)))
            rc = kern_fail(rc);
        dev_leave(&g);
    }
    unlock();
    return rc;
}

/* ---- cached allocations: device staging, pinned undo ---- */

static cudaError_t blk_release(const pool *pl, blk *b)
{
    if (pl->pinned)
        return cudaFreeHost(b->p);
    devg g;
    if (dev_enter(&g, b->device))
        return cudaErrorInvalidDevice;
    cudaError_t e = cudaFree(b->p);
    dev_leave(&g);
    return e;
}

/* Free idle blocks, largest first, until at most cap bytes stay cached. */
static void pool_trim(pool *pl, size_t cap)
{
    while (pl->cached > cap) {
        blk **best = NULL;
        for (blk **pp = &pl->list; *pp; pp = &(*pp)->next)
            if (!(*pp)->busy && (!best || (*pp)->size > (*best)->size))
                best = pp;
        if (!best)
            return;
        blk *b = *best;
        *best = b->next;
        pl->cached -= b->size;
        if (blk_release(pl, b) != cudaSuccess)
            (void)cudaGetLastError();
        free(b);
    }
}

/* A new block; *other_addr: pinned memory whose device address differs
 * (saves then go by cudaMemcpyAsync). Called without the backend's lock,
 * in relaxed capture mode: a thread pinning GBs (core/undo.c's
 * reservation) must neither stall the backend's other callers nor break
 * an engine's CUDA graph capture on another thread (cudaMalloc and
 * cudaHostAlloc are unsafe calls under global capture mode). */
static cudaError_t blk_alloc(const pool *pl, void **p, size_t size, bool *other_addr)
{
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    bool relaxed = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
    cudaError_t e;
    *other_addr = false;
    if (!pl->pinned) {
        e = cudaMalloc(p, size);
    } else {
        e = cudaHostAlloc(p, size, cudaHostAllocPortable | cudaHostAllocMapped);
        void *d = NULL;
        if (e == cudaSuccess && (cudaHostGetDevicePointer(&d, *p, 0) != cudaSuccess || d != *p)) {
            (void)cudaGetLastError();
            *other_addr = true;
        }
    }
    if (relaxed)
        (void)cudaThreadExchangeStreamCaptureMode(&mode);
    return e;
}

static void *pool_alloc(pool *pl, size_t bytes)
{
    size_t need = ((bytes ? bytes : 1) + 2 * MIB - 1) & ~(2 * MIB - 1);
    int dev = -1;
    lock_raw(); /* an allocation orders nothing: deferred slices stay queued */
    if (!pl->pinned && cudaGetDevice(&dev) != cudaSuccess)
        (void)cudaGetLastError();
    blk *best = NULL;
    for (blk *b = pl->list; b; b = b->next)
        if (!b->busy && b->device == dev && b->size >= need && b->size / 2 <= need &&
            (!best || b->size < best->size))
            best = b;
    void *p = NULL;
    if (best) {
        best->busy = true;
        pl->cached -= best->size;
        p = best->p;
        unlock();
        return p;
    }
    unlock(); /* the allocation itself outside the lock (blk_alloc) */
    blk *b = malloc(sizeof *b);
    bool other_addr = false;
    cudaError_t e = b ? blk_alloc(pl, &p, need, &other_addr) : cudaErrorMemoryAllocation;
    if (b && e == cudaErrorMemoryAllocation) { /* give the cache back, try again */
        (void)cudaGetLastError();
        lock_raw();
        pool_trim(pl, 0);
        unlock();
        e = blk_alloc(pl, &p, need, &other_addr);
    }
    lock_raw();
    if (e != cudaSuccess) {
        cu_fail(e, pl->pinned ? "cudaHostAlloc (undo log)" : "cudaMalloc (staging)");
        free(b);
        p = NULL;
    } else {
        if (other_addr)
            G.host_ptr_is_dev = false;
        *b = (blk){pl->list, p, need, dev, true};
        pl->list = b;
        if (pl->pinned) {
            G.allocs.undo_pinned++;
            G.allocs.undo_pinned_bytes += need;
        } else {
            G.allocs.staging++;
        }
    }
    unlock();
    return p;
}

static void pool_free(pool *pl, void *p, size_t cache_cap)
{
    if (!p)
        return;
    lock();
    for (blk *b = pl->list; b; b = b->next)
        if (b->p == p && b->busy) {
            b->busy = false;
            pl->cached += b->size;
            break;
        }
    pool_trim(pl, cache_cap);
    unlock();
}

static void *cuda_staging_alloc(size_t bytes)
{
    return pool_alloc(&G.staging, bytes);
}

static void cuda_staging_free(void *p)
{
    pool_free(&G.staging, p, G.cfg.staging_cache);
}

static void *cuda_undo_alloc(size_t bytes)
{
    return pool_alloc(&G.undo, bytes);
}

static void cuda_undo_free(void *p)
{
    pool_free(&G.undo, p, G.cfg.undo_cache);
}

/* ---- undo: save (async, on stream), restore (blocking) ---- */

/* A save reads only its own region and writes only its fresh undo memory,
 * so it may go before save rows still pending (memcpy_now would flush
 * them and wait for the other table: a host wait per tensor when small
 * and large saves alternate). It still follows every write issued
 * earlier on the stream. */
static int save_now(cq *q, void *dst, const void *src, size_t n)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, (cudaStream_t)q->stream);
    if (e != cudaSuccess)
        return cu_fail(e, "cudaMemcpyAsync (undo save)");
    G.stats.memcpy_calls++;
    return REFIT_OK;
}

/* The save stream of q, made at its first use. */
static int side_init(cq *q)
{
    if (q->side)
        return REFIT_OK;
    cudaError_t e = cudaStreamCreateWithFlags(&q->side, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&q->fork, cudaEventDisableTiming);
    for (uint32_t i = 0; i < SAVE_EVENTS && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&q->save_ev[i], cudaEventDisableTiming);
    if (e == cudaSuccess) {
        G.allocs.side_streams++;
        return REFIT_OK;
    }
    int rc = cu_fail(e, "making the undo save stream");
    if (q->side)
        cudaStreamDestroy(q->side);
    if (q->fork)
        cudaEventDestroy(q->fork);
    for (uint32_t i = 0; i < SAVE_EVENTS; i++)
        if (q->save_ev[i])
            cudaEventDestroy(q->save_ev[i]);
    q->side = NULL;
    q->fork = NULL;
    memset(q->save_ev, 0, sizeof q->save_ev);
    return rc;
}

int backend_cuda_prepare(int dev, void *stream, unsigned what)
{
    if (dev < 0 || dev >= MAX_DEVICES)
        return fail(REFIT_EINVAL, "no such device");
    lock();
    devg g;
    cq *q;
    int rc = dev_enter(&g, dev);
    if (!rc) {
        rc = queue_get(&q, stream, dev);
        if (!rc && (what & REFIT_SYS_CUDA_PREPARE_SAVES) && G.cfg.save_side)
            rc = side_init(q);
        for (uint32_t i = 0; !rc && (what & REFIT_SYS_CUDA_PREPARE_RING) &&
                             i < G.cfg.ring_chunks; i++)
            if (!q->ring[i].p)
                rc = chunk_init(q, &q->ring[i]);
        dev_leave(&g);
    }
    unlock();
    return rc;
}

/* A marker among the deferred slices (of the queue D holds): its stream
 * waits for ev there, after the slices queued before it (earlier tensors)
 * are issued. */
static void defer_marker(cudaEvent_t ev, uint64_t *mark)
{
    static const char none[1];
    if (D.head - D.issued == DEFER_CAP)
        defer_wait_issued(D.head - DEFER_CAP + 1);
    dslice *x = &D.s[D.head % DEFER_CAP];
    *x = (dslice){(char *)none, none, (char *)none, 0, D.cur, ++D.calls, false, {0}, {0}, 0, ev};
    *mark = D.head + 1;
    __atomic_store_n(&D.head, D.head + 1, __ATOMIC_RELEASE);
    defer_wake();
}

/* A large pinned save on q's save stream: it reads its region once the
 * stream's work before the update's first save is done (no write of the
 * update comes before its region's save), and the stream waits for it
 * before whatever is issued after this call. */
static int side_save(cq *q, void *dst, const void *src, size_t n)
{
    int rc = side_init(q);
    if (rc)
        return rc;
    cudaStream_t st = (cudaStream_t)q->stream;
    cudaError_t e = cudaSuccess;
    if (!q->forked) {
        e = cudaEventRecord(q->fork, st);
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent(q->side, q->fork, 0);
        if (e != cudaSuccess)
            return cu_fail(e, "ordering the undo save stream");
        q->forked = true;
    }
    uint32_t i = q->save_next++ % SAVE_EVENTS;
    if (q->save_mark[i]) /* its last marker must be issued before it is recorded again */
        defer_wait_issued(q->save_mark[i]);
    q->save_mark[i] = 0;
    e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, q->side);
    if (e != cudaSuccess)
        return cu_fail(e, "cudaMemcpyAsync (undo save)");
    G.stats.memcpy_calls++;
    if ((e = cudaEventRecord(q->save_ev[i], q->side)) != cudaSuccess)
        return cu_fail(e, "recording an undo save's event");
    if (D.q == q && D.issued < D.head)
        defer_marker(q->save_ev[i], &q->save_mark[i]);
    else if ((e = cudaStreamWaitEvent(st, q->save_ev[i], 0)) != cudaSuccess)
        return cu_fail(e, "waiting for an undo save");
    return REFIT_OK;
}

static int cuda_save(void *host_dst, const void *src, size_t n, void *stream)
{
    if (n == 0)
        return REFIT_OK;
    lock_raw(); /* a save precedes its own region's write; slices of other regions stay queued */
    int dev = stream_device(stream);
    devg g;
    cq *q;
    int rc = dev_enter(&g, dev);
    if (!rc) {
        rc = queue_get(&q, stream, dev);
        if (!rc && n < G.cfg.save_min && G.host_ptr_is_dev)
            rc = queue_rows(q, true, (uint64_t)(uintptr_t)host_dst, (uint64_t)(uintptr_t)src, n);
        else if (!rc && G.cfg.save_side)
            rc = side_save(q, host_dst, src, n);
        else if (!rc)
            rc = save_now(q, host_dst, src, n);
        dev_leave(&g);
    }
    unlock();
    return rc;
}

static int cuda_restore(void *dst, const void *host_src, size_t n, void *stream)
{
    (void)stream; /* abort has waited for every stream; this one blocks */
    if (n == 0)
        return REFIT_OK;
    lock();
    cudaError_t e = cudaMemcpy(dst, host_src, n, cudaMemcpyDefault);
    int rc = e == cudaSuccess ? REFIT_OK : cu_fail(e, "cudaMemcpy (undo restore)");
    unlock();
    return rc;
}

/* ---- undo in device memory (the context's undo_device_budget) ---- */

static void *cuda_undo_dev_alloc(int device, size_t bytes)
{
    void *p = NULL;
    lock_raw(); /* an allocation orders nothing: deferred slices stay queued */
    devg g;
    if (!dev_enter(&g, device)) {
        enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed; /* see blk_alloc */
        bool relaxed = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
        cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
        if (relaxed)
            (void)cudaThreadExchangeStreamCaptureMode(&mode);
        if (e != cudaSuccess) {
            cu_fail(e, "cudaMalloc (undo log in device memory)");
            (void)cudaGetLastError();
            p = NULL;
        } else {
            G.allocs.undo_device++;
            G.allocs.undo_device_bytes += bytes;
        }
        dev_leave(&g);
    }
    unlock();
    return p;
}

static void cuda_undo_dev_free(int device, void *p)
{
    if (!p)
        return;
    lock();
    devg g;
    if (!dev_enter(&g, device)) {
        if (cudaFree(p) != cudaSuccess)
            (void)cudaGetLastError();
        dev_leave(&g);
    }
    unlock();
}

/* A device save is rows of the save table (unless save_dev_memcpy_min
 * sends a large one to save_now): a flush launches the saves queued since
 * the last launch as one kernel, ahead of the copy rows that overwrite
 * them, so a dense model's saves are a few launches instead of a
 * cudaMemcpyAsync (and its tail) per tensor. Immediate work (the pageable
 * path's slices, a kernel copy) launches only the pending save rows
 * (launch_saves), without switching tables, so nothing waits per tensor. */
static int cuda_save_dev(void *dev_dst, const void *src, size_t n, int device, void *stream)
{
    if (n == 0)
        return REFIT_OK;
    lock_raw(); /* a save precedes its own region's write; slices of other regions stay queued */
    devg g;
    cq *q;
    int rc = dev_enter(&g, device);
    if (!rc) {
        rc = queue_get(&q, stream, device);
        size_t memcpy_min = G.cfg.save_dev_memcpy_min;
        if (!rc && (n < G.cfg.save_min || !memcpy_min || n < memcpy_min))
            rc = queue_rows(q, true, (uint64_t)(uintptr_t)dev_dst, (uint64_t)(uintptr_t)src, n);
        else if (!rc)
            rc = save_now(q, dev_dst, src, n);
        dev_leave(&g);
    }
    unlock();
    return rc;
}

/* Abort has waited for every stream; each restore waits for itself so the
 * next (older) entry lands after it, and abort returns with the bytes in
 * place for any stream of the engine. */
static int cuda_restore_dev(void *dst, const void *dev_src, size_t n, int device)
{
    if (n == 0)
        return REFIT_OK;
    lock();
    devg g;
    int rc = dev_enter(&g, device);
    if (!rc) {
        cudaError_t e = cudaMemcpyAsync(dst, dev_src, n, cudaMemcpyDeviceToDevice, 0);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(0);
        if (e != cudaSuccess)
            rc = cu_fail(e, "cudaMemcpyAsync (undo restore from device memory)");
        dev_leave(&g);
    }
    unlock();
    return rc;
}

const backend backend_cuda = {
    .name = "cuda",
    .can_read = cuda_can_read,
    .copy = cuda_copy,
    .flush = cuda_flush,
    .zero = cuda_zero,
    .fingerprint = cuda_fingerprint,
    .staging_alloc = cuda_staging_alloc,
    .staging_free = cuda_staging_free,
    .undo_alloc = cuda_undo_alloc,
    .undo_free = cuda_undo_free,
    .save = cuda_save,
    .restore = cuda_restore,
    .sync = cuda_sync,
    .last_error = backend_cuda_last_error,
    .hold_host_sources = cuda_hold_host_sources,
    .undo_dev_alloc = cuda_undo_dev_alloc,
    .undo_dev_free = cuda_undo_dev_free,
    .save_dev = cuda_save_dev,
    .restore_dev = cuda_restore_dev,
    .scatter = backend_cuda_scatter,
};

/* ---- fingerprint into device memory (the NCCL transport's checksums) ---- */

typedef struct fp_to_arg {
    const refit_view *v;
    void *dst;
} fp_to_arg;

static int fp_to_launch(void *arg, void *stream)
{
    const fp_to_arg *a = arg;
    return kern_fingerprint_to_cuda(a->v, a->dst, stream);
}

int backend_cuda_fingerprint_to(void *dst, const refit_view *v, void *stream)
{
    if (v->device.device_type != REFIT_DEVICE_CUDA)
        return fail(REFIT_EUNSUPPORTED, "fingerprint_to: the view is not device memory");
    fp_to_arg a = {v, dst};
    return backend_cuda_run(v->device.device_id, stream, fp_to_launch, &a);
}
