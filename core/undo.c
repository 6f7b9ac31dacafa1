#include <stdlib.h>
#include <string.h>

#include <refit/refit.h>

#include "core/internal.h"
#include "core/undo.h"

struct undo_chunk {
    undo_chunk *next;
    size_t size, used;
    _Alignas(64) char data[];
};

#define UNDO_CHUNK_MIN (4u << 20)

static char *undo_alloc(undo_log *u, size_t n)
{
    size_t need = (n + 63) & ~(size_t)63;
    undo_chunk *c = u->chunks;
    if (!c || c->size - c->used < need) {
        size_t size = need > UNDO_CHUNK_MIN ? need : UNDO_CHUNK_MIN;
        c = malloc(sizeof *c + size);
        if (!c)
            return NULL;
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
    char *saved = undo_alloc(u, n);
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
    for (uint32_t i = 0; i < u->n; i++) {
        int rc = u->e[i].be->sync(stream);
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
        free(c);
    }
    free(u->e);
    memset(u, 0, sizeof *u);
}
