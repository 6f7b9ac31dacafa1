/* The bucket wire format (version 4): plans cover every tensor exactly once
 * for any bucket size (ramped at both ends), headers, stamps and the
 * announce round-trip, and the decoders refuse every malformed field (all
 * of it is untrusted input) without reading past their buffers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "transports/nccl/bucket.h"

static const int64_t SH_A[] = {10, 8}, SH_EMPTY[] = {0, 16}, SH_FP4[] = {6, 3},
                     SH_FP4E[] = {8, 4}, SH_BIG[] = {300, 7}, SH_WIDE[] = {2, 1000},
                     SH_X[] = {1}, SH_3D[] = {5, 3, 4};

#define E2M1 ((refit_dtype){REFIT_DTYPE_FLOAT4_E2M1FN, 4, 1})
#define F16 ((refit_dtype){REFIT_DTYPE_FLOAT, 16, 1})

static const bkt_tensor TS[] = {
    {"model.a.weight", REFIT_F32, 2, SH_A, false},
    {"model.scale", REFIT_F32, 0, NULL, false},
    {"model.empty", REFIT_BF16, 2, SH_EMPTY, false},
    {"model.fp4.odd", E2M1, 2, SH_FP4, false},
    {"model.fp4.even", E2M1, 2, SH_FP4E, false},
    {"model.big.weight", F16, 2, SH_BIG, false},
    {"model.wide.weight", REFIT_F32, 2, SH_WIDE, false},
    {"x", REFIT_U8, 1, SH_X, false},
    {"model.cube", REFIT_I32, 3, SH_3D, false},
};
#define NTS ((uint32_t)(sizeof TS / sizeof *TS))

static const char *LABEL = "step-1200";

static uint64_t bytes_of(const bkt_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return bkt_bytes(t->dtype, n);
}

/* Encode bucket b of p into a fresh buffer; *ex: what a receiver expects. */
static uint8_t *encode(const bkt_plan *p, uint32_t b, bkt_expect *ex)
{
    uint8_t *buf = calloc(1, p->buckets[b].header_bytes);
    assert_non_null(buf);
    bkt_header_encode(buf, p, b, TS, LABEL, 0x1234);
    *ex = (bkt_expect){b, p->n_buckets, 0x1234, p->buckets[b].header_bytes, bkt_total(p, b),
                       p->max_total};
    return buf;
}

/* Decode every bucket; each tensor's rows must come exactly once, in order. */
static void roundtrip(uint64_t cap)
{
    bkt_plan p;
    char err[256];
    assert_int_equal(bkt_plan_build(&p, TS, NTS, cap, strlen(LABEL), err, sizeof err), 0);
    int64_t next_row[16] = {0};
    uint64_t seen = 0;
    bkt_header h = {0};
    for (uint32_t b = 0; b < p.n_buckets; b++) {
        bkt_expect ex;
        uint8_t *buf = encode(&p, b, &ex);
        int rc = bkt_header_decode(&h, buf, &ex, err, sizeof err);
        free(buf);
        if (rc)
            fail_msg("cap %llu bucket %u: %s", (unsigned long long)cap, b, err);
        assert_true(h.payload_bytes <= cap);
        assert_string_equal(h.label, LABEL);
        assert_true(h.payload_offset == BKT_ALIGN);
        assert_true(h.payload_bytes + BKT_ALIGN == bkt_total(&p, b));
        for (uint32_t k = 0; k < h.n_entries; k++) {
            const bkt_entry *e = &h.entries[k];
            uint32_t t = p.pieces[p.buckets[b].first + k].tensor;
            assert_string_equal(e->name, TS[t].name);
            assert_int_equal(e->ndim, TS[t].ndim);
            assert_int_equal(e->offset % BKT_ALIGN, 0);
            int64_t dim0 = TS[t].ndim ? TS[t].shape[0] : 1;
            assert_int_equal(e->row_offset, next_row[t]);
            next_row[t] += e->rows;
            assert_true(e->part || (e->rows == dim0 && e->bytes == bytes_of(&TS[t])));
            seen += e->bytes;
        }
    }
    for (uint32_t t = 0; t < NTS; t++)
        assert_int_equal(next_row[t], TS[t].ndim ? TS[t].shape[0] : 1);
    assert_true(seen == p.total_payload - 0 || seen <= p.total_payload);
    bkt_header_free(&h);
    bkt_plan_free(&p);
}

static void test_roundtrip_any_bucket_size(void **state)
{
    (void)state;
    static const uint64_t caps[] = {4000, 4001, 4096, 5000, 8000, 10000, 65536, 1 << 30};
    for (size_t i = 0; i < sizeof caps / sizeof *caps; i++)
        roundtrip(caps[i]);
}

static void test_plan_splits_only_what_does_not_fit(void **state)
{
    (void)state;
    bkt_plan p;
    char err[256];
    assert_int_equal(bkt_plan_build(&p, TS, NTS, 4096, 0, err, sizeof err), 0);
    for (uint32_t i = 0; i < p.n_pieces; i++) {
        const bkt_piece *pc = &p.pieces[i];
        assert_true(pc->bytes <= 4096);
        assert_true(!pc->part || bytes_of(&TS[pc->tensor]) > 4096);
    }
    assert_int_equal(p.n_pieces, NTS + 1 + 1); /* big in 2 parts, wide in 2 */
    bkt_plan p2;
    assert_int_equal(bkt_plan_build(&p2, TS, NTS, 4096, 0, err, sizeof err), 0);
    assert_int_equal(p2.n_pieces, p.n_pieces);
    for (uint32_t i = 0; i < p.n_pieces; i++) { /* field by field: padding is not data */
        const bkt_piece *a = &p.pieces[i], *b = &p2.pieces[i];
        assert_true(a->tensor == b->tensor && a->part == b->part &&
                    a->row_offset == b->row_offset && a->rows == b->rows &&
                    a->offset == b->offset && a->bytes == b->bytes);
    }
    bkt_plan_free(&p);
    bkt_plan_free(&p2);
}

static void plan_fails(const bkt_tensor *t, uint64_t cap, int status, const char *msg)
{
    bkt_plan p;
    char err[256] = "";
    assert_int_equal(bkt_plan_build(&p, t, 1, cap, 0, err, sizeof err), status);
    if (!strstr(err, msg))
        fail_msg("\"%s\" lacks \"%s\"", err, msg);
}

static void test_plan_refusals(void **state)
{
    (void)state;
    plan_fails(&TS[6], 3999, REFIT_EINVAL, "one row of dim 0 is 4000 bytes");
    plan_fails(&TS[3], 8, REFIT_EINVAL, "not a whole number of bytes");
    const int64_t neg[] = {-1, 4}, huge[] = {INT64_MAX / 2, 4};
    bkt_tensor t = {"n", REFIT_F32, 2, neg, false};
    plan_fails(&t, 1 << 20, REFIT_EINVAL, "overflows");
    t.shape = huge;
    plan_fails(&t, 1 << 20, REFIT_EINVAL, "overflows");
    t = (bkt_tensor){"", REFIT_F32, 0, NULL, false};
    plan_fails(&t, 1 << 20, REFIT_EINVAL, "empty");
    t = (bkt_tensor){"d", REFIT_F32, 9, SH_A, false};
    plan_fails(&t, 1 << 20, REFIT_EINVAL, "dims");
    t = (bkt_tensor){"l", {2, 32, 2}, 0, NULL, false};
    plan_fails(&t, 1 << 20, REFIT_EUNSUPPORTED, "cannot be sent");
    bkt_plan p;
    char err[64];
    assert_int_equal(bkt_plan_build(&p, TS, 1, 0, 0, err, sizeof err), REFIT_EINVAL);
    assert_int_equal(bkt_plan_build(&p, TS, 1, 1024, BKT_MAX_LABEL + 1, err, sizeof err),
                     REFIT_EINVAL);
}

/* ---- malformed headers ---- */

typedef struct bad_case {
    const char *what;
    size_t at;                  /* byte offset; entry fields relative to the first entry */
    int entry;
    int width;                  /* 1, 2, 4, 8 */
    uint64_t value;
    const char *msg;
} bad_case;

static void put(uint8_t *p, int width, uint64_t v)
{
    for (int i = 0; i < width; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void reseal(uint8_t *buf, uint32_t hb)
{
    put(buf + hb - 8, 8, bkt_checksum(buf, hb - 8));
}

static void test_decoder_refuses_each_bad_field(void **state)
{
    (void)state;
    bkt_plan p;
    char err[256];
    assert_int_equal(bkt_plan_build(&p, TS, NTS, 1 << 20, strlen(LABEL), err, sizeof err), 0);
    size_t e0 = BKT_FIXED_HEADER + strlen(LABEL);
    const bad_case cases[] = {
        {"magic", 0, 0, 4, 0x11111111, "bad magic"},
        {"flags", 6, 0, 2, 0x80, "unknown flags"},
        {"flags unknown low", 6, 0, 2, 0x2, "unknown flags"},
        {"flags DIRECT on a packed bucket", 6, 0, 2, BKT_H_DIRECT, "DIRECT with 9 entries"},
        {"reserved sum", 64, 0, 8, 77, "reserved bytes"},
        {"index", 8, 0, 4, 3, "arrived where"},
        {"nonce", 24, 0, 8, 99, "arrived where"},
        {"header bytes", 20, 0, 4, 4096, "do not add up"},
        {"payload bytes", 40, 0, 8, 1, "do not add up"},
        {"payload offset", 32, 0, 8, 0, "do not add up"},
        {"payload offset v1", 32, 0, 8, 512, "do not add up"},
        {"next total", 48, 0, 8, 5, "next bucket"},
        {"next total huge", 48, 0, 8, (uint64_t)1 << 40, "next bucket"},
        {"next header", 56, 0, 4, 12, "next bucket"},
        {"label length", 60, 0, 2, 5000, "label"},
        {"reserved", 62, 0, 2, 1, "label"},
        {"n_entries", 16, 0, 4, 1u << 30, "cannot fit"},
        {"ndim", 6, 1, 1, 9, "bad dims"},
        {"name length 0", 0, 1, 2, 0, "name length"},
        {"name length long", 0, 1, 2, 60000, "name length"},
        {"entry flags", 7, 1, 1, 2, "flags"},
        {"bits 0", 3, 1, 1, 0, "shape"},
        {"lanes", 4, 1, 2, 4, "shape"},
        {"bytes", 32, 1, 8, 12, "byte count"},
        {"offset unaligned", 24, 1, 8, 3, "placement"},
        {"offset beyond", 24, 1, 8, 1u << 30, "placement"},
        {"rows", 16, 1, 8, 11, "row range"},
        {"row offset", 8, 1, 8, (uint64_t)-1, "row range"},
        {"shape negative", 40, 1, 8, (uint64_t)-5, "shape"},
        {"shape overflow", 40, 1, 8, (uint64_t)1 << 62, "shape"},
        {"name NUL", 56, 1, 1, 0, "bad name"},
    };
    bkt_header h = {0};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const bad_case *c = &cases[i];
        bkt_expect ex;
        uint8_t *buf = encode(&p, 0, &ex);
        put(buf + (c->entry ? e0 : 0) + c->at, c->width, c->value);
        reseal(buf, ex.header_bytes);
        int rc = bkt_header_decode(&h, buf, &ex, err, sizeof err);
        free(buf);
        if (rc != REFIT_ECORRUPT || !strstr(err, c->msg))
            fail_msg("%s: rc %d, \"%s\" (wanted \"%s\")", c->what, rc, err, c->msg);
    }
    /* a flipped byte without a new checksum */
    bkt_expect ex;
    uint8_t *buf = encode(&p, 0, &ex);
    buf[ex.header_bytes / 2] ^= 0x40;
    assert_int_equal(bkt_header_decode(&h, buf, &ex, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "checksum"));
    free(buf);
    /* what the chain promised differs from what came */
    buf = encode(&p, 0, &ex);
    ex.total += 1;
    assert_int_equal(bkt_header_decode(&h, buf, &ex, err, sizeof err), REFIT_ECORRUPT);
    ex.total -= 1;
    ex.header_bytes = 10;
    assert_int_equal(bkt_header_decode(&h, buf, &ex, err, sizeof err), REFIT_ECORRUPT);
    free(buf);
    bkt_header_free(&h);
    bkt_plan_free(&p);
}

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Random mutations with a valid checksum: decode either refuses or gives
 * entries that stay inside the payload (ASan watches the reads). */
static void test_decoder_survives_random_mutations(void **state)
{
    (void)state;
    bkt_plan p;
    char err[256];
    assert_int_equal(bkt_plan_build(&p, TS, NTS, 1 << 20, strlen(LABEL), err, sizeof err), 0);
    bkt_header h = {0};
    uint64_t s = 42;
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        bkt_expect ex;
        uint8_t *buf = encode(&p, 0, &ex);
        int n = 1 + (int)(rng(&s) % 4);
        for (int k = 0; k < n; k++)
            buf[rng(&s) % (ex.header_bytes - 8)] = (uint8_t)rng(&s);
        reseal(buf, ex.header_bytes);
        int rc = bkt_header_decode(&h, buf, &ex, err, sizeof err);
        free(buf);
        assert_true(rc == REFIT_OK || rc == REFIT_ECORRUPT);
        if (rc)
            continue;
        accepted++;
        for (uint32_t k = 0; k < h.n_entries; k++)
            assert_true(h.entries[k].offset + h.entries[k].bytes <= h.payload_bytes);
    }
    assert_true(accepted < 20000);
    bkt_header_free(&h);
    bkt_plan_free(&p);
}

static void test_announce(void **state)
{
    (void)state;
    bkt_announce a = {.n_buckets = 3, .first_header = 200, .nonce = 0xabc, .index_bytes = 700,
                      .first_total = 4096, .max_total = 8192, .total_payload = 10000,
                      .n_entries = 12},
                 b;
    uint8_t buf[BKT_ANNOUNCE_BYTES];
    char err[256];
    bkt_announce_encode(buf, &a);
    assert_int_equal(bkt_announce_decode(&b, buf, 1 << 20, err, sizeof err), 0);
    assert_true(b.n_buckets == 3 && b.first_header == 200 && b.nonce == 0xabc &&
                b.first_total == 4096 && b.max_total == 8192 && b.total_payload == 10000 &&
                b.n_entries == 12 && b.flags == 0 && b.index_bytes == 700);
    assert_int_equal(bkt_announce_decode(&b, buf, 8191, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "accepts"));
    buf[9] ^= 1;
    assert_int_equal(bkt_announce_decode(&b, buf, 1 << 20, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "checksum"));
    /* sizes that cannot be: each refused with a valid checksum */
    const struct {
        uint64_t first_total, index_bytes;
        uint32_t first_header;
    } bad_sizes[] = {
        {9000, 700, 200},              /* first above the largest */
        {0, 700, 200},                 /* an empty first broadcast */
        {4096, 100, 200},              /* index smaller than its first header */
        {4096, 3 * 40, 40},            /* headers smaller than the fixed part */
        {4096, BKT_MAX_INDEX + 1, 200},
    };
    for (size_t i = 0; i < sizeof bad_sizes / sizeof *bad_sizes; i++) {
        bkt_announce c = a;
        c.first_total = bad_sizes[i].first_total;
        c.index_bytes = bad_sizes[i].index_bytes;
        c.first_header = bad_sizes[i].first_header;
        bkt_announce_encode(buf, &c);
        if (bkt_announce_decode(&b, buf, 1 << 20, err, sizeof err) != REFIT_ECORRUPT)
            fail_msg("sizes case %zu accepted", i);
        assert_non_null(strstr(err, "inconsistent sizes"));
    }
    /* a reserved byte set (checksum resealed): refused */
    bkt_announce_encode(buf, &a);
    buf[80] = 1;
    uint64_t sum = bkt_checksum(buf, 120);
    for (int i = 0; i < 8; i++)
        buf[120 + i] = (uint8_t)(sum >> (8 * i));
    assert_int_equal(bkt_announce_decode(&b, buf, 1 << 20, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "reserved"));
    /* the trailer: whole records, at most one per bucket, none without
     * buckets; payload sums announced; any other flag refused */
    const uint64_t bad_trailers[] = {BKT_TRAILER_REC - 1, BKT_TRAILER_REC + 8,
                                     4 * BKT_TRAILER_REC};
    for (size_t i = 0; i < sizeof bad_trailers / sizeof *bad_trailers; i++) {
        bkt_announce c = a;
        c.trailer_bytes = bad_trailers[i];
        bkt_announce_encode(buf, &c);
        if (bkt_announce_decode(&b, buf, 1 << 20, err, sizeof err) != REFIT_ECORRUPT)
            fail_msg("trailer of %llu bytes accepted", (unsigned long long)bad_trailers[i]);
        assert_non_null(strstr(err, "trailer"));
    }
    bkt_announce t = a;
    t.trailer_bytes = 3 * BKT_TRAILER_REC;
    t.flags = BKT_A_PAYLOAD_SUM;
    t.first_total = 1; /* a DIRECT bucket of one byte */
    bkt_announce_encode(buf, &t);
    assert_int_equal(bkt_announce_decode(&b, buf, 1 << 20, err, sizeof err), 0);
    assert_true(b.trailer_bytes == 3 * BKT_TRAILER_REC && b.flags == BKT_A_PAYLOAD_SUM &&
                b.first_total == 1);
    t.flags = 0x2;
    bkt_announce_encode(buf, &t);
    assert_int_equal(bkt_announce_decode(&b, buf, 1 << 20, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "unknown flags"));
    /* versions 1 to 4 (4: no patches; 3: no DIRECT buckets, no trailer) are refused by
     * name */
    for (uint8_t v = 1; v < BKT_VERSION; v++) {
        char want[64];
        snprintf(want, sizeof want, "wire version %u, this refit reads %u", v, BKT_VERSION);
        bkt_announce_encode(buf, &a);
        buf[4] = v;
        assert_int_equal(bkt_announce_decode(&b, buf, 1 << 20, err, sizeof err),
                         REFIT_ECORRUPT);
        assert_non_null(strstr(err, want));
    }
    a = (bkt_announce){0};
    bkt_announce_encode(buf, &a);
    assert_int_equal(bkt_announce_decode(&b, buf, 1 << 20, err, sizeof err), 0);
    a.index_bytes = 5; /* no buckets, yet an index */
    bkt_announce_encode(buf, &a);
    assert_int_equal(bkt_announce_decode(&b, buf, 1 << 20, err, sizeof err), REFIT_ECORRUPT);
    a.index_bytes = 0; /* no buckets, yet a trailer */
    a.trailer_bytes = BKT_TRAILER_REC;
    bkt_announce_encode(buf, &a);
    assert_int_equal(bkt_announce_decode(&b, buf, 1 << 20, err, sizeof err), REFIT_ECORRUPT);
    memset(buf, 0, sizeof buf);
    assert_int_equal(bkt_announce_decode(&b, buf, 1 << 20, err, sizeof err), REFIT_ECORRUPT);
}

/* ---- stamps ---- */

static void reseal_stamp(uint8_t *buf)
{
    put(buf + 56, 8, bkt_checksum(buf, 56));
}

static void test_stamp(void **state)
{
    (void)state;
    char err[256];
    uint8_t buf[BKT_STAMP_BYTES];
    bkt_stamp a = {BKT_F_PAYLOAD_SUM, 7, 0, 0xfeed, 4096}, b;
    bkt_stamp_encode(buf, &a);
    assert_int_equal(bkt_stamp_decode(&b, buf, 7, 0xfeed, 4096, err, sizeof err), 0);
    assert_true(b.flags == a.flags && b.index == 7 && b.status == 0 && b.nonce == 0xfeed &&
                b.payload_bytes == 4096);
    /* what the index promised differs */
    assert_int_equal(bkt_stamp_decode(&b, buf, 8, 0xfeed, 4096, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "not of bucket 8"));
    assert_int_equal(bkt_stamp_decode(&b, buf, 7, 0xfeee, 4096, err, sizeof err), REFIT_ECORRUPT);
    assert_int_equal(bkt_stamp_decode(&b, buf, 7, 0xfeed, 4095, err, sizeof err), REFIT_ECORRUPT);
    /* a cancel carries a refit status */
    bkt_stamp c = {BKT_F_CANCEL, 7, REFIT_EUNSUPPORTED, 0xfeed, 4096};
    bkt_stamp_encode(buf, &c);
    assert_int_equal(bkt_stamp_decode(&b, buf, 7, 0xfeed, 4096, err, sizeof err), 0);
    assert_int_equal(b.status, REFIT_EUNSUPPORTED);
    const struct {
        const char *what;
        size_t at;
        int width;
        uint64_t value;
        const char *msg;
    } cases[] = {
        {"magic", 0, 4, 0x4b425452, "magic"},
        {"version", 4, 2, 1, "version"},
        {"unknown flag", 6, 2, 0x4, "flags"},
        {"cancel with sum", 6, 2, BKT_F_CANCEL | BKT_F_PAYLOAD_SUM, "flags"},
        {"cancel status ok", 12, 4, 0, "status"},
        {"cancel status positive", 12, 4, 5, "status"},
        {"cancel status huge", 12, 4, (uint32_t)-5000, "status"},
        {"reserved", 44, 1, 1, "reserved"},
        {"version 2's old sum field", 32, 8, 0x1234567890abcdefull, "reserved"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bkt_stamp_encode(buf, &c);
        put(buf + cases[i].at, cases[i].width, cases[i].value);
        reseal_stamp(buf);
        int rc = bkt_stamp_decode(&b, buf, 7, 0xfeed, 4096, err, sizeof err);
        if (rc != REFIT_ECORRUPT || !strstr(err, cases[i].msg))
            fail_msg("%s: rc %d, \"%s\"", cases[i].what, rc, err);
    }
    /* a status without cancel */
    bkt_stamp d = {0, 7, REFIT_EIO, 0xfeed, 4096};
    bkt_stamp_encode(buf, &d);
    assert_int_equal(bkt_stamp_decode(&b, buf, 7, 0xfeed, 4096, err, sizeof err), REFIT_ECORRUPT);
    /* a flipped bit without a new checksum */
    bkt_stamp_encode(buf, &a);
    buf[33] ^= 0x10;
    assert_int_equal(bkt_stamp_decode(&b, buf, 7, 0xfeed, 4096, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "checksum"));
    /* the payload checksum word after the stamp is little-endian (the
     * device writes it as a native word) */
    const uint8_t w[8] = {0xef, 0xcd, 0xab, 0x90, 0x78, 0x56, 0x34, 0x12};
    assert_true(bkt_le64(w) == 0x1234567890abcdefull);
}

/* ---- the ramp: small buckets at both ends ---- */

static void test_plan_ramps_at_both_ends(void **state)
{
    (void)state;
    const uint64_t MB = 1 << 20, cap = 64 * MB;
    /* Llama-like rows: 4096 bf16 = 8 KiB per row; 600 MiB in all */
    static const int64_t sh_emb[] = {32000, 4096}, sh_qkv[] = {12288, 4096},
                         sh_norm[] = {4096}, sh_down[] = {4096, 14336};
    const bkt_tensor ts[] = {
        {"embed", REFIT_BF16, 2, sh_emb, false}, {"qkv", REFIT_BF16, 2, sh_qkv, false},
        {"norm", REFIT_BF16, 1, sh_norm, false}, {"down", REFIT_BF16, 2, sh_down, false},
        {"head", REFIT_BF16, 2, sh_emb, false},
    };
    bkt_plan p;
    char err[256];
    assert_int_equal(bkt_plan_build(&p, ts, 5, cap, 3, err, sizeof err), 0);
    uint64_t first = cap / BKT_RAMP;
    assert_true(p.buckets[0].payload_bytes <= first);
    assert_true(p.buckets[p.n_buckets - 1].payload_bytes <= first);
    assert_true(p.buckets[1].payload_bytes > first);
    assert_true(p.max_total == BKT_ALIGN + cap); /* the middle reaches the cap */
    int64_t next[5] = {0};
    for (uint32_t b = 0; b < p.n_buckets; b++) {
        assert_true(p.buckets[b].payload_bytes <= cap);
        for (uint32_t k = 0; k < p.buckets[b].n; k++) {
            const bkt_piece *pc = &p.pieces[p.buckets[b].first + k];
            int64_t rows = pc->part ? pc->rows : ts[pc->tensor].shape[0];
            assert_int_equal(pc->part ? pc->row_offset : 0, next[pc->tensor]);
            next[pc->tensor] += rows;
        }
    }
    for (int i = 0; i < 5; i++)
        assert_int_equal(next[i], ts[i].shape[0]);
    /* the caps themselves: doubling from cap/16, halving what is left */
    assert_true(bkt_plan_cap(cap, 0, 1000 * MB) == first);
    assert_true(bkt_plan_cap(cap, 1, 1000 * MB) == 2 * first);
    assert_true(bkt_plan_cap(cap, 9, 1000 * MB) == cap);
    assert_true(bkt_plan_cap(cap, 9, 40 * MB) == 20 * MB);
    assert_true(bkt_plan_cap(cap, 9, 5 * MB) == first);
    assert_true(bkt_plan_cap(MB, 0, 1000 * MB) == MB); /* small buckets: no ramp */
    assert_true(bkt_plan_cap(4096, 3, 1) == 4096);
    assert_true(bkt_slots(BKT_ALIGN + ((uint64_t)1 << 30)) == 2);
    assert_true(bkt_slots(BKT_ALIGN + 64 * MB) == 7);
    assert_true(bkt_slots(BKT_ALIGN + MB) == BKT_MAX_SLOTS);
    bkt_plan_free(&p);
}

/* Random tensor sets (shapes only: planning reads no data) and bucket sizes
 * from 1 KiB to 2 GiB, ramped or not: every tensor's rows come exactly once
 * and in order, a whole piece only when unsplit, no bucket above its size,
 * pieces aligned and inside the payload, every bucket but an empty update's
 * non-empty, headers encodable and decodable as a chain. */
static void test_plan_random_property(void **state)
{
    (void)state;
    uint64_t seed = 7;
    int64_t shapes[24][3];
    bkt_tensor ts[24];
    char names[24][16];
    for (int it = 0; it < 300; it++) {
        uint32_t n = 1 + (uint32_t)(rng(&seed) % 24);
        for (uint32_t i = 0; i < n; i++) {
            int nd = (int)(rng(&seed) % 3) + 1;
            for (int d = 0; d < 3; d++)
                shapes[i][d] = d == 0 ? (int64_t)(rng(&seed) % 20000) : 1 + (int64_t)(rng(&seed) % 400);
            snprintf(names[i], sizeof names[i], "t%u.w", i);
            ts[i] = (bkt_tensor){names[i], rng(&seed) % 2 ? REFIT_BF16 : REFIT_F32, nd, shapes[i], false};
        }
        uint64_t bucket = (uint64_t)1024 << (rng(&seed) % 22);
        bucket += rng(&seed) % 2 ? 0 : rng(&seed) % bucket;
        bkt_plan p;
        char err[256];
        int rc = bkt_plan_build(&p, ts, n, bucket, 5, err, sizeof err);
        if (rc) { /* only a row wider than a bucket may be refused */
            assert_int_equal(rc, REFIT_EINVAL);
            assert_non_null(strstr(err, "cannot be split"));
            continue;
        }
        int64_t next[24] = {0};
        for (uint32_t b = 0; b < p.n_buckets; b++) {
            const bkt_span *sp = &p.buckets[b];
            assert_true(sp->payload_bytes <= bucket);
            assert_true(sp->n > 0 || n == 0);
            assert_true(sp->header_bytes <= BKT_MAX_HEADER);
            uint64_t end = 0;
            for (uint32_t k = 0; k < sp->n; k++) {
                const bkt_piece *pc = &p.pieces[sp->first + k];
                const bkt_tensor *t = &ts[pc->tensor];
                assert_int_equal(pc->offset % BKT_ALIGN, 0);
                assert_true(pc->offset >= end);
                end = pc->offset + pc->bytes;
                assert_true(end <= sp->payload_bytes);
                if (!pc->part) {
                    assert_int_equal(next[pc->tensor], 0);
                    assert_true(pc->bytes == bytes_of(t));
                    next[pc->tensor] = t->shape[0];
                } else {
                    assert_int_equal(pc->row_offset, next[pc->tensor]);
                    assert_true(pc->rows > 0);
                    next[pc->tensor] += pc->rows;
                }
            }
        }
        for (uint32_t i = 0; i < n; i++)
            assert_int_equal(next[i], ts[i].shape[0]);
        /* the index: every header back to back, walked as a chain */
        uint64_t ib = bkt_index_bytes(&p), at = 0;
        uint8_t *idx = malloc(ib);
        assert_non_null(idx);
        for (uint32_t b = 0; b < p.n_buckets; at += p.buckets[b++].header_bytes)
            bkt_header_encode(idx + at, &p, b, ts, "label", 99);
        bkt_header h = {0};
        uint32_t hb = p.buckets[0].header_bytes;
        uint64_t total = bkt_total(&p, 0);
        at = 0;
        for (uint32_t b = 0; b < p.n_buckets; b++) {
            bkt_expect ex = {b, p.n_buckets, 99, hb, total, p.max_total};
            if (bkt_header_decode(&h, idx + at, &ex, err, sizeof err))
                fail_msg("iteration %d bucket %u: %s", it, b, err);
            at += hb;
            hb = h.next_header;
            total = h.next_total;
        }
        assert_true(at == ib);
        free(idx);
        bkt_header_free(&h);
        bkt_plan_free(&p);
    }
}

/* ---- DIRECT buckets ---- */

/* TS with every tensor marked direct. */
static void direct_ts(bkt_tensor *out)
{
    for (uint32_t i = 0; i < NTS; i++) {
        out[i] = TS[i];
        out[i].direct = true;
    }
}

/* DIRECT tensors of at least direct_min bytes come first, one piece per
 * bucket (parts of at most the bucket size), payload only; the rest is
 * packed as without them; every row comes exactly once. */
static void test_plan_direct(void **state)
{
    (void)state;
    bkt_tensor ts[NTS];
    direct_ts(ts);
    ts[0].direct = false; /* model.a.weight: 320 bytes, not contiguous on the device */
    char err[256];
    static const uint64_t caps[] = {4000, 4096, 5000, 1 << 20};
    for (size_t c = 0; c < sizeof caps / sizeof *caps; c++) {
        bkt_plan p;
        assert_int_equal(bkt_plan_build_direct(&p, ts, NTS, caps[c], 100, strlen(LABEL), err,
                                               sizeof err), 0);
        int64_t next_row[NTS];
        memset(next_row, 0, sizeof next_row);
        uint32_t direct = 0, prev = UINT32_MAX, first = UINT32_MAX, tensors = 0;
        bool later_direct = false;
        assert_true(p.buckets[0].direct); /* the first DIRECT tensor leads */
        for (uint32_t b = 0; b < p.n_buckets; b++) {
            const bkt_span *sp = &p.buckets[b];
            if (sp->direct) {
                /* the smallest tensor first (a receiver that is still
                 * beginning scatters it from a slot), then largest first
                 * (the last DIRECT sum, which nothing hides, is small) */
                uint32_t ti = p.pieces[sp->first].tensor;
                if (first == UINT32_MAX)
                    first = ti;
                later_direct = later_direct || ti != first;
                if (prev != ti) {
                    tensors++;
                    assert_true(bytes_of(&ts[first]) <= bytes_of(&ts[ti]));
                    if (tensors > 2)
                        assert_true(bytes_of(&ts[prev]) >= bytes_of(&ts[ti]));
                }
                prev = ti;
                direct++;
                assert_int_equal(sp->n, 1);
                assert_true(bkt_total(&p, b) == sp->payload_bytes);
                assert_true(sp->payload_bytes <= caps[c]);
            } else {
                /* packed ones right after the first DIRECT tensor's */
                assert_false(later_direct);
                assert_true(bkt_total(&p, b) == BKT_ALIGN + sp->payload_bytes);
            }
            for (uint32_t k = 0; k < sp->n; k++) {
                const bkt_piece *pc = &p.pieces[sp->first + k];
                uint64_t bytes = bytes_of(&ts[pc->tensor]);
                assert_int_equal(sp->direct, ts[pc->tensor].direct && bytes >= 100);
                assert_int_equal(pc->part ? pc->row_offset : 0, next_row[pc->tensor]);
                next_row[pc->tensor] += pc->part ? pc->rows
                                                 : (ts[pc->tensor].ndim ? ts[pc->tensor].shape[0] : 1);
            }
        }
        for (uint32_t t = 0; t < NTS; t++)
            assert_int_equal(next_row[t], TS[t].ndim ? TS[t].shape[0] : 1);
        assert_int_equal(p.n_direct, direct);
        assert_true(direct >= 3);
        bkt_plan_free(&p);
    }
    /* direct_min 0: exactly the plan without DIRECT buckets */
    bkt_plan a, b;
    assert_int_equal(bkt_plan_build_direct(&a, ts, NTS, 4096, 0, 3, err, sizeof err), 0);
    assert_int_equal(bkt_plan_build(&b, TS, NTS, 4096, 3, err, sizeof err), 0);
    assert_int_equal(a.n_buckets, b.n_buckets);
    assert_int_equal(a.n_direct, 0);
    for (uint32_t k = 0; k < a.n_buckets; k++)
        assert_true(a.buckets[k].payload_bytes == b.buckets[k].payload_bytes &&
                    a.buckets[k].n == b.buckets[k].n && !a.buckets[k].direct);
    bkt_plan_free(&a);
    bkt_plan_free(&b);
    /* every tensor DIRECT: no empty packed bucket after them */
    assert_int_equal(bkt_plan_build_direct(&a, ts + 5, 2, 1 << 20, 1, 3, err, sizeof err), 0);
    assert_int_equal(a.n_buckets, 2);
    assert_int_equal(a.n_direct, 2);
    bkt_plan_free(&a);
    /* a DIRECT tensor whose row exceeds the bucket is refused as a packed one is */
    assert_int_equal(bkt_plan_build_direct(&a, ts + 6, 1, 3999, 1, 3, err, sizeof err),
                     REFIT_EINVAL);
    assert_non_null(strstr(err, "one row of dim 0 is 4000 bytes"));
}

/* A DIRECT bucket's header: flag, no stamp room, one entry covering the
 * payload; each field broken (checksum resealed) is refused by name, and
 * random mutations either are refused or stay inside the payload. */
static void test_direct_header_fields(void **state)
{
    (void)state;
    bkt_tensor ts[NTS];
    direct_ts(ts);
    bkt_plan p;
    char err[256];
    assert_int_equal(bkt_plan_build_direct(&p, ts, NTS, 1 << 20, 100, strlen(LABEL), err,
                                           sizeof err), 0);
    uint32_t b = 0;
    while (b < p.n_buckets && !p.buckets[b].direct)
        b++;
    assert_true(b + 1 < p.n_buckets);
    bkt_header h = {0};
    uint8_t *buf = calloc(1, p.buckets[b].header_bytes);
    assert_non_null(buf);
    bkt_header_encode(buf, &p, b, ts, LABEL, 0x1234);
    bkt_expect ex = {b, p.n_buckets, 0x1234, p.buckets[b].header_bytes, bkt_total(&p, b),
                     p.max_total};
    assert_int_equal(bkt_header_decode(&h, buf, &ex, err, sizeof err), 0);
    assert_int_equal(h.flags, BKT_H_DIRECT);
    assert_true(h.payload_offset == 0 && h.payload_bytes == ex.total && h.n_entries == 1);
    assert_true(h.entries[0].offset == 0 && h.entries[0].bytes == h.payload_bytes);
    assert_true(h.next_total == bkt_total(&p, b + 1));
    size_t e0 = BKT_FIXED_HEADER + strlen(LABEL);
    const struct {
        const char *what;
        size_t at;
        int entry, width;
        uint64_t value, total_delta;
        const char *msg;
    } cases[] = {
        {"flag cleared", 6, 0, 2, 0, 0, "do not add up"},
        {"flag and an unknown one", 6, 0, 2, BKT_H_DIRECT | 0x4, 0, "unknown flags"},
        {"stamp room", 32, 0, 8, BKT_ALIGN, 0, "do not add up"},
        {"two entries", 16, 0, 4, 2, 0, "DIRECT with 2 entries"},
        {"no entry", 16, 0, 4, 0, 0, "DIRECT with 0 entries"},
        {"payload longer than the entry", 40, 0, 8, 0, BKT_ALIGN, "is not its"},
        {"entry placed after the start", 24, 1, 8, BKT_ALIGN, 0, "placement"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bkt_header_encode(buf, &p, b, ts, LABEL, 0x1234);
        bkt_expect e = ex;
        e.total += cases[i].total_delta;
        uint64_t v = cases[i].total_delta ? h.payload_bytes + cases[i].total_delta
                                          : cases[i].value;
        put(buf + (cases[i].entry ? e0 : 0) + cases[i].at, cases[i].width, v);
        reseal(buf, ex.header_bytes);
        bkt_header tmp = {0};
        int rc = bkt_header_decode(&tmp, buf, &e, err, sizeof err);
        bkt_header_free(&tmp);
        if (rc != REFIT_ECORRUPT || !strstr(err, cases[i].msg))
            fail_msg("%s: rc %d, \"%s\" (wanted \"%s\")", cases[i].what, rc, err,
                     cases[i].msg);
    }
    uint64_t s = 7;
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        bkt_header_encode(buf, &p, b, ts, LABEL, 0x1234);
        int n = 1 + (int)(rng(&s) % 4);
        for (int k = 0; k < n; k++)
            buf[rng(&s) % (ex.header_bytes - 8)] = (uint8_t)rng(&s);
        reseal(buf, ex.header_bytes);
        int rc = bkt_header_decode(&h, buf, &ex, err, sizeof err);
        assert_true(rc == REFIT_OK || rc == REFIT_ECORRUPT);
        if (rc)
            continue;
        accepted++;
        if (h.flags & BKT_H_DIRECT)
            assert_true(h.n_entries == 1 && h.entries[0].offset == 0 &&
                        h.entries[0].bytes == h.payload_bytes && h.payload_bytes == ex.total);
    }
    assert_true(accepted < 20000);
    free(buf);
    bkt_header_free(&h);
    bkt_plan_free(&p);
}

static void test_trailer_layout(void **state)
{
    (void)state;
    /* the stamps back to back, then the words: one copy writes the stamps,
     * the device the 8-byte aligned words */
    assert_int_equal(bkt_trailer_bytes(3), 3 * 72);
    assert_int_equal(bkt_trailer_stamp(2), 128);
    assert_int_equal(bkt_trailer_sum(3, 0), 192);
    assert_int_equal(bkt_trailer_sum(3, 2), 208);
    assert_int_equal(bkt_trailer_sum(3, 2) % 8, 0);
}

static void test_sizes(void **state)
{
    (void)state;
    assert_true(bkt_bytes(REFIT_F32, 3) == 12);
    assert_true(bkt_bytes(E2M1, 3) == 2);
    assert_true(bkt_bytes(REFIT_F32, INT64_MAX) == UINT64_MAX);
    assert_true(bkt_bytes(REFIT_F32, -1) == UINT64_MAX);
    assert_true(bkt_align(1) == BKT_ALIGN);
    assert_true(bkt_align(BKT_ALIGN) == BKT_ALIGN);
    uint8_t z[20] = {0};
    assert_true(bkt_checksum(z, 20) != bkt_checksum(z, 19));
}

/* A patch's element count, and its first bad entry (1 + its index): a
 * negative index, a run under one element, a sum past INT64_MAX. */
static void test_patch_elements(void **state)
{
    (void)state;
    int64_t e = -1;
    const int64_t idx[] = {5, 0, 9}, runs[] = {2, 1, 4};
    assert_int_equal(bkt_patch_elements(3, idx, NULL, &e), 0);
    assert_int_equal(e, 3);
    assert_int_equal(bkt_patch_elements(3, idx, runs, &e), 0);
    assert_int_equal(e, 7);
    assert_int_equal(bkt_patch_elements(0, NULL, NULL, &e), 0);
    assert_int_equal(e, 0);
    const int64_t neg[] = {1, 2, -3}, zero[] = {1, 0, 1}, huge[] = {INT64_MAX, 1};
    assert_int_equal(bkt_patch_elements(3, neg, NULL, &e), 3);
    assert_int_equal(bkt_patch_elements(3, idx, zero, &e), 2);
    assert_int_equal(bkt_patch_elements(2, idx, huge, &e), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_any_bucket_size),
        cmocka_unit_test(test_plan_splits_only_what_does_not_fit),
        cmocka_unit_test(test_plan_refusals),
        cmocka_unit_test(test_decoder_refuses_each_bad_field),
        cmocka_unit_test(test_decoder_survives_random_mutations),
        cmocka_unit_test(test_announce),
        cmocka_unit_test(test_stamp),
        cmocka_unit_test(test_plan_ramps_at_both_ends),
        cmocka_unit_test(test_plan_random_property),
        cmocka_unit_test(test_plan_direct),
        cmocka_unit_test(test_direct_header_fields),
        cmocka_unit_test(test_trailer_layout),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_patch_elements),
    };
    return cmocka_run_group_tests_name("nccl-bucket", tests, NULL, NULL);
}
