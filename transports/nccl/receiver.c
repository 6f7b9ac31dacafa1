/*
 * The worker side: buckets into refit_load / refit_load_part calls on an
 * open transaction, straight from the bucket buffer (on a GPU the CUDA
 * backend batches every copy of a bucket into one launch at flush).
 *
 * The announce and the index (every header) come first, so every bucket's
 * size is known before any payload moves. Then, with S slots (bkt_slots:
 * 2 to 8; host view, the GPU runs what is posted; shown for packed buckets,
 * each holding a slot until used: DIRECT ones received in place hold none,
 * so up to RCV_DEPTH broadcasts are posted ahead, rcv_pump):
 *
 *   post 0..S-1                       broadcast k into slot k % S, its stamp
 *                                     to the host, a ticket
 *   k = 0:  wait 0; stamp 0; [sum 0 on the device]; scatter 0 (engine
 *           stream); NCCL stream waits for the engine stream; post S
 *   k = 1:  wait 1; ...                                          post S+1
 *
 * NCCL always has the next S-1 broadcasts queued while the host handles
 * bucket k, and a slot is posted again only behind the scatter that read
 * it, ordered on the device (wait_stream), never by a host sync. The host
 * waits for broadcast k itself (with the deadline) before scattering it, so
 * the engine stream never waits on NCCL: no host call can hang on a dead
 * peer without a deadline.
 *
 * Payload checksums: each bucket's fingerprint is summed on the engine
 * stream into a small array of transport memory, and the sender's (the
 * word after the stamp) comes to the host with the stamp; the two are
 * compared once, after the last bucket and before the vote. A mismatch
 * fails the update naming the bucket; what was scattered rolls back with
 * the vote's abort, as for any local failure.
 *
 * DIRECT buckets (one tensor or dim-0 part, payload only) are claimed when
 * posted: where txn_claim_direct accepts the route (a plain copy onto
 * contiguous bytes of a runtime tensor on the transport's device), the
 * broadcast goes straight into the runtime tensor, behind the engine
 * stream's queued work (the undo save among it) on the device; anywhere
 * else into a slot and scattered as a packed bucket's. Their stamps and
 * the sender's checksum words come in the trailer, after the last bucket;
 * their own sums (summed over the runtime bytes once the broadcast is in)
 * are compared with the others'. Only a transport whose abort stops every
 * queued broadcast may write runtime tensors (x->writes_outside).
 *
 * A local failure (a refused load, a bad stamp or payload checksum, begin
 * refused, the sender's CANCEL) switches to draining: the rest of the
 * update is still received (the others are broadcasting it) but not
 * scattered, and the failure is voted. A transport failure or a corrupt
 * announce or index ends the update at once: the sizes cannot be
 * followed, the transport is aborted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/sys/transport.h>

#include "core/util.h"
#include "core/ctx.h"
#include "core/model.h"
#include "core/txn.h"
#include "transports/nccl/bucket.h"
#include "transports/nccl/xport.h"

#define RCV_MAX_ACCEPT ((uint64_t)4 << 30)
#define RCV_FREE_LATER 8
/* Broadcasts a receiver keeps posted ahead: packed buckets (and DIRECT ones
 * that cannot land in place) each hold one of the S slots until used;
 * DIRECT ones received in place hold none, so with large DIRECT buckets
 * (S = 2) NCCL still has up to this many queued. */
#define RCV_DEPTH BKT_MAX_SLOTS
#define RCV_NO_SLOT UINT32_MAX

/* Where bucket k's header sits in the index, and its broadcast's size;
 * with a payload checksum, the sender's (compared after the last bucket). */
typedef struct rcv_ref {
    uint64_t at, total;
    uint32_t header_bytes;
    bool direct;                /* BKT_H_DIRECT: payload only, stamp in the trailer */
    uint32_t rec;               /* DIRECT: its place in the trailer */
    bool tried;                 /* DIRECT: claimed, or found not to fit, when first posted */
    void *dst;                  /* DIRECT: claimed, received into this runtime memory */
    uint32_t slot;              /* the slot it was received into, or RCV_NO_SLOT */
    bool summed;                /* its fingerprint was queued into sums[k] */
    uint64_t want;              /* the sender's checksum */
} rcv_ref;

struct refit_receiver {
    refit_model *m;
    refit_ctx *ctx;
    refit_transport *x;
    const backend *be;          /* serves the transport's memory */
    int root;
    double timeout, start_timeout;
    void *stream;
    uint64_t max_accept;
    refit_filter_fn filter;
    void *filter_user;
    void *slot[BKT_MAX_SLOTS];
    uint32_t n_slots;
    uint64_t slot_bytes;
    void *ann;                  /* transport memory: the announce, then the index */
    uint8_t *ann_host;
    void *idx;
    uint8_t *idx_host;
    uint64_t idx_cap;
    uint8_t *stamps;            /* host: each bucket's stamp and checksum word
                                 * (BKT_STAMP_COPY bytes), copied behind its broadcast */
    uint32_t stamps_cap;
    void *sums;                 /* transport memory: each bucket's payload fingerprint */
    uint8_t *sums_host;         /* their copy, read once after the last bucket */
    rcv_ref *refs;
    uint32_t refs_cap;
    void *trailer;              /* transport memory: the DIRECT buckets' stamps and sums */
    uint8_t *trailer_host;
    uint64_t trailer_cap;
    bkt_header h;
    bkt_header hc;              /* a DIRECT bucket's header, decoded to claim it */
    struct {                    /* a tensor split along a dim other than its route's */
        char *name;
        void *buf;
        uint64_t row_bytes;
        int64_t got;
        refit_dtype dtype;
        int32_t ndim;
        int64_t shape[REFIT_MAX_DIMS];
    } as;
    void *free_later[RCV_FREE_LATER]; /* read by queued copies: freed after a sync */
    int n_free_later;
    uint64_t direct_bytes;      /* of the last update: received into runtime tensors */
};

int refit_receiver_create(refit_receiver **out, refit_model *m, refit_transport *x,
                          const refit_recv_opts *o)
{
    refit_recv_opts def = REFIT_RECV_OPTS_INIT;
    if (!out || !m || !x)
        return REFIT_EINVAL;
    *out = NULL;
    refit_ctx *ctx = m->ctx;
    ctx_clear_error(ctx);
    o = o ? o : &def;
    if (x->ctx != ctx)
        return ctx_error(ctx, REFIT_EINVAL, "receiver: the transport belongs to another "
                         "context than the model");
    if (o->version != REFIT_RECV_OPTS_VERSION || o->root < 0 || o->root >= x->nranks ||
        o->root == x->rank || o->timeout_s < 0 || o->start_timeout_s < 0)
        return ctx_error(ctx, REFIT_EINVAL, "receiver: bad options (version %u, root %d: this "
                         "rank is %d of %d)", o->version, o->root, x->rank, x->nranks);
    const backend *be = backend_for_device(x->device);
    if (!be)
        return ctx_error(ctx, REFIT_EUNSUPPORTED, "receiver: no backend serves the %s "
                         "transport's memory (device type %d)", x->ops->name,
                         x->device.device_type);
    refit_receiver *r = calloc(1, sizeof *r);
    if (!r)
        return ctx_error(ctx, REFIT_ENOMEM, "receiver: out of memory");
    *r = (refit_receiver){.m = m, .ctx = ctx, .x = x, .be = be, .root = o->root,
                          .stream = o->stream, .filter = o->filter,
                          .filter_user = o->filter_user};
    r->timeout = o->timeout_s > 0 ? o->timeout_s : x->timeout_s;
    r->start_timeout = o->start_timeout_s > 0 ? o->start_timeout_s : r->timeout;
    r->max_accept = o->max_bucket_bytes ? o->max_bucket_bytes : RCV_MAX_ACCEPT;
    *out = r;
    return REFIT_OK;
}

/* Everything queued on the stream is done: buffers it read can go. */
static int rcv_sync(refit_receiver *r)
{
    int rc = r->be->sync(r->stream);
    for (int i = 0; i < r->n_free_later; i++)
        r->x->ops->mem_free(r->x, r->free_later[i]);
    r->n_free_later = 0;
    return rc;
}

static void rcv_free_assembly(refit_receiver *r)
{
    if (r->as.buf)
        r->x->ops->mem_free(r->x, r->as.buf);
    free(r->as.name);
    memset(&r->as, 0, sizeof r->as);
}

void refit_receiver_destroy(refit_receiver *r)
{
    if (!r)
        return;
    refit_transport *x = r->x;
    (void)rcv_sync(r);
    rcv_free_assembly(r);
    /* nothing is in flight here: every update ends with its broadcasts
     * completed, or with the transport aborted (ncclCommAbort stops them) */
    for (uint32_t i = 0; i < BKT_MAX_SLOTS; i++)
        if (r->slot[i])
            x->ops->mem_free(x, r->slot[i]);
    if (r->ann)
        x->ops->mem_free(x, r->ann);
    if (r->idx)
        x->ops->mem_free(x, r->idx);
    if (r->ann_host)
        x->ops->host_free(x, r->ann_host);
    if (r->idx_host)
        x->ops->host_free(x, r->idx_host);
    if (r->stamps)
        x->ops->host_free(x, r->stamps);
    if (r->sums)
        x->ops->mem_free(x, r->sums);
    if (r->sums_host)
        x->ops->host_free(x, r->sums_host);
    if (r->trailer)
        x->ops->mem_free(x, r->trailer);
    if (r->trailer_host)
        x->ops->host_free(x, r->trailer_host);
    free(r->refs);
    bkt_header_free(&r->h);
    bkt_header_free(&r->hc);
    free(r);
}

/* ---- one update ---- */

typedef struct rcv_run {
    refit_txn *txn;             /* NULL while draining without a txn */
    const refit_update_opts *begin; /* begin at bucket 0 with these, or NULL */
    refit_txn **began;
    bkt_announce an;
    uint64_t ticket[RCV_DEPTH]; /* bucket k's broadcast: ticket[k % RCV_DEPTH] */
    uint32_t next;              /* the next bucket to post */
    uint32_t slot_user[BKT_MAX_SLOTS]; /* the bucket a slot was posted for, until used */
    uint32_t slot_turn;         /* where the search for a free slot starts */
    uint64_t trailer_ticket;
    uint32_t n_direct;
    int local;                  /* first local failure: drain from there */
    bool cancelled;             /* the sender cancelled */
    char why[REFIT_ERRMSG_SIZE];
    refit_progress_fn progress;
    void *user;
    uint64_t bytes, tensors;
    uint32_t buckets;
    char label[BKT_MAX_LABEL + 1];
} rcv_run;

/* Remember the first local failure and its message; from now on drain. */
static void rcv_local(refit_receiver *r, rcv_run *run, int rc)
{
    if (run->local || !rc)
        return;
    run->local = rc;
    snprintf(run->why, sizeof run->why, "%s", r->ctx->errmsg[0] ? r->ctx->errmsg
                                                                 : refit_strerror(rc));
}

static void rcv_free_slots(refit_receiver *r)
{
    for (uint32_t i = 0; i < BKT_MAX_SLOTS; i++) {
        if (r->slot[i])
            r->x->ops->mem_free(r->x, r->slot[i]);
        r->slot[i] = NULL;
    }
    r->slot_bytes = 0;
    r->n_slots = 0;
}

/* Slots for the announced buckets (grown, never in flight here). */
static int rcv_slots(refit_receiver *r, uint64_t max_total)
{
    refit_transport *x = r->x;
    uint32_t want = bkt_slots(max_total);
    if (r->slot_bytes >= max_total && r->n_slots == want)
        return REFIT_OK;
    rcv_free_slots(r);
    for (uint32_t i = 0; i < want; i++)
        if (x->ops->mem_alloc(x, &r->slot[i], max_total)) {
            rcv_free_slots(r);
            return xport_fail(x, REFIT_ENOMEM, "receiver: no transport memory for %u buckets "
                              "of %llu bytes", want, (unsigned long long)max_total);
        }
    r->slot_bytes = max_total;
    r->n_slots = want;
    return REFIT_OK;
}

/* Transport memory and its host mirror, grown (never shrunk) to hold n
 * bytes; on failure both are gone and *cap is 0. */
static int rcv_grow_mirrored(refit_transport *x, void **dev, uint8_t **host, uint64_t *cap,
                             uint64_t n)
{
    if (*cap >= n)
        return REFIT_OK;
    if (*dev)
        x->ops->mem_free(x, *dev);
    if (*host)
        x->ops->host_free(x, *host);
    *dev = NULL;
    *host = NULL;
    *cap = 0;
    if (x->ops->mem_alloc(x, dev, n) || x->ops->host_alloc(x, (void **)host, n))
        return REFIT_ENOMEM;
    *cap = n;
    return REFIT_OK;
}

/* Room for the index, the stamps and the bucket table of an announce. */
static int rcv_index_memory(refit_receiver *r, const bkt_announce *an)
{
    refit_transport *x = r->x;
    if (rcv_grow_mirrored(x, &r->idx, &r->idx_host, &r->idx_cap, an->index_bytes))
        return xport_fail(x, REFIT_ENOMEM, "receiver: no memory for an index of %llu bytes",
                          (unsigned long long)an->index_bytes);
    if (r->stamps_cap < an->n_buckets) {
        if (r->stamps)
            x->ops->host_free(x, r->stamps);
        if (r->sums)
            x->ops->mem_free(x, r->sums);
        if (r->sums_host)
            x->ops->host_free(x, r->sums_host);
        r->stamps = r->sums_host = NULL;
        r->sums = NULL;
        r->stamps_cap = 0;
        free(r->refs);
        size_t n = an->n_buckets;
        r->refs = malloc(n * sizeof *r->refs);
        if (!r->refs || x->ops->host_alloc(x, (void **)&r->stamps, n * BKT_STAMP_COPY) ||
            x->ops->mem_alloc(x, &r->sums, n * 8) ||
            x->ops->host_alloc(x, (void **)&r->sums_host, n * 8))
            return xport_fail(x, REFIT_ENOMEM, "receiver: no memory for %u buckets' stamps "
                              "and checksums", an->n_buckets);
        r->stamps_cap = an->n_buckets;
    }
    if (rcv_grow_mirrored(x, &r->trailer, &r->trailer_host, &r->trailer_cap, an->trailer_bytes))
        return xport_fail(x, REFIT_ENOMEM, "receiver: no memory for a trailer of %llu bytes",
                          (unsigned long long)an->trailer_bytes);
    return REFIT_OK;
}

/* One broadcast of n bytes at dev into host, waited for. */
static int rcv_fetch(refit_receiver *r, void *dev, uint8_t *host, uint64_t n, double deadline)
{
    refit_transport *x = r->x;
    uint64_t t;
    int rc = x->ops->bcast(x, dev, n, r->root, deadline);
    if (!rc)
        rc = x->ops->to_host(x, host, dev, n);
    if (!rc)
        rc = x->ops->mark(x, &t);
    return rc ? rc : x->ops->wait(x, t, deadline);
}

/* Every header of the index, checked as a chain (each names the next
 * one's size) before any payload is posted; the table says where each is. */
static int rcv_index(refit_receiver *r, rcv_run *run)
{
    const bkt_announce *an = &run->an;
    uint64_t at = 0, total = an->first_total;
    uint32_t hb = an->first_header;
    char err[512];
    for (uint32_t k = 0; k < an->n_buckets; k++) {
        if (hb > an->index_bytes - at)
            return xport_fail(r->x, REFIT_ECORRUPT, "index: bucket %u's %u-byte header runs "
                              "past the %llu-byte index", k, hb,
                              (unsigned long long)an->index_bytes);
        bkt_expect ex = {k, an->n_buckets, an->nonce, hb, total, an->max_total};
        if (bkt_header_decode(&r->h, r->idx_host + at, &ex, err, sizeof err))
            return xport_fail(r->x, REFIT_ECORRUPT, "index: %s", err);
        if (k == 0)
            snprintf(run->label, sizeof run->label, "%s", r->h.label);
        else if (strcmp(run->label, r->h.label))
            return xport_fail(r->x, REFIT_ECORRUPT, "index: bucket %u is labelled '%s', "
                              "bucket 0 '%s'", k, r->h.label, run->label);
        bool direct = r->h.flags & BKT_H_DIRECT;
        r->refs[k] = (rcv_ref){.at = at, .total = total, .header_bytes = hb, .direct = direct,
                               .rec = run->n_direct, .slot = RCV_NO_SLOT};
        run->n_direct += direct;
        at += hb;
        hb = r->h.next_header;
        total = r->h.next_total;
    }
    if (at != an->index_bytes)
        return xport_fail(r->x, REFIT_ECORRUPT, "index: %llu stray bytes after the last header",
                          (unsigned long long)(an->index_bytes - at));
    if (bkt_trailer_bytes(run->n_direct) != an->trailer_bytes)
        return xport_fail(r->x, REFIT_ECORRUPT, "index: %u DIRECT buckets, but the announce's "
                          "trailer is %llu bytes", run->n_direct,
                          (unsigned long long)an->trailer_bytes);
    return REFIT_OK;
}

static int rcv_announce(refit_receiver *r, rcv_run *run)
{
    refit_transport *x = r->x;
    if (!r->ann && (x->ops->mem_alloc(x, &r->ann, BKT_ANNOUNCE_BYTES) ||
                    x->ops->host_alloc(x, (void **)&r->ann_host, BKT_ANNOUNCE_BYTES)))
        return xport_fail(x, REFIT_ENOMEM, "receiver: no memory for the announce");
    int rc = rcv_fetch(r, r->ann, r->ann_host, BKT_ANNOUNCE_BYTES,
                       xport_now() + r->start_timeout);
    if (rc)
        return rc;
    char err[256];
    if (bkt_announce_decode(&run->an, r->ann_host, r->max_accept, err, sizeof err))
        return xport_fail(x, REFIT_ECORRUPT, "%s", err);
    if (!run->an.n_buckets)
        return REFIT_OK;
    rc = rcv_index_memory(r, &run->an);
    if (!rc)
        rc = rcv_fetch(r, r->idx, r->idx_host, run->an.index_bytes, xport_now() + r->timeout);
    if (!rc)
        rc = rcv_index(r, run);
    return rc ? rc : rcv_slots(r, run->an.max_total);
}

static int rcv_split_dim(const refit_model *m, const char *name);

/* DIRECT bucket k, before its broadcast is posted: where its bytes may go
 * straight (txn_claim_direct), else *dst NULL (a slot). A claim refused
 * is a local failure, as the load would have been. */
static void rcv_claim(refit_receiver *r, rcv_run *run, uint32_t k, void **dst)
{
    const rcv_ref *ref = &r->refs[k];
    *dst = NULL;
    if (!run->txn || run->local || !r->x->writes_outside)
        return;
    bkt_expect ex = {k, run->an.n_buckets, run->an.nonce, ref->header_bytes, ref->total,
                     run->an.max_total};
    char err[512];
    if (bkt_header_decode(&r->hc, r->idx_host + ref->at, &ex, err, sizeof err)) {
        rcv_local(r, run, ctx_error(r->ctx, REFIT_ECORRUPT, "update '%s': %s", run->label, err));
        return;
    }
    const bkt_entry *e = &r->hc.entries[0];
    /* filtered out, or parts of a tensor split along another dim (assembled) */
    if ((r->filter && !r->filter(r->filter_user, e->name)) ||
        (e->part && rcv_split_dim(r->m, e->name) != 0))
        return;
    int64_t shape[REFIT_MAX_DIMS];
    memcpy(shape, e->shape, sizeof shape);
    if (e->part)
        shape[0] = e->rows;
    refit_tensor t = {.device = r->x->device, .ndim = e->ndim, .dtype = e->dtype,
                      .shape = shape};
    rcv_local(r, run, txn_claim_direct(run->txn, e->name, e->part, e->row_offset, &t, r->stream,
                                       dst));
    if (*dst)
        r->direct_bytes += e->bytes;
}

/* A DIRECT bucket, when first posted: claimed (in place) or not. */
static void rcv_try_claim(refit_receiver *r, rcv_run *run, uint32_t k)
{
    rcv_ref *ref = &r->refs[k];
    ref->tried = true;
    rcv_claim(r, run, k, &ref->dst);
    /* the undo save must be on the device before the broadcast */
    int rc = ref->dst ? r->be->flush(r->stream) : REFIT_OK;
    if (rc) {
        rcv_local(r, run, ctx_error(r->ctx, rc, "bucket %u: the engine stream's queued copies "
                                    "failed: %s", k, refit_strerror(rc)));
        ref->dst = NULL;
    }
}

/* A free slot for bucket k (round robin), or RCV_NO_SLOT while every slot
 * holds a bucket not used yet. */
static uint32_t rcv_take_slot(refit_receiver *r, rcv_run *run, uint32_t k)
{
    for (uint32_t j = 0; j < r->n_slots; j++) {
        uint32_t i = (run->slot_turn + j) % r->n_slots;
        if (run->slot_user[i] == RCV_NO_SLOT) {
            run->slot_user[i] = k;
            run->slot_turn = i + 1;
            return i;
        }
    }
    return RCV_NO_SLOT;
}

/* Post bucket k: the broadcast into its slot, then its stamp and checksum
 * word to the host; a DIRECT one into the runtime tensor it claimed (after
 * the engine stream's queued work: its reads of the old bytes, the undo
 * save) or its slot. Behind the last bucket, the trailer. */
static int rcv_post(refit_receiver *r, rcv_run *run, uint32_t k)
{
    refit_transport *x = r->x;
    rcv_ref *ref = &r->refs[k];
    void *slot = ref->slot == RCV_NO_SLOT ? NULL : r->slot[ref->slot];
    double deadline = xport_now() + r->timeout;
    int rc = REFIT_OK;
    if (ref->direct) {
        rc = ref->dst ? x->ops->wait_stream(x, r->stream) : REFIT_OK;
        if (!rc)
            rc = x->ops->bcast(x, ref->dst ? ref->dst : slot, ref->total, r->root, deadline);
    } else {
        rc = x->ops->bcast(x, slot, ref->total, r->root, deadline);
        if (!rc)
            rc = x->ops->to_host(x, r->stamps + (size_t)k * BKT_STAMP_COPY, slot,
                                 BKT_STAMP_COPY);
    }
    if (!rc)
        rc = x->ops->mark(x, &run->ticket[k % RCV_DEPTH]);
    if (rc || k + 1 < run->an.n_buckets || !run->n_direct)
        return rc;
    rc = x->ops->bcast(x, r->trailer, run->an.trailer_bytes, r->root, deadline);
    if (!rc)
        rc = x->ops->to_host(x, r->trailer_host, r->trailer, run->an.trailer_bytes);
    return rc ? rc : x->ops->mark(x, &run->trailer_ticket);
}

/* ---- scatter ---- */

/* The dim deliveries of a checkpoint tensor split along (refit_load_part):
 * its route's shard dim, else 0. Read from the sealed plan; -2 when the
 * model has no such tensor (the load then reports it). */
static int rcv_split_dim(const refit_model *m, const char *name)
{
    if (!m->sealed)
        return -2;
    uint32_t ri = names_find(&m->route_names, name);
    return ri == NAMES_NONE ? -2 : m->routes[ri].split_dim;
}

static refit_view rcv_bytes_view(void *p, uint64_t n, refit_device dev)
{
    refit_view v = {.data = p, .device = dev, .dtype = REFIT_U8, .ndim = 1,
                    .shape = {(int64_t)n}, .strides = {1}};
    return v;
}

static int rcv_free_later(refit_receiver *r, void *p)
{
    int rc = r->n_free_later == RCV_FREE_LATER ? rcv_sync(r) : REFIT_OK;
    r->free_later[r->n_free_later++] = p;
    return rc;
}

/* A dim-0 piece of a tensor whose route splits along another dim: rows go
 * into a whole-tensor buffer (in order), and the whole tensor is loaded
 * once every row arrived. */
static int rcv_assemble(refit_receiver *r, refit_txn *txn, const bkt_entry *e, void *src)
{
    refit_transport *x = r->x;
    if (r->as.name && strcmp(r->as.name, e->name))
        return ctx_error(r->ctx, REFIT_EUNSUPPORTED, "load %s: its parts arrived interleaved "
                         "with the parts of %s", e->name, r->as.name);
    if (!r->as.name) {
        uint64_t whole = e->bytes / (uint64_t)e->rows * (uint64_t)e->shape[0];
        if (!(r->as.name = xstrdup(e->name)) || x->ops->mem_alloc(x, &r->as.buf, whole)) {
            rcv_free_assembly(r);
            return ctx_error(r->ctx, REFIT_ENOMEM, "load %s: no memory to assemble its %llu "
                             "bytes", e->name, (unsigned long long)whole);
        }
        r->as.row_bytes = e->bytes / (uint64_t)e->rows;
        r->as.dtype = e->dtype;
        r->as.ndim = e->ndim;
        memcpy(r->as.shape, e->shape, sizeof r->as.shape);
    }
    if (e->row_offset != r->as.got)
        return ctx_error(r->ctx, REFIT_EOVERLAP, "load %s: part at row %lld arrived where row "
                         "%lld was expected", e->name, (long long)e->row_offset,
                         (long long)r->as.got);
    refit_view d = rcv_bytes_view((char *)r->as.buf + (uint64_t)e->row_offset * r->as.row_bytes,
                                  e->bytes, x->device);
    refit_view s = rcv_bytes_view(src, e->bytes, x->device);
    int rc = r->be->copy(&d, &s, r->stream);
    if (rc)
        return ctx_error(r->ctx, rc, "load %s: assembling its parts failed", e->name);
    if ((r->as.got += e->rows) < r->as.shape[0])
        return REFIT_OK;
    refit_tensor t = {.data = r->as.buf, .device = x->device, .ndim = r->as.ndim,
                      .dtype = r->as.dtype, .shape = r->as.shape};
    rc = refit_load(txn, r->as.name, &t, r->stream);
    int frc = rcv_free_later(r, r->as.buf);
    r->as.buf = NULL;
    rcv_free_assembly(r);
    return rc ? rc : frc;
}

static int rcv_entry(refit_receiver *r, refit_txn *txn, const bkt_entry *e, uint8_t *payload)
{
    int64_t shape[REFIT_MAX_DIMS];
    memcpy(shape, e->shape, sizeof shape);
    if (e->part)
        shape[0] = e->rows;
    refit_tensor t = {.data = payload + e->offset, .device = r->x->device, .ndim = e->ndim,
                      .dtype = e->dtype, .shape = shape};
    if (!e->part)
        return refit_load(txn, e->name, &t, r->stream);
    int sd = rcv_split_dim(r->m, e->name);
    if (sd == 0 || sd == -2)
        return refit_load_part(txn, e->name, e->row_offset, &t, r->stream);
    return rcv_assemble(r, txn, e, t.data);
}

/* One entry delivered: counted, and reported. */
static void rcv_count(rcv_run *run, const bkt_entry *e)
{
    run->tensors++;
    run->bytes += e->bytes;
    if (run->progress)
        run->progress(run->user, run->bytes, run->tensors, e->name);
}

/* A patch (bkt_header_decode checked its g entries: indices, counts when
 * g is 3, values): its indices and counts copied to the host, where
 * refit_load_delta reads them (a wait on the engine stream), its values
 * read from the slot as a whole tensor's bytes are. */
static int rcv_patch(refit_receiver *r, refit_txn *txn, const bkt_entry *e, uint32_t g,
                     uint8_t *payload)
{
    size_t n = (size_t)e->shape[0], words = (g == 3 ? 2 : 1) * n;
    int64_t *host = malloc((words ? words : 1) * sizeof *host);
    if (!host)
        return ctx_error(r->ctx, REFIT_ENOMEM, "load_delta %s: no memory for %zu indices",
                         e->name, n);
    int rc = REFIT_OK;
    for (uint32_t j = 0; j + 1 < g && !rc; j++)
        rc = backend_read(r->be, host + j * n, payload + e[j].offset, e[j].bytes, r->stream);
    if (rc) {
        free(host);
        return ctx_error(r->ctx, rc, "load_delta %s: copying its indices to the host failed: "
                         "%s", e->name, r->be->last_error());
    }
    const bkt_entry *v = &e[g - 1];
    int64_t shape[1] = {v->shape[0]};
    refit_tensor t = {.data = payload + v->offset, .device = r->x->device, .ndim = 1,
                      .dtype = v->dtype, .shape = shape};
    rc = g == 3 ? refit_load_delta_runs(txn, e->name, n, host, host + n, &t, r->stream)
                : refit_load_delta(txn, e->name, n, host, &t, r->stream);
    free(host);
    return rc;
}

static int rcv_scatter(refit_receiver *r, rcv_run *run, uint8_t *payload)
{
    const bkt_header *h = &r->h;
    for (uint32_t k = 0; k < h->n_entries; k++) {
        const bkt_entry *e = &h->entries[k];
        uint32_t g = e->kind != BKT_E_DELTA_INDICES ? 1
                     : k + 2 < h->n_entries && e[1].kind == BKT_E_DELTA_COUNTS ? 3 : 2;
        if (r->filter && !r->filter(r->filter_user, e->name)) {
            k += g - 1;
            continue;
        }
        int rc = g > 1 ? rcv_patch(r, run->txn, e, g, payload)
                       : rcv_entry(r, run->txn, e, payload);
        if (rc)
            return rc;
        for (uint32_t j = 1; j < g; j++)
            run->bytes += e[j].bytes;
        rcv_count(run, e);
        k += g - 1;
    }
    return r->be->flush(r->stream);
}

/* Bucket k's fingerprint into sums[k], queued on the engine stream ahead of
 * its scatter (so before the slot is posted again); the last bucket's on
 * the transport's stream instead, idle once the last broadcast is in, so
 * it runs beside the last scatter and the comparison's copy follows it in
 * stream order. The sender's is kept for the comparison. */
static int rcv_checksum(refit_receiver *r, const rcv_run *run, uint32_t k, uint8_t *payload)
{
    rcv_ref *ref = &r->refs[k];
    refit_view v = rcv_bytes_view(payload, r->h.payload_bytes, r->x->device);
    /* a DIRECT bucket's comes with the trailer */
    if (!ref->direct)
        ref->want = bkt_le64(r->stamps + (size_t)k * BKT_STAMP_COPY + BKT_SUM_AT);
    void *stream = k + 1 == run->an.n_buckets ? r->x->stream : r->stream;
    int rc = r->x->ops->fingerprint_to(r->x, (uint8_t *)r->sums + (size_t)k * 8, &v, stream);
    if (rc)
        return ctx_error(r->ctx, rc, "bucket %u: %s", k, r->x->err);
    ref->summed = true;
    return REFIT_OK;
}

/* Every queued fingerprint against the sender's, once the engine stream is
 * done (rcv_sync; the last bucket's is ahead of the copy on the transport's
 * stream): one copy and one wait for the whole update. A transport failure
 * is returned; a mismatch is local (the first bucket named). */
static int rcv_compare(refit_receiver *r, rcv_run *run)
{
    refit_transport *x = r->x;
    uint32_t n = run->an.n_buckets, first = n;
    for (uint32_t k = 0; k < n && first == n; k++)
        if (r->refs[k].summed)
            first = k;
    if (first == n)
        return REFIT_OK;
    uint64_t t;
    int rc = x->ops->to_host(x, r->sums_host, r->sums, (size_t)n * 8);
    if (!rc)
        rc = x->ops->mark(x, &t);
    if (!rc)
        rc = x->ops->wait(x, t, xport_now() + r->timeout);
    if (rc)
        return rc;
    for (uint32_t k = first; k < n; k++) {
        uint64_t got = bkt_le64(r->sums_host + (size_t)k * 8);
        if (!r->refs[k].summed || got == r->refs[k].want)
            continue;
        rcv_local(r, run, ctx_error(r->ctx, REFIT_ECORRUPT, "bucket %u of update '%s': payload "
                                    "checksum %016llx, the sender's is %016llx; the update is "
                                    "refused (its loaded bytes roll back with the abort, or "
                                    "the worker is POISONED without an undo log)", k, run->label,
                                    (unsigned long long)got,
                                    (unsigned long long)r->refs[k].want));
        break;
    }
    return REFIT_OK;
}

/* ---- the update loop ---- */

/* refit_receive_update begins once the sender's label is known. */
static void rcv_begin(refit_receiver *r, rcv_run *run)
{
    if (!run->begin)
        return;
    refit_update_opts o = *run->begin;
    char uri[96];
    snprintf(uri, sizeof uri, "%s://rank%d/%016llx", r->x->ops->name, r->root,
             (unsigned long long)run->an.nonce);
    if (!o.version_label)
        o.version_label = run->label[0] ? run->label : NULL;
    if (!o.source_uri)
        o.source_uri = uri;
    int rc = refit_begin(run->began, r->m, &o);
    run->begin = NULL;
    if (rc)
        rcv_local(r, run, rc);
    else
        run->txn = *run->began;
}

static void rcv_cancelled(refit_receiver *r, rcv_run *run, const bkt_stamp *st)
{
    run->cancelled = true;
    rcv_local(r, run, ctx_error(r->ctx, st->status, "the sender cancelled update '%s' at "
                                "bucket %u of %u (%s)", run->label, st->index,
                                run->an.n_buckets, refit_status_name(st->status)));
}

/* DIRECT bucket k arrived (its stamp comes with the trailer): summed where
 * it landed when the sender sums payloads; claimed, it is loaded already,
 * else scattered from its slot as a packed bucket. */
static void rcv_use_direct(refit_receiver *r, rcv_run *run, uint32_t k, uint8_t *slot)
{
    const rcv_ref *ref = &r->refs[k];
    if (run->local)
        return;
    bkt_expect ex = {k, run->an.n_buckets, run->an.nonce, ref->header_bytes, ref->total,
                     run->an.max_total};
    char err[512];
    if (bkt_header_decode(&r->h, r->idx_host + ref->at, &ex, err, sizeof err)) {
        rcv_local(r, run, ctx_error(r->ctx, REFIT_ECORRUPT, "update '%s': %s", run->label, err));
        return;
    }
    uint8_t *payload = ref->dst ? ref->dst : slot;
    if (run->an.flags & BKT_A_PAYLOAD_SUM)
        rcv_local(r, run, rcv_checksum(r, run, k, payload));
    if (run->local)
        return;
    if (ref->dst)
        rcv_count(run, &r->h.entries[0]);
    else
        rcv_local(r, run, rcv_scatter(r, run, payload));
}

/* The trailer (posted behind the last bucket): every DIRECT bucket's stamp
 * and the sender's checksum word. A bad stamp or a CANCEL is local, as in
 * a packed bucket. Returns transport failures. */
static int rcv_trailer(refit_receiver *r, rcv_run *run)
{
    if (!run->n_direct)
        return REFIT_OK;
    int rc = r->x->ops->wait(r->x, run->trailer_ticket, xport_now() + r->timeout);
    if (rc)
        return rc;
    uint32_t n = run->an.n_buckets;
    char err[512];
    for (uint32_t k = 0; k < n; k++) {
        rcv_ref *ref = &r->refs[k];
        if (!ref->direct)
            continue;
        bkt_stamp st;
        if (bkt_stamp_decode(&st, r->trailer_host + bkt_trailer_stamp(ref->rec), k,
                             run->an.nonce, ref->total, err, sizeof err)) {
            rcv_local(r, run, ctx_error(r->ctx, REFIT_ECORRUPT, "update '%s': the trailer: %s",
                                        run->label, err));
            ref->summed = false;
            continue;
        }
        if (st.flags & BKT_F_CANCEL) {
            if (!run->cancelled)
                rcv_cancelled(r, run, &st);
            ref->summed = false;
            continue;
        }
        if (!(st.flags & BKT_F_PAYLOAD_SUM) != !(run->an.flags & BKT_A_PAYLOAD_SUM))
            rcv_local(r, run, ctx_error(r->ctx, REFIT_ECORRUPT, "update '%s': bucket %u's stamp "
                                        "and the announce disagree on the payload checksum",
                                        run->label, k));
        ref->want = bkt_le64(r->trailer_host + bkt_trailer_sum(run->n_direct, ref->rec));
    }
    return REFIT_OK;
}

/* Bucket k arrived: its stamp, then (unless draining) its checksum and
 * scatter. A bad stamp is local: the sizes come from the index, so the
 * rest can still be drained and the failure voted. */
static void rcv_use(refit_receiver *r, rcv_run *run, uint32_t k, uint8_t *slot)
{
    const rcv_ref *ref = &r->refs[k];
    bkt_stamp st;
    char err[512];
    if (ref->direct) {
        rcv_use_direct(r, run, k, slot);
        return;
    }
    if (bkt_stamp_decode(&st, r->stamps + (size_t)k * BKT_STAMP_COPY, k, run->an.nonce,
                         ref->total - BKT_ALIGN, err, sizeof err)) {
        rcv_local(r, run, ctx_error(r->ctx, REFIT_ECORRUPT, "update '%s': %s; nothing of it "
                                    "was loaded", run->label, err));
        return;
    }
    if (st.flags & BKT_F_CANCEL) {
        if (!run->cancelled)
            rcv_cancelled(r, run, &st);
        return;
    }
    if (run->local)
        return;
    /* validated with the index: decoding again only fills the entries */
    bkt_expect ex = {k, run->an.n_buckets, run->an.nonce, ref->header_bytes, ref->total,
                     run->an.max_total};
    if (bkt_header_decode(&r->h, r->idx_host + ref->at, &ex, err, sizeof err)) {
        rcv_local(r, run, ctx_error(r->ctx, REFIT_ECORRUPT, "update '%s': %s", run->label, err));
        return;
    }
    if (st.flags & BKT_F_PAYLOAD_SUM)
        rcv_local(r, run, rcv_checksum(r, run, k, slot + BKT_ALIGN));
    if (!run->local)
        rcv_local(r, run, rcv_scatter(r, run, slot + BKT_ALIGN));
}

/* Post every bucket before until that can go now, in order (callers keep
 * until at most RCV_DEPTH beyond the first bucket not used yet), each
 * DIRECT one claimed first, and one that needs a slot only when a slot is
 * free (a slot is posted again behind the scatter that read it: the caller
 * made the NCCL stream wait for the engine stream). Some bucket is always
 * in flight or postable: every slot is free once the buckets before the
 * next one are used. */
static int rcv_pump(refit_receiver *r, rcv_run *run, uint32_t until)
{
    int rc = REFIT_OK;
    while (!rc && run->next < run->an.n_buckets && run->next < until) {
        uint32_t k = run->next;
        rcv_ref *ref = &r->refs[k];
        if (ref->direct && !ref->tried)
            rcv_try_claim(r, run, k);
        if (!ref->dst && (ref->slot = rcv_take_slot(r, run, k)) == RCV_NO_SLOT)
            break;
        rc = rcv_post(r, run, k);
        run->next++;
    }
    return rc;
}

/* Wait for bucket k, use it, free its slot, and post what can go behind
 * the scatter that read it. Returns transport failures; local ones are
 * kept in run. */
static int rcv_bucket(refit_receiver *r, rcv_run *run, uint32_t k)
{
    refit_transport *x = r->x;
    rcv_ref *ref = &r->refs[k];
    if (k >= run->next) /* rcv_pump always leaves the next bucket posted */
        return xport_fail(x, REFIT_EINTERNAL, "receiver: bucket %u was never posted", k);
    int rc = x->ops->wait(x, run->ticket[k % RCV_DEPTH], xport_now() + r->timeout);
    if (rc)
        return rc;
    run->buckets++;
    rcv_use(r, run, k, ref->slot == RCV_NO_SLOT ? NULL : r->slot[ref->slot]);
    if (ref->slot != RCV_NO_SLOT)
        run->slot_user[ref->slot] = RCV_NO_SLOT;
    if (run->next >= run->an.n_buckets)
        return REFIT_OK;
    rc = x->ops->wait_stream(x, r->stream);
    return rc ? rc : rcv_pump(r, run, k + 1 + RCV_DEPTH);
}

static int rcv_update(refit_receiver *r, rcv_run *run)
{
    r->direct_bytes = 0;
    int rc = xport_check(r->x);
    if (!rc)
        rc = rcv_announce(r, run);
    uint32_t n = run->an.n_buckets;
    for (uint32_t i = 0; i < BKT_MAX_SLOTS; i++)
        run->slot_user[i] = RCV_NO_SLOT;
    /* DIRECT buckets are claimed as they are posted, which needs the txn:
     * when it is still to begin, bucket 0 (the smallest DIRECT one) is
     * posted first, with no txn to claim it (a slot), so begin's journal
     * write overlaps its transfer */
    if (!rc && run->n_direct && run->begin) {
        rc = rcv_pump(r, run, 1);
        rcv_begin(r, run);
    }
    if (!rc)
        rc = rcv_pump(r, run, RCV_DEPTH);
    /* after the first posts: begin's journal write overlaps their transfer */
    if (!rc)
        rcv_begin(r, run);
    for (uint32_t k = 0; !rc && k < n; k++)
        rc = rcv_bucket(r, run, k);
    if (!rc)
        rc = rcv_trailer(r, run);
    int src = rcv_sync(r);
    if (!rc && src)
        rcv_local(r, run, ctx_error(r->ctx, src, "copies of the last bucket failed: %s",
                                    refit_strerror(src)));
    if (!rc && !src)
        rc = rcv_compare(r, run);
    if (!rc && r->as.name)
        rcv_local(r, run, ctx_error(r->ctx, REFIT_EINCOMPLETE, "load %s: %lld of its %lld "
                                    "rows arrived", r->as.name, (long long)r->as.got,
                                    (long long)r->as.shape[0]));
    rcv_free_assembly(r);
    return rc;
}

/* The transport failed (rc: its status): abort it, journal, and say what
 * was awaited. A deadline stays REFIT_ETIMEDOUT; anything else is EIO. */
static int rcv_fatal(refit_receiver *r, const rcv_run *run, int64_t journal_id, int rc)
{
    int st = rc == REFIT_ETIMEDOUT ? REFIT_ETIMEDOUT : REFIT_EIO;
    refit_transport *x = r->x;
    char msg[sizeof x->err];
    snprintf(msg, sizeof msg, "%s", x->err);
    xport_abort(x, "receiver: %s", msg);
    xport_journal(r->ctx, journal_id, "transport", "update '%s': %s; after %u of %u buckets; "
                  "the %s transport was aborted", run->label[0] ? run->label : "?", msg,
                  run->buckets, run->an.n_buckets, x->ops->name);
    return ctx_error(r->ctx, st, "receive: update '%s': %s (%u of %u buckets had "
                     "arrived); the %s transport is aborted", run->label[0] ? run->label : "?",
                     msg, run->buckets, run->an.n_buckets, x->ops->name);
}

uint64_t refit_sys_receiver_direct_bytes(const refit_receiver *r)
{
    return r ? r->direct_bytes : 0;
}

int refit_receive(refit_receiver *r, refit_txn *txn, refit_progress_fn progress, void *user)
{
    if (!r || !txn)
        return REFIT_EINVAL;
    ctx_clear_error(r->ctx);
    rcv_run run = {.txn = txn, .progress = progress, .user = user};
    int rc = rcv_update(r, &run);
    if (rc)
        return rcv_fatal(r, &run, refit_txn_journal_id(txn), rc);
    return run.local ? ctx_error(r->ctx, run.local, "%s", run.why) : REFIT_OK;
}

/* The transport failed under refit_receive_update: abort the update here
 * too (no vote can be taken). */
static int rcv_update_failed(refit_receiver *r, const rcv_run *run, refit_txn *txn,
                             refit_group_result *res, int rc)
{
    int st = rcv_fatal(r, run, txn ? refit_txn_journal_id(txn) : 0, rc);
    char why[REFIT_ERRMSG_SIZE];
    snprintf(why, sizeof why, "%s", r->ctx->errmsg);
    res->worker_status = txn ? refit_abort_reason(txn, why) : REFIT_OK;
    res->decision = st;
    res->local_status = st;
    return ctx_error(r->ctx, st, "%s; update aborted on this rank, %s", why,
                     res->worker_status == REFIT_EPOISONED ? "worker POISONED"
                     : txn                                 ? "bytes rolled back"
                                                           : "nothing was begun");
}

int refit_receive_update(refit_receiver *r, const refit_update_opts *opts,
                         refit_group_result *out)
{
    refit_update_opts def = REFIT_UPDATE_OPTS_INIT;
    if (!r)
        return REFIT_EINVAL;
    ctx_clear_error(r->ctx);
    refit_txn *txn = NULL;
    rcv_run run = {.begin = opts ? opts : &def, .began = &txn};
    refit_group_result res = {.decision = REFIT_EIO, .failed_rank = -1};
    double t0 = xport_now();
    int rc = rcv_update(r, &run);
    if (rc) {
        rc = rcv_update_failed(r, &run, txn, &res, rc);
    } else {
        if (run.local)
            ctx_error(r->ctx, run.local, "%s", run.why);
        rc = refit_group_finalize(r->x, txn, run.local, &res);
    }
    res.buckets = run.buckets;
    res.tensors = run.tensors;
    res.bytes = run.bytes;
    res.seconds = xport_now() - t0;
    snprintf(res.version_label, sizeof res.version_label, "%.*s",
             (int)sizeof res.version_label - 1, run.label);
    if (out)
        *out = res;
    return rc;
}
