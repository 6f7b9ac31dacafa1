/*
 * The bucket wire format of the NCCL transport (docs/nccl.md). Everything a
 * receiver needs travels in the broadcasts themselves: no other channel.
 *
 * One update on the wire (wire version 5: entries may be patches; version
 * 4 had whole tensors and parts only, version 3 no direct buckets and no
 * trailer, version 2 carried the payload checksum inside the stamp,
 * version 1 each header inside its bucket):
 *
 *   announce  128 bytes, fixed: bucket count, nonce, the index's size, the
 *             sizes of bucket 0 and of the largest bucket, the trailer's
 *             size, whether payloads are summed
 *   index     every bucket's header, back to back (one broadcast): each
 *             names the next one's size and says whether it is DIRECT, so
 *             the whole update is known before its first payload byte moves
 *   bucket 0  [stamp | zero pad to 256 | payload]      one broadcast
 *   bucket 1  [payload]  (DIRECT: one tensor or part,   one broadcast
 *             sent from the tensor itself and received,
 *             where the route allows, into the runtime tensor)
 *   ...
 *   trailer   [stamp of every DIRECT bucket | their payload checksum words]
 *             one broadcast, only when some bucket is DIRECT
 *
 * Knowing every size up front, every rank posts broadcast n+1 (and more)
 * right behind broadcast n: no host round trip between buckets. The stamp
 * (64 bytes) is what a bucket cannot know in advance: CANCEL when the
 * sender failed while packing (it then still sends every planned bucket,
 * unpacked, so collectives keep matching), and whether the 8 bytes right
 * after it (BKT_SUM_AT, in the pad) hold the payload's checksum. The
 * sender's device writes that word straight from the payload, ordered
 * before the broadcast, so no host waits for it; it sits outside the
 * stamp's own checksum (a flipped bit in it fails the payload comparison,
 * which refuses the bucket all the same).
 *
 * All integers are little-endian. Headers and stamps are untrusted input:
 * the decoders check every field, every size against the buffer and every
 * multiplication for overflow before anything reads the payload.
 *
 * Checksum: refit's content fingerprint (kernels/fingerprint.h): the
 * splitmix64-mixed 8-byte words of the bytes, keyed by position and
 * summed. 64 bits, not cryptographic: it catches corruption, truncation
 * and misrouted buffers, not tampering. Being a sum, it runs as one
 * parallel pass on a GPU (backend fingerprint) with the same value as on
 * the host. The announce, headers and stamps always carry one; the
 * payload's is optional (BKT_F_PAYLOAD_SUM in the stamp, the value at
 * BKT_SUM_AT).
 */
#ifndef REFIT_CORE_NCCL_BUCKET_H
#define REFIT_CORE_NCCL_BUCKET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <refit/refit.h>

#define BKT_MAGIC_ANNOUNCE 0x4e415452u /* "RTAN" */
#define BKT_MAGIC_BUCKET 0x4b425452u   /* "RTBK" */
#define BKT_MAGIC_STAMP 0x53425452u    /* "RTBS" */
#define BKT_VERSION 5
#define BKT_ANNOUNCE_BYTES 128
#define BKT_STAMP_BYTES 64
#define BKT_ALIGN 256                  /* payload and every piece start here */
#define BKT_SUM_AT BKT_STAMP_BYTES     /* the payload checksum word (little-endian) */
#define BKT_STAMP_COPY (BKT_SUM_AT + 8) /* what a receiver copies to the host per bucket */
#define BKT_FIXED_HEADER 72            /* bytes before the label */
#define BKT_FIXED_ENTRY 40             /* bytes of an entry before shape and name */
#define BKT_MAX_HEADER (64u << 20)
#define BKT_MAX_NAME 4096
#define BKT_MAX_LABEL 1024
#define BKT_MAX_BUCKETS (1u << 24)
#define BKT_MAX_INDEX ((uint64_t)256 << 20)
#define BKT_DEFAULT_BYTES ((uint64_t)1 << 30)
/* Buckets ramp up from bucket_bytes / BKT_RAMP (at least BKT_RAMP_MIN)
 * and back down at the end, so the first pack and the last scatter, which
 * nothing overlaps, are small. */
#define BKT_RAMP 16
#define BKT_RAMP_MIN ((uint64_t)4 << 20)
/* Slots (buckets in flight) each rank holds: as many as fit this budget,
 * 2 to BKT_MAX_SLOTS, so small buckets keep NCCL fed too. */
#define BKT_SLOT_BUDGET ((uint64_t)512 << 20)
#define BKT_MAX_SLOTS 8
/* Per DIRECT bucket in the trailer: its stamp, and its checksum word (the
 * words come after every stamp, so the stamps go in one copy and the
 * words are written by the device). */
#define BKT_TRAILER_REC (BKT_STAMP_BYTES + 8)
/* Default of refit_send_opts.direct_min_bytes: none (docs/nccl.md,
 * "DIRECT buckets off by default": slower than packed buckets on 2 x H200). */
#define BKT_DIRECT_MIN_DEFAULT ((uint64_t)0)

/* Stamp flags. */
#define BKT_F_PAYLOAD_SUM 0x1u /* the word at BKT_SUM_AT is the payload's checksum */
#define BKT_F_CANCEL 0x2u      /* the sender failed: payload not packed, status says why */
/* Announce flags. */
#define BKT_A_PAYLOAD_SUM 0x1u /* the sender sums every payload (receivers sum DIRECT ones) */
/* Entry kinds (byte 7 of an entry). A patch of a checkpoint tensor for a
 * delta update (refit_load_delta) is two or three consecutive entries of
 * one packed bucket, all named after the tensor: its flat indices (or run
 * starts), I64 [n]; its run lengths, I64 [n], only in the run form; its
 * values, [m] of the checkpoint dtype. */
#define BKT_E_WHOLE 0
#define BKT_E_PART 1
#define BKT_E_DELTA_INDICES 2
#define BKT_E_DELTA_COUNTS 3
#define BKT_E_DELTA_VALUES 4
/* Header flags. */
#define BKT_H_DIRECT 0x1u      /* payload only (at offset 0), one entry; its stamp and
                                * checksum word are in the trailer */

/* ---- announce ---- */

typedef struct bkt_announce {
    uint16_t flags;
    uint32_t n_buckets;
    uint32_t first_header;      /* header bytes of bucket 0 (first in the index) */
    uint64_t nonce;             /* the update's id on the wire; every header repeats it */
    uint64_t index_bytes;       /* the index broadcast: every header, back to back */
    uint64_t first_total;       /* bytes of bucket 0's broadcast */
    uint64_t max_total;         /* the largest bucket's broadcast */
    uint64_t total_payload;
    uint64_t n_entries;         /* pieces over all buckets */
    uint64_t trailer_bytes;     /* BKT_TRAILER_REC per DIRECT bucket, 0: no trailer */
} bkt_announce;

void bkt_announce_encode(uint8_t out[BKT_ANNOUNCE_BYTES], const bkt_announce *a);
/* REFIT_ECORRUPT with a message in err when anything is off, including a
 * largest bucket above max_accept. */
int bkt_announce_decode(bkt_announce *a, const uint8_t in[BKT_ANNOUNCE_BYTES],
                        uint64_t max_accept, char *err, size_t errlen);

/* ---- planning (sender) ---- */

/* A tensor to send, as the planner sees it. */
typedef struct bkt_tensor {
    const char *name;
    refit_dtype dtype;
    int32_t ndim;
    const int64_t *shape;
    bool direct;                /* its bytes can be broadcast as they are (contiguous,
                                 * in the transport's memory) */
} bkt_tensor;

/* A piece: rows [row_offset, row_offset + rows) of dim 0 of a tensor, or
 * the whole tensor (part false). */
typedef struct bkt_piece {
    uint32_t tensor;
    bool part;
    int64_t row_offset, rows;
    uint64_t offset, bytes;     /* in the bucket's payload */
} bkt_piece;

typedef struct bkt_span {
    uint32_t first, n;          /* pieces */
    uint32_t header_bytes;
    uint64_t payload_bytes;
    bool direct;                /* one piece, broadcast from its tensor (BKT_H_DIRECT) */
} bkt_span;

typedef struct bkt_plan {
    bkt_piece *pieces;
    uint32_t n_pieces, cap_pieces;
    bkt_span *buckets;
    uint32_t n_buckets, cap_buckets;
    uint64_t max_total, total_payload;
    uint32_t n_direct;          /* DIRECT buckets (they come first) */
    const uint8_t *kinds;       /* per tensor BKT_E_* (borrowed); NULL: all whole */
} bkt_plan;

/* Cut tensors into buckets of at most bucket_bytes of payload (less at
 * both ends: the ramp, bkt_plan_cap): a tensor that fits its bucket goes
 * whole (a new bucket when the current one is too full), a larger one is
 * split into row ranges of dim 0. The same tensors and bucket size give
 * the same plan. REFIT_EINVAL / REFIT_EUNSUPPORTED / REFIT_ENOMEM with err.
 * No DIRECT buckets (bkt_plan_build_direct with direct_min 0). */
int bkt_plan_build(bkt_plan *p, const bkt_tensor *t, uint32_t n, uint64_t bucket_bytes,
                   size_t label_len, char *err, size_t errlen);
/* As bkt_plan_build, and a tensor marked direct of at least direct_min
 * bytes (0: none) goes in DIRECT buckets of its own, whole when it fits
 * bucket_bytes, else as dim-0 row ranges of at most bucket_bytes: the
 * smallest such tensor's buckets first, then the packed buckets as
 * bkt_plan_build plans the rest, then the other DIRECT tensors', largest
 * first (ties in the order given). DIRECT buckets need no ramp: nothing
 * packs or scatters them. */
int bkt_plan_build_direct(bkt_plan *p, const bkt_tensor *t, uint32_t n, uint64_t bucket_bytes,
                          uint64_t direct_min, size_t label_len, char *err, size_t errlen);
/* The elements a patch of n entries writes: single flat indices, or runs
 * of counts[i] elements from indices[i]. Returns 0 with *elements set when
 * every entry is well formed, else 1 + the first bad entry (a negative
 * index, a run of fewer than 1 element, or a total past INT64_MAX); the
 * senders name it in their own words. */
size_t bkt_patch_elements(size_t n, const int64_t *indices, const int64_t *counts,
                          int64_t *elements);

/* A patch as a sender takes it, before any model sees it: a name of 1 to
 * BKT_MAX_NAME bytes, n indices (NULL only when n is 0) and their counts
 * (NULL: single elements), n_values values (-1: none, or not 1-D).
 * REFIT_OK, or REFIT_EINVAL with why written ("index 0 is -1 (negative)",
 * "3 values for 2 elements"); each sender puts its own words before it. */
int bkt_patch_check(const char *name, size_t n, const int64_t *indices, const int64_t *counts,
                    int64_t n_values, char *why, size_t len);

/* As bkt_plan_build_direct, with kinds[i] the BKT_E_* of tensor i (NULL:
 * every one whole): a patch (BKT_E_DELTA_INDICES, then optionally
 * BKT_E_DELTA_COUNTS, then BKT_E_DELTA_VALUES, consecutive, 1-D) goes into
 * one packed bucket, a new one when the current cannot hold it all, past
 * the ramp's cap if need be; a patch larger than bucket_bytes is
 * REFIT_EINVAL. kinds is kept in p (borrowed) for bkt_header_encode. */
int bkt_plan_build_kinds(bkt_plan *p, const bkt_tensor *t, const uint8_t *kinds, uint32_t n,
                         uint64_t bucket_bytes, uint64_t direct_min, size_t label_len,
                         char *err, size_t errlen);
void bkt_plan_free(bkt_plan *p);
/* The payload cap of bucket b when left bytes remain to plan. */
uint64_t bkt_plan_cap(uint64_t bucket_bytes, uint32_t b, uint64_t left);
/* Slots a rank holds for buckets of at most max_total bytes. */
uint32_t bkt_slots(uint64_t max_total);
/* Bytes of the index of p (every header). */
uint64_t bkt_index_bytes(const bkt_plan *p);

static inline uint64_t bkt_align(uint64_t n)
{
    return (n + BKT_ALIGN - 1) & ~(uint64_t)(BKT_ALIGN - 1);
}
/* Bytes of bucket b's broadcast: the stamp's 256 bytes + payload; a
 * DIRECT bucket's payload alone. */
static inline uint64_t bkt_total(const bkt_plan *p, uint32_t b)
{
    return (p->buckets[b].direct ? 0 : BKT_ALIGN) + p->buckets[b].payload_bytes;
}
/* Bytes of the trailer of n DIRECT buckets; where the j-th one's stamp and
 * checksum word are in it. */
static inline uint64_t bkt_trailer_bytes(uint32_t n) { return (uint64_t)n * BKT_TRAILER_REC; }
static inline uint64_t bkt_trailer_stamp(uint32_t j) { return (uint64_t)j * BKT_STAMP_BYTES; }
static inline uint64_t bkt_trailer_sum(uint32_t n, uint32_t j)
{
    return (uint64_t)n * BKT_STAMP_BYTES + (uint64_t)j * 8;
}

/* Write bucket b's header into buf (at least header_bytes). */
void bkt_header_encode(uint8_t *buf, const bkt_plan *p, uint32_t b, const bkt_tensor *t,
                       const char *label, uint64_t nonce);

/* ---- the stamp: the first 64 bytes of every bucket's broadcast ---- */

typedef struct bkt_stamp {
    uint16_t flags;             /* BKT_F_* */
    uint32_t index;
    int32_t status;             /* CANCEL: the sender's refit status; else 0 */
    uint64_t nonce, payload_bytes;
} bkt_stamp;

void bkt_stamp_encode(uint8_t out[BKT_STAMP_BYTES], const bkt_stamp *s);
/* REFIT_ECORRUPT (err says why) unless in is a sound stamp of bucket
 * index of update nonce, with payload_bytes of payload. */
int bkt_stamp_decode(bkt_stamp *s, const uint8_t in[BKT_STAMP_BYTES], uint32_t index,
                     uint64_t nonce, uint64_t payload_bytes, char *err, size_t errlen);

/* ---- decoding (receiver) ---- */

typedef struct bkt_entry {
    const char *name;           /* NUL-terminated, in the header's arena */
    refit_dtype dtype;
    int32_t ndim;
    int64_t shape[REFIT_MAX_DIMS]; /* the full checkpoint shape */
    bool part;
    uint8_t kind;               /* BKT_E_*: a patch's entries are checked as a group */
    int64_t row_offset, rows;
    uint64_t offset, bytes;
} bkt_entry;

/* What the chain promised about the next header. */
typedef struct bkt_expect {
    uint32_t index, n_buckets;
    uint64_t nonce;
    uint32_t header_bytes;
    uint64_t total;             /* bytes received */
    uint64_t max_total;         /* the announce's largest bucket */
} bkt_expect;

typedef struct bkt_header {
    uint16_t flags;             /* BKT_H_DIRECT or 0 */
    uint32_t index, n_buckets, n_entries, header_bytes, next_header;
    uint64_t nonce, payload_offset, payload_bytes, next_total;
    char label[BKT_MAX_LABEL + 1];
    bkt_entry *entries;
    uint32_t cap_entries;
    char *arena;                /* names */
    size_t cap_arena;
} bkt_header;

/* Decode buf (header_bytes of ex) into h, reusing its arrays. REFIT_ECORRUPT
 * (err names the field) or REFIT_ENOMEM. */
int bkt_header_decode(bkt_header *h, const uint8_t *buf, const bkt_expect *ex, char *err,
                      size_t errlen);
void bkt_header_free(bkt_header *h);

/* The checksum (see the top of this file) of n bytes in host memory. */
uint64_t bkt_checksum(const void *p, size_t n);
/* The little-endian 64-bit word at p (a payload checksum word). */
uint64_t bkt_le64(const uint8_t *p);

/* Bytes of numel elements of dt, or UINT64_MAX on overflow. */
uint64_t bkt_bytes(refit_dtype dt, int64_t numel);

#endif
