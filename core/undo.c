#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <refit/refit.h>

#include "core/util.h"
#include "core/undo.h"
#include "kernels/copy.h"

/* Saved bytes live in chunks: device chunks from the backend's
 * undo_dev_alloc (a save is a copy on the device), host chunks from its
 * undo_alloc (pinned for a device backend, so saves stay asynchronous).
 * A save fills the current chunk of its placement and goes on in the
 * next, so chunks have no unused tails and any pooled chunk serves any
 * save: an update like the last one takes the same chunks in the same
 * order and allocates nothing. */
struct undo_chunk {
    undo_chunk *next;
    const backend *be;
    int device;
    undo_place place;
    char *data;
    size_t size, used;
};

/* The model's chunks between updates. The reservation's thread is the only
 * one touching a pool while `running`; whoever waits for it (settle) owns
 * it again: a log settles before its first pool access, so an update that
 * saves nothing (rollback off) never waits. */
struct undo_pool {
    undo_chunk *chunks;
    uint64_t allocs;            /* chunks ever allocated for it */
    uint64_t reserved[2];       /* bytes the reservation allocated */
    uint64_t reserve_ns;
    int reserve_failed;
    atomic_int running;         /* its thread has not finished */
    atomic_int held_off;        /* an update that saves nothing runs: the thread
                                   allocates no chunk until it ends (undo_pool_hold) */
    int joinable;               /* a thread to join */
    pthread_t thread;
    undo_span *needs;           /* per (backend, device): bytes with slack */
    uint32_t n_needs;
    uint64_t device_budget;
};

#define UNDO_ALIGN 256u              /* every piece starts 256-byte aligned */
#define UNDO_CHUNK_MIN (4u << 20)
#define UNDO_CHUNK_MAX ((size_t)256 << 20)
/* Bytes a save may take beyond its own in a chunk (its misalignment and
 * the rounding of its end), and what a chunk may leave unused at its end
 * (plus the split of a save there): undo_room's arithmetic. */
#define UNDO_PIECE_SLACK (2u * UNDO_ALIGN)
#define UNDO_CHUNK_SLACK (4u * UNDO_ALIGN)

static size_t align_up(size_t n)
{
    return (n + UNDO_ALIGN - 1) & ~(size_t)(UNDO_ALIGN - 1);
}

void undo_pool_hold(undo_pool *pool, int on)
{
    if (pool)
        atomic_store(&pool->held_off, on);
}

void undo_pool_settle(undo_pool *pool)
{
    if (pool)
        atomic_store(&pool->held_off, 0); /* wanted now: it goes on */
    if (pool && pool->joinable) {
        pthread_join(pool->thread, NULL);
        pool->joinable = 0;
    }
}

static uint32_t chunks_bytes(const undo_chunk *c, uint64_t out[2])
{
    uint32_t n = 0;
    out[UNDO_DEVICE] = out[UNDO_HOST] = 0;
    for (; c; c = c->next, n++)
        out[c->place] += c->size;
    return n;
}

uint32_t undo_pool_bytes(undo_pool *const *pool, uint64_t out[2])
{
    undo_pool *p = pool ? *pool : NULL;
    undo_pool_settle(p);
    return chunks_bytes(p ? p->chunks : NULL, out);
}

void undo_pool_stats_get(undo_pool *pool, undo_pool_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!pool)
        return;
    if ((out->reserving = atomic_load(&pool->running)))
        return;
    undo_pool_settle(pool); /* finished: the join does not wait */
    out->chunks = chunks_bytes(pool->chunks, out->bytes);
    out->allocs = pool->allocs;
    out->reserved[0] = pool->reserved[0];
    out->reserved[1] = pool->reserved[1];
    out->reserve_ns = pool->reserve_ns;
    out->reserve_failed = pool->reserve_failed;
}

static undo_pool *pool_new(void)
{
    undo_pool *p = calloc(1, sizeof *p);
    if (p)
        atomic_init(&p->running, 0);
    return p;
}

void undo_init(undo_log *u, undo_pool **pool, uint64_t device_budget)
{
    memset(u, 0, sizeof *u);
    u->pool = pool;
    u->device_budget = device_budget;
}

/* Before the log's first use of its pool: the reservation waited for, and
 * what the model holds read. */
static void log_settle(undo_log *u)
{
    if (u->settled)
        return;
    u->settled = 1;
    if (u->pool && !*u->pool)
        *u->pool = pool_new(); /* none: chunks go uncounted and back to nothing */
    undo_pool_bytes(u->pool, u->held);
}

/* A pooled chunk of (be, device, place), taken out of the pool: the
 * oldest first, as undo_free put them back. */
static undo_chunk *pool_take(undo_pool **pool, const backend *be, int device, undo_place place)
{
    if (!pool || !*pool)
        return NULL;
    for (undo_chunk **pp = &(*pool)->chunks; *pp; pp = &(*pp)->next) {
        undo_chunk *c = *pp;
        if (c->be == be && c->device == device && c->place == place) {
            *pp = c->next;
            c->used = 0;
            return c;
        }
    }
    return NULL;
}

/* Size of a new chunk: as large as what the model already holds of that
 * placement (few allocations as a model grows), within [MIN, MAX]; a
 * device chunk also within what the budget leaves. 0: none. */
static size_t chunk_size(const undo_log *u, undo_place place)
{
    uint64_t held = u->held[place];
    size_t size = held < UNDO_CHUNK_MIN ? UNDO_CHUNK_MIN
                : held > UNDO_CHUNK_MAX ? UNDO_CHUNK_MAX
                                        : align_up((size_t)held);
    if (place == UNDO_DEVICE) {
        uint64_t left = u->device_budget > held ? u->device_budget - held : 0;
        if (left < size)
            size = (size_t)left & ~(size_t)(UNDO_ALIGN - 1);
    }
    return size;
}

static undo_chunk *chunk_new(undo_log *u, const backend *be, int device, undo_place place)
{
    size_t size = chunk_size(u, place);
    if (size == 0)
        return NULL;
    undo_chunk *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    c->data = place == UNDO_DEVICE ? be->undo_dev_alloc(device, size) : be->undo_alloc(size);
    if (!c->data) {
        free(c);
        if (place == UNDO_DEVICE)
            u->device_refused = 1; /* not what the engine granted: stop asking */
        return NULL;
    }
    *c = (undo_chunk){NULL, be, device, place, c->data, size, 0};
    u->held[place] += size;
    if (u->pool && *u->pool)
        (*u->pool)->allocs++;
    return c;
}

static bool device_allowed(const undo_log *u, const backend *be)
{
    return u->device_budget > 0 && !u->device_refused && be->undo_dev_alloc && be->save_dev &&
           be->restore_dev;
}

/* Room for up to want bytes saved from src: *out, congruent to src modulo
 * UNDO_ALIGN (copies of aligned words), and how many (0: none anywhere). */
static size_t undo_room(undo_log *u, const backend *be, int device, const char *src, size_t want,
                        char **out, undo_place *place)
{
    size_t mis = (uintptr_t)src & (UNDO_ALIGN - 1);
    log_settle(u);
    for (int p = device_allowed(u, be) ? UNDO_DEVICE : UNDO_HOST; p <= UNDO_HOST; p++) {
        undo_chunk *c = u->cur[p];
        if (!c || c->be != be || c->device != device || c->used + mis >= c->size) {
            c = pool_take(u->pool, be, device, (undo_place)p);
            if (!c && !(c = chunk_new(u, be, device, (undo_place)p)))
                continue;
            c->next = u->chunks;
            u->chunks = c;
            u->cur[p] = c;
        }
        if (c->used + mis >= c->size)
            continue; /* a chunk smaller than one alignment step */
        size_t room = c->size - c->used - mis;
        *out = c->data + c->used + mis;
        *place = (undo_place)p;
        return room < want ? room : want;
    }
    return 0;
}

int undo_save(undo_log *u, const backend *be, int device, char *dst, size_t n, void *stream)
{
    for (size_t off = 0; off < n;) {
        if (grow_array((void **)&u->e, &u->cap, u->n_entries, sizeof *u->e))
            return REFIT_ENOMEM;
        char *saved;
        undo_place place;
        size_t k = undo_room(u, be, device, dst + off, n - off, &saved, &place);
        if (k == 0)
            return REFIT_ENOMEM;
        int rc = place == UNDO_DEVICE ? be->save_dev(saved, dst + off, k, device, stream)
                                      : be->save(saved, dst + off, k, stream);
        if (rc)
            return rc;
        undo_chunk *c = u->cur[place];
        c->used = align_up((size_t)(saved - c->data) + k);
        if (c->used > c->size)
            c->used = c->size;
        u->e[u->n_entries++] = (undo_entry){.dst = dst + off, .saved = saved, .n = k,
                                            .be = be, .device = device, .place = place};
        u->placed[place] += k;
        off += k;
    }
    u->n++;
    u->bytes += n;
    return REFIT_OK;
}

/* Room for whole units (unit bytes each, up to want bytes) in the
 * current chunk of a placement (host_only: host), taken: *out, aligned,
 * and how many bytes (0: none anywhere). A chunk with less than a unit
 * left is passed over for the next. */
static size_t undo_take(undo_log *u, const backend *be, int device, bool host_only, size_t want,
                        size_t unit, char **out, undo_place *place)
{
    log_settle(u);
    for (int p = !host_only && device_allowed(u, be) ? UNDO_DEVICE : UNDO_HOST; p <= UNDO_HOST;
         p++) {
        for (int fresh = 0; fresh < 2; fresh++) {
            undo_chunk *c = u->cur[p];
            if (!c || c->be != be || c->device != device || c->size - c->used < unit) {
                c = pool_take(u->pool, be, device, (undo_place)p);
                if (!c && !(c = chunk_new(u, be, device, (undo_place)p)))
                    break;
                c->next = u->chunks;
                u->chunks = c;
                u->cur[p] = c;
            }
            size_t room = (c->size - c->used) / unit * unit;
            if (room == 0)
                continue; /* a chunk smaller than one unit: the next */
            room = room < want ? room : want;
            *out = c->data + c->used;
            *place = (undo_place)p;
            c->used = align_up(c->used + room);
            if (c->used > c->size)
                c->used = c->size;
            return room;
        }
    }
    return 0;
}

/* A large copy in parts on threads (a patch's offsets into the log). */
typedef struct copy_job {
    char *dst;
    const char *src;
} copy_job;

static void copy_part(void *arg, uint32_t part, size_t lo, size_t hi)
{
    (void)part;
    const copy_job *j = arg;
    memcpy(j->dst + lo, j->src + lo, hi - lo);
}

/* One piece of s: runs (or elements) [i, ...) from element `skip` of run
 * i, as many as the rooms hold; its offsets copied to off (counts after
 * them), its old bytes to old. *pi, *pskip, *pv advance past it. */
static void scatter_piece(const backend_scatter *s, backend_scatter *piece, int64_t *off,
                          size_t max_runs, int64_t max_el, size_t *pi, int64_t *pskip,
                          int64_t *pv)
{
    size_t i = *pi, k = 0;
    int64_t skip = *pskip, el = 0;
    if (!s->counts) {
        k = s->n - i < max_runs ? s->n - i : max_runs;
        k = (int64_t)k < max_el ? k : (size_t)max_el;
        copy_job j = {(char *)off, (const char *)(s->off + i)};
        util_parallel(k * sizeof *off, (size_t)32 << 20, &j, copy_part);
        el = (int64_t)k;
        *pi = i + k;
    } else {
        int64_t *counts = off + max_runs;
        while (i < s->n && k < max_runs && el < max_el) {
            int64_t c = s->counts[i] - skip, take = c < max_el - el ? c : max_el - el;
            off[k] = s->off[i] < 0 ? -1 : s->off[i] + skip * s->run_stride;
            counts[k++] = take;
            el += take;
            if (take == c) {
                i++;
                skip = 0;
            } else {
                skip += take;
            }
        }
        piece->counts = counts;
        *pi = i;
        *pskip = skip;
    }
    piece->off = off;
    piece->n = k;
    piece->elements = el;
    size_t ve = kern_dtype_size(s->values_dtype);
    piece->values = (const char *)s->values + *pv * s->values_stride * (int64_t)ve;
    *pv += el;
}

int undo_scatter(undo_log *u, const backend *be, int device, const backend_scatter *s,
                 void *stream)
{
    size_t e = kern_dtype_size(s->dst_dtype), per = s->counts ? 16 : 8;
    size_t i = 0;
    int64_t skip = 0, v = 0;
    while (i < s->n) { /* none (an empty patch): nothing saved, still one save */
        if (grow_array((void **)&u->e, &u->cap, u->n_entries, sizeof *u->e))
            return REFIT_ENOMEM;
        /* the old bytes of what is left, then its offsets beside */
        int64_t left = s->counts ? 0 : (int64_t)(s->n - i);
        for (size_t j = i; s->counts && j < s->n; j++)
            left += s->counts[j] - (j == i ? skip : 0);
        char *old, *offs;
        undo_place place, oplace;
        size_t got = undo_take(u, be, device, false, (size_t)left * e, e, &old, &place);
        if (got == 0)
            return REFIT_ENOMEM;
        int64_t max_el = (int64_t)(got / e);
        /* runs it may take: elements, or at most as many runs as elements */
        size_t runs = s->counts ? s->n - i : (size_t)max_el;
        if (s->counts && (int64_t)runs > max_el)
            runs = (size_t)max_el;
        size_t ogot = undo_take(u, be, device, true, runs * per, per, &offs, &oplace);
        if (ogot == 0)
            return REFIT_ENOMEM;
        backend_scatter piece = *s;
        scatter_piece(s, &piece, (int64_t *)(void *)offs, ogot / per, max_el, &i, &skip, &v);
        piece.old = old;
        piece.old_on_device = place == UNDO_DEVICE;
        piece.arrays_held = 1;
        int rc = be->scatter(&piece, stream);
        if (rc)
            return rc;
        size_t n = (size_t)piece.elements * e;
        u->e[u->n_entries++] = (undo_entry){s->dst, old, n, be, device, place, piece.off,
                                            piece.counts, piece.n, s->run_stride, s->dst_dtype,
                                            s->dst_device};
        u->placed[place] += n;
        u->bytes += n;
    }
    u->n++;
    return REFIT_OK;
}

/* Scatter a scatter entry's old bytes back, and wait for it. */
static int restore_scatter(const undo_entry *e, void *stream)
{
    size_t es = kern_dtype_size(e->dtype);
    refit_device host = {e->dst_device.device_type == REFIT_DEVICE_CPU ? REFIT_DEVICE_CPU
                                                                       : REFIT_DEVICE_CUDA_HOST,
                         0};
    backend_scatter s = {
        .dst = e->dst, .dst_device = e->dst_device, .dst_dtype = e->dtype, .off = e->off,
        .counts = e->counts, .n = e->n_off, .run_stride = e->run_stride,
        .elements = (int64_t)(e->n / es), .values = e->saved, .values_dtype = e->dtype,
        .values_device = e->place == UNDO_DEVICE ? e->dst_device : host, .values_stride = 1,
        .arrays_held = 1,
    };
    int rc = e->be->scatter(&s, stream);
    return rc ? rc : e->be->sync(stream);
}

int undo_restore_all(undo_log *u, void *stream)
{
    int first = REFIT_OK;
    for (uint32_t i = u->n_entries; i-- > 0;) {
        const undo_entry *e = &u->e[i];
        int rc = e->off ? restore_scatter(e, stream)
               : e->place == UNDO_DEVICE ? e->be->restore_dev(e->dst, e->saved, e->n, e->device)
                                         : e->be->restore(e->dst, e->saved, e->n, stream);
        if (rc && !first)
            first = rc;
    }
    return first;
}

static void chunk_release(undo_chunk *c)
{
    if (c->place == UNDO_DEVICE)
        c->be->undo_dev_free(c->device, c->data);
    else
        c->be->undo_free(c->data);
    free(c);
}

void undo_free(undo_log *u)
{
    if (u->chunks && u->pool && !*u->pool)
        *u->pool = pool_new(); /* none: the chunks are freed */
    undo_pool *pool = u->pool ? *u->pool : NULL;
    while (u->chunks) {
        undo_chunk *c = u->chunks;
        u->chunks = c->next;
        if (pool) {
            c->next = pool->chunks;
            pool->chunks = c;
        } else {
            chunk_release(c);
        }
    }
    free(u->e);
    memset(u, 0, sizeof *u);
}

void undo_pool_free(undo_pool **pool)
{
    undo_pool *p = *pool;
    if (!p)
        return;
    undo_pool_settle(p);
    while (p->chunks) {
        undo_chunk *c = p->chunks;
        p->chunks = c->next;
        chunk_release(c);
    }
    free(p->needs);
    free(p);
    *pool = NULL;
}

/* ---- the reservation ---- */

static bool be_has_device(const backend *be)
{
    return be->undo_dev_alloc && be->save_dev && be->restore_dev;
}

/* One chunk of size bytes for the pool; 0 on failure. */
static int reserve_chunk(undo_pool *p, const backend *be, int device, undo_place place,
                         size_t size)
{
    /* a pinned allocation stalls the driver's other calls for its length:
     * none while an update that needs no chunk copies */
    while (atomic_load(&p->held_off))
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    undo_chunk *c = malloc(sizeof *c);
    char *data = !c ? NULL : place == UNDO_DEVICE ? be->undo_dev_alloc(device, size)
                                                  : be->undo_alloc(size);
    if (!data) {
        free(c);
        p->reserve_failed = 1;
        return 0;
    }
    *c = (undo_chunk){p->chunks, be, device, place, data, size, 0};
    p->chunks = c;
    p->allocs++;
    p->reserved[place] += size;
    return 1;
}

/* Chunks of (be, device, place) until have covers want (each chunk also
 * covers its own end's slack), none above cap bytes in all (device: what
 * the budget leaves). Returns the bytes covered. */
static uint64_t reserve_place(undo_pool *p, const backend *be, int device, undo_place place,
                              uint64_t have, uint64_t want, uint64_t *cap)
{
    while (have < want && !p->reserve_failed) {
        uint64_t size = want - have + UNDO_CHUNK_SLACK;
        size = size > UNDO_CHUNK_MAX ? UNDO_CHUNK_MAX : align_up((size_t)size);
        if (place == UNDO_HOST && size < UNDO_CHUNK_MIN)
            size = UNDO_CHUNK_MIN;
        if (cap) {
            if (size > *cap)
                size = *cap & ~(uint64_t)(UNDO_ALIGN - 1);
            if (size < UNDO_ALIGN)
                break; /* what an update's chunk_size would not take either */
            *cap -= size;
        }
        if (!reserve_chunk(p, be, device, place, (size_t)size))
            break;
        have += size > UNDO_CHUNK_SLACK ? size - UNDO_CHUNK_SLACK : 0;
    }
    return have;
}

/* Each (backend, device) in the order given: its device chunks while the
 * budget lasts, as the saves of an update take them, then host chunks for
 * the rest. Chunks the pool holds already count. */
static void reserve_run(undo_pool *p)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t held[2];
    chunks_bytes(p->chunks, held);
    uint64_t budget_left = p->device_budget > held[UNDO_DEVICE]
                               ? p->device_budget - held[UNDO_DEVICE] : 0;
    for (uint32_t i = 0; i < p->n_needs && !p->reserve_failed; i++) {
        const undo_span *nd = &p->needs[i];
        uint64_t have[2] = {0, 0};
        for (const undo_chunk *c = p->chunks; c; c = c->next)
            if (c->be == nd->be && c->device == nd->device)
                have[c->place] += c->size > UNDO_CHUNK_SLACK ? c->size - UNDO_CHUNK_SLACK : 0;
        uint64_t dev = 0;
        if (p->device_budget && be_has_device(nd->be))
            dev = reserve_place(p, nd->be, nd->device, UNDO_DEVICE, have[UNDO_DEVICE], nd->bytes,
                                &budget_left);
        if (dev < nd->bytes)
            reserve_place(p, nd->be, nd->device, UNDO_HOST, have[UNDO_HOST], nd->bytes - dev,
                          NULL);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    p->reserve_ns += (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec));
}

static void *reserve_main(void *arg)
{
    undo_pool *p = arg;
    reserve_run(p);
    atomic_store(&p->running, 0);
    return NULL;
}

int undo_pool_reserve(undo_pool **pool, const undo_span *spans, uint32_t n,
                      uint64_t device_budget, int background)
{
    if (!*pool && !(*pool = pool_new()))
        return REFIT_ENOMEM;
    undo_pool *p = *pool;
    undo_pool_settle(p);
    free(p->needs);
    p->needs = NULL;
    p->n_needs = 0;
    p->reserve_failed = 0;
    p->device_budget = device_budget;
    undo_span *nd = n ? malloc(sizeof *nd * n) : NULL;
    if (n && !nd)
        return REFIT_ENOMEM;
    /* per (backend, device), in order of first appearance; few of them */
    for (uint32_t i = 0; i < n; i++) {
        uint32_t j = 0;
        while (j < p->n_needs && (nd[j].be != spans[i].be || nd[j].device != spans[i].device))
            j++;
        if (j == p->n_needs)
            nd[p->n_needs++] = (undo_span){spans[i].be, spans[i].device, 0};
        nd[j].bytes += spans[i].bytes + UNDO_PIECE_SLACK;
    }
    p->needs = nd;
    if (background) {
        atomic_store(&p->running, 1);
        if (pthread_create(&p->thread, NULL, reserve_main, p) == 0) {
            p->joinable = 1;
            return REFIT_OK;
        }
        atomic_store(&p->running, 0);
    }
    reserve_run(p);
    return REFIT_OK;
}
