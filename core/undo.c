#include <stdlib.h>
#include <string.h>

#include <refit/refit.h>

#include "core/internal.h"
#include "core/undo.h"

/* Saved bytes live in chunks from their backend's undo_alloc (pinned host
 * memory for a device backend, so saves stay asynchronous). */
struct undo_chunk {
    undo_chunk *next;
    const backend *be;
    char *data;
    size_t size, used;
};

#define UNDO_CHUNK_MIN (4u << 20)

/* A pooled chunk of be that holds need bytes, taken out of the pool. */
static undo_chunk *pool_take(undo_chunk **pool, const backend *be, size_t need)
{
    for (undo_chunk **pp = pool; pool && *pp; pp = &(*pp)->next) {
        undo_chunk *c = *pp;
        if (c->be == be && c->size >= need) {
            *pp = c->next;
            c->used = 0;
            return c;
        }
    }
    return NULL;
}

static char *undo_alloc(undo_log *u, const backend *be, size_t n)
{
    size_t need = (n + 63) & ~(size_t)63;
    undo_chunk *c = u->chunks;
    if (!c || c->be != be || c->size - c->used < need) {
        size_t size = need > UNDO_CHUNK_MIN ? need : UNDO_CHUNK_MIN;
        if ((c = pool_take(u->pool, be, need))) {
            c->next = u->chunks;
            u->chunks = c;
            char *p = c->data;
            c->used = need;
            return p;
        }
        c = malloc(sizeof *c);
        if (!c)
            return NULL;
        c->data = be->undo_alloc(size);
        if (!c->data) {
            free(c);
            return NULL;
        }
        c->be = be;
        c->size = size;
        c->used = 0;
        c->next = u->chunks;
        u->chunks = c;
    }
    char *p = c->data + c->used;
    c->used += need;
    return p;
}

int undo_save(undo_log *u, const backend *be, char *dst, size_t n, void *stream)
{
    if (grow_array((void **)&u->e, &u->cap, u->n, sizeof *u->e))
        return REFIT_ENOMEM;
    char *saved = undo_alloc(u, be, n);
    if (!saved)
        return REFIT_ENOMEM;
    int rc = be->save(saved, dst, n, stream);
    if (rc)
        return rc;
    u->e[u->n++] = (undo_entry){dst, saved, n, be};
    u->bytes += n;
    return REFIT_OK;
}

int undo_restore_all(undo_log *u, void *stream)
{
    int first = REFIT_OK;
    for (uint32_t i = u->n; i-- > 0;) {
        undo_entry *e = &u->e[i];
        int rc = e->be->restore(e->dst, e->saved, e->n, stream);
        if (rc && !first)
            first = rc;
    }
    return first;
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
            c->be->undo_free(c->data);
            free(c);
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
        c->be->undo_free(c->data);
        free(c);
    }
}
