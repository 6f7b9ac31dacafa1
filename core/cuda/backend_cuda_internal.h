/* What the CUDA backend's files share (backend_cuda.c, cuda_ring.c,
 * cuda_streams.c, cuda_copy.c, cuda_undo.c): its tunables, its one
 * process-wide state, the per-stream queue, the deferred slices, and the
 * functions one file calls in another. Not a public header: nothing
 * outside core/cuda/ includes it. */
#ifndef REFIT_CORE_CUDA_BACKEND_CUDA_INTERNAL_H
#define REFIT_CORE_CUDA_BACKEND_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "core/cuda/backend_cuda.h"
#include "core/cuda/kern_cuda.h"
#include "kernels/copy.h"

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

/* The backend's state (G, backend_cuda.c). */
struct cuda_state {
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
};

extern struct cuda_state G;

/* ---- current device ---- */

typedef struct devg {
    int prev;
    bool changed;
} devg;

/* ---- deferred pageable reads (cuda_ring.c says how) ---- */

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
    bool strided;               /* cast too: written through dv (a strided destination;
                                 * the source is the piece's bytes in dv's shape, row-major) */
    refit_view dv;
    int filled;                 /* SL_*: FILLED set by the worker that copied it (release) */
    cudaEvent_t wait;           /* a marker (no bytes): the stream waits for this
                                 * save's event here, in slice order */
} dslice;

#define DEFER_CAP 4096u

/* A slice's state: published (again once issued: its slot is free), or
 * copied into the ring by a worker (a marker too, with nothing to copy). */
#define SL_QUEUED 0
#define SL_FILLED 1

/* The slices in flight (D, cuda_ring.c). */
struct cuda_defer {
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
};

extern struct cuda_defer D;

/* backend_cuda.c: tunables, errors, the lock, the current device */
size_t env_size(const char *name, size_t def, size_t unit, size_t lo, size_t hi);
uint64_t now_ns(void);
int cu_fail(cudaError_t e, const char *what);
int kern_fail(int rc);
int fail(int rc, const char *what);
void lock_raw(void);
void lock(void);
void unlock(void);
int dev_enter(devg *g, int dev);
void dev_leave(const devg *g);

/* cuda_ring.c: placement, worker threads, the pinned ring, deferred reads */
void par_memcpy(void *d, const void *s, size_t n);
int chunk_init(cq *q, pchunk *c);
int ring_take(cq *q, size_t want, uint64_t align_to, pchunk **oc, char **op);
int chunk_mark(pchunk *c, cudaStream_t st);
void defer_wake(void);
void dma_timing_resolve(void);
void defer_wait_issued(uint64_t upto);
int defer_queue(cq *q, char *dst, const char *src, size_t bytes, const refit_dtype *cast,
                const refit_view *dview);
void defer_settle_all(void);
int cuda_hold_host_sources(void *stream, int on);

/* cuda_streams.c: the queue of each (stream, device), its tables and flush */
void chunk_release(pchunk *c);
int queue_get(cq **out, void *stream, int device);
int stream_device(void *stream);
int launch_saves(cq *q);
int queue_flush(cq *q);
int before_immediate(cq *q);
int queue_rows(cq *q, bool save, uint64_t dst, uint64_t src, uint64_t bytes);

/* cuda_copy.c: copy, flush, sync, zero, fingerprint */
int memcpy_now(cq *q, void *dst, const void *src, size_t n);
int kernel_now(cq *q, const refit_view *dst, const refit_view *src);
int cuda_copy(const refit_view *dst, const refit_view *src, void *stream);
int cuda_can_read(refit_device src);
int cuda_flush(void *stream);
int cuda_sync(void *stream);
int cuda_zero(const refit_view *dst, void *stream);
int cuda_fingerprint(const refit_view *v, uint64_t *out, void *stream);

/* cuda_undo.c: cached allocations and undo saves and restores */
void *cuda_staging_alloc(size_t bytes);
void cuda_staging_free(void *p);
void *cuda_undo_alloc(size_t bytes);
void cuda_undo_free(void *p);
int cuda_save(void *host_dst, const void *src, size_t n, void *stream);
int cuda_restore(void *dst, const void *host_src, size_t n, void *stream);
void *cuda_undo_dev_alloc(int device, size_t bytes);
void cuda_undo_dev_free(int device, void *p);
int cuda_save_dev(void *dev_dst, const void *src, size_t n, int device, void *stream);
int cuda_restore_dev(void *dst, const void *dev_src, size_t n, int device);

#endif
