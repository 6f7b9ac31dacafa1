/* The control channel's messages (msg.h): encoders, and decoders that
 * check every field of untrusted bytes. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <refit/refit.h>

#include "transports/ipc/msg.h"

static int bad(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (errlen)
        vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return REFIT_ECORRUPT;
}

static ipc_rbuf reader(const ipc_frame *f)
{
    return (ipc_rbuf){.p = f->payload, .len = f->len};
}

static int want_type(const ipc_frame *f, uint16_t type, char *err, size_t errlen)
{
    if (f->type != type)
        return bad(err, errlen, "control channel: a %s frame where %s was expected",
                   ipc_type_name(f->type), ipc_type_name(type));
    return REFIT_OK;
}

/* ---- HELLO ---- */

void ipc_hello_encode(ipc_wbuf *w, const ipc_hello *h)
{
    ipc_w32(w, h->role);
    ipc_w32(w, h->pid);
    ipc_w32(w, (uint32_t)h->rank);
    ipc_w32(w, h->workers);
}

int ipc_hello_decode(ipc_hello *h, const ipc_frame *f, uint32_t want_role, char *err,
                     size_t errlen)
{
    int rc = want_type(f, IPC_HELLO, err, errlen);
    if (rc)
        return rc;
    ipc_rbuf r = reader(f);
    h->role = ipc_r32(&r);
    h->pid = ipc_r32(&r);
    h->rank = (int32_t)ipc_r32(&r);
    h->workers = ipc_r32(&r);
    if (r.short_read || r.at != r.len)
        return bad(err, errlen, "HELLO: %u bytes, 16 expected", f->len);
    if (h->role != want_role)
        return bad(err, errlen, "HELLO: role %u, %u expected (two trainers or two workers "
                   "on one socket?)", h->role, want_role);
    return REFIT_OK;
}

/* ---- MEMS ---- */

void ipc_mems_encode(ipc_wbuf *w, const ipc_mems *t)
{
    ipc_w32(w, t->epoch);
    ipc_w32(w, t->n);
    ipc_w32(w, t->has_event ? IPC_MEMS_EVENT : 0);
    ipc_w32(w, 0);
    if (t->has_event)
        ipc_w_bytes(w, t->event, IPC_HANDLE_BYTES);
    for (uint32_t i = 0; i < t->n; i++) {
        const ipc_mem_desc *m = &t->m[i];
        ipc_w32(w, m->id);
        ipc_w32(w, m->gen);
        ipc_w16(w, m->kind);
        ipc_w16(w, 0);
        ipc_w32(w, (uint32_t)m->device);
        ipc_w64(w, m->bytes);
        ipc_w_bytes(w, m->handle, IPC_HANDLE_BYTES);
    }
}

uint16_t ipc_mems_fds(const ipc_mems *t, int *fds, uint16_t cap)
{
    uint16_t n = 0;
    for (uint32_t i = 0; i < t->n; i++)
        if (t->m[i].kind == IPC_MEM_HOST_FD && n < cap)
            fds[n++] = t->m[i].fd;
    return n;
}

static int cmp_id(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int mems_ids_unique(const ipc_mems *t, char *err, size_t errlen)
{
    uint32_t *ids = malloc((size_t)t->n * sizeof *ids + 1);
    if (!ids)
        return REFIT_ENOMEM;
    for (uint32_t i = 0; i < t->n; i++)
        ids[i] = t->m[i].id;
    qsort(ids, t->n, sizeof *ids, cmp_id);
    int rc = REFIT_OK;
    for (uint32_t i = 1; i < t->n && !rc; i++)
        if (ids[i] == ids[i - 1])
            rc = bad(err, errlen, "MEMS: memory id %u listed twice", ids[i]);
    free(ids);
    return rc;
}

static int mem_decode(ipc_mem_desc *m, ipc_rbuf *r, uint32_t i, char *err, size_t errlen)
{
    m->id = ipc_r32(r);
    m->gen = ipc_r32(r);
    m->kind = ipc_r16(r);
    uint16_t pad = ipc_r16(r);
    m->device = (int32_t)ipc_r32(r);
    m->bytes = ipc_r64(r);
    const uint8_t *h = ipc_r_bytes(r, IPC_HANDLE_BYTES);
    m->fd = -1;
    if (!h)
        return bad(err, errlen, "MEMS: memory %u runs past the frame", i);
    memcpy(m->handle, h, IPC_HANDLE_BYTES);
    if (pad || (m->kind != IPC_MEM_CUDA && m->kind != IPC_MEM_HOST_FD))
        return bad(err, errlen, "MEMS: memory %u (id %u): unknown kind %u", i, m->id, m->kind);
    if (m->bytes == 0 || m->bytes > ((uint64_t)1 << 48))
        return bad(err, errlen, "MEMS: memory %u (id %u): %llu bytes", i, m->id,
                   (unsigned long long)m->bytes);
    if (m->kind == IPC_MEM_CUDA && m->device < 0)
        return bad(err, errlen, "MEMS: memory %u (id %u): CUDA device %d", i, m->id, m->device);
    return REFIT_OK;
}

int ipc_mems_decode(ipc_mems *t, ipc_frame *f, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    int rc = want_type(f, IPC_MEMS, err, errlen);
    if (rc)
        return rc;
    ipc_rbuf r = reader(f);
    t->epoch = ipc_r32(&r);
    t->n = ipc_r32(&r);
    uint32_t flags = ipc_r32(&r), zero = ipc_r32(&r);
    if (r.short_read || (flags & ~IPC_MEMS_EVENT) || zero)
        return bad(err, errlen, "MEMS: short frame, unknown flags 0x%x or reserved bytes set",
                   flags);
    t->has_event = flags & IPC_MEMS_EVENT;
    const uint8_t *ev = t->has_event ? ipc_r_bytes(&r, IPC_HANDLE_BYTES) : NULL;
    if (t->has_event && !ev)
        return bad(err, errlen, "MEMS: the event handle runs past the frame");
    if (ev)
        memcpy(t->event, ev, IPC_HANDLE_BYTES);
    if (t->n > IPC_MAX_MEMS || (uint64_t)t->n * IPC_MEM_REC != r.len - r.at)
        return bad(err, errlen, "MEMS: %u memories in %zu bytes (%d each)", t->n, r.len - r.at,
                   IPC_MEM_REC);
    if (t->n && !(t->m = calloc(t->n, sizeof *t->m)))
        return REFIT_ENOMEM;
    uint16_t host = 0;
    for (uint32_t i = 0; i < t->n && !rc; i++) {
        rc = mem_decode(&t->m[i], &r, i, err, errlen);
        host += !rc && t->m[i].kind == IPC_MEM_HOST_FD;
    }
    if (!rc && host != f->n_fds)
        rc = bad(err, errlen, "MEMS: %u host memories, %u descriptors passed", host, f->n_fds);
    if (!rc)
        rc = mems_ids_unique(t, err, errlen);
    if (rc) {
        ipc_mems_free(t);
        return rc;
    }
    uint16_t k = 0;
    for (uint32_t i = 0; i < t->n; i++)
        if (t->m[i].kind == IPC_MEM_HOST_FD) {
            t->m[i].fd = f->fds[k];
            f->fds[k++] = -1;
        }
    return REFIT_OK;
}

void ipc_mems_free(ipc_mems *t)
{
    for (uint32_t i = 0; t->m && i < t->n; i++)
        if (t->m[i].fd >= 0)
            close(t->m[i].fd);
    free(t->m);
    memset(t, 0, sizeof *t);
}

/* ---- INDEX ---- */

void ipc_index_encode(ipc_wbuf *w, const ipc_index *x, const uint8_t an[BKT_ANNOUNCE_BYTES])
{
    ipc_w32(w, x->id);
    ipc_w32(w, x->epoch);
    ipc_w32(w, x->n_buckets);
    ipc_w32(w, 0);
    for (uint32_t b = 0; b < x->n_buckets; b++) {
        ipc_w32(w, x->refs[b].mem);
        ipc_w32(w, 0);
        ipc_w64(w, x->refs[b].offset);
    }
    ipc_w_bytes(w, an, BKT_ANNOUNCE_BYTES);
    ipc_w_bytes(w, x->index, x->index_bytes);
}

int ipc_index_decode(ipc_index *x, const ipc_frame *f, uint64_t max_bucket, char *err,
                     size_t errlen)
{
    memset(x, 0, sizeof *x);
    int rc = want_type(f, IPC_INDEX, err, errlen);
    if (rc)
        return rc;
    ipc_rbuf r = reader(f);
    x->id = ipc_r32(&r);
    x->epoch = ipc_r32(&r);
    x->n_buckets = ipc_r32(&r);
    uint32_t zero = ipc_r32(&r);
    if (r.short_read || zero || !x->id)
        return bad(err, errlen, "INDEX: short frame (%u bytes), index id 0 or reserved bytes "
                   "set", f->len);
    if (x->n_buckets == 0 || x->n_buckets > BKT_MAX_BUCKETS ||
        (uint64_t)x->n_buckets * IPC_REF_REC + BKT_ANNOUNCE_BYTES > r.len - r.at)
        return bad(err, errlen, "INDEX %u: %u buckets cannot fit in a %u-byte frame", x->id,
                   x->n_buckets, f->len);
    if (!(x->refs = malloc((size_t)x->n_buckets * sizeof *x->refs)))
        return REFIT_ENOMEM;
    for (uint32_t b = 0; b < x->n_buckets; b++) {
        x->refs[b].mem = ipc_r32(&r);
        uint32_t pad = ipc_r32(&r);
        x->refs[b].offset = ipc_r64(&r);
        if (pad) {
            ipc_index_free(x);
            return bad(err, errlen, "INDEX %u: bucket %u: reserved bytes set", x->id, b);
        }
    }
    rc = bkt_announce_decode(&x->an, ipc_r_bytes(&r, BKT_ANNOUNCE_BYTES), max_bucket, err,
                             errlen);
    if (!rc && (x->an.n_buckets != x->n_buckets || x->an.trailer_bytes))
        rc = bad(err, errlen, "INDEX %u: the announce (%u buckets, trailer %llu bytes) "
                 "disagrees with the bucket map (%u buckets)", x->id, x->an.n_buckets,
                 (unsigned long long)x->an.trailer_bytes, x->n_buckets);
    if (!rc && x->an.index_bytes != r.len - r.at)
        rc = bad(err, errlen, "INDEX %u: the announce's index is %llu bytes, the frame holds "
                 "%zu", x->id, (unsigned long long)x->an.index_bytes, r.len - r.at);
    if (rc) {
        ipc_index_free(x);
        return rc;
    }
    x->index = r.p + r.at;
    x->index_bytes = x->an.index_bytes;
    return REFIT_OK;
}

void ipc_index_free(ipc_index *x)
{
    free(x->refs);
    x->refs = NULL;
}

/* ---- UPDATE ---- */

void ipc_update_encode(ipc_wbuf *w, const ipc_update *u, const uint64_t *sums)
{
    size_t ll = strlen(u->label);
    ipc_w64(w, u->seq);
    ipc_w32(w, u->epoch);
    ipc_w32(w, u->flags);
    ipc_w32(w, u->index_id);
    ipc_w32(w, u->n_buckets);
    ipc_w16(w, (uint16_t)ll);
    ipc_w16(w, 0);
    ipc_w32(w, 0);
    ipc_w_bytes(w, u->label, ll);
    for (uint32_t b = 0; (u->flags & IPC_U_SUMS) && b < u->n_buckets; b++)
        ipc_w64(w, sums[b]);
}

int ipc_update_decode(ipc_update *u, const ipc_frame *f, char *err, size_t errlen)
{
    memset(u, 0, sizeof *u);
    int rc = want_type(f, IPC_UPDATE, err, errlen);
    if (rc)
        return rc;
    ipc_rbuf r = reader(f);
    u->seq = ipc_r64(&r);
    u->epoch = ipc_r32(&r);
    u->flags = ipc_r32(&r);
    u->index_id = ipc_r32(&r);
    u->n_buckets = ipc_r32(&r);
    uint16_t ll = ipc_r16(&r), z16 = ipc_r16(&r);
    uint32_t z32 = ipc_r32(&r);
    if (r.short_read || (u->flags & ~(IPC_U_EVENT | IPC_U_SUMS)) || z16 || z32)
        return bad(err, errlen, "UPDATE: short frame (%u bytes), unknown flags 0x%x or "
                   "reserved bytes set", f->len, u->flags);
    if (!u->index_id)
        return bad(err, errlen, "UPDATE %llu: index id 0", (unsigned long long)u->seq);
    if (u->n_buckets == 0 || u->n_buckets > BKT_MAX_BUCKETS || ll > BKT_MAX_LABEL)
        return bad(err, errlen, "UPDATE %llu: %u buckets, a label of %u bytes (1 to %u "
                   "buckets, at most %d bytes)", (unsigned long long)u->seq, u->n_buckets, ll,
                   BKT_MAX_BUCKETS, BKT_MAX_LABEL);
    uint64_t want = IPC_UPDATE_FIXED + (uint64_t)ll +
                    (u->flags & IPC_U_SUMS ? 8u * (uint64_t)u->n_buckets : 0);
    if (want != f->len)
        return bad(err, errlen, "UPDATE %llu: %u bytes, %llu expected (a label of %u bytes%s)",
                   (unsigned long long)u->seq, f->len, (unsigned long long)want, ll,
                   u->flags & IPC_U_SUMS ? " and a checksum per bucket" : "");
    const uint8_t *label = ipc_r_bytes(&r, ll);
    if (memchr(label, 0, ll))
        return bad(err, errlen, "UPDATE %llu: the version label holds a NUL byte",
                   (unsigned long long)u->seq);
    memcpy(u->label, label, ll);
    u->label[ll] = '\0';
    u->sums = u->flags & IPC_U_SUMS ? r.p + r.at : NULL;
    return REFIT_OK;
}

/* ---- VOTE, DECISION, RESULT ---- */

void ipc_status_encode(ipc_wbuf *w, uint64_t seq, int32_t status, const char *msg)
{
    size_t n = msg ? strlen(msg) : 0;
    if (n > IPC_MAX_MSG)
        n = IPC_MAX_MSG;
    ipc_w64(w, seq);
    ipc_w32(w, (uint32_t)status);
    ipc_w16(w, (uint16_t)n);
    ipc_w_bytes(w, msg, n);
}

int ipc_status_decode(ipc_status_msg *s, const ipc_frame *f, uint64_t want_seq, char *err,
                      size_t errlen)
{
    ipc_rbuf r = reader(f);
    s->seq = ipc_r64(&r);
    s->status = (int32_t)ipc_r32(&r);
    uint16_t n = ipc_r16(&r);
    const uint8_t *m = ipc_r_bytes(&r, n);
    if (!m || r.at != r.len || n > IPC_MAX_MSG || memchr(m, 0, n))
        return bad(err, errlen, "%s: malformed (%u bytes)", ipc_type_name(f->type), f->len);
    if (s->seq != want_seq)
        return bad(err, errlen, "%s for update %llu where update %llu was expected",
                   ipc_type_name(f->type), (unsigned long long)s->seq,
                   (unsigned long long)want_seq);
    if (s->status > 0 || s->status < -1000)
        return bad(err, errlen, "%s: status %d is no refit status", ipc_type_name(f->type),
                   s->status);
    memcpy(s->msg, m, n);
    s->msg[n] = '\0';
    return REFIT_OK;
}
