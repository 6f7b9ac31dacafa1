/*
 * libFuzzer target for the IPC control channel's messages (transports/ipc/msg.c,
 * transports/ipc/keeper_msg.c): arbitrary bytes as one received frame, fed to
 * the decoder a peer's frame of that kind meets.
 *
 * Byte 0 picks the decoder (low three bits, mod 7: HELLO, a member's
 * HELLO, MEMS, INDEX, UPDATE, a status message, K_OFFER); with its top
 * bit set, byte 1 is the frame's type instead of the decoder's own (a
 * frame of the wrong kind must be refused). Byte 1 is the decoder's
 * argument (the role wanted, descriptors passed, the largest bucket, the
 * restoring model's counts); the rest is the payload, in a buffer of
 * exactly its size (NULL when empty, as ipc_recv leaves it).
 *
 * Beyond "no crash, no sanitizer report, no leak": a refusal says why; an
 * accepted frame re-encodes to exactly its payload (every byte was
 * checked), whatever points into the payload lies inside it, and the
 * descriptors passed are each either taken by the table or left to the
 * frame, all closed once both are freed.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transports/ipc/keeper_msg.h"
#include "transports/ipc/msg.h"

enum { D_HELLO, D_MEMBER, D_MEMS, D_INDEX, D_UPDATE, D_STATUS, D_OFFER, D_COUNT };

static const uint16_t own_type[D_COUNT] = {IPC_HELLO, IPC_HELLO, IPC_MEMS, IPC_INDEX,
                                           IPC_UPDATE, IPC_VOTE, IPC_K_OFFER};
static const uint16_t status_types[] = {IPC_VOTE, IPC_DECISION, IPC_RESULT, IPC_K_DONE,
                                        IPC_K_CONFIRM};

static void need(int ok)
{
    if (!ok)
        abort();
}

/* The payload re-encoded must be the payload. */
static void same(ipc_wbuf *w, const ipc_frame *f)
{
    need(!w->failed && w->len == f->len && (!f->len || !memcmp(w->p, f->payload, f->len)));
    ipc_wbuf_free(w);
}

static int inside(const ipc_frame *f, const void *p, uint64_t n)
{
    const uint8_t *q = p;
    if (!n)
        return 1;
    return f->payload && q >= f->payload && q <= f->payload + f->len &&
           n <= (uint64_t)(f->payload + f->len - q);
}

static void fuzz_mems(ipc_frame *f, uint8_t arg, char *err, size_t errlen)
{
    static int devnull = -1;
    if (devnull < 0 && (devnull = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
        return;
    int passed[8];
    f->n_fds = arg % 8;
    for (uint16_t i = 0; i < f->n_fds; i++)
        need((passed[i] = f->fds[i] = dup(devnull)) >= 0);
    ipc_mems t;
    int rc = ipc_mems_decode(&t, f, err, errlen);
    if (rc) {
        need(err[0] && !t.m); /* t.n may say what was refused */
    } else {
        uint16_t k = 0;
        for (uint32_t i = 0; i < t.n; i++)
            if (t.m[i].kind == IPC_MEM_HOST_FD)
                need(t.m[i].fd == passed[k++]);
            else
                need(t.m[i].fd == -1);
        need(k == f->n_fds);
        for (uint16_t i = 0; i < f->n_fds; i++)
            need(f->fds[i] == -1);
        ipc_wbuf w = {0};
        ipc_mems_encode(&w, &t);
        same(&w, f);
        ipc_mems_free(&t);
    }
    for (uint16_t i = 0; i < f->n_fds; i++)
        if (f->fds[i] >= 0)
            close(f->fds[i]);
    for (uint16_t i = 0; i < f->n_fds; i++)
        need(fcntl(passed[i], F_GETFD) == -1);
    f->n_fds = 0;
}

/* The index's headers walked as the worker walks them (receiver.c; whole
 * tensors, parts and patch entries), each checksum made right first when
 * fix is set: a refusal says why, an entry lies inside its bucket. */
static void walk_index(const ipc_index *x, uint8_t *idx, int fix, char *err, size_t errlen)
{
    bkt_header h;
    memset(&h, 0, sizeof h);
    uint64_t at = 0, total = x->an.first_total;
    uint32_t hb = x->an.first_header;
    for (uint32_t k = 0; k < x->n_buckets && hb <= x->index_bytes - at; k++) {
        if (fix && hb >= 8) {
            uint64_t sum = bkt_checksum(idx + at, hb - 8);
            for (int i = 0; i < 8; i++)
                idx[at + hb - 8 + i] = (uint8_t)(sum >> (8 * i));
        }
        bkt_expect ex = {k, x->n_buckets, x->an.nonce, hb, total, x->an.max_total};
        err[0] = '\0';
        if (bkt_header_decode(&h, idx + at, &ex, err, errlen)) {
            need(err[0] != 0);
            break;
        }
        for (uint32_t e = 0; e < h.n_entries; e++)
            need(h.entries[e].offset <= h.payload_bytes &&
                 h.entries[e].bytes <= h.payload_bytes - h.entries[e].offset);
        at += hb;
        hb = h.next_header;
        total = h.next_total;
    }
    bkt_header_free(&h);
}

static void fuzz_index(ipc_frame *f, uint8_t arg, char *err, size_t errlen)
{
    /* odd arg: the announce's checksum made right, so what lies behind it
     * is fuzzed */
    if ((arg & 1) && f->len >= 16) {
        uint64_t n = bkt_le64(f->payload + 8) & 0xffffffffu;
        uint64_t at = 16 + n * IPC_REF_REC;
        if (n <= BKT_MAX_BUCKETS && at + BKT_ANNOUNCE_BYTES <= f->len) {
            uint64_t sum = bkt_checksum(f->payload + at, 120);
            for (int i = 0; i < 8; i++)
                f->payload[at + 120 + i] = (uint8_t)(sum >> (8 * i));
        }
    }
    ipc_index x;
    uint64_t max_bucket = (uint64_t)1 << (8 + (arg >> 1) % 40);
    if (ipc_index_decode(&x, f, max_bucket, err, errlen)) {
        need(err[0] && !x.refs);
        return;
    }
    need(x.n_buckets && x.refs && x.an.n_buckets == x.n_buckets && x.an.max_total <= max_bucket);
    need(inside(f, x.index, x.index_bytes) && x.index + x.index_bytes == f->payload + f->len);
    ipc_wbuf w = {0};
    ipc_index_encode(&w, &x, f->payload + 16 + (size_t)x.n_buckets * IPC_REF_REC);
    same(&w, f);
    walk_index(&x, f->payload + (f->len - x.index_bytes), arg & 1, err, errlen);
    ipc_index_free(&x);
}

static void fuzz_update(const ipc_frame *f, char *err, size_t errlen)
{
    ipc_update u;
    if (ipc_update_decode(&u, f, err, errlen)) {
        need(err[0] != 0);
        return;
    }
    need(u.n_buckets && u.n_buckets <= BKT_MAX_BUCKETS && u.index_id);
    need(strlen(u.label) <= BKT_MAX_LABEL);
    uint64_t *sums = NULL;
    if (u.flags & IPC_U_SUMS) {
        need(inside(f, u.sums, (uint64_t)u.n_buckets * 8));
        need((sums = malloc((size_t)u.n_buckets * 8)) != NULL);
        for (uint32_t b = 0; b < u.n_buckets; b++)
            sums[b] = bkt_le64(u.sums + (size_t)b * 8);
    } else {
        need(u.sums == NULL);
    }
    ipc_wbuf w = {0};
    ipc_update_encode(&w, &u, sums);
    same(&w, f);
    free(sums);
}

static void fuzz_offer(const ipc_frame *f, uint8_t arg, char *err, size_t errlen)
{
    uint32_t max_modules = (arg & 15) == 15 ? UINT32_MAX : 1u << (arg & 15);
    uint32_t max_runtime = (arg >> 4) == 15 ? UINT32_MAX : 1u << (arg >> 4);
    ipc_k_offer o;
    if (ipc_k_offer_decode(&o, f, max_modules, max_runtime, err, errlen)) {
        need(err[0] && !o.places); /* a refusal keeps nothing */
        return;
    }
    need(o.status <= 0 && o.status >= -1000);
    if (!o.status) {
        need(o.n_modules <= max_modules && o.n_runtime <= max_runtime && o.places);
        need(o.sig_bytes && inside(f, o.sig, o.sig_bytes));
        need(inside(f, o.fps, (uint64_t)o.n_modules * 8));
        for (uint32_t i = 0; i < o.n_modules; i++)
            (void)ipc_k_offer_fp(&o, i);
    }
    uint64_t *fps = malloc(((size_t)o.n_modules + 1) * 8);
    need(fps != NULL);
    for (uint32_t i = 0; !o.status && i < o.n_modules; i++)
        fps[i] = ipc_k_offer_fp(&o, i);
    ipc_wbuf w = {0};
    ipc_k_offer_encode(&w, &o, fps);
    same(&w, f);
    free(fps);
    ipc_k_offer_free(&o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int d = (data[0] & 0x7f) % D_COUNT;
    uint8_t arg = data[1];
    ipc_frame f;
    memset(&f, 0, sizeof f);
    f.type = own_type[d];
    if (d == D_STATUS)
        f.type = status_types[arg % 5];
    else if (data[0] & 0x80)
        f.type = arg;
    f.len = (uint32_t)(size - 2);
    if (f.len) {
        f.payload = malloc(f.len);
        if (!f.payload)
            return 0;
        memcpy(f.payload, data + 2, f.len);
    }
    char err[512];
    err[0] = '\0';
    switch (d) {
    case D_HELLO:
    case D_MEMBER: {
        ipc_hello h;
        uint32_t role = 1 + arg % 4;
        int rc = d == D_HELLO ? ipc_hello_decode(&h, &f, role, err, sizeof err)
                              : ipc_hello_decode_member(&h, &f, err, sizeof err);
        if (rc) {
            need(err[0] != 0);
            break;
        }
        need(d == D_HELLO ? h.role == role
                          : h.role == IPC_ROLE_WORKER || h.role == IPC_ROLE_KEEPER);
        ipc_wbuf w = {0};
        ipc_hello_encode(&w, &h);
        same(&w, &f);
        break;
    }
    case D_MEMS:
        fuzz_mems(&f, arg, err, sizeof err);
        break;
    case D_INDEX:
        fuzz_index(&f, arg, err, sizeof err);
        break;
    case D_UPDATE:
        fuzz_update(&f, err, sizeof err);
        break;
    case D_STATUS: {
        /* the sequence wanted: the frame's own when arg's bit 3 is set */
        uint64_t want = (arg & 8) && f.len >= 8 ? bkt_le64(f.payload) : 0;
        ipc_status_msg s;
        if (ipc_status_decode(&s, &f, want, err, sizeof err)) {
            need(err[0] != 0);
            break;
        }
        need(s.seq == want && s.status <= 0 && strlen(s.msg) <= IPC_MAX_MSG);
        ipc_wbuf w = {0};
        ipc_status_encode(&w, s.seq, s.status, s.msg);
        same(&w, &f);
        break;
    }
    case D_OFFER:
        fuzz_offer(&f, arg, err, sizeof err);
        break;
    }
    free(f.payload);
    return 0;
}
