/* The bucket wire format: planning, encoding, and the decoders that treat
 * every announce, header and stamp as untrusted input (bucket.h has the
 * layout). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transports/nccl/bucket.h"
#include "kernels/fingerprint.h"
#include "core/errbuf.h"

/* ---- little-endian fields ---- */

static void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t rd32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}


uint64_t bkt_checksum(const void *p, size_t n)
{
    kern_fp fp;
    kern_fp_init(&fp);
    kern_fp_update(&fp, p, n);
    return kern_fp_final(&fp);
}

uint64_t bkt_bytes(refit_dtype dt, int64_t numel)
{
    if (numel < 0 || dt.bits == 0)
        return UINT64_MAX;
    if ((uint64_t)numel > (UINT64_MAX - 7) / dt.bits)
        return UINT64_MAX;
    return ((uint64_t)numel * dt.bits + 7) / 8;
}

/* Elements of a shape; -1 on a negative extent or overflow. */
static int64_t shape_numel(int32_t ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        if (shape[i] && n > INT64_MAX / shape[i])
            return -1;
        n *= shape[i];
    }
    return n;
}

/* ---- announce ---- */

void bkt_announce_encode(uint8_t out[BKT_ANNOUNCE_BYTES], const bkt_announce *a)
{
    memset(out, 0, BKT_ANNOUNCE_BYTES);
    wr32(out, BKT_MAGIC_ANNOUNCE);
    wr16(out + 4, BKT_VERSION);
    wr16(out + 6, a->flags);
    wr32(out + 8, a->n_buckets);
    wr32(out + 12, a->first_header);
    wr64(out + 16, a->nonce);
    wr64(out + 24, a->first_total);
    wr64(out + 32, a->max_total);
    wr64(out + 40, a->total_payload);
    wr64(out + 48, a->n_entries);
    wr64(out + 56, a->index_bytes);
    wr64(out + 64, a->trailer_bytes);
    /* 72..119 reserved (zero) */
    wr64(out + 120, bkt_checksum(out, 120));
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

/* The sizes an announce promises, against each other and the limits. */
static bool announce_sizes_ok(const bkt_announce *a)
{
    if (a->n_buckets == 0)
        return !a->first_total && !a->first_header && !a->max_total && !a->index_bytes &&
               !a->trailer_bytes;
    /* a DIRECT bucket is its payload alone (at least a byte); the header
     * says which kind each is and checks its size exactly */
    return a->first_header >= BKT_FIXED_HEADER + 8 && a->first_header <= BKT_MAX_HEADER &&
           a->first_total >= 1 && a->first_total <= a->max_total &&
           a->trailer_bytes % BKT_TRAILER_REC == 0 &&
           a->trailer_bytes / BKT_TRAILER_REC <= a->n_buckets &&
           a->index_bytes >= a->first_header && a->index_bytes <= BKT_MAX_INDEX &&
           a->index_bytes / a->n_buckets >= BKT_FIXED_HEADER + 8;
}

int bkt_announce_decode(bkt_announce *a, const uint8_t in[BKT_ANNOUNCE_BYTES],
                        uint64_t max_accept, char *err, size_t errlen)
{
    const int C = REFIT_ECORRUPT;
    if (rd32(in) != BKT_MAGIC_ANNOUNCE)
        return errbuf_set(err, errlen, C, "announce: bad magic 0x%08x (not a refit sender?)", rd32(in));
    if (rd16(in + 4) != BKT_VERSION)
        return errbuf_set(err, errlen, C, "announce: wire version %u, this refit reads %u",
                   rd16(in + 4), BKT_VERSION);
    if (rd64(in + 120) != bkt_checksum(in, 120))
        return errbuf_set(err, errlen, C, "announce: checksum mismatch");
    *a = (bkt_announce){.flags = rd16(in + 6), .n_buckets = rd32(in + 8),
                        .first_header = rd32(in + 12), .nonce = rd64(in + 16),
                        .first_total = rd64(in + 24), .max_total = rd64(in + 32),
                        .total_payload = rd64(in + 40), .n_entries = rd64(in + 48),
                        .index_bytes = rd64(in + 56), .trailer_bytes = rd64(in + 64)};
    if ((a->flags & ~BKT_A_PAYLOAD_SUM) || !all_zero(in + 72, 48))
        return errbuf_set(err, errlen, C, "announce: unknown flags 0x%x or reserved bytes set",
                   a->flags);
    if (a->n_buckets > BKT_MAX_BUCKETS)
        return errbuf_set(err, errlen, C, "announce: %u buckets (at most %u)", a->n_buckets,
                   BKT_MAX_BUCKETS);
    if (a->max_total > max_accept)
        return errbuf_set(err, errlen, C, "announce: buckets of %llu bytes, above the %llu this "
                   "receiver accepts", (unsigned long long)a->max_total,
                   (unsigned long long)max_accept);
    if (!announce_sizes_ok(a))
        return errbuf_set(err, errlen, C, "announce: inconsistent sizes (buckets %u, first %llu bytes "
                   "with a %u-byte header, largest %llu, index %llu, trailer %llu)", a->n_buckets,
                   (unsigned long long)a->first_total, a->first_header,
                   (unsigned long long)a->max_total, (unsigned long long)a->index_bytes,
                   (unsigned long long)a->trailer_bytes);
    return REFIT_OK;
}

/* ---- stamp ---- */

uint64_t bkt_le64(const uint8_t *p)
{
    return rd64(p);
}

void bkt_stamp_encode(uint8_t out[BKT_STAMP_BYTES], const bkt_stamp *st)
{
    memset(out, 0, BKT_STAMP_BYTES);
    wr32(out, BKT_MAGIC_STAMP);
    wr16(out + 4, BKT_VERSION);
    wr16(out + 6, st->flags);
    wr32(out + 8, st->index);
    wr32(out + 12, (uint32_t)st->status);
    wr64(out + 16, st->nonce);
    wr64(out + 24, st->payload_bytes);
    wr64(out + 56, bkt_checksum(out, 56));
}

int bkt_stamp_decode(bkt_stamp *st, const uint8_t in[BKT_STAMP_BYTES], uint32_t index,
                     uint64_t nonce, uint64_t payload_bytes, char *err, size_t errlen)
{
    const int C = REFIT_ECORRUPT;
    if (rd32(in) != BKT_MAGIC_STAMP || rd16(in + 4) != BKT_VERSION)
        return errbuf_set(err, errlen, C, "bucket %u: bad stamp magic or wire version", index);
    if (rd64(in + 56) != bkt_checksum(in, 56))
        return errbuf_set(err, errlen, C, "bucket %u: stamp checksum mismatch", index);
    *st = (bkt_stamp){.flags = rd16(in + 6), .index = rd32(in + 8),
                      .status = (int32_t)rd32(in + 12), .nonce = rd64(in + 16),
                      .payload_bytes = rd64(in + 24)};
    if (st->index != index || st->nonce != nonce || st->payload_bytes != payload_bytes)
        return errbuf_set(err, errlen, C, "bucket %u: the stamp is of bucket %u of update %016llx "
                   "(%llu bytes), not of bucket %u of update %016llx (%llu bytes)", index,
                   st->index, (unsigned long long)st->nonce,
                   (unsigned long long)st->payload_bytes, index, (unsigned long long)nonce,
                   (unsigned long long)payload_bytes);
    bool cancel = st->flags & BKT_F_CANCEL;
    if ((st->flags & ~(BKT_F_PAYLOAD_SUM | BKT_F_CANCEL)) || !all_zero(in + 32, 24) ||
        (cancel ? st->status >= 0 || st->status < -2047 || (st->flags & BKT_F_PAYLOAD_SUM)
                : st->status != 0))
        return errbuf_set(err, errlen, C, "bucket %u: stamp flags 0x%x, status %d or reserved bytes "
                   "inconsistent", index, st->flags, st->status);
    return REFIT_OK;
}

/* ---- planning ---- */

static uint64_t entry_size(const bkt_tensor *t)
{
    return BKT_FIXED_ENTRY + 8u * (uint64_t)t->ndim + strlen(t->name);
}

/* Bytes of a tensor, and of one dim-0 row when rows split on byte
 * boundaries (0 otherwise: such a tensor is only sent whole). */
static int tensor_sizes(const bkt_tensor *t, uint64_t *bytes, uint64_t *row_bytes, char *err,
                        size_t errlen)
{
    size_t nl = t->name ? strlen(t->name) : 0;
    if (nl == 0 || nl > BKT_MAX_NAME)
        return errbuf_set(err, errlen, REFIT_EINVAL, "tensor name %s", nl ? "too long" : "empty");
    if (t->ndim < 0 || t->ndim > REFIT_MAX_DIMS || (t->ndim && !t->shape))
        return errbuf_set(err, errlen, REFIT_EINVAL, "%s: %d dims", t->name, t->ndim);
    if (t->dtype.lanes != 1 || t->dtype.bits == 0 || t->dtype.bits > 64)
        return errbuf_set(err, errlen, REFIT_EUNSUPPORTED, "%s: dtype %s cannot be sent", t->name,
                   refit_dtype_name(t->dtype));
    int64_t numel = shape_numel(t->ndim, t->shape);
    *bytes = numel < 0 ? UINT64_MAX : bkt_bytes(t->dtype, numel);
    if (*bytes == UINT64_MAX || *bytes > (uint64_t)INT64_MAX)
        return errbuf_set(err, errlen, REFIT_EINVAL, "%s: shape overflows", t->name);
    *row_bytes = 0;
    if (t->ndim >= 1 && t->shape[0] > 0) {
        uint64_t row_bits = (uint64_t)(numel / t->shape[0]) * t->dtype.bits;
        if (row_bits % 8 == 0)
            *row_bytes = row_bits / 8;
    }
    return REFIT_OK;
}

static int plan_add_piece(bkt_plan *p, bkt_piece pc)
{
    if (p->n_pieces == p->cap_pieces) {
        uint32_t cap = p->cap_pieces ? 2 * p->cap_pieces : 64;
        bkt_piece *np = realloc(p->pieces, (size_t)cap * sizeof *np);
        if (!np)
            return REFIT_ENOMEM;
        p->pieces = np;
        p->cap_pieces = cap;
    }
    p->pieces[p->n_pieces++] = pc;
    bkt_span *b = &p->buckets[p->n_buckets - 1];
    b->n++;
    b->payload_bytes = pc.offset + pc.bytes;
    return REFIT_OK;
}

/* Close the current bucket (if it holds anything) and open a new one. */
static int plan_open_bucket(bkt_plan *p, uint32_t fixed_header)
{
    if (p->n_buckets && p->buckets[p->n_buckets - 1].n == 0)
        return REFIT_OK;
    if (p->n_buckets == BKT_MAX_BUCKETS)
        return REFIT_EINVAL;
    if (p->n_buckets == p->cap_buckets) {
        uint32_t cap = p->cap_buckets ? 2 * p->cap_buckets : 16;
        bkt_span *nb = realloc(p->buckets, (size_t)cap * sizeof *nb);
        if (!nb)
            return REFIT_ENOMEM;
        p->buckets = nb;
        p->cap_buckets = cap;
    }
    p->buckets[p->n_buckets++] = (bkt_span){p->n_pieces, 0, fixed_header, 0, false};
    return REFIT_OK;
}

uint64_t bkt_plan_cap(uint64_t bucket_bytes, uint32_t b, uint64_t left)
{
    uint64_t first = bucket_bytes / BKT_RAMP;
    if (first < BKT_RAMP_MIN)
        first = BKT_RAMP_MIN;
    if (first >= bucket_bytes)
        return bucket_bytes;
    uint64_t cap = first;
    for (uint32_t k = 0; k < b && cap < bucket_bytes; k++)
        cap *= 2;
    /* the end: each bucket takes half of what is left, down to the first
     * bucket's size, so the last scatter (nothing after it to hide it
     * behind) is small */
    uint64_t tail = left / 2 + left % 2;
    if (tail < first)
        tail = first;
    if (cap > tail)
        cap = tail;
    return cap < bucket_bytes ? cap : bucket_bytes;
}

uint32_t bkt_slots(uint64_t max_total)
{
    uint64_t n = max_total ? BKT_SLOT_BUDGET / max_total : BKT_MAX_SLOTS;
    return n < 2 ? 2 : n > BKT_MAX_SLOTS ? BKT_MAX_SLOTS : (uint32_t)n;
}

uint64_t bkt_index_bytes(const bkt_plan *p)
{
    uint64_t n = 0;
    for (uint32_t b = 0; b < p->n_buckets; b++)
        n += p->buckets[b].header_bytes;
    return n;
}

/* Planning state: the current bucket's cap and the bytes not yet placed. */
typedef struct planner {
    bkt_plan *p;
    uint64_t bucket_bytes, left, cap;
    uint32_t fixed;
    uint32_t first_packed;      /* the ramp counts packed buckets from here */
} planner;

/* Close the current bucket (if it holds anything), open the next. */
static int pl_next(planner *pl)
{
    int rc = plan_open_bucket(pl->p, pl->fixed);
    if (!rc)
        pl->cap = bkt_plan_cap(pl->bucket_bytes, pl->p->n_buckets - 1 - pl->first_packed,
                               pl->left);
    return rc;
}

static int pl_add(planner *pl, bkt_piece pc, uint32_t eh)
{
    int rc = plan_add_piece(pl->p, pc);
    if (rc)
        return rc;
    pl->p->buckets[pl->p->n_buckets - 1].header_bytes += eh;
    pl->left -= pc.bytes < pl->left ? pc.bytes : pl->left;
    return REFIT_OK;
}

/* Tensor i: whole into the current bucket when it fits, else into a new
 * one; a tensor larger than an empty bucket goes as row ranges of dim 0,
 * each starting a bucket (so every bucket but the last of them is full). */
static int plan_tensor(planner *pl, uint32_t i, const bkt_tensor *t, uint64_t bytes,
                       uint64_t row_bytes, uint32_t eh, char *err, size_t errlen)
{
    bkt_plan *p = pl->p;
    int64_t dim0 = t->ndim ? t->shape[0] : 1, row = 0;
    for (int rc;;) {
        bkt_span *b = &p->buckets[p->n_buckets - 1];
        uint64_t off = b->n ? bkt_align(b->payload_bytes) : 0;
        uint64_t rest = row ? (uint64_t)(dim0 - row) * row_bytes : bytes;
        if (b->header_bytes + eh <= BKT_MAX_HEADER && off <= pl->cap && rest <= pl->cap - off)
            return pl_add(pl, row ? (bkt_piece){i, true, row, dim0 - row, off, rest}
                                  : (bkt_piece){i, false, 0, 0, off, bytes}, eh);
        if (b->n) {
            if ((rc = pl_next(pl)))
                return rc;
            continue;
        }
        if (row_bytes == 0 || row_bytes > pl->bucket_bytes)
            return errbuf_set(err, errlen, REFIT_EINVAL, "%s: larger than a bucket (%llu bytes) and "
                       "cannot be split: one row of dim 0 is %llu bytes%s", t->name,
                       (unsigned long long)pl->bucket_bytes, (unsigned long long)row_bytes,
                       row_bytes ? "" : " or not a whole number of bytes");
        /* a row wider than the ramp's cap gets a whole bucket */
        uint64_t cap = pl->cap < row_bytes ? pl->bucket_bytes : pl->cap;
        int64_t rows = (int64_t)(cap / row_bytes);
        if (rows > dim0 - row)
            rows = dim0 - row;
        if ((rc = pl_add(pl, (bkt_piece){i, true, row, rows, 0, (uint64_t)rows * row_bytes}, eh)))
            return rc;
        if ((row += rows) == dim0)
            return REFIT_OK;
        if ((rc = pl_next(pl)))
            return rc;
    }
}

/* A patch: its entries t[i, i + g) (indices, counts, values), 1-D, all
 * into one packed bucket: the current one when they fit its cap, else a
 * new one, past the ramp's cap if need be. */
static int plan_patch(planner *pl, uint32_t i, uint32_t g, const bkt_tensor *t, char *err,
                      size_t errlen)
{
    bkt_plan *p = pl->p;
    uint64_t sz[3];
    uint32_t eh = 0;
    for (uint32_t j = 0; j < g; j++) {
        uint64_t row_bytes;
        int rc = tensor_sizes(&t[i + j], &sz[j], &row_bytes, err, errlen);
        if (rc)
            return rc;
        eh += (uint32_t)entry_size(&t[i + j]);
    }
    for (int rc;;) {
        bkt_span *b = &p->buckets[p->n_buckets - 1];
        uint64_t off = b->n ? bkt_align(b->payload_bytes) : 0, at[3], end = off;
        for (uint32_t j = 0; j < g; j++) {
            at[j] = j ? bkt_align(end) : off;
            end = at[j] + sz[j];
        }
        bool fits = b->header_bytes + eh <= BKT_MAX_HEADER && end <= pl->cap;
        if (!fits && b->n) {
            if ((rc = pl_next(pl)))
                return rc;
            continue;
        }
        if (!fits && end > pl->bucket_bytes)
            return errbuf_set(err, errlen, REFIT_EINVAL, "%s: its patch is %llu bytes, more "
                              "than a bucket (%llu bytes); a patch goes in one bucket: raise "
                              "bucket_bytes", t[i].name, (unsigned long long)end,
                              (unsigned long long)pl->bucket_bytes);
        for (uint32_t j = 0; j < g; j++)
            if ((rc = pl_add(pl, (bkt_piece){i + j, false, 0, 0, at[j], sz[j]},
                             (uint32_t)entry_size(&t[i + j]))))
                return rc;
        return REFIT_OK;
    }
}

/* The entries of the patch starting at t[i] (3 with counts, else 2), 0
 * when kinds do not make one there: indices, then counts, then values,
 * all named alike and 1-D. */
static uint32_t patch_entries(const bkt_tensor *t, const uint8_t *kinds, uint32_t i,
                              uint32_t n)
{
    uint32_t g = i + 2 < n && kinds[i + 1] == BKT_E_DELTA_COUNTS ? 3 : 2;
    if (kinds[i] != BKT_E_DELTA_INDICES || i + g > n ||
        kinds[i + g - 1] != BKT_E_DELTA_VALUES)
        return 0;
    for (uint32_t j = 0; j < g; j++)
        if (t[i + j].ndim != 1 || !t[i + j].name || strcmp(t[i + j].name, t[i].name) ||
            (j + 1 < g && (t[i + j].dtype.code != REFIT_DTYPE_INT || t[i + j].dtype.bits != 64 ||
                           t[i + j].shape[0] != t[i].shape[0])))
            return 0;
    return g;
}

/* Tensor i in DIRECT buckets of its own: whole when it fits a bucket,
 * else row ranges of dim 0 of at most bucket_bytes. */
static int plan_direct(planner *pl, uint32_t i, const bkt_tensor *t, uint64_t bytes,
                       uint64_t row_bytes, uint32_t eh, char *err, size_t errlen)
{
    bkt_plan *p = pl->p;
    int64_t dim0 = t->ndim ? t->shape[0] : 1, rows = dim0;
    if (bytes > pl->bucket_bytes) {
        if (row_bytes == 0 || row_bytes > pl->bucket_bytes)
            return errbuf_set(err, errlen, REFIT_EINVAL, "%s: larger than a bucket (%llu bytes) and "
                       "cannot be split: one row of dim 0 is %llu bytes%s", t->name,
                       (unsigned long long)pl->bucket_bytes, (unsigned long long)row_bytes,
                       row_bytes ? "" : " or not a whole number of bytes");
        rows = (int64_t)(pl->bucket_bytes / row_bytes);
    }
    /* bytes >= direct_min >= 1: every extent is positive */
    for (int64_t row = 0; row < dim0;) {
        int64_t n = rows < dim0 - row ? rows : dim0 - row;
        bool part = n != dim0;
        bkt_piece pc = part ? (bkt_piece){i, true, row, n, 0, (uint64_t)n * row_bytes}
                            : (bkt_piece){i, false, 0, 0, 0, bytes};
        int rc = plan_open_bucket(p, pl->fixed);
        if (!rc)
            rc = plan_add_piece(p, pc);
        if (rc)
            return rc;
        p->buckets[p->n_buckets - 1].header_bytes += eh;
        p->buckets[p->n_buckets - 1].direct = true;
        p->n_direct++;
        if (!part)
            return REFIT_OK;
        row += n;
    }
    return REFIT_OK;
}

static void plan_totals(bkt_plan *p)
{
    p->max_total = p->total_payload = 0;
    for (uint32_t b = 0; b < p->n_buckets; b++) {
        if (bkt_total(p, b) > p->max_total)
            p->max_total = bkt_total(p, b);
        p->total_payload += p->buckets[b].payload_bytes;
    }
}

static bool goes_direct(const bkt_tensor *t, uint64_t bytes, uint64_t direct_min)
{
    return t->direct && direct_min && bytes >= direct_min;
}

typedef struct sized {
    uint64_t bytes;
    uint32_t i;
} sized;

/* Largest first, then in the order given: deterministic. */
static int larger_first(const void *a, const void *b)
{
    const sized *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* The DIRECT tensors in the order their buckets go: the smallest first,
 * then the rest largest first (ties in the order given). A receiver that
 * begins its transaction only once the index is in (refit_receive_update)
 * takes bucket 0 into a slot while it begins and scatters it, so the
 * first is the smallest; the receivers sum each DIRECT bucket where it
 * landed once its broadcast is in, and only the last one's sum has no
 * broadcast after it to hide behind, so the last is small. *order is
 * malloc'd (NULL when there are none). */
static int direct_order(const bkt_tensor *t, uint32_t n, uint64_t direct_min, sized **order,
                        uint32_t *m, char *err, size_t errlen)
{
    *order = NULL;
    *m = 0;
    if (!direct_min)
        return REFIT_OK;
    sized *o = malloc((n ? n : 1) * sizeof *o);
    if (!o)
        return errbuf_set(err, errlen, REFIT_ENOMEM, "planning buckets: out of memory");
    for (uint32_t i = 0; i < n; i++) {
        uint64_t bytes = 0, row_bytes = 0;
        tensor_sizes(&t[i], &bytes, &row_bytes, err, errlen);
        if (goes_direct(&t[i], bytes, direct_min))
            o[(*m)++] = (sized){bytes, i};
    }
    qsort(o, *m, sizeof *o, larger_first);
    if (*m > 1) {
        sized smallest = o[*m - 1];
        memmove(o + 1, o, (*m - 1) * sizeof *o);
        o[0] = smallest;
    }
    *order = o;
    return REFIT_OK;
}

/* DIRECT buckets of the tensors order[from, to). */
static int plan_directs(planner *pl, const bkt_tensor *t, const sized *order, uint32_t from,
                        uint32_t to, char *err, size_t errlen)
{
    int rc = REFIT_OK;
    for (uint32_t k = from; k < to && !rc; k++) {
        const bkt_tensor *ti = &t[order[k].i];
        uint64_t bytes = 0, row_bytes = 0;
        tensor_sizes(ti, &bytes, &row_bytes, err, errlen);
        rc = plan_direct(pl, order[k].i, ti, bytes, row_bytes, (uint32_t)entry_size(ti), err,
                         errlen);
        if (rc == REFIT_ENOMEM)
            errbuf_set(err, errlen, rc, "planning buckets: out of memory");
        else if (rc == REFIT_EINVAL && pl->p->n_buckets == BKT_MAX_BUCKETS)
            errbuf_set(err, errlen, rc, "%s: more than %u buckets", ti->name, BKT_MAX_BUCKETS);
    }
    return rc;
}

int bkt_plan_build(bkt_plan *p, const bkt_tensor *t, uint32_t n, uint64_t bucket_bytes,
                   size_t label_len, char *err, size_t errlen)
{
    return bkt_plan_build_direct(p, t, n, bucket_bytes, 0, label_len, err, errlen);
}

int bkt_plan_build_direct(bkt_plan *p, const bkt_tensor *t, uint32_t n, uint64_t bucket_bytes,
                          uint64_t direct_min, size_t label_len, char *err, size_t errlen)
{
    return bkt_plan_build_kinds(p, t, NULL, n, bucket_bytes, direct_min, label_len, err,
                                errlen);
}

int bkt_plan_build_kinds(bkt_plan *p, const bkt_tensor *t, const uint8_t *kinds, uint32_t n,
                         uint64_t bucket_bytes, uint64_t direct_min, size_t label_len,
                         char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    /* patches go packed: a DIRECT bucket carries one whole tensor or part */
    for (uint32_t i = 0; kinds && i < n; i++)
        if (kinds[i] != BKT_E_WHOLE && t[i].direct)
            return errbuf_set(err, errlen, REFIT_EINVAL, "%s: a patch's entry marked direct",
                              t[i].name ? t[i].name : "?");
    if (bucket_bytes == 0 || bucket_bytes > ((uint64_t)1 << 48) || label_len > BKT_MAX_LABEL)
        return errbuf_set(err, errlen, REFIT_EINVAL, "bucket size %llu or label length %zu out of "
                   "range", (unsigned long long)bucket_bytes, label_len);
    planner pl = {p, bucket_bytes, 0, 0, BKT_FIXED_HEADER + (uint32_t)label_len + 8, 0};
    int rc = REFIT_OK;
    uint32_t packed = 0;
    for (uint32_t i = 0; i < n && !rc; i++) {
        uint64_t bytes = 0, row_bytes = 0;
        rc = tensor_sizes(&t[i], &bytes, &row_bytes, err, errlen);
        if (!rc && goes_direct(&t[i], bytes, direct_min))
            continue;
        packed++;
        pl.left = !rc && bytes < UINT64_MAX - pl.left ? pl.left + bytes : UINT64_MAX;
    }
    /* The first DIRECT tensor's buckets, then the packed ones, then the
     * other DIRECT ones: packing and scattering overlap DIRECT broadcasts
     * at both ends (nothing packs or scatters those, so they need no ramp)
     * and the update ends on a DIRECT bucket, with no scatter after it. */
    sized *order = NULL;
    uint32_t m = 0;
    if (!rc)
        rc = direct_order(t, n, direct_min, &order, &m, err, errlen);
    if (!rc)
        rc = plan_directs(&pl, t, order, 0, m ? 1 : 0, err, errlen);
    pl.first_packed = p->n_buckets;
    /* no tensors: one bucket of no entries still carries the label */
    if (!rc && (packed || !p->n_buckets))
        rc = pl_next(&pl);
    for (uint32_t i = 0; i < n && !rc; i++) {
        uint64_t bytes = 0, row_bytes = 0;
        tensor_sizes(&t[i], &bytes, &row_bytes, err, errlen);
        if (goes_direct(&t[i], bytes, direct_min))
            continue;
        if (kinds && kinds[i] != BKT_E_WHOLE) {
            uint32_t g = patch_entries(t, kinds, i, n);
            rc = g ? plan_patch(&pl, i, g, t, err, errlen)
                   : errbuf_set(err, errlen, REFIT_EINVAL, "%s: entry %u is not the start "
                                "of a patch (indices, counts, values; 1-D, named alike)",
                                t[i].name ? t[i].name : "?", i);
            i += g ? g - 1 : 0;
        } else {
            rc = plan_tensor(&pl, i, &t[i], bytes, row_bytes, (uint32_t)entry_size(&t[i]),
                             err, errlen);
        }
        if (rc == REFIT_ENOMEM)
            errbuf_set(err, errlen, rc, "planning buckets: out of memory");
        else if (rc == REFIT_EINVAL && p->n_buckets == BKT_MAX_BUCKETS)
            errbuf_set(err, errlen, rc, "%s: more than %u buckets", t[i].name, BKT_MAX_BUCKETS);
    }
    if (!rc)
        rc = plan_directs(&pl, t, order, m ? 1 : 0, m, err, errlen);
    free(order);
    if (rc) {
        bkt_plan_free(p);
        return rc;
    }
    plan_totals(p);
    p->kinds = kinds;
    return REFIT_OK;
}

void bkt_plan_free(bkt_plan *p)
{
    free(p->pieces);
    free(p->buckets);
    memset(p, 0, sizeof *p);
}

/* ---- header encoding ---- */

static uint8_t *encode_entry(uint8_t *q, const bkt_piece *pc, const bkt_tensor *t,
                             uint8_t kind)
{
    size_t nl = strlen(t->name);
    wr16(q, (uint16_t)nl);
    q[2] = t->dtype.code;
    q[3] = t->dtype.bits;
    wr16(q + 4, t->dtype.lanes);
    q[6] = (uint8_t)t->ndim;
    q[7] = pc->part ? BKT_E_PART : kind;
    int64_t rows = pc->part ? pc->rows : (t->ndim ? t->shape[0] : 1);
    wr64(q + 8, (uint64_t)pc->row_offset);
    wr64(q + 16, (uint64_t)rows);
    wr64(q + 24, pc->offset);
    wr64(q + 32, pc->bytes);
    q += BKT_FIXED_ENTRY;
    for (int d = 0; d < t->ndim; d++, q += 8)
        wr64(q, (uint64_t)t->shape[d]);
    memcpy(q, t->name, nl);
    return q + nl;
}

void bkt_header_encode(uint8_t *buf, const bkt_plan *p, uint32_t b, const bkt_tensor *t,
                       const char *label, uint64_t nonce)
{
    const bkt_span *s = &p->buckets[b];
    bool last = b + 1 == p->n_buckets;
    size_t ll = strlen(label);
    memset(buf, 0, BKT_FIXED_HEADER);
    wr32(buf, BKT_MAGIC_BUCKET);
    wr16(buf + 4, BKT_VERSION);
    wr16(buf + 6, s->direct ? BKT_H_DIRECT : 0);
    wr32(buf + 8, b);
    wr32(buf + 12, p->n_buckets);
    wr32(buf + 16, s->n);
    wr32(buf + 20, s->header_bytes);
    wr64(buf + 24, nonce);
    wr64(buf + 32, s->direct ? 0 : BKT_ALIGN); /* the stamp's room, none when DIRECT */
    wr64(buf + 40, s->payload_bytes);
    wr64(buf + 48, last ? 0 : bkt_total(p, b + 1));
    wr32(buf + 56, last ? 0 : p->buckets[b + 1].header_bytes);
    wr16(buf + 60, (uint16_t)ll);
    /* 62..71 reserved (zero; version 1 had the payload's checksum here) */
    memcpy(buf + BKT_FIXED_HEADER, label, ll);
    uint8_t *q = buf + BKT_FIXED_HEADER + ll;
    for (uint32_t k = 0; k < s->n; k++) {
        const bkt_piece *pc = &p->pieces[s->first + k];
        q = encode_entry(q, pc, &t[pc->tensor], p->kinds ? p->kinds[pc->tensor] : BKT_E_WHOLE);
    }
    wr64(q, bkt_checksum(buf, (size_t)(q - buf)));
}

/* ---- header decoding: every field is checked before it is used ---- */

static int decode_next(bkt_header *h, const bkt_expect *ex, char *err, size_t errlen)
{
    bool last = h->index + 1 == h->n_buckets;
    if (last ? (h->next_total || h->next_header)
             : (h->next_header < BKT_FIXED_HEADER + 8 || h->next_header > BKT_MAX_HEADER ||
                h->next_total < 1 || h->next_total > ex->max_total))
        return errbuf_set(err, errlen, REFIT_ECORRUPT, "bucket %u: next bucket's size (%llu bytes, "
                   "%u-byte header) inconsistent with %u buckets of at most %llu bytes",
                   h->index, (unsigned long long)h->next_total, h->next_header,
                   h->n_buckets, (unsigned long long)ex->max_total);
    return REFIT_OK;
}

static int decode_fixed(bkt_header *h, const uint8_t *buf, const bkt_expect *ex, char *err,
                        size_t errlen)
{
    const int C = REFIT_ECORRUPT;
    uint32_t hb = ex->header_bytes;
    if (rd32(buf) != BKT_MAGIC_BUCKET || rd16(buf + 4) != BKT_VERSION)
        return errbuf_set(err, errlen, C, "bucket %u: bad magic or wire version", ex->index);
    if (rd64(buf + hb - 8) != bkt_checksum(buf, hb - 8))
        return errbuf_set(err, errlen, C, "bucket %u: header checksum mismatch", ex->index);
    h->flags = rd16(buf + 6);
    h->index = rd32(buf + 8);
    h->n_buckets = rd32(buf + 12);
    h->n_entries = rd32(buf + 16);
    h->header_bytes = rd32(buf + 20);
    h->nonce = rd64(buf + 24);
    h->payload_offset = rd64(buf + 32);
    h->payload_bytes = rd64(buf + 40);
    h->next_total = rd64(buf + 48);
    h->next_header = rd32(buf + 56);
    if ((h->flags & ~BKT_H_DIRECT) || rd64(buf + 64))
        return errbuf_set(err, errlen, C, "bucket %u: unknown flags 0x%x or reserved bytes set",
                   ex->index, h->flags);
    if (h->index != ex->index || h->n_buckets != ex->n_buckets || h->nonce != ex->nonce)
        return errbuf_set(err, errlen, C, "bucket %u of %u (update %016llx) arrived where bucket %u "
                   "of %u (update %016llx) was expected", h->index, h->n_buckets,
                   (unsigned long long)h->nonce, ex->index, ex->n_buckets,
                   (unsigned long long)ex->nonce);
    bool direct = h->flags & BKT_H_DIRECT;
    if (direct && (h->payload_bytes == 0 || h->n_entries != 1))
        return errbuf_set(err, errlen, C, "bucket %u: DIRECT with %u entries and %llu payload bytes "
                   "(one entry of at least a byte)", h->index, h->n_entries,
                   (unsigned long long)h->payload_bytes);
    if (h->header_bytes != hb || h->payload_offset != (direct ? 0 : BKT_ALIGN) ||
        ex->total < h->payload_offset || h->payload_bytes != ex->total - h->payload_offset)
        return errbuf_set(err, errlen, C, "bucket %u: sizes (header %u, payload %llu at %llu) do "
                   "not add up to the %llu bytes received", h->index, h->header_bytes,
                   (unsigned long long)h->payload_bytes,
                   (unsigned long long)h->payload_offset, (unsigned long long)ex->total);
    return decode_next(h, ex, err, errlen);
}

static int decode_label(bkt_header *h, const uint8_t *buf, uint32_t hb, char *err,
                        size_t errlen)
{
    uint16_t ll = rd16(buf + 60);
    if (ll > BKT_MAX_LABEL || BKT_FIXED_HEADER + 8u + ll > hb || rd16(buf + 62) != 0 ||
        memchr(buf + BKT_FIXED_HEADER, 0, ll))
        return errbuf_set(err, errlen, REFIT_ECORRUPT, "bucket %u: bad version label (%u bytes)",
                   h->index, ll);
    memcpy(h->label, buf + BKT_FIXED_HEADER, ll);
    h->label[ll] = '\0';
    uint64_t room = hb - 8u - BKT_FIXED_HEADER - ll;
    if (h->n_entries > room / BKT_FIXED_ENTRY)
        return errbuf_set(err, errlen, REFIT_ECORRUPT, "bucket %u: %u entries cannot fit in a "
                   "%u-byte header", h->index, h->n_entries, hb);
    return REFIT_OK;
}

/* Rows, byte count and placement of one entry against its shape. */
static int check_entry(const bkt_entry *e, uint64_t prev_end, uint64_t payload_bytes,
                       const char **why)
{
    int64_t numel = shape_numel(e->ndim, e->shape);
    uint64_t want;
    *why = "shape";
    if (numel < 0 || e->dtype.lanes != 1 || e->dtype.bits == 0 || e->dtype.bits > 64)
        return -1;
    int64_t dim0 = e->ndim ? e->shape[0] : 1;
    *why = "row range";
    if (e->row_offset < 0 || e->rows < 0 || e->row_offset > dim0 || e->rows > dim0 - e->row_offset)
        return -1;
    if (!e->part) {
        if (e->row_offset != 0 || e->rows != dim0)
            return -1;
        want = bkt_bytes(e->dtype, numel);
    } else {
        if (e->ndim == 0 || e->rows == 0)
            return -1;
        uint64_t row_el = (uint64_t)(numel / dim0);
        if (row_el > UINT64_MAX / 64)
            return -1;
        uint64_t row_bits = row_el * e->dtype.bits, row_bytes = row_bits / 8;
        if (row_bits % 8 || (row_bytes && (uint64_t)e->rows > UINT64_MAX / row_bytes))
            return -1;
        want = (uint64_t)e->rows * row_bytes;
    }
    *why = "byte count";
    if (want == UINT64_MAX || e->bytes != want)
        return -1;
    *why = "payload placement";
    if (e->offset % BKT_ALIGN || e->offset < prev_end || e->offset > payload_bytes ||
        e->bytes > payload_bytes - e->offset)
        return -1;
    return 0;
}

static int decode_entry(bkt_header *h, uint32_t k, const uint8_t **cur, const uint8_t *end,
                        size_t *arena_used, uint64_t *prev_end, char *err, size_t errlen)
{
    const uint8_t *q = *cur;
    bkt_entry *e = &h->entries[k];
    if ((size_t)(end - q) < BKT_FIXED_ENTRY)
        return errbuf_set(err, errlen, REFIT_ECORRUPT, "bucket %u: entry %u runs past the header",
                   h->index, k);
    uint16_t nl = rd16(q);
    *e = (bkt_entry){.dtype = {q[2], q[3], rd16(q + 4)}, .ndim = q[6], .part = q[7] == 1,
                     .kind = q[7],
                     .row_offset = (int64_t)rd64(q + 8), .rows = (int64_t)rd64(q + 16),
                     .offset = rd64(q + 24), .bytes = rd64(q + 32)};
    if (q[7] > BKT_E_DELTA_VALUES || e->ndim > REFIT_MAX_DIMS || nl == 0 || nl > BKT_MAX_NAME ||
        (size_t)(end - q) < BKT_FIXED_ENTRY + 8u * e->ndim + nl)
        return errbuf_set(err, errlen, REFIT_ECORRUPT, "bucket %u: entry %u: bad dims, flags or "
                   "name length", h->index, k);
    q += BKT_FIXED_ENTRY;
    for (int d = 0; d < e->ndim; d++, q += 8)
        e->shape[d] = (int64_t)rd64(q);
    char *name = h->arena + *arena_used;
    memcpy(name, q, nl);
    name[nl] = '\0';
    const char *why = "name";
    if (memchr(q, 0, nl) || check_entry(e, *prev_end, h->payload_bytes, &why))
        return errbuf_set(err, errlen, REFIT_ECORRUPT, "bucket %u: entry %u (%.*s): bad %s", h->index,
                   k, (int)nl, (const char *)q, why);
    e->name = name;
    *arena_used += nl + 1u;
    *prev_end = e->offset + e->bytes;
    *cur = q + nl;
    return REFIT_OK;
}

static int header_room(bkt_header *h, uint32_t hb)
{
    if (h->cap_entries < h->n_entries) {
        bkt_entry *ne = realloc(h->entries, (size_t)h->n_entries * sizeof *ne);
        if (!ne)
            return REFIT_ENOMEM;
        h->entries = ne;
        h->cap_entries = h->n_entries;
    }
    /* names plus their NULs never exceed the header: each entry spends at
     * least BKT_FIXED_ENTRY bytes besides its name */
    if (h->cap_arena < hb) {
        char *na = realloc(h->arena, hb);
        if (!na)
            return REFIT_ENOMEM;
        h->arena = na;
        h->cap_arena = hb;
    }
    return REFIT_OK;
}

/* Patches: every delta entry belongs to one, indices (I64 [n]), then
 * counts (I64 [n], optional), then values (1-D), consecutive and named
 * alike; none in a DIRECT bucket. */
static int check_patches(const bkt_header *h, char *err, size_t errlen)
{
    for (uint32_t k = 0; k < h->n_entries; k++) {
        const bkt_entry *e = h->entries + k;
        if (e->kind < BKT_E_DELTA_INDICES)
            continue;
        uint32_t g = k + 2 < h->n_entries && e[1].kind == BKT_E_DELTA_COUNTS ? 3 : 2;
        bool ok = e->kind == BKT_E_DELTA_INDICES && !(h->flags & BKT_H_DIRECT) &&
                  k + g <= h->n_entries && e[g - 1].kind == BKT_E_DELTA_VALUES;
        for (uint32_t j = 0; ok && j < g; j++)
            ok = e[j].ndim == 1 && !strcmp(e[j].name, e->name) &&
                 (j + 1 == g || (e[j].dtype.code == REFIT_DTYPE_INT && e[j].dtype.bits == 64 &&
                                 e[j].shape[0] == e->shape[0]));
        if (!ok)
            return errbuf_set(err, errlen, REFIT_ECORRUPT, "bucket %u: entry %u (%s): its "
                              "flags say a patch's entry, but it is not a patch (I64 indices, "
                              "I64 counts of as many, values; 1-D, named alike, in a packed "
                              "bucket)", h->index, k, e->name);
        k += g - 1;
    }
    return REFIT_OK;
}

int bkt_header_decode(bkt_header *h, const uint8_t *buf, const bkt_expect *ex, char *err,
                      size_t errlen)
{
    uint32_t hb = ex->header_bytes;
    if (hb < BKT_FIXED_HEADER + 8 || hb > BKT_MAX_HEADER)
        return errbuf_set(err, errlen, REFIT_ECORRUPT, "bucket %u: header of %u bytes", ex->index, hb);
    int rc = decode_fixed(h, buf, ex, err, errlen);
    if (!rc)
        rc = decode_label(h, buf, hb, err, errlen);
    if (!rc && (rc = header_room(h, hb)))
        return errbuf_set(err, errlen, rc, "bucket %u: out of memory for %u entries", h->index,
                   h->n_entries);
    const uint8_t *cur = buf + BKT_FIXED_HEADER + strlen(h->label), *end = buf + hb - 8;
    size_t used = 0;
    uint64_t prev_end = 0;
    for (uint32_t k = 0; !rc && k < h->n_entries; k++)
        rc = decode_entry(h, k, &cur, end, &used, &prev_end, err, errlen);
    if (!rc && cur != end)
        rc = errbuf_set(err, errlen, REFIT_ECORRUPT, "bucket %u: %zu stray bytes after the entries",
                 h->index, (size_t)(end - cur));
    if (!rc)
        rc = check_patches(h, err, errlen);
    /* a DIRECT bucket's one entry is its whole broadcast */
    if (!rc && (h->flags & BKT_H_DIRECT) &&
        (h->entries[0].offset != 0 || h->entries[0].bytes != h->payload_bytes))
        rc = errbuf_set(err, errlen, REFIT_ECORRUPT, "bucket %u: a DIRECT bucket whose entry (%llu "
                 "bytes at %llu) is not its %llu-byte payload", h->index,
                 (unsigned long long)h->entries[0].bytes, (unsigned long long)h->entries[0].offset,
                 (unsigned long long)h->payload_bytes);
    return rc;
}

void bkt_header_free(bkt_header *h)
{
    free(h->entries);
    free(h->arena);
    h->entries = NULL;
    h->arena = NULL;
    h->cap_entries = 0;
    h->cap_arena = 0;
}

int bkt_patch_check(const char *name, size_t n, const int64_t *indices, const int64_t *counts,
                    int64_t n_values, char *why, size_t len)
{
    int64_t elements = 0;
    size_t bad;
    if (!name || !*name || strlen(name) > BKT_MAX_NAME || n_values < 0)
        snprintf(why, len, "a name of 1 to %d bytes and 1-D values are needed", BKT_MAX_NAME);
    else if (n && !indices)
        snprintf(why, len, "indices NULL for %zu entries", n);
    else if (n > (size_t)INT64_MAX / 8)
        snprintf(why, len, "%zu indices", n);
    else if ((bad = bkt_patch_elements(n, indices, counts, &elements))) {
        size_t i = bad - 1;
        int64_t c = counts ? counts[i] : 1;
        snprintf(why, len, "%s %zu is %lld%s", counts ? "run" : "index", i,
                 (long long)(c < 1 ? c : indices[i]),
                 c < 1 ? " elements (at least 1)" : " (negative)");
    } else if (n_values != elements)
        snprintf(why, len, "%lld values for %lld elements", (long long)n_values,
                 (long long)elements);
    else
        return REFIT_OK;
    return REFIT_EINVAL;
}

size_t bkt_patch_elements(size_t n, const int64_t *indices, const int64_t *counts,
                          int64_t *elements)
{
    int64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t c = counts ? counts[i] : 1;
        if (indices[i] < 0 || c < 1 || sum > INT64_MAX - c)
            return i + 1;
        sum += c;
    }
    *elements = sum;
    return 0;
}
