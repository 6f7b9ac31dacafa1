/*
 * libFuzzer target for the NCCL bucket index (transports/nccl/bucket.c): the
 * announce and the chain of headers a receiver walks before any payload
 * moves, decoded exactly as transports/nccl/receiver.c's rcv_index walks them.
 *
 * The first byte picks the mode:
 *   even  raw: the rest is an announce (128 bytes) and an index. The
 *         harness writes the right checksum into the announce and into each
 *         header before decoding it (a random input would otherwise never
 *         get past a checksum), so the fields behind them are what is fuzzed.
 *   odd   planned: the rest describes tensors (dtype, shape) and a bucket
 *         size; the sender's planner and encoder write the index, one byte
 *         of it may be flipped (then checksums fixed as above), and the
 *         receiver's walk must decode an unflipped index back to exactly the
 *         planned pieces.
 * Beyond "no crash, no sanitizer report": every decoded entry lies inside
 * its payload, in order, with a byte size that matches its dtype and rows,
 * and every failure says why.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transports/nccl/bucket.h"

#define MAX_TENSORS 24

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void check_header(const bkt_header *h)
{
    uint64_t prev_end = 0;
    for (uint32_t k = 0; k < h->n_entries; k++) {
        const bkt_entry *e = &h->entries[k];
        if (e->offset < prev_end || e->offset > h->payload_bytes ||
            e->bytes > h->payload_bytes - e->offset)
            abort();
        if (e->ndim < 0 || e->ndim > REFIT_MAX_DIMS || !e->name || strlen(e->name) > BKT_MAX_NAME)
            abort();
        int64_t numel = e->part ? e->rows : 1;
        for (int d = e->part ? 1 : 0; d < e->ndim; d++)
            if (__builtin_mul_overflow(numel, e->shape[d], &numel))
                abort();
        if (e->part && (e->ndim < 1 || e->row_offset < 0 || e->rows < 0 ||
                        e->row_offset > e->shape[0] - e->rows))
            abort();
        if (bkt_bytes(e->dtype, numel) != e->bytes)
            abort();
        prev_end = e->offset + e->bytes;
    }
}

/* rcv_index's walk over idx (n bytes), fixing each checksum first when fix
 * is set. Returns 0 when the whole index decodes. pieces: when not NULL,
 * the plan the index must decode back to. */
static int walk(uint8_t *ann, uint8_t *idx, size_t n, int fix, const bkt_plan *plan,
                const bkt_tensor *t)
{
    char err[512];
    bkt_announce an;
    if (fix)
        put64(ann + 120, bkt_checksum(ann, 120));
    err[0] = 0;
    if (bkt_announce_decode(&an, ann, (uint64_t)1 << 32, err, sizeof err))
        return err[0] ? 1 : (abort(), 1);
    if (an.index_bytes != n)
        return 1;
    bkt_header h;
    memset(&h, 0, sizeof h);
    uint64_t at = 0, total = an.first_total;
    uint32_t hb = an.first_header, piece = 0;
    int rc = 0;
    char label[BKT_MAX_LABEL + 1] = "";
    for (uint32_t k = 0; k < an.n_buckets && !rc; k++) {
        if (hb > an.index_bytes - at) {
            rc = 1;
            break;
        }
        if (fix && hb >= 8)
            put64(idx + at + hb - 8, bkt_checksum(idx + at, hb - 8));
        bkt_expect ex = {k, an.n_buckets, an.nonce, hb, total, an.max_total};
        err[0] = 0;
        if (bkt_header_decode(&h, idx + at, &ex, err, sizeof err)) {
            if (!err[0])
                abort();
            rc = 1;
            break;
        }
        check_header(&h);
        if (k == 0)
            memcpy(label, h.label, sizeof label);
        else if (strcmp(label, h.label))
            rc = 1;
        for (uint32_t e = 0; plan && e < h.n_entries; e++, piece++) {
            const bkt_piece *p = &plan->pieces[plan->buckets[k].first + e];
            const bkt_entry *d = &h.entries[e];
            if (piece >= plan->n_pieces || strcmp(d->name, t[p->tensor].name) ||
                d->part != p->part || d->offset != p->offset || d->bytes != p->bytes ||
                (p->part && (d->row_offset != p->row_offset || d->rows != p->rows)))
                abort();
        }
        at += hb;
        hb = h.next_header;
        total = h.next_total;
    }
    if (!rc && at != an.index_bytes)
        rc = 1;
    if (plan && !rc && piece != plan->n_pieces)
        abort();
    bkt_header_free(&h);
    return rc;
}

static void fuzz_raw(const uint8_t *data, size_t size)
{
    if (size < BKT_ANNOUNCE_BYTES)
        return;
    uint8_t ann[BKT_ANNOUNCE_BYTES];
    memcpy(ann, data, sizeof ann);
    size_t n = size - BKT_ANNOUNCE_BYTES;
    uint8_t *idx = malloc(n ? n : 1);
    if (!idx)
        return;
    memcpy(idx, data + BKT_ANNOUNCE_BYTES, n);
    walk(ann, idx, n, 1, NULL, NULL);
    free(idx);
}

static const refit_dtype dtypes[] = {
    {REFIT_DTYPE_FLOAT, 32, 1}, {REFIT_DTYPE_BFLOAT, 16, 1}, {REFIT_DTYPE_UINT, 8, 1},
    {REFIT_DTYPE_FLOAT4_E2M1FN, 4, 1}, {REFIT_DTYPE_INT, 64, 1},
};

static void fuzz_planned(const uint8_t *data, size_t size)
{
    if (size < 4)
        return;
    /* bucket bytes: 256 B .. 16 MiB; flip: where in the index, 0 = none */
    uint64_t bucket = (uint64_t)256 << (data[0] % 17);
    uint32_t flip = (uint32_t)data[1] | (uint32_t)data[2] << 8;
    uint8_t flip_bits = data[3];
    data += 4;
    size -= 4;
    bkt_tensor t[MAX_TENSORS];
    int64_t shapes[MAX_TENSORS][REFIT_MAX_DIMS];
    char names[MAX_TENSORS][40];
    uint32_t n = 0;
    while (size >= 3 && n < MAX_TENSORS) {
        int ndim = data[0] % 4;
        size_t need = 2 + (size_t)ndim;
        if (size < need)
            break;
        t[n].dtype = dtypes[(data[0] >> 2) % (sizeof dtypes / sizeof dtypes[0])];
        t[n].ndim = ndim;
        t[n].direct = data[1] & 1;
        /* names: some long, some repeated prefixes */
        int len = 1 + (data[1] >> 1) % 38;
        for (int i = 0; i < len; i++)
            names[n][i] = (char)('a' + (i * 7 + (int)n) % 26);
        names[n][len] = 0;
        t[n].name = names[n];
        for (int d = 0; d < ndim; d++)
            shapes[n][d] = data[2 + d] % 97;
        if (t[n].dtype.bits == 4 && ndim > 0 && shapes[n][ndim - 1] % 2)
            shapes[n][ndim - 1]++; /* whole bytes per row */
        t[n].shape = shapes[n];
        data += need;
        size -= need;
        n++;
    }
    bkt_plan p;
    memset(&p, 0, sizeof p);
    char err[512];
    const char *label = "step-7";
    uint64_t direct_min = (flip_bits & 1) ? 64 : 0;
    if (bkt_plan_build_direct(&p, t, n, bucket, direct_min, strlen(label), err, sizeof err)) {
        bkt_plan_free(&p);
        return;
    }
    uint64_t ib = p.n_buckets ? bkt_index_bytes(&p) : 0;
    bkt_announce an = {.n_buckets = p.n_buckets, .nonce = 0x1234, .index_bytes = ib,
                       .max_total = p.max_total, .total_payload = p.total_payload,
                       .n_entries = p.n_pieces, .trailer_bytes = bkt_trailer_bytes(p.n_direct)};
    if (p.n_buckets) {
        an.first_header = p.buckets[0].header_bytes;
        an.first_total = bkt_total(&p, 0);
    }
    uint8_t ann[BKT_ANNOUNCE_BYTES];
    bkt_announce_encode(ann, &an);
    uint8_t *idx = malloc(ib ? ib : 1);
    if (!idx) {
        bkt_plan_free(&p);
        return;
    }
    uint8_t *q = idx;
    for (uint32_t b = 0; b < p.n_buckets; q += p.buckets[b++].header_bytes)
        bkt_header_encode(q, &p, b, t, label, 0x1234);
    if (walk(ann, idx, ib, 0, &p, t))
        abort(); /* what the sender writes, the receiver reads */
    if (flip && ib) {
        idx[flip % ib] ^= flip_bits ? flip_bits : 1;
        walk(ann, idx, ib, 1, NULL, NULL);
    }
    free(idx);
    bkt_plan_free(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1)
        fuzz_planned(data + 1, size - 1);
    else
        fuzz_raw(data + 1, size - 1);
    return 0;
}
