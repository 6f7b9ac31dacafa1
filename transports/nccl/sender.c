/*
 * The trainer side: plan every bucket of the update first, broadcast the
 * announce and the index (every header), then per bucket pack (backend
 * copies into a slot's payload, checksum), stamp it and broadcast it.
 * DIRECT buckets (a tensor of at least direct_min bytes, contiguous on the
 * transport's device) come first and are broadcast from the tensor itself:
 * no slot, no pack; their stamps and checksums (summed on the packing
 * stream into the trailer's memory) go in the trailer, one broadcast after
 * the last bucket.
 * Slots (bkt_slots: 2 to 8) rotate: bucket b is packed into the slot of
 * bucket b - slots once that broadcast completed, while the broadcasts
 * queued after it keep NCCL busy. The broadcast waits for the packing
 * copies on the device (wait_stream), not on the host; with checksums, the
 * payload's fingerprint is summed on the packing stream straight into the
 * bucket's checksum word (BKT_SUM_AT), so no host waits for it either: the
 * only host waits of a send are a slot's previous broadcast and the end.
 *
 * A local failure while packing stamps that bucket and every later one
 * CANCEL, unpacked: receivers posted every planned broadcast, so each one
 * is still sent; they drain, and the vote aborts the update everywhere.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/names.h"
#include "core/util.h"
#include "core/ctx.h"
#include "transports/nccl/bucket.h"
#include "transports/nccl/xport.h"
#include "kernels/copy.h"

typedef struct snd_tensor {
    char *name;
    const refit_tensor *t;      /* borrowed, or own */
    uint8_t kind;               /* BKT_E_WHOLE, or one entry of a patch */
    refit_tensor *own;          /* a patch's indices or counts: the caller's
                                 * array described here (freed by clear) */
} snd_tensor;

struct refit_sender {
    refit_transport *x;
    refit_ctx *ctx;
    char *label;
    uint64_t bucket_bytes;
    int root;
    bool sum;
    double timeout;
    void *stream;
    snd_tensor *ts;
    uint32_t n, cap;
    bkt_tensor *bt;             /* the planner's view of ts, rebuilt per send */
    uint8_t *kinds;             /* ts' kinds for the planner; NULL until a patch */
    uint32_t n_patches;
    names by_name;
    void *slot[BKT_MAX_SLOTS];  /* transport memory */
    uint32_t n_slots;
    uint64_t slot_bytes;
    uint64_t ticket[BKT_MAX_SLOTS];
    bool inflight[BKT_MAX_SLOTS];
    uint8_t *stamps;            /* host memory of the transport: every bucket's stamp */
    uint32_t stamps_cap;        /* in buckets */
    void *ann;                  /* transport memory: the announce, then the index */
    uint8_t *ann_host;
    void *idx;
    uint8_t *idx_host;
    uint64_t idx_cap;
    uint64_t direct_min;        /* 0: no DIRECT buckets */
    void *trailer;              /* transport memory: DIRECT stamps, then their sums */
    uint8_t *trailer_host;      /* the stamps, copied in at the end */
    uint32_t trailer_cap;       /* in DIRECT buckets */
    uint64_t direct_bytes;      /* of the last send: broadcast from the tensors */
    uint64_t last;              /* ticket of the last broadcast */
    bool busy;                  /* work queued since the last drain */
    uint64_t sends;
};

int refit_sender_create(refit_sender **out, refit_transport *x, const refit_send_opts *o)
{
    refit_send_opts def = REFIT_SEND_OPTS_INIT;
    if (!out || !x)
        return REFIT_EINVAL;
    *out = NULL;
    refit_ctx *ctx = x->ctx;
    ctx_clear_error(ctx);
    o = o ? o : &def;
    /* version 1 callers (their struct ends before direct_min_bytes) get the default */
    if ((o->version != 1 && o->version != REFIT_SEND_OPTS_VERSION) || o->root < 0 ||
        o->root >= x->nranks ||
        o->root != x->rank || o->timeout_s < 0)
        return ctx_error(ctx, REFIT_EINVAL, "sender: bad options (version %u, root %d: this "
                         "rank is %d of %d)", o->version, o->root, x->rank, x->nranks);
    const char *label = o->version_label ? o->version_label : "unnamed";
    if (strlen(label) > BKT_MAX_LABEL)
        return ctx_error(ctx, REFIT_EINVAL, "sender: version label longer than %d bytes",
                         BKT_MAX_LABEL);
    refit_sender *s = calloc(1, sizeof *s);
    if (!s || !(s->label = xstrdup(label))) {
        free(s);
        return ctx_error(ctx, REFIT_ENOMEM, "sender: out of memory");
    }
    s->x = x;
    s->ctx = ctx;
    s->bucket_bytes = o->bucket_bytes ? o->bucket_bytes : BKT_DEFAULT_BYTES;
    s->root = o->root;
    s->sum = o->checksum_payload != 0;
    s->timeout = o->timeout_s > 0 ? o->timeout_s : x->timeout_s;
    s->stream = o->stream;
    s->direct_min = o->version >= 2 ? o->direct_min_bytes : BKT_DIRECT_MIN_DEFAULT;
    *out = s;
    return REFIT_OK;
}

static int sender_drain(refit_sender *s);

static void sender_free_slots(refit_sender *s)
{
    for (uint32_t i = 0; i < BKT_MAX_SLOTS; i++) {
        if (s->slot[i])
            s->x->ops->mem_free(s->x, s->slot[i]);
        s->slot[i] = NULL;
        s->inflight[i] = false;
    }
    s->slot_bytes = 0;
    s->n_slots = 0;
}

static void sender_free_index(refit_sender *s)
{
    if (s->idx)
        s->x->ops->mem_free(s->x, s->idx);
    if (s->idx_host)
        s->x->ops->host_free(s->x, s->idx_host);
    if (s->stamps)
        s->x->ops->host_free(s->x, s->stamps);
    if (s->trailer)
        s->x->ops->mem_free(s->x, s->trailer);
    if (s->trailer_host)
        s->x->ops->host_free(s->x, s->trailer_host);
    s->idx = s->idx_host = s->stamps = s->trailer = s->trailer_host = NULL;
    s->idx_cap = 0;
    s->stamps_cap = 0;
    s->trailer_cap = 0;
}

void refit_sender_clear(refit_sender *s)
{
    if (!s)
        return;
    for (uint32_t i = 0; i < s->n; i++) {
        free(s->ts[i].name);
        free(s->ts[i].own);
    }
    s->n = 0;
    s->n_patches = 0;
    names_free(&s->by_name);
}

int refit_sender_set_label(refit_sender *s, const char *label)
{
    if (!s)
        return REFIT_EINVAL;
    ctx_clear_error(s->ctx);
    if (!label || strlen(label) > BKT_MAX_LABEL)
        return ctx_error(s->ctx, REFIT_EINVAL, "sender: version label %s", label ? "longer "
                         "than 1024 bytes" : "missing");
    char *copy = xstrdup(label);
    if (!copy)
        return ctx_error(s->ctx, REFIT_ENOMEM, "sender: out of memory");
    free(s->label);
    s->label = copy;
    return REFIT_OK;
}

void refit_sender_destroy(refit_sender *s)
{
    if (!s)
        return;
    refit_sender_clear(s);
    /* a slot still on the wire is not freed under NCCL's feet: it is
     * waited for, and past the deadline the transport is aborted (which
     * stops the kernel that reads it) */
    if (!s->x->aborted && s->busy && sender_drain(s))
        xport_abort(s->x, "sender destroyed with a broadcast stuck: %s", s->x->err);
    sender_free_slots(s);
    sender_free_index(s);
    if (s->ann)
        s->x->ops->mem_free(s->x, s->ann);
    if (s->ann_host)
        s->x->ops->host_free(s->x, s->ann_host);
    free(s->ts);
    free(s->bt);
    free(s->kinds);
    free(s->label);
    free(s);
}

int refit_sender_add(refit_sender *s, const char *name, const refit_tensor *t)
{
    if (!s)
        return REFIT_EINVAL;
    ctx_clear_error(s->ctx);
    refit_view v;
    if (!name || !*name || strlen(name) > BKT_MAX_NAME || xport_view(t, &v))
        return ctx_error(s->ctx, REFIT_EINVAL, "sender: tensor %s: bad name or descriptor "
                         "(dims, shape, data)", name ? name : "(null)");
    if (s->n == s->cap && grow_array((void **)&s->ts, &s->cap, s->n, sizeof *s->ts))
        return ctx_error(s->ctx, REFIT_ENOMEM, "sender: out of memory");
    char *copy = xstrdup(name);
    if (!copy)
        return ctx_error(s->ctx, REFIT_ENOMEM, "sender: out of memory");
    int rc = names_insert(&s->by_name, copy, s->n);
    if (rc) {
        free(copy);
        return ctx_error(s->ctx, rc, rc == REFIT_EEXIST ? "sender: tensor %s added twice"
                                                        : "sender: %s: out of memory", name);
    }
    s->ts[s->n++] = (snd_tensor){copy, t, BKT_E_WHOLE, NULL};
    return REFIT_OK;
}

/* One entry of a patch; index NULL: values, borrowed. */
static int add_entry(refit_sender *s, const char *name, uint8_t kind, size_t n,
                     const int64_t *a, const refit_tensor *values)
{
    if (s->n == s->cap && grow_array((void **)&s->ts, &s->cap, s->n, sizeof *s->ts))
        return REFIT_ENOMEM;
    snd_tensor st = {xstrdup(name), values, kind, NULL};
    if (a) { /* the tensor and its shape in one allocation, freed by clear */
        st.own = calloc(1, sizeof *st.own + sizeof(int64_t));
        if (st.own) {
            int64_t *shape = (int64_t *)(st.own + 1);
            shape[0] = (int64_t)n;
            *st.own = (refit_tensor){.data = (void *)a, .device = {REFIT_DEVICE_CPU, 0},
                                     .ndim = 1, .dtype = {REFIT_DTYPE_INT, 64, 1},
                                     .shape = shape};
        }
        st.t = st.own;
    }
    if (!st.name || !st.t) {
        free(st.name);
        free(st.own);
        return REFIT_ENOMEM;
    }
    s->ts[s->n++] = st;
    return REFIT_OK;
}

/* What the sender can check of a patch without the model. */
static int check_patch(refit_sender *s, const char *name, size_t n, const int64_t *indices,
                       const int64_t *counts, const refit_tensor *values)
{
    char why[160];
    refit_view v;
    int64_t nv = values && !xport_view(values, &v) && v.ndim == 1 ? v.shape[0] : -1;
    int rc = bkt_patch_check(name, n, indices, counts, nv, why, sizeof why);
    return rc ? ctx_error(s->ctx, rc, "sender: patch of %s: %s", name ? name : "(null)", why)
              : REFIT_OK;
}

int refit_sender_add_delta(refit_sender *s, const char *name, size_t n, const int64_t *indices,
                           const int64_t *counts, const refit_tensor *values)
{
    if (!s)
        return REFIT_EINVAL;
    ctx_clear_error(s->ctx);
    int rc = check_patch(s, name, n, indices, counts, values);
    if (rc)
        return rc;
    if (names_find(&s->by_name, name) != NAMES_NONE)
        return ctx_error(s->ctx, REFIT_EEXIST, "sender: tensor %s added twice", name);
    uint32_t first = s->n;
    static const int64_t none[1];
    rc = add_entry(s, name, BKT_E_DELTA_INDICES, n, indices ? indices : none, NULL);
    if (!rc && counts)
        rc = add_entry(s, name, BKT_E_DELTA_COUNTS, n, counts, NULL);
    if (!rc)
        rc = add_entry(s, name, BKT_E_DELTA_VALUES, 0, NULL, values);
    if (!rc)
        rc = names_insert(&s->by_name, s->ts[first].name, first);
    if (rc) {
        while (s->n > first) {
            s->n--;
            free(s->ts[s->n].name);
            free(s->ts[s->n].own);
        }
        return ctx_error(s->ctx, REFIT_ENOMEM, "sender: out of memory");
    }
    s->n_patches++;
    return REFIT_OK;
}

/* ---- packing ---- */

/* src: the piece's rows of the tensor; dst: their place in the payload.
 * Contiguous tensors go as plain bytes (any dtype, one batched row on a
 * device); strided ones as typed views the backend's copy walks. */
static int piece_views(const snd_tensor *st, const bkt_piece *pc, uint8_t *at,
                       refit_device dev, refit_view *src, refit_view *dst)
{
    if (xport_view(st->t, src))
        return REFIT_EINVAL;
    int64_t rows = pc->part ? pc->rows : (src->ndim ? src->shape[0] : 1);
    if (xport_view_contiguous(src)) {
        uint64_t row_bytes = rows ? pc->bytes / (uint64_t)rows : 0;
        src->data = (char *)src->data + (uint64_t)pc->row_offset * row_bytes;
        src->dtype = REFIT_U8;
        src->ndim = 1;
        src->shape[0] = (int64_t)pc->bytes;
        src->strides[0] = 1;
    } else {
        size_t es = kern_dtype_size(src->dtype);
        if (es == 0)
            return REFIT_EUNSUPPORTED; /* sub-byte elements: contiguous only */
        if (pc->part) {
            src->data = (char *)src->data + pc->row_offset * src->strides[0] * (int64_t)es;
            src->shape[0] = pc->rows;
        }
    }
    *dst = *src;
    dst->data = at;
    dst->device = dev;
    int64_t stride = 1;
    for (int i = dst->ndim - 1; i >= 0; i--) {
        dst->strides[i] = stride;
        stride *= dst->shape[i] > 0 ? dst->shape[i] : 1;
    }
    return REFIT_OK;
}

/* Bucket b's pieces into the payload at slot + BKT_ALIGN and its stamp
 * into the slot's first bytes, enqueued on the sender's stream (the stamp
 * rides in the same batch as the pieces: no copy of its own on the NCCL
 * stream); with checksums, their fingerprint into the slot's checksum word
 * behind them, on the same stream. Nothing waits. */
static int pack_bucket(refit_sender *s, const bkt_plan *p, uint32_t b, uint8_t *slot,
                       const uint8_t *stamp)
{
    const backend *be = backend_for_device(s->x->device);
    const bkt_span *sp = &p->buckets[b];
    uint8_t *payload = slot + BKT_ALIGN;
    if (!be)
        return ctx_error(s->ctx, REFIT_EUNSUPPORTED, "sender: no backend serves the "
                         "transport's memory (device type %d)", s->x->device.device_type);
    for (uint32_t k = 0; k < sp->n; k++) {
        const bkt_piece *pc = &p->pieces[sp->first + k];
        const snd_tensor *st = &s->ts[pc->tensor];
        refit_view src, dst;
        int rc = piece_views(st, pc, payload + pc->offset, s->x->device, &src, &dst);
        if (!rc && !be->can_read(src.device))
            rc = REFIT_EUNSUPPORTED;
        if (!rc && pc->bytes)
            rc = be->copy(&dst, &src, s->stream);
        if (rc) {
            /* what was queued writes into the slot: done before it is reused or freed */
            (void)be->sync(s->stream);
            return ctx_error(s->ctx, rc, "sender: packing %s into bucket %u failed: %s (the "
                             "%s backend, source on device type %d)", st->name, b,
                             refit_strerror(rc), be->name, st->t->device.device_type);
        }
    }
    refit_view sv = {.data = (void *)stamp, .device = s->x->host_device, .dtype = REFIT_U8,
                     .ndim = 1, .shape = {BKT_STAMP_BYTES}, .strides = {1}};
    refit_view sd = sv;
    sd.data = slot;
    sd.device = s->x->device;
    int rc = be->copy(&sd, &sv, s->stream);
    if (!rc)
        rc = be->flush(s->stream);
    if (rc) {
        (void)be->sync(s->stream);
        return ctx_error(s->ctx, rc, "sender: bucket %u: packing copies failed: %s (%s)", b,
                         refit_strerror(rc), be->last_error());
    }
    if (s->sum) {
        refit_view v = {.data = payload, .device = s->x->device, .dtype = REFIT_U8, .ndim = 1,
                        .shape = {(int64_t)sp->payload_bytes}, .strides = {1}};
        if ((rc = s->x->ops->fingerprint_to(s->x, slot + BKT_SUM_AT, &v, s->stream)))
            return ctx_error(s->ctx, rc, "sender: bucket %u: %s", b, s->x->err);
    }
    return REFIT_OK;
}

/* ---- sending ---- */

/* Slots for the plan's buckets, the index and the stamps, grown while
 * nothing is in flight (every send ends drained). */
static int sender_announce_memory(refit_sender *s)
{
    refit_transport *x = s->x;
    if (!s->ann && (x->ops->mem_alloc(x, &s->ann, BKT_ANNOUNCE_BYTES) ||
                    x->ops->host_alloc(x, (void **)&s->ann_host, BKT_ANNOUNCE_BYTES)))
        return ctx_error(s->ctx, REFIT_ENOMEM, "sender: no transport memory for the announce");
    return REFIT_OK;
}

static int sender_memory(refit_sender *s, const bkt_plan *p, uint64_t index_bytes)
{
    refit_transport *x = s->x;
    int arc = sender_announce_memory(s);
    if (arc)
        return arc;
    /* slots hold packed buckets only: DIRECT ones go from their tensors */
    uint64_t packed_max = BKT_ALIGN;
    for (uint32_t b = 0; b < p->n_buckets; b++)
        if (!p->buckets[b].direct && bkt_total(p, b) > packed_max)
            packed_max = bkt_total(p, b);
    uint32_t want = bkt_slots(packed_max);
    if (s->slot_bytes < packed_max || s->n_slots != want) {
        sender_free_slots(s);
        for (uint32_t i = 0; i < want; i++)
            if (x->ops->mem_alloc(x, &s->slot[i], packed_max)) {
                sender_free_slots(s);
                return ctx_error(s->ctx, REFIT_ENOMEM, "sender: no transport memory for %u "
                                 "buckets of %llu bytes", want, (unsigned long long)packed_max);
            }
        s->slot_bytes = packed_max;
        s->n_slots = want;
    }
    if (s->idx_cap < index_bytes || s->stamps_cap < p->n_buckets ||
        s->trailer_cap < p->n_direct) {
        sender_free_index(s);
        if (x->ops->mem_alloc(x, &s->idx, index_bytes) ||
            x->ops->host_alloc(x, (void **)&s->idx_host, index_bytes) ||
            x->ops->host_alloc(x, (void **)&s->stamps, (size_t)p->n_buckets * BKT_STAMP_BYTES) ||
            (p->n_direct &&
             (x->ops->mem_alloc(x, &s->trailer, bkt_trailer_bytes(p->n_direct)) ||
              x->ops->host_alloc(x, (void **)&s->trailer_host,
                                 bkt_trailer_bytes(p->n_direct))))) {
            sender_free_index(s);
            return ctx_error(s->ctx, REFIT_ENOMEM, "sender: no memory for the index of %u "
                             "buckets (%llu bytes)", p->n_buckets,
                             (unsigned long long)index_bytes);
        }
        s->idx_cap = index_bytes;
        s->stamps_cap = p->n_buckets;
        s->trailer_cap = p->n_direct;
    }
    return REFIT_OK;
}

/* A tensor NCCL can broadcast as it is: contiguous, in the transport's
 * memory (on the communicator's device). */
static bool direct_source(const refit_sender *s, const refit_tensor *t)
{
    refit_view v;
    return s->direct_min && !xport_view(t, &v) && xport_view_contiguous(&v) &&
           v.device.device_type == s->x->device.device_type &&
           v.device.device_id == s->x->device.device_id;
}

static int sender_plan(refit_sender *s, bkt_plan *p)
{
    bkt_tensor *bt = realloc(s->bt, (s->n ? s->n : 1) * sizeof *bt);
    if (!bt)
        return ctx_error(s->ctx, REFIT_ENOMEM, "sender: out of memory");
    s->bt = bt;
    uint8_t *kinds = s->n_patches ? realloc(s->kinds, s->n) : s->kinds;
    if (s->n_patches && !kinds)
        return ctx_error(s->ctx, REFIT_ENOMEM, "sender: out of memory");
    s->kinds = kinds;
    for (uint32_t i = 0; i < s->n; i++) {
        bool whole = s->ts[i].kind == BKT_E_WHOLE;
        bt[i] = (bkt_tensor){s->ts[i].name, s->ts[i].t->dtype, s->ts[i].t->ndim,
                             s->ts[i].t->shape, whole && direct_source(s, s->ts[i].t)};
        if (s->n_patches)
            kinds[i] = s->ts[i].kind;
    }
    char err[512];
    int rc = bkt_plan_build_kinds(p, bt, s->n_patches ? kinds : NULL, s->n, s->bucket_bytes,
                                  s->direct_min, strlen(s->label), err, sizeof err);
    return rc ? ctx_error(s->ctx, rc, "sender: %s", err) : REFIT_OK;
}

/* Unique per send and process: ties every header to its announce. */
static uint64_t sender_nonce(refit_sender *s)
{
    uint64_t z = (uint64_t)(xport_now() * 1e9) ^ ((uint64_t)getpid() << 32) ^
                 (uint64_t)(uintptr_t)s ^ (++s->sends * 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The announce, then the index (every header): enqueued, not waited for
 * (the host copies stay untouched until the send's drain). */
static int send_announce(refit_sender *s, const bkt_plan *p, uint64_t nonce)
{
    refit_transport *x = s->x;
    uint64_t ib = p->n_buckets ? bkt_index_bytes(p) : 0;
    bkt_announce an = {.n_buckets = p->n_buckets, .nonce = nonce, .index_bytes = ib,
                       .max_total = p->max_total, .total_payload = p->total_payload,
                       .n_entries = p->n_pieces, .trailer_bytes = bkt_trailer_bytes(p->n_direct),
                       .flags = s->sum ? BKT_A_PAYLOAD_SUM : 0};
    if (p->n_buckets) {
        an.first_header = p->buckets[0].header_bytes;
        an.first_total = bkt_total(p, 0);
    }
    if (!s->ann)
        return xport_fail(x, REFIT_ENOMEM, "sender: no transport memory for the announce");
    bkt_announce_encode(s->ann_host, &an);
    s->busy = true;
    double deadline = xport_now() + s->timeout;
    int rc = x->ops->from_host(x, s->ann, s->ann_host, BKT_ANNOUNCE_BYTES);
    if (!rc)
        rc = x->ops->bcast(x, s->ann, BKT_ANNOUNCE_BYTES, s->root, deadline);
    if (rc || !p->n_buckets)
        return rc ? rc : x->ops->mark(x, &s->last);
    uint8_t *q = s->idx_host;
    for (uint32_t b = 0; b < p->n_buckets; q += p->buckets[b++].header_bytes)
        bkt_header_encode(q, p, b, s->bt, s->label, nonce);
    rc = x->ops->from_host(x, s->idx, s->idx_host, ib);
    if (!rc)
        rc = x->ops->bcast(x, s->idx, ib, s->root, deadline);
    if (!rc)
        rc = x->ops->mark(x, &s->last);
    return rc;
}

/* The stamp of a bucket the sender gave up on: the cause rides along, so
 * every rank votes it, not a generic transport error. */
static void stamp_cancel(uint8_t *stamp, bkt_stamp *st, int local)
{
    st->flags = BKT_F_CANCEL;
    st->status = local < 0 && local >= -2047 ? local : REFIT_EINTERNAL;
    bkt_stamp_encode(stamp, st);
}

/* DIRECT bucket b (the j-th): broadcast from its tensor. Its stamp goes in
 * the trailer's host copy, its checksum (on the packing stream, beside the
 * broadcasts) into the trailer's memory. The first of a run of DIRECT
 * buckets waits on the device for the packing stream (whatever wrote the
 * tensors there before the send); the checksums queued after that wait
 * hold back only the trailer, not the broadcasts. Sent even after a local
 * failure (stamped CANCEL): the receivers posted it. */
static int send_direct(refit_sender *s, const bkt_plan *p, uint32_t b, uint32_t j,
                       uint64_t nonce, int *local)
{
    refit_transport *x = s->x;
    const bkt_piece *pc = &p->pieces[p->buckets[b].first];
    refit_view src, dst;
    if (piece_views(&s->ts[pc->tensor], pc, NULL, x->device, &src, &dst))
        return xport_fail(x, REFIT_EINTERNAL, "sender: bucket %u: its tensor has no bytes", b);
    bkt_stamp st = {.index = b, .nonce = nonce, .payload_bytes = pc->bytes,
                    .flags = s->sum ? BKT_F_PAYLOAD_SUM : 0};
    uint8_t *stamp = s->trailer_host + bkt_trailer_stamp(j);
    bkt_stamp_encode(stamp, &st);
    int rc = b == 0 || !p->buckets[b - 1].direct ? x->ops->wait_stream(x, s->stream) : REFIT_OK;
    if (rc)
        return rc;
    if (!*local && s->sum) {
        void *word = (uint8_t *)s->trailer + bkt_trailer_sum(p->n_direct, j);
        if ((rc = x->ops->fingerprint_to(x, word, &src, s->stream)))
            *local = ctx_error(s->ctx, rc, "sender: bucket %u (%s): %s", b,
                               s->ts[pc->tensor].name, x->err);
    }
    if (*local)
        stamp_cancel(stamp, &st, *local);
    rc = x->ops->bcast(x, src.data, pc->bytes, s->root, xport_now() + s->timeout);
    if (!rc)
        s->direct_bytes += pc->bytes;
    return rc ? rc : x->ops->mark(x, &s->last);
}

/* The trailer: every DIRECT bucket's stamp (one copy from host memory, on
 * the transport's stream) and checksum word (written by the packing
 * stream, which the broadcast waits for). */
static int send_trailer(refit_sender *s, const bkt_plan *p)
{
    refit_transport *x = s->x;
    if (!p->n_direct)
        return REFIT_OK;
    int rc = x->ops->wait_stream(x, s->stream);
    if (!rc)
        rc = x->ops->from_host(x, s->trailer, s->trailer_host,
                               (size_t)p->n_direct * BKT_STAMP_BYTES);
    if (!rc)
        rc = x->ops->bcast(x, s->trailer, bkt_trailer_bytes(p->n_direct), s->root,
                           xport_now() + s->timeout);
    return rc ? rc : x->ops->mark(x, &s->last);
}

/* One packed bucket, the packed-th. *local: the first local failure (this
 * bucket and the rest then go out stamped CANCEL). Returns a transport
 * failure only. */
static int send_bucket(refit_sender *s, const bkt_plan *p, uint32_t b, uint32_t packed,
                       uint64_t nonce, int *local)
{
    refit_transport *x = s->x;
    uint32_t i = packed % s->n_slots;
    if (s->inflight[i]) {
        int rc = x->ops->wait(x, s->ticket[i], xport_now() + s->timeout);
        if (rc)
            return rc;
        s->inflight[i] = false;
    }
    bkt_stamp st = {.index = b, .nonce = nonce, .payload_bytes = p->buckets[b].payload_bytes,
                    .flags = s->sum ? BKT_F_PAYLOAD_SUM : 0};
    uint8_t *stamp = s->stamps + (size_t)b * BKT_STAMP_BYTES;
    bkt_stamp_encode(stamp, &st);
    if (!*local)
        *local = pack_bucket(s, p, b, s->slot[i], stamp);
    /* the broadcast after the packing stream's copies, stamp and sum */
    int rc = x->ops->wait_stream(x, s->stream);
    if (!rc && *local) {
        /* written on the NCCL stream, behind whatever the failed pack had
         * queued */
        stamp_cancel(stamp, &st, *local);
        rc = x->ops->from_host(x, s->slot[i], stamp, BKT_STAMP_BYTES);
    }
    if (!rc)
        rc = x->ops->bcast(x, s->slot[i], bkt_total(p, b), s->root, xport_now() + s->timeout);
    if (!rc)
        rc = x->ops->mark(x, &s->ticket[i]);
    if (!rc)
        s->last = s->ticket[i];
    s->inflight[i] = rc == REFIT_OK;
    return rc;
}

/* Everything queued is done: the host buffers and slots may be reused. */
static int sender_drain(refit_sender *s)
{
    int rc = s->busy ? s->x->ops->wait(s->x, s->last, xport_now() + s->timeout) : REFIT_OK;
    if (!rc) {
        s->busy = false;
        for (uint32_t i = 0; i < BKT_MAX_SLOTS; i++)
            s->inflight[i] = false;
    }
    return rc;
}

/* The update on the wire: announce, index, every bucket, and the drain. */
static int sender_wire(refit_sender *s, bkt_plan *p, int *local)
{
    uint64_t nonce = sender_nonce(s);
    s->direct_bytes = 0;
    *local = sender_plan(s, p);
    if (!*local && (*local = sender_memory(s, p, bkt_index_bytes(p))))
        bkt_plan_free(p);
    /* a plan refused on a first send still announces (empty): the vote,
     * not a deadline, tells the workers */
    if (*local && !s->ann)
        (void)sender_announce_memory(s);
    /* nothing planned: an empty announce, so the workers go straight to
     * the vote (which this rank's failure decides) instead of a deadline */
    int rc = send_announce(s, p, nonce);
    uint32_t direct = 0, packed = 0;
    for (uint32_t b = 0; !rc && b < p->n_buckets; b++)
        rc = p->buckets[b].direct ? send_direct(s, p, b, direct++, nonce, local)
                                  : send_bucket(s, p, b, packed++, nonce, local);
    if (!rc)
        rc = send_trailer(s, p);
    int drc = sender_drain(s);
    return rc ? rc : drc;
}

static void sender_report(refit_sender *s, int rc, const refit_group_result *res,
                          const char *why)
{
    if (rc)
        ctx_error(s->ctx, REFIT_EIO, "sender: update '%s': %s; the transport is aborted, the "
                  "workers abort at their deadline", s->label, s->x->err);
    else if (res->local_status)
        ctx_error(s->ctx, res->local_status, "%s; update '%s' aborted on every rank", why,
                  s->label);
    else if (res->decision)
        ctx_error(s->ctx, res->decision, "sender: update '%s' aborted: rank %d voted %s",
                  s->label, res->failed_rank, refit_status_name(res->decision));
}

uint64_t sender_direct_bytes(const refit_sender *s)
{
    return s ? s->direct_bytes : 0;
}

int refit_sender_send(refit_sender *s, refit_group_result *out)
{
    if (!s)
        return REFIT_EINVAL;
    refit_group_result res = {.decision = REFIT_EIO, .failed_rank = -1};
    snprintf(res.version_label, sizeof res.version_label, "%s", s->label);
    ctx_clear_error(s->ctx);
    double t0 = xport_now();
    bkt_plan p = {0};
    int local = REFIT_OK;
    int rc = xport_check(s->x);
    if (!rc)
        rc = sender_wire(s, &p, &local);
    char why[REFIT_ERRMSG_SIZE];
    snprintf(why, sizeof why, "%s", s->ctx->errmsg);
    if (rc) {
        xport_abort(s->x, "sender: %s", s->x->err);
        xport_journal(s->ctx, 0, "transport", "sender: update '%s' failed on the wire: %s; "
                      "transport aborted", s->label, s->x->err);
    } else {
        rc = group_vote(s->x, local, xport_now() + s->timeout, &res);
    }
    res.buckets = p.n_buckets;
    for (uint32_t i = 0; i < p.n_pieces; i++) /* a patch is one tensor */
        res.tensors += !p.kinds || p.kinds[p.pieces[i].tensor] == BKT_E_WHOLE ||
                       p.kinds[p.pieces[i].tensor] == BKT_E_DELTA_INDICES;
    for (uint32_t i = 0; i < p.n_pieces; i++)
        res.bytes += p.pieces[i].bytes;
    res.seconds = xport_now() - t0;
    res.worker_status = REFIT_OK;
    bkt_plan_free(&p);
    sender_report(s, rc, &res, why);
    if (out)
        *out = res;
    return rc ? REFIT_EIO : res.decision;
}
