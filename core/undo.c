#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <refit/refit.h>

#include "core/util.h"
#include "core/undo.h"

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

#define UNDO_ALIGN 256u              /* every piece starts 256-byte aligned */
#define UNDO_CHUNK_MIN (4u << 20)
#define UNDO_CHUNK_MAX ((size_t)256 << 20)

static size_t align_up(size_t n)
{
    return (n + UNDO_ALIGN - 1) & ~(size_t)(UNDO_ALIGN - 1);
}

uint32_t undo_pool_bytes(undo_chunk *const *pool, uint64_t out[2])
{
    uint32_t n = 0;
    out[UNDO_DEVICE] = out[UNDO_HOST] = 0;
    for (const undo_chunk *c = pool ? *pool : NULL; c; c = c->next, n++)
        out[c->place] += c->size;
    return n;
}

void undo_init(undo_log *u, undo_chunk **pool, uint64_t device_budget)
{
    memset(u, 0, sizeof *u);
    u->pool = pool;
    u->device_budget = device_budget;
    undo_pool_bytes(pool, u->held);
}

/* A pooled chunk of (be, device, place), taken out of the pool: the
 * oldest first, as undo_free put them back. */
static undo_chunk *pool_take(undo_chunk **pool, const backend *be, int device, undo_place place)
{
    for (undo_chunk **pp = pool; pool && *pp; pp = &(*pp)->next) {
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
        u->e[u->n_entries++] = (undo_entry){dst + off, saved, k, be, device, place};
        u->placed[place] += k;
        off += k;
    }
    u->n++;
    u->bytes += n;
    return REFIT_OK;
}

int undo_restore_all(undo_log *u, void *stream)
{
    int first = REFIT_OK;
    for (uint32_t i = u->n_entries; i-- > 0;) {
        const undo_entry *e = &u->e[i];
        int rc = e->place == UNDO_DEVICE ? e->be->restore_dev(e->dst, e->saved, e->n, e->device)
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
    while (u->chunks) {
        undo_chunk *c = u->chunks;
        u->chunks = c->next;
        if (u->pool) {
            c->next = *u->pool;
            *u->pool = c;
        } else {
            chunk_release(c);
        }
    }
    free(u->e);
    memset(u, 0, sizeof *u);
}

void undo_pool_free(undo_chunk **pool)
{
    while (*pool) {
        undo_chunk *c = *pool;
        *pool = c->next;
        chunk_release(c);
    }
}
