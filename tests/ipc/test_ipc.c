/* The IPC transport on the host (memfd standing in for CUDA IPC memory):
 * the control channel and its framing, every malformed frame, the
 * messages' validation, and whole updates between two processes: commit,
 * reuse of handles across updates, refusals that write nothing, a trainer
 * that dies or stalls mid-update, a group that aborts together. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <malloc.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>
#include <refit/ipc.h>

#include "transports/ipc/chan.h"
#include "transports/ipc/msg.h"
#include "journal/journal.h"
#include "tests/ipc/itest.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define IT_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(IT_ASAN)
#define IT_ASAN 1
#endif
#ifdef IT_ASAN
#include <sanitizer/allocator_interface.h>
#endif

static char g_path[2][108];

static int setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* Paths of each test's own: a failed test leaves its receiver listening
 * (and a live socket is never replaced). */
static int fresh_paths(void **state)
{
    static int n;
    (void)state;
    n++;
    for (int i = 0; i < 2; i++)
        snprintf(g_path[i], sizeof g_path[i], "/tmp/refit-ipc-%d-%d-%d.sock", (int)getpid(), n,
                 i);
    return 0;
}

/* ---- the channel ---- */

static void pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
}

static void t_frame_roundtrip(void **state)
{
    (void)state;
    int sv[2];
    pair(sv);
    char err[512];
    const char msg[] = "hello, worker";
    assert_int_equal(ipc_send(sv[0], IPC_VOTE, msg, sizeof msg, NULL, 0, ipc_now() + 2, err,
                              sizeof err), REFIT_OK);
    assert_int_equal(ipc_send(sv[0], IPC_DECISION, NULL, 0, NULL, 0, ipc_now() + 2, err,
                              sizeof err), REFIT_OK);
    ipc_frame f;
    assert_int_equal(ipc_recv(sv[1], &f, 1024, ipc_now() + 2, err, sizeof err), REFIT_OK);
    assert_int_equal(f.type, IPC_VOTE);
    assert_int_equal(f.len, sizeof msg);
    assert_memory_equal(f.payload, msg, sizeof msg);
    ipc_frame_free(&f);
    assert_int_equal(ipc_recv(sv[1], &f, 1024, ipc_now() + 2, err, sizeof err), REFIT_OK);
    assert_int_equal(f.type, IPC_DECISION);
    assert_int_equal(f.len, 0);
    ipc_frame_free(&f);
    close(sv[0]);
    close(sv[1]);
}

typedef struct bad_frame {
    const char *name;
    void (*make)(uint8_t *buf, size_t *len);
    int status;
    const char *says;
} bad_frame;

static const uint8_t PAYLOAD[16] = "0123456789abcdef";

static void good(uint8_t *b, size_t *len, uint16_t type)
{
    ipc_header_encode(b, type, sizeof PAYLOAD, 0, bkt_checksum(PAYLOAD, sizeof PAYLOAD));
    memcpy(b + IPC_FRAME_HEADER, PAYLOAD, sizeof PAYLOAD);
    *len = IPC_FRAME_HEADER + sizeof PAYLOAD;
}

static void reseal(uint8_t *b)
{
    uint64_t s = bkt_checksum(b, 24);
    for (int i = 0; i < 8; i++)
        b[24 + i] = (uint8_t)(s >> (8 * i));
}

static void mk_magic(uint8_t *b, size_t *len) { good(b, len, IPC_VOTE); b[0] ^= 0xff; }
static void mk_version(uint8_t *b, size_t *len) { good(b, len, IPC_VOTE); b[4] = 9; reseal(b); }
static void mk_hsum(uint8_t *b, size_t *len) { good(b, len, IPC_VOTE); b[25] ^= 1; }
static void mk_type(uint8_t *b, size_t *len) { good(b, len, IPC_VOTE); b[6] = 77; reseal(b); }
static void mk_type0(uint8_t *b, size_t *len) { good(b, len, IPC_VOTE); b[6] = 0; reseal(b); }
static void mk_flags(uint8_t *b, size_t *len) { good(b, len, IPC_VOTE); b[14] = 1; reseal(b); }
static void mk_fds(uint8_t *b, size_t *len) { good(b, len, IPC_VOTE); b[12] = 1; reseal(b); }
static void mk_fds_index(uint8_t *b, size_t *len) { good(b, len, IPC_INDEX); b[12] = 1; reseal(b); }
static void mk_type8(uint8_t *b, size_t *len) { good(b, len, IPC_VOTE); b[6] = 8; reseal(b); }
static void mk_version1(uint8_t *b, size_t *len) { good(b, len, IPC_UPDATE); b[4] = 1; reseal(b); }
static void mk_fds_mems(uint8_t *b, size_t *len) { good(b, len, IPC_MEMS); b[12] = 2; reseal(b); }
static void mk_huge(uint8_t *b, size_t *len)
{
    good(b, len, IPC_UPDATE);
    b[8] = b[9] = b[10] = 0xff;
    b[11] = 0x7f;
    reseal(b);
}
static void mk_psum(uint8_t *b, size_t *len) { good(b, len, IPC_VOTE); b[IPC_FRAME_HEADER + 3] ^= 4; }
static void mk_trunc_header(uint8_t *b, size_t *len) { good(b, len, IPC_VOTE); *len = 12; }
static void mk_trunc_payload(uint8_t *b, size_t *len) { good(b, len, IPC_VOTE); *len -= 5; }
static void mk_empty(uint8_t *b, size_t *len) { (void)b; *len = 0; }

static const bad_frame BAD[] = {
    {"bad magic", mk_magic, REFIT_ECORRUPT, "bad magic"},
    {"unknown version", mk_version, REFIT_ECORRUPT, "protocol version 9; this refit speaks 2"},
    {"version 1 (its UPDATE held the index)", mk_version1, REFIT_ECORRUPT,
     "protocol version 1; this refit speaks 2"},
    {"header checksum", mk_hsum, REFIT_ECORRUPT, "header checksum"},
    {"unknown type", mk_type, REFIT_ECORRUPT, "unknown type 77"},
    {"type 0", mk_type0, REFIT_ECORRUPT, "unknown type 0"},
    {"flags", mk_flags, REFIT_ECORRUPT, "unknown flags"},
    {"descriptors on a VOTE", mk_fds, REFIT_ECORRUPT, "descriptors"},
    {"descriptors on an INDEX", mk_fds_index, REFIT_ECORRUPT, "control frame INDEX: announces 1 descriptors"},
    {"type past INDEX", mk_type8, REFIT_ECORRUPT, "unknown type 8"},
    {"descriptors announced, none passed", mk_fds_mems, REFIT_ECORRUPT, "2 descriptors announced, 0"},
    {"too large", mk_huge, REFIT_ECORRUPT, "at most"},
    {"payload checksum", mk_psum, REFIT_ECORRUPT, "payload checksum"},
    {"truncated header", mk_trunc_header, REFIT_EIO, "truncated frame: the peer closed after 12 of 32"},
    {"truncated payload", mk_trunc_payload, REFIT_EIO, "truncated frame: the peer closed after 11 of 16"},
    {"closed", mk_empty, REFIT_EIO, "closed the connection"},
};

static void t_frame_malformed(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        int sv[2];
        pair(sv);
        uint8_t buf[IPC_FRAME_HEADER + 64];
        size_t len;
        BAD[i].make(buf, &len);
        if (len)
            assert_int_equal(write(sv[0], buf, len), (ssize_t)len);
        close(sv[0]);
        ipc_frame f;
        char err[512] = "";
        int rc = ipc_recv(sv[1], &f, 1 << 20, ipc_now() + 2, err, sizeof err);
        if (rc != BAD[i].status || !strstr(err, BAD[i].says))
            fail_msg("%s: status %d, message '%s'", BAD[i].name, rc, err);
        assert_null(f.payload);
        close(sv[1]);
    }
}

/* A peer that closes with our frame unread (a trainer process that exits
 * after a commit, the worker's RESULT in its socket): the kernel resets
 * the connection. Between frames that is the peer leaving, as a plain
 * close (the receiver then waits for the next trainer); mid-frame, a
 * truncated frame. */
static void t_frame_peer_reset(void **state)
{
    (void)state;
    uint8_t buf[IPC_FRAME_HEADER + 64];
    size_t len;
    good(buf, &len, IPC_VOTE);
    for (int mid = 0; mid < 2; mid++) {
        int sv[2];
        pair(sv);
        assert_int_equal(write(sv[1], buf, len), (ssize_t)len); /* never read by sv[0] */
        if (mid)
            assert_int_equal(write(sv[0], buf, 12), 12);
        close(sv[0]);
        ipc_frame f;
        char err[512] = "";
        assert_int_equal(ipc_recv(sv[1], &f, 1024, ipc_now() + 2, err, sizeof err), REFIT_EIO);
        if (!strstr(err, mid ? "truncated frame: the peer closed after 12 of 32"
                             : "the peer closed the connection"))
            fail_msg("%s: '%s'", mid ? "mid-frame" : "between frames", err);
        assert_null(f.payload);
        close(sv[1]);
    }
}

static void t_frame_deadline(void **state)
{
    (void)state;
    int sv[2];
    pair(sv);
    char err[512];
    ipc_frame f;
    double t0 = ipc_now();
    assert_int_equal(ipc_recv(sv[1], &f, 1024, t0 + 0.2, err, sizeof err), REFIT_ETIMEDOUT);
    double dt = ipc_now() - t0;
    assert_true(dt >= 0.19 && dt < 2.0);
    assert_non_null(strstr(err, "deadline passed waiting for the frame header"));
    /* half a frame, then silence: the deadline, not a hang */
    uint8_t buf[IPC_FRAME_HEADER + 64];
    size_t len;
    good(buf, &len, IPC_VOTE);
    assert_int_equal(write(sv[0], buf, len - 4), (ssize_t)(len - 4));
    assert_int_equal(ipc_recv(sv[1], &f, 1024, ipc_now() + 0.2, err, sizeof err),
                     REFIT_ETIMEDOUT);
    assert_non_null(strstr(err, "frame payload (12 of 16"));
    close(sv[0]);
    close(sv[1]);
}

/* ---- messages ---- */

static ipc_frame frame_of(uint16_t type, ipc_wbuf *w)
{
    ipc_frame f = {.type = type, .len = (uint32_t)w->len, .payload = w->p};
    for (int i = 0; i < IPC_MAX_FDS; i++)
        f.fds[i] = -1;
    return f;
}

static void t_mems_refused(void **state)
{
    (void)state;
    char err[512];
    ipc_mem_desc d[2] = {{.id = 3, .gen = 1, .kind = IPC_MEM_CUDA, .device = 0, .bytes = 4096, .fd = -1},
                         {.id = 3, .gen = 1, .kind = IPC_MEM_CUDA, .device = 0, .bytes = 64, .fd = -1}};
    ipc_mems t = {.epoch = 1, .n = 2, .m = d}, out;
    ipc_wbuf w = {0};
    ipc_mems_encode(&w, &t);
    ipc_frame f = frame_of(IPC_MEMS, &w);
    assert_int_equal(ipc_mems_decode(&out, &f, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "memory id 3 listed twice"));
    d[1].id = 4;
    d[1].kind = 9;
    w.len = 0;
    ipc_mems_encode(&w, &t);
    f = frame_of(IPC_MEMS, &w);
    assert_int_equal(ipc_mems_decode(&out, &f, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "unknown kind 9"));
    d[1].kind = IPC_MEM_HOST_FD; /* a host memory, no descriptor passed */
    w.len = 0;
    ipc_mems_encode(&w, &t);
    f = frame_of(IPC_MEMS, &w);
    assert_int_equal(ipc_mems_decode(&out, &f, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "1 host memories, 0 descriptors"));
    d[1].kind = IPC_MEM_CUDA;
    d[1].bytes = 0;
    w.len = 0;
    ipc_mems_encode(&w, &t);
    f = frame_of(IPC_MEMS, &w);
    assert_int_equal(ipc_mems_decode(&out, &f, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "0 bytes"));
    d[1].bytes = 64;
    w.len = 0;
    ipc_mems_encode(&w, &t);
    f = frame_of(IPC_MEMS, &w);
    f.len -= 1; /* one record short */
    assert_int_equal(ipc_mems_decode(&out, &f, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "2 memories in 175 bytes"));
    f.len += 1;
    assert_int_equal(ipc_mems_decode(&out, &f, err, sizeof err), REFIT_OK);
    assert_int_equal(out.n, 2);
    assert_int_equal(out.m[1].bytes, 64);
    ipc_mems_free(&out);
    ipc_wbuf_free(&w);
}

static void t_status_refused(void **state)
{
    (void)state;
    char err[512];
    ipc_status_msg m;
    ipc_wbuf w = {0};
    ipc_status_encode(&w, 5, REFIT_EIO, "gone");
    ipc_frame f = frame_of(IPC_VOTE, &w);
    assert_int_equal(ipc_status_decode(&m, &f, 6, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "VOTE for update 5 where update 6"));
    assert_int_equal(ipc_status_decode(&m, &f, 5, err, sizeof err), REFIT_OK);
    assert_string_equal(m.msg, "gone");
    f.len--;
    assert_int_equal(ipc_status_decode(&m, &f, 5, err, sizeof err), REFIT_ECORRUPT);
    w.len = 0;
    ipc_status_encode(&w, 5, 7, "");
    f = frame_of(IPC_VOTE, &w);
    assert_int_equal(ipc_status_decode(&m, &f, 5, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "status 7 is no refit status"));
    ipc_wbuf_free(&w);
}

/* INDEX and UPDATE decoded from their encoders, and the refusals a raw
 * trainer cannot reach through a worker (t_refusals has the others). */
static void t_index_update_decode(void **state)
{
    (void)state;
    char err[512];
    ipc_ref ref = {.mem = 3, .offset = 4096};
    uint8_t hdr[BKT_FIXED_HEADER + 8] = {0};
    bkt_announce an = {.n_buckets = 1, .first_header = BKT_FIXED_HEADER + 8,
                       .index_bytes = sizeof hdr, .first_total = 1, .max_total = 1,
                       .total_payload = 1, .n_entries = 0};
    uint8_t ab[BKT_ANNOUNCE_BYTES];
    bkt_announce_encode(ab, &an);
    ipc_index x = {.id = 5, .epoch = 2, .n_buckets = 1, .refs = &ref, .index = hdr,
                   .index_bytes = sizeof hdr}, out;
    ipc_wbuf w = {0};
    ipc_index_encode(&w, &x, ab);
    ipc_frame f = frame_of(IPC_INDEX, &w);
    assert_int_equal(ipc_index_decode(&out, &f, 1 << 20, err, sizeof err), REFIT_OK);
    assert_int_equal(out.id, 5);
    assert_int_equal(out.epoch, 2);
    assert_int_equal(out.refs[0].mem, 3);
    assert_int_equal(out.refs[0].offset, 4096);
    assert_int_equal(out.index_bytes, sizeof hdr);
    ipc_index_free(&out);
    x.id = 0;
    w.len = 0;
    ipc_index_encode(&w, &x, ab);
    f = frame_of(IPC_INDEX, &w);
    assert_int_equal(ipc_index_decode(&out, &f, 1 << 20, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "index id 0"));
    x.id = 5;
    uint8_t hdr2[2 * sizeof hdr] = {0};
    an.n_buckets = 2; /* the announce says two, the map holds one */
    an.index_bytes = sizeof hdr2;
    bkt_announce_encode(ab, &an);
    x.index = hdr2;
    x.index_bytes = sizeof hdr2;
    w.len = 0;
    ipc_index_encode(&w, &x, ab);
    f = frame_of(IPC_INDEX, &w);
    assert_int_equal(ipc_index_decode(&out, &f, 1 << 20, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "INDEX 5: the announce (2 buckets"));
    f.type = IPC_UPDATE;
    assert_int_equal(ipc_index_decode(&out, &f, 1 << 20, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "a UPDATE frame where INDEX was expected"));

    uint64_t sums[2] = {0x1122334455667788ull, 7};
    ipc_update u = {.seq = 9, .epoch = 2, .flags = IPC_U_EVENT | IPC_U_SUMS, .index_id = 5,
                    .n_buckets = 2}, ud;
    ipc_copy_str(u.label, sizeof u.label, "step-9");
    w.len = 0;
    ipc_update_encode(&w, &u, sums);
    assert_int_equal(w.len, IPC_UPDATE_FIXED + 6 + 16);
    f = frame_of(IPC_UPDATE, &w);
    assert_int_equal(ipc_update_decode(&ud, &f, err, sizeof err), REFIT_OK);
    assert_int_equal(ud.seq, 9);
    assert_int_equal(ud.index_id, 5);
    assert_string_equal(ud.label, "step-9");
    assert_true(bkt_le64(ud.sums) == sums[0] && bkt_le64(ud.sums + 8) == 7);
    u.index_id = 0;
    w.len = 0;
    ipc_update_encode(&w, &u, sums);
    f = frame_of(IPC_UPDATE, &w);
    assert_int_equal(ipc_update_decode(&ud, &f, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "UPDATE 9: index id 0"));
    u.index_id = 5;
    u.n_buckets = 0;
    w.len = 0;
    ipc_update_encode(&w, &u, sums);
    f = frame_of(IPC_UPDATE, &w);
    assert_int_equal(ipc_update_decode(&ud, &f, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "UPDATE 9: 0 buckets"));
    u.n_buckets = 2;
    u.flags = IPC_U_EVENT; /* no sums, but the frame keeps 16 bytes of them */
    w.len = 0;
    ipc_update_encode(&w, &u, sums);
    ipc_w64(&w, 1);
    f = frame_of(IPC_UPDATE, &w);
    assert_int_equal(ipc_update_decode(&ud, &f, err, sizeof err), REFIT_ECORRUPT);
    assert_non_null(strstr(err, "UPDATE 9: 46 bytes, 38 expected"));
    ipc_wbuf_free(&w);
}

/* ---- whole updates: a trainer process, this process the worker ---- */

typedef struct trainer_job {
    const char *path[2];
    int n_workers;
    uint64_t first, count;      /* versions first .. first + count - 1 */
    int share;                  /* SHARE tensors from refit_ipc_host_alloc */
    int checksum;
    const char *extra;          /* one more tensor, the model does not expect */
    int expect;                 /* status every send should return */
    int expect_failed_rank;
} trainer_job;

/* A commit's phases, each stamped, in the order they happen. */
static bool send_profile_ordered(const refit_ipc_send_profile *p, uint64_t seq)
{
    const uint64_t at[] = {p->start_ns, p->packed_ns, p->encoded_ns, p->results_ns,
                           p->posted_ns, p->voted_ns, p->decided_ns, p->end_ns};
    bool ok = p->seq == seq && at[0] > 0;
    for (size_t i = 1; i < sizeof at / sizeof *at; i++)
        ok &= at[i] >= at[i - 1];
    if (!ok)
        fprintf(stderr, "trainer: send profile of %llu out of order (seq %llu)\n",
                (unsigned long long)seq, (unsigned long long)p->seq);
    return ok;
}

/* The real sender: count updates of the checkpoint, the tensors refreshed
 * in place (the same buffers every step, as a trainer's parameters). */
static int run_trainer(void *arg)
{
    trainer_job *j = arg;
    refit_ctx *ctx = NULL;
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    if (refit_open(&ctx, &o))
        return 10;
    refit_ipc_send_opts so = REFIT_IPC_SEND_OPTS_INIT;
    so.bucket_bytes = 2048; /* several buckets */
    so.checksum = j->checksum;
    so.timeout_s = 20;
    refit_ipc_sender *s;
    if (refit_ipc_sender_create(&s, ctx, j->path, j->n_workers, &so)) {
        fprintf(stderr, "trainer: %s\n", refit_errmsg(ctx));
        return 11;
    }
    nt_ckpt c;
    nt_ckpt_make(&c, j->first);
    void *dst[NT_N];
    refit_tensor t[NT_N];
    int rc = 0;
    for (int i = 0; i < NT_N && !rc; i++) {
        t[i] = c.t[i];
        size_t bytes = 1;
        for (int d = 0; d < t[i].ndim; d++)
            bytes *= (size_t)t[i].shape[d];
        bytes = bytes * t[i].dtype.bits / 8;
        dst[i] = c.buf[i];
        if (j->share && i % 2 == 0) { /* every other one unpacked */
            if (refit_ipc_host_alloc(s, bytes, &dst[i]))
                rc = 12;
            t[i].data = dst[i];
        }
        if (!rc && refit_ipc_sender_add(s, NT_SPECS[i].ckpt, &t[i],
                                        j->share && i % 2 == 0 ? REFIT_IPC_SHARE
                                                               : REFIT_IPC_PACK))
            rc = 13;
    }
    int64_t xs[1] = {4};
    float xb[4] = {0};
    refit_tensor xt = {.data = xb, .device = {REFIT_DEVICE_CPU, 0}, .ndim = 1,
                       .dtype = REFIT_F32, .shape = xs};
    if (!rc && j->extra && refit_ipc_sender_add(s, j->extra, &xt, REFIT_IPC_PACK))
        rc = 14;
    for (uint64_t v = j->first; !rc && v < j->first + j->count; v++) {
        nt_ckpt n;
        nt_ckpt_make(&n, v);
        for (int i = 0; i < NT_N; i++) {
            size_t bytes = 1;
            for (int d = 0; d < t[i].ndim; d++)
                bytes *= (size_t)t[i].shape[d];
            memcpy(dst[i], n.buf[i], bytes * t[i].dtype.bits / 8);
        }
        nt_ckpt_free(&n);
        char label[32];
        snprintf(label, sizeof label, "v%llu", (unsigned long long)v);
        refit_ipc_sender_set_label(s, label);
        refit_group_result res;
        int st = refit_ipc_sender_send(s, &res);
        refit_ipc_send_profile pf;
        refit_ipc_sender_profile(s, &pf);
        if (st != j->expect) {
            fprintf(stderr, "trainer: send %s: %d (%s)\n", label, st, refit_errmsg(ctx));
            rc = 15;
        } else if (st && res.failed_rank != j->expect_failed_rank) {
            rc = 16;
        } else if (!st && !send_profile_ordered(&pf, v - j->first + 1)) {
            rc = 17;
        }
    }
    refit_ipc_sender_destroy(s);
    nt_ckpt_free(&c);
    refit_close(ctx);
    return rc;
}

typedef struct worker_fix {
    nt_worker w;
    refit_ipc_receiver *r;
} worker_fix;

static void worker_open(worker_fix *f, int which, double timeout, uint64_t max_bucket)
{
    assert_int_equal(nt_worker_open(&f->w, 0, 1, NULL), REFIT_OK);
    refit_ipc_recv_opts o = REFIT_IPC_RECV_OPTS_INIT;
    o.timeout_s = timeout;
    o.start_timeout_s = 20;
    o.max_bucket_bytes = max_bucket;
    assert_int_equal(refit_ipc_receiver_create(&f->r, f->w.m, g_path[which], &o), REFIT_OK);
}

static void worker_close(worker_fix *f)
{
    refit_ipc_receiver_destroy(f->r);
    nt_worker_close(&f->w);
}

static int receive(worker_fix *f, refit_group_result *res)
{
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.rollback = 1;
    return refit_ipc_receive_update(f->r, &uo, res);
}

static void expect_at(worker_fix *f, uint64_t version)
{
    char label[32];
    snprintf(label, sizeof label, "v%llu", (unsigned long long)version);
    assert_int_equal(refit_worker_health(f->w.ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(f->w.ctx), label);
    assert_true(nt_fp(&f->w) == nt_cold_fp(0, 1, version));
}

static void updates_commit(int share, int checksum)
{
    worker_fix f;
    worker_open(&f, 0, 20, 0);
    trainer_job j = {.path = {g_path[0]}, .n_workers = 1, .first = 1, .count = 10,
                     .share = share, .checksum = checksum};
    pid_t pid = it_fork(run_trainer, &j);
    refit_ipc_stats st0 = {0}, st;
    for (uint64_t v = 1; v <= 10; v++) {
        refit_group_result res;
        int rc = receive(&f, &res);
        if (rc)
            fail_msg("update v%llu: %s", (unsigned long long)v, refit_errmsg(f.w.ctx));
        assert_int_equal(res.decision, REFIT_OK);
        assert_string_equal(res.version_label, refit_worker_version(f.w.ctx));
        expect_at(&f, v);
        /* every phase of the worker's side stamped, in order; no GPU here */
        refit_ipc_recv_profile pf;
        assert_int_equal(refit_ipc_receiver_profile(f.r, &pf), REFIT_OK);
        assert_int_equal(pf.seq, v);
        const uint64_t at[] = {pf.call_ns, pf.update_ns, pf.checked_ns, pf.begun_ns,
                               pf.waited_ns, pf.enqueued_ns, pf.prepared_ns, pf.voted_ns,
                               pf.decision_ns, pf.committed_ns, pf.result_ns};
        assert_true(at[0] > 0);
        for (size_t i = 1; i < sizeof at / sizeof *at; i++)
            if (at[i] < at[i - 1])
                fail_msg("update v%llu: phase %zu at %llu, before phase %zu at %llu",
                         (unsigned long long)v, i, (unsigned long long)at[i], i - 1,
                         (unsigned long long)at[i - 1]);
        assert_int_equal(pf.copies_done_ns, 0);
        assert_true(pf.gpu_copy_ms == -1 && pf.gpu_wait_ms == -1);
        if (v == 1)
            refit_ipc_receiver_stats(f.r, &st0);
    }
    assert_int_equal(it_wait(pid), 0);
    refit_ipc_receiver_stats(f.r, &st);
    assert_int_equal(st.connections, 1);
    assert_int_equal(st.updates, 10);
    assert_true(st0.handles_opened >= 1);
    assert_int_equal(st.handles_opened, st0.handles_opened); /* opened once */
    assert_int_equal(st.handles_closed, 0);
    assert_int_equal(st.refused, 0);
    assert_int_equal(st.source_sets_built, 1); /* one prepared set for 10 updates */
    worker_close(&f);
}

static void t_updates_packed(void **state) { (void)state; updates_commit(0, 0); }
static void t_updates_shared(void **state) { (void)state; updates_commit(1, 0); }
static void t_updates_checksum(void **state) { (void)state; updates_commit(1, 1); }

/* An index naming a tensor the model does not expect: refused before
 * begin; then the next update commits. */
static void t_unknown_tensor(void **state)
{
    (void)state;
    worker_fix f;
    worker_open(&f, 0, 20, 0);
    trainer_job bad = {.path = {g_path[0]}, .n_workers = 1, .first = 1, .count = 1,
                       .extra = "model.nope.weight", .expect = REFIT_EUNEXPECTED,
                       .expect_failed_rank = 0};
    pid_t pid = it_fork(run_trainer, &bad);
    refit_group_result res;
    assert_int_equal(receive(&f, &res), REFIT_EUNEXPECTED);
    assert_non_null(strstr(refit_errmsg(f.w.ctx), "model.nope.weight"));
    assert_non_null(strstr(refit_errmsg(f.w.ctx), "nothing written"));
    assert_int_equal(refit_worker_health(f.w.ctx), REFIT_HEALTH_EMPTY);
    assert_int_equal(it_wait(pid), 0);
    trainer_job ok = {.path = {g_path[0]}, .n_workers = 1, .first = 2, .count = 1};
    pid = it_fork(run_trainer, &ok);
    assert_int_equal(receive(&f, &res), REFIT_OK);
    expect_at(&f, 2);
    assert_int_equal(it_wait(pid), 0);
    worker_close(&f);
}

/* ---- the raw trainer: corrupt, die, stall ---- */

typedef struct raw_job {
    const char *path;
    uint64_t version;
    rt_fix fix_index, fix_update;
    int mode;                   /* 0 finish, 1 die after UPDATE, 2 stall after UPDATE,
                                   3 garbage instead of HELLO, 4 an unsealed memfd (the
                                   worker must drop it) */
    int expect_vote;
    const char *name0;          /* tensor 0 under this name instead */
} raw_job;

static int run_raw(void *arg)
{
    raw_job *j = arg;
    if (j->mode == 3) {
        int fd;
        char err[256];
        if (ipc_connect(j->path, ipc_now() + 10, &fd, err, sizeof err))
            return 20;
        static const char junk[64] = "GET / HTTP/1.1\r\n\r\n";
        if (write(fd, junk, sizeof junk) != (ssize_t)sizeof junk)
            return 21;
        sleep(1);
        close(fd);
        return 0;
    }
    rt t;
    int rc = rt_open_named(&t, j->path, j->version, 1024, j->name0);
    if (!rc && j->mode == 4)
        rc = rt_unseal(&t);
    if (!rc)
        rc = rt_send_mems(&t);
    if (!rc)
        rc = rt_send_update(&t, j->fix_index, j->fix_update);
    if (rc && j->mode == 4 && t.fd >= 0 && strstr(t.err, "the peer is gone")) {
        rt_close(&t);
        return 0; /* its MEMS refused, the worker closed before the INDEX went */
    }
    if (rc) {
        fprintf(stderr, "raw trainer: %s\n", t.err);
        return 22;
    }
    if (j->mode == 1)
        _exit(0); /* dead mid-update: no vote read, no decision */
    if (j->mode == 2) {
        sleep(30);
        return 23;
    }
    int vote = 0;
    rc = rt_finish(&t, &vote);
    rt_close(&t);
    if (j->mode == 4)
        return rc ? 0 : 26;
    return rc ? 24 : vote == j->expect_vote ? 0 : 25;
}

static void commit_raw(worker_fix *f, uint64_t v)
{
    raw_job j = {.path = g_path[0], .version = v};
    pid_t pid = it_fork(run_raw, &j);
    refit_group_result res;
    int rc = receive(f, &res);
    if (rc)
        fail_msg("raw update v%llu: %s", (unsigned long long)v, refit_errmsg(f->w.ctx));
    expect_at(f, v);
    assert_int_equal(it_wait(pid), 0);
}

static void t_raw_commit(void **state)
{
    (void)state;
    worker_fix f;
    worker_open(&f, 0, 20, 0);
    commit_raw(&f, 4); /* the NCCL planner's buckets: parts of tensors too */
    commit_raw(&f, 5);
    worker_close(&f);
}

/* Refusals of a sound frame's content: offsets past the memory, an
 * unknown memory, a stale table, a corrupt header. */
static uint64_t rd64le(const uint8_t *p) { return bkt_le64(p); }
static void wr64le(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }

/* INDEX: 16 bytes, then a record per bucket (memory id, 0, offset), the
 * announce and the headers; UPDATE: 32 bytes and the label. */
#define IX_REFS 16
static size_t ix_announce(const rt *t) { return IX_REFS + t->p.n_buckets * IPC_REF_REC; }
static void fix_offset(rt *t, uint8_t *p, size_t *len)
{
    (void)len;
    uint8_t *ref = p + IX_REFS + (t->p.n_buckets - 1) * IPC_REF_REC;
    wr64le(ref + 8, rd64le(ref + 8) + 512); /* the last bucket past the end */
}
static void fix_mem(rt *t, uint8_t *p, size_t *len) { (void)t; (void)len; p[IX_REFS] = 9; }
static void fix_ix_epoch(rt *t, uint8_t *p, size_t *len) { (void)t; (void)len; p[4] ^= 1; }
static void fix_ix_pad(rt *t, uint8_t *p, size_t *len) { (void)t; (void)len; p[IX_REFS + 4] = 1; }
static void fix_header(rt *t, uint8_t *p, size_t *len)
{
    (void)len;
    p[ix_announce(t) + BKT_ANNOUNCE_BYTES + 100] ^= 0x10;
}
static void fix_announce(rt *t, uint8_t *p, size_t *len)
{
    (void)len;
    p[ix_announce(t) + 8] ^= 1; /* its checksum then fails */
}
static void fix_ix_id0(rt *t, uint8_t *p, size_t *len) { (void)t; (void)len; p[0] = 0; }
static void fix_ix_cut(rt *t, uint8_t *p, size_t *len) { (void)t; (void)p; *len -= 1; }
static void fix_ix_buckets(rt *t, uint8_t *p, size_t *len) { (void)t; (void)len; p[10] = 0xff; }
static void fix_up_epoch(rt *t, uint8_t *p, size_t *len) { (void)t; (void)len; p[8] ^= 1; }
static void fix_up_index(rt *t, uint8_t *p, size_t *len) { (void)t; (void)len; p[16] = 2; }
static void fix_up_buckets(rt *t, uint8_t *p, size_t *len) { (void)t; (void)len; p[20] ^= 1; }
static void fix_up_sums(rt *t, uint8_t *p, size_t *len)
{
    (void)t;
    p[12] |= IPC_U_SUMS; /* and a checksum per bucket after the label: */
    *len += 8u * t->p.n_buckets; /* zeros: send_fixed leaves room */
}
static void fix_up_flags(rt *t, uint8_t *p, size_t *len) { (void)t; (void)len; p[12] |= 0x40; }
static void fix_up_cut(rt *t, uint8_t *p, size_t *len) { (void)t; (void)p; *len -= 1; }
static void fix_up_nul(rt *t, uint8_t *p, size_t *len) { (void)t; (void)len; p[IPC_UPDATE_FIXED] = 0; }
static void fix_up_label(rt *t, uint8_t *p, size_t *len)
{
    (void)t;
    (void)len;
    p[24] = 0xff; /* a label of 0x7ff bytes */
    p[25] = 0x07;
}

typedef struct refusal {
    const char *name;
    rt_fix fix_index, fix_update;
    const char *says;
} refusal;

static const refusal REFUSALS[] = {
    {"offset past the memory", fix_offset, NULL, "runs past memory 1"},
    {"unknown memory", fix_mem, NULL, "names memory 9, which the trainer never shared"},
    {"index of a stale table", fix_ix_epoch, NULL, "INDEX 1 of memory table 6; this worker holds 7"},
    {"index reserved bytes", fix_ix_pad, NULL, "INDEX 1: bucket 0: reserved bytes set"},
    {"corrupt header", fix_header, NULL, "header checksum mismatch"},
    {"announce", fix_announce, NULL, "announce: checksum mismatch"},
    {"index cut short", fix_ix_cut, NULL, "the frame holds"},
    {"index id 0", fix_ix_id0, NULL, "holds none (an INDEX comes first); the last INDEX was "
     "refused: INDEX: short frame"},
    {"index bucket count", fix_ix_buckets, NULL, "cannot fit"},
    {"update of a stale table", NULL, fix_up_epoch, "UPDATE of memory table 6; this worker holds 7"},
    {"update of another index", NULL, fix_up_index, "UPDATE names index 2; this worker holds index 1"},
    {"update bucket count", NULL, fix_up_buckets, "UPDATE names 14 buckets; index 1 has 15"},
    {"update checksums the index lacks", NULL, fix_up_sums, "UPDATE carries checksums; its index announces none"},
    {"update flags", NULL, fix_up_flags, "unknown flags 0x40"},
    {"update cut short", NULL, fix_up_cut, "UPDATE 2: 33 bytes, 34 expected"},
    {"update label NUL", NULL, fix_up_nul, "the version label holds a NUL byte"},
    {"update label too long", NULL, fix_up_label, "a label of 2047 bytes"},
};

static void t_refusals(void **state)
{
    (void)state;
    worker_fix f;
    worker_open(&f, 0, 20, 0);
    commit_raw(&f, 1);
    uint64_t fp = nt_fp(&f.w);
    for (size_t i = 0; i < sizeof REFUSALS / sizeof *REFUSALS; i++) {
        raw_job j = {.path = g_path[0], .version = 2, .fix_index = REFUSALS[i].fix_index,
                     .fix_update = REFUSALS[i].fix_update, .expect_vote = REFIT_ECORRUPT};
        pid_t pid = it_fork(run_raw, &j);
        refit_group_result res;
        int rc = receive(&f, &res);
        if (rc != REFIT_ECORRUPT || !strstr(refit_errmsg(f.w.ctx), REFUSALS[i].says))
            fail_msg("%s: %d '%s'", REFUSALS[i].name, rc, refit_errmsg(f.w.ctx));
        assert_int_equal(res.local_status, REFIT_ECORRUPT);
        expect_at(&f, 1);
        assert_true(nt_fp(&f.w) == fp);
        assert_int_equal(it_wait(pid), 0);
    }
    refit_ipc_stats st;
    refit_ipc_receiver_stats(f.r, &st);
    assert_int_equal(st.refused, sizeof REFUSALS / sizeof *REFUSALS);
    commit_raw(&f, 3); /* still usable */
    worker_close(&f);
}

/* Not a refit peer at all: refused, the worker waits for the next one. */
static void t_garbage_peer(void **state)
{
    (void)state;
    worker_fix f;
    worker_open(&f, 0, 20, 0);
    raw_job j = {.path = g_path[0], .mode = 3};
    pid_t pid = it_fork(run_raw, &j);
    refit_group_result res;
    assert_int_equal(receive(&f, &res), REFIT_ECORRUPT);
    assert_non_null(strstr(refit_errmsg(f.w.ctx), "bad magic"));
    assert_int_equal(refit_worker_health(f.w.ctx), REFIT_HEALTH_EMPTY);
    assert_int_equal(it_wait(pid), 0);
    commit_raw(&f, 1);
    worker_close(&f);
}

/* The trainer dies (or stalls) after its update was loaded and prepared:
 * no decision by the deadline, so the worker rolls back, says why, and
 * takes the next trainer's update. */
static void dead_or_stalled(int mode, int rollback)
{
    worker_fix f;
    worker_open(&f, 0, mode == 2 ? 0.3 : 5, 0);
    commit_raw(&f, 1);
    raw_job j = {.path = g_path[0], .version = 2, .mode = mode};
    pid_t pid = it_fork(run_raw, &j);
    refit_group_result res;
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.rollback = rollback;
    double t0 = ipc_now();
    int rc = refit_ipc_receive_update(f.r, &uo, &res);
    double dt = ipc_now() - t0;
    assert_int_equal(rc, mode == 2 ? REFIT_ETIMEDOUT : REFIT_EIO);
    assert_non_null(strstr(refit_errmsg(f.w.ctx), "no decision from the trainer"));
    assert_int_equal(res.local_status, REFIT_OK); /* it had prepared */
    assert_int_equal(res.vote_taken, 0);
    if (mode == 2) {
        assert_true(dt >= 0.29 && dt < 5);
        kill(pid, SIGKILL);
    }
    it_wait(pid);
    if (rollback) {
        assert_int_equal(res.worker_status, REFIT_OK);
        expect_at(&f, 1);
    } else {
        assert_int_equal(res.worker_status, REFIT_EPOISONED);
        assert_int_equal(refit_worker_health(f.w.ctx), REFIT_HEALTH_POISONED);
    }
    trainer_job ok = {.path = {g_path[0]}, .n_workers = 1, .first = 3, .count = 1};
    pid = it_fork(run_trainer, &ok);
    assert_int_equal(receive(&f, &res), REFIT_OK);
    expect_at(&f, 3);
    assert_int_equal(it_wait(pid), 0);
    worker_close(&f);
}

static void t_dead_trainer(void **state) { (void)state; dead_or_stalled(1, 1); }
static void t_stalled_trainer(void **state) { (void)state; dead_or_stalled(2, 1); }
static void t_dead_trainer_poisons(void **state) { (void)state; dead_or_stalled(1, 0); }

/* Two workers, one refuses (its largest bucket is too small): the trainer
 * decides abort for both, and the one that had prepared rolls back. */
static int run_worker_b(void *arg)
{
    (void)arg;
    nt_worker w;
    if (nt_worker_open(&w, 0, 1, NULL))
        return 30;
    refit_ipc_recv_opts o = REFIT_IPC_RECV_OPTS_INIT;
    o.timeout_s = 20;
    o.start_timeout_s = 20;
    o.max_bucket_bytes = 300; /* smaller than the trainer's */
    refit_ipc_receiver *r;
    if (refit_ipc_receiver_create(&r, w.m, g_path[1], &o))
        return 31;
    refit_group_result res;
    int rc = refit_ipc_receive_update(r, NULL, &res);
    int ok = rc == REFIT_ECORRUPT && res.decision == REFIT_ECORRUPT &&
             refit_worker_health(w.ctx) == REFIT_HEALTH_EMPTY;
    refit_ipc_receiver_destroy(r);
    nt_worker_close(&w);
    return ok ? 0 : 32;
}

static void t_group_abort(void **state)
{
    (void)state;
    worker_fix f;
    worker_open(&f, 0, 20, 0);
    commit_raw(&f, 1);
    pid_t b = it_fork(run_worker_b, NULL);
    trainer_job j = {.path = {g_path[0], g_path[1]}, .n_workers = 2, .first = 2, .count = 1,
                     .expect = REFIT_ECORRUPT, .expect_failed_rank = 1};
    pid_t tr = it_fork(run_trainer, &j);
    refit_group_result res;
    int rc = receive(&f, &res);
    assert_int_equal(rc, REFIT_ECORRUPT);
    assert_int_equal(res.local_status, REFIT_OK);
    assert_int_equal(res.decision, REFIT_ECORRUPT);
    assert_non_null(strstr(refit_errmsg(f.w.ctx), "aborted by the group"));
    expect_at(&f, 1);
    assert_int_equal(it_wait(b), 0);
    assert_int_equal(it_wait(tr), 0);
    worker_close(&f);
}

/* ---- busy-polling, the options' versions ---- */

static void t_spin(void **state)
{
    (void)state;
    int sv[2];
    pair(sv);
    double t0 = ipc_now();
    assert_int_equal(ipc_spin_readable(sv[1], t0 + 0.02), 0); /* nothing came */
    assert_true(ipc_now() - t0 >= 0.02);
    char err[256];
    assert_int_equal(ipc_send(sv[0], IPC_VOTE, "x", 1, NULL, 0, ipc_now() + 2, err, sizeof err),
                     REFIT_OK);
    t0 = ipc_now();
    assert_int_equal(ipc_spin_readable(sv[1], t0 + 5), 1);
    assert_true(ipc_now() - t0 < 1);
    close(sv[0]);
    close(sv[1]);
}

/* A caller built against version 1 of the options passes a shorter struct:
 * nothing past it is read (the heap block ends there: ASan would see it). */
static void opts_old(uint32_t version)
{
    nt_worker w;
    assert_int_equal(nt_worker_open(&w, 0, 1, NULL), REFIT_OK);
    size_t rn = version == 1 ? offsetof(refit_ipc_recv_opts, spin_s)
                             : offsetof(refit_ipc_recv_opts, socket_mode);
    refit_ipc_recv_opts rv = REFIT_IPC_RECV_OPTS_INIT;
    rv.version = version;
    rv.timeout_s = 0.2;
    void *ro = malloc(rn);
    memcpy(ro, &rv, rn);
    refit_ipc_receiver *r;
    assert_int_equal(refit_ipc_receiver_create(&r, w.m, g_path[0], ro), REFIT_OK);
    free(ro);
    /* the receiver does not answer (one thread): the sender's HELLO wait
     * runs to its deadline */
    struct stat st; /* an older caller's socket is 0600 too */
    assert_int_equal(lstat(g_path[0], &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    size_t sn = version == 1 ? offsetof(refit_ipc_send_opts, spin_s)
                             : offsetof(refit_ipc_send_opts, allow_uids);
    refit_ipc_send_opts sv = REFIT_IPC_SEND_OPTS_INIT;
    sv.version = version;
    sv.timeout_s = 0.2;
    void *sp = malloc(sn);
    memcpy(sp, &sv, sn);
    refit_ipc_sender *s = NULL;
    const char *paths[1] = {g_path[0]};
    assert_int_equal(refit_ipc_sender_create(&s, w.ctx, paths, 1, sp), REFIT_ETIMEDOUT);
    assert_null(s);
    free(sp);
    refit_ipc_send_opts *so;
    so = calloc(1, sizeof *so);
    so->version = REFIT_IPC_SEND_OPTS_VERSION + 1;
    assert_int_equal(refit_ipc_sender_create(&s, w.ctx, paths, 1, so), REFIT_EINVAL);
    char bad[64];
    snprintf(bad, sizeof bad, "invalid version %d", REFIT_IPC_SEND_OPTS_VERSION + 1);
    assert_non_null(strstr(refit_errmsg(w.ctx), bad));
    free(so);
    refit_ipc_receiver_destroy(r);
    nt_worker_close(&w);
}

static void t_opts_v1(void **state) { (void)state; opts_old(1); }
static void t_opts_v2(void **state) { (void)state; opts_old(2); }

/* Version 3's lists: a count without its array, and bad modes, refused. */
static void t_opts_v3(void **state)
{
    (void)state;
    nt_worker w;
    assert_int_equal(nt_worker_open(&w, 0, 1, NULL), REFIT_OK);
    refit_ipc_recv_opts ro = REFIT_IPC_RECV_OPTS_INIT;
    ro.n_allow_uids = 2;
    refit_ipc_receiver *r = NULL;
    assert_int_equal(refit_ipc_receiver_create(&r, w.m, g_path[0], &ro), REFIT_EINVAL);
    assert_non_null(strstr(refit_errmsg(w.ctx), "2 allow_uids and no array"));
    ro.n_allow_uids = 0;
    ro.socket_mode = 01777;
    assert_int_equal(refit_ipc_receiver_create(&r, w.m, g_path[0], &ro), REFIT_EINVAL);
    assert_non_null(strstr(refit_errmsg(w.ctx), "mode 01777"));
    assert_null(r);
    refit_ipc_send_opts so = REFIT_IPC_SEND_OPTS_INIT;
    so.n_allow_uids = 1;
    refit_ipc_sender *s = NULL;
    const char *paths[1] = {g_path[0]};
    assert_int_equal(refit_ipc_sender_create(&s, w.ctx, paths, 1, &so), REFIT_EINVAL);
    assert_non_null(strstr(refit_errmsg(w.ctx), "1 allow_uids and no array"));
    assert_null(s);
    nt_worker_close(&w);
}

/* ---- the RESULT of a commit, read at the next send ---- */

typedef struct late_job {
    const char *path;
    int bad_result;             /* 1: the first RESULT names another update */
} late_job;

static int raw_status(int fd, uint16_t type, uint64_t seq, int status)
{
    ipc_wbuf w = {0};
    char err[256];
    ipc_status_encode(&w, seq, status, "");
    int rc = ipc_send(fd, type, w.p, (uint32_t)w.len, NULL, 0, ipc_now() + 10, err, sizeof err);
    ipc_wbuf_free(&w);
    return rc;
}

/* HELLO, then frames up to an UPDATE (MEMS with 1 and 0 on a new
 * connection): its seq, or 0. */
static uint64_t raw_worker_update(int fd, int greet, int *mems)
{
    char err[256];
    ipc_frame f;
    if (greet) {
        if (ipc_recv(fd, &f, 64, ipc_now() + 10, err, sizeof err))
            return 0;
        ipc_frame_free(&f);
        ipc_wbuf w = {0};
        ipc_hello_encode(&w, &(ipc_hello){IPC_ROLE_WORKER, (uint32_t)getpid(), 0, 1});
        int rc = ipc_send(fd, IPC_HELLO, w.p, (uint32_t)w.len, NULL, 0, ipc_now() + 10, err,
                          sizeof err);
        ipc_wbuf_free(&w);
        if (rc)
            return 0;
    }
    for (;;) {
        if (ipc_recv(fd, &f, IPC_MAX_PAYLOAD, ipc_now() + 10, err, sizeof err))
            return 0;
        uint16_t type = f.type;
        uint64_t seq = type == IPC_UPDATE && f.len >= 8 ? bkt_le64(f.payload) : 0;
        *mems += type == IPC_MEMS;
        ipc_frame_free(&f);
        if (type == IPC_UPDATE)
            return seq;
    }
}

/* A worker speaking frame by frame: votes OK for two updates, and writes
 * the first one's RESULT only 0.5 s after the DECISION (or one naming
 * update 99). */
static int run_late_worker(void *arg)
{
    late_job *j = arg;
    char err[256];
    int lfd, fd, mems = 0;
    ipc_sock_id id;
    if (ipc_listen(j->path, 0600, &lfd, &id, err, sizeof err) ||
        ipc_accept(lfd, ipc_now() + 10, &fd, err, sizeof err))
        return 40;
    for (uint64_t want = 1; want <= 2; want++) {
        uint64_t seq = raw_worker_update(fd, want == 1, &mems);
        if (seq != want && j->bad_result && want == 2 && !seq) {
            /* the trainer refused the RESULT and dropped us: it reconnects */
            close(fd);
            mems = 0;
            if (ipc_accept(lfd, ipc_now() + 10, &fd, err, sizeof err))
                return 41;
            seq = raw_worker_update(fd, 1, &mems);
            if (mems != 1)
                return 42; /* a new connection gets the table again */
        }
        if (seq != want)
            return 43;
        ipc_frame f;
        if (raw_status(fd, IPC_VOTE, seq, 0) ||
            ipc_recv(fd, &f, 4096, ipc_now() + 10, err, sizeof err))
            return 44;
        int decision_ok = f.type == IPC_DECISION;
        ipc_frame_free(&f);
        if (!decision_ok)
            return 45;
        if (want == 1)
            usleep(500 * 1000);
        /* the last one may find the trainer gone: it does not wait for it */
        if (raw_status(fd, IPC_RESULT, want == 1 && j->bad_result ? 99 : seq, 0) && want == 1)
            return 46;
    }
    close(fd);
    close(lfd);
    unlink(j->path);
    return 0;
}

static void result_read_later(int bad_result)
{
    late_job j = {.path = g_path[1], .bad_result = bad_result};
    pid_t pid = it_fork(run_late_worker, &j);
    refit_ctx *ctx;
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    assert_int_equal(refit_open(&ctx, &o), REFIT_OK);
    refit_ipc_send_opts so = REFIT_IPC_SEND_OPTS_INIT;
    so.timeout_s = 10;
    refit_ipc_sender *s;
    const char *paths[1] = {g_path[1]};
    assert_int_equal(refit_ipc_sender_create(&s, ctx, paths, 1, &so), REFIT_OK);
    int64_t shape[1] = {16};
    float x[16] = {1};
    refit_tensor t = {.data = x, .device = {REFIT_DEVICE_CPU, 0}, .ndim = 1,
                      .dtype = REFIT_F32, .shape = shape};
    assert_int_equal(refit_ipc_sender_add(s, "w", &t, REFIT_IPC_PACK), REFIT_OK);
    refit_group_result res;
    refit_ipc_send_profile pf;
    double t0 = ipc_now();
    assert_int_equal(refit_ipc_sender_send(s, &res), REFIT_OK);
    assert_true(ipc_now() - t0 < 0.4); /* the commit's RESULT was not waited for */
    assert_int_equal(res.decision, REFIT_OK);
    assert_int_equal(refit_ipc_sender_profile(s, &pf), REFIT_OK);
    assert_int_equal(pf.seq, 1);
    t0 = ipc_now();
    int rc = refit_ipc_sender_send(s, &res);
    if (rc)
        fail_msg("second send: %s", refit_errmsg(ctx));
    assert_int_equal(refit_ipc_sender_profile(s, &pf), REFIT_OK);
    assert_int_equal(pf.seq, 2);
    /* it read the late RESULT first (0.5 s after the decision) */
    assert_true((double)(pf.results_ns - pf.start_ns) * 1e-9 > 0.25);
    refit_ipc_sender_destroy(s);
    refit_close(ctx);
    assert_int_equal(it_wait(pid), 0);
}

static void t_result_read_later(void **state) { (void)state; result_read_later(0); }
static void t_result_refused_later(void **state) { (void)state; result_read_later(1); }

/* ---- who may talk to a worker (docs/ipc.md, "Trust model") ---- */

/* Another user is uid 65534 in a child that root forked. */
#define NEED_ROOT()                                                                          \
    do {                                                                                     \
        if (geteuid() != 0) {                                                                \
            print_message("# skipped: acting as another uid (setresuid 65534) needs root\n"); \
            skip();                                                                          \
        }                                                                                    \
    } while (0)

static int become_nobody(void)
{
    return setgroups(0, NULL) || setresgid(65534, 65534, 65534) ||
                   setresuid(65534, 65534, 65534) ? -1 : 0;
}

/* A listening socket at path without refit's checks (a stranger's). */
static int raw_listen(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 4)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static int event_cat(void *user, const journal_event_row *row)
{
    char *s = user;
    size_t n = strlen(s);
    snprintf(s + n, 8192 - n, "[%s] %s\n", row->kind, row->message);
    return 0;
}

static void journal_events(const char *db, char out[8192])
{
    journal *jr = NULL;
    journal_opts o = JOURNAL_OPTS_INIT;
    o.readonly = 1;
    char err[256];
    out[0] = '\0';
    assert_int_equal(journal_open(&jr, db, &o, err, sizeof err), REFIT_OK);
    assert_int_equal(journal_events_list(jr, 0, 0, event_cat, out), REFIT_OK);
    journal_close(jr);
}

static void unlink_db(const char *db)
{
    char p[160];
    unlink(db);
    snprintf(p, sizeof p, "%s-wal", db);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", db);
    unlink(p);
}

static void worker_open_with(worker_fix *f, int which, const refit_ipc_recv_opts *o,
                             const char *journal)
{
    assert_int_equal(nt_worker_open(&f->w, 0, 1, journal), REFIT_OK);
    if (refit_ipc_receiver_create(&f->r, f->w.m, g_path[which], o))
        fail_msg("receiver on %s: %s", g_path[which], refit_errmsg(f->w.ctx));
}

/* I1: a second receiver on a path where one listens is refused (the first
 * keeps serving); a stale socket is replaced; destroy unlinks only the
 * socket that receiver bound. */
static void t_live_socket(void **state)
{
    (void)state;
    worker_fix a;
    worker_open(&a, 0, 20, 0);
    nt_worker w2;
    assert_int_equal(nt_worker_open(&w2, 0, 1, NULL), REFIT_OK);
    refit_ipc_receiver *b = NULL;
    int rc = refit_ipc_receiver_create(&b, w2.m, g_path[0], NULL);
    if (rc != REFIT_EEXIST || !strstr(refit_errmsg(w2.ctx), g_path[0]))
        fail_msg("a second receiver on %s, where a live one listens: %d '%s'", g_path[0], rc,
                 rc ? refit_errmsg(w2.ctx) : "created");
    assert_null(b);
    commit_raw(&a, 1); /* the first still serves */
    int s = raw_listen(g_path[1]);
    assert_true(s >= 0);
    close(s); /* stale: the file stays, nobody listens */
    refit_ipc_receiver *c = NULL, *d = NULL;
    assert_int_equal(refit_ipc_receiver_create(&c, w2.m, g_path[1], NULL), REFIT_OK);
    assert_int_equal(unlink(g_path[1]), 0); /* a rolling restart: the next one binds anew */
    assert_int_equal(refit_ipc_receiver_create(&d, w2.m, g_path[1], NULL), REFIT_OK);
    refit_ipc_receiver_destroy(c);
    struct stat st;
    if (lstat(g_path[1], &st))
        fail_msg("destroying a receiver unlinked %s, which another receiver had bound",
                 g_path[1]);
    refit_ipc_receiver_destroy(d);
    assert_int_equal(lstat(g_path[1], &st), -1);
    nt_worker_close(&w2);
    worker_close(&a);
}

/* I2: the socket is the owner's alone whatever the umask. */
static void t_socket_mode(void **state)
{
    (void)state;
    mode_t old = umask(0);
    worker_fix f;
    worker_open(&f, 0, 20, 0);
    umask(old);
    struct stat st;
    assert_int_equal(lstat(g_path[0], &st), 0);
    if ((st.st_mode & 0777) != 0600)
        fail_msg("the worker's socket is %04o under umask 000; 0600 expected",
                 (unsigned)(st.st_mode & 0777));
    refit_ipc_receiver_destroy(f.r);
    refit_ipc_recv_opts o = REFIT_IPC_RECV_OPTS_INIT;
    o.socket_mode = 0660; /* the embedder's group too */
    assert_int_equal(refit_ipc_receiver_create(&f.r, f.w.m, g_path[0], &o), REFIT_OK);
    assert_int_equal(lstat(g_path[0], &st), 0);
    assert_int_equal(st.st_mode & 0777, 0660);
    worker_close(&f);
}

typedef struct nobody_job {
    const char *path;
    uint64_t version;
} nobody_job;

/* As uid 65534, a whole update by the raw trainer: 0 when the worker
 * closed on it, 1 when it committed. */
static int run_nobody_trainer(void *arg)
{
    nobody_job *j = arg;
    if (become_nobody())
        return 50;
    rt t;
    int rc = rt_open(&t, j->path, j->version, 1024);
    if (!rc)
        rc = rt_send_mems(&t);
    if (!rc)
        rc = rt_send_update(&t, NULL, NULL);
    int vote = -1;
    if (!rc)
        rc = rt_finish(&t, &vote);
    int closed = rc == REFIT_EIO && strstr(t.err, "control channel");
    if (rc && !closed)
        fprintf(stderr, "nobody trainer: %s\n", t.err);
    rt_close(&t);
    return !rc ? (vote == 0 ? 1 : 2) : closed ? 0 : 3;
}

/* I2: a trainer of another uid reaches the socket (the embedder opened
 * its mode) and is refused by its credentials: bytes and health as they
 * were, a journal event naming its uid and pid. */
static void t_peer_other_uid(void **state)
{
    (void)state;
    NEED_ROOT();
    char db[128];
    snprintf(db, sizeof db, "/tmp/refit-ipc-%d.db", (int)getpid());
    unlink_db(db);
    worker_fix f;
    refit_ipc_recv_opts o = REFIT_IPC_RECV_OPTS_INIT;
    o.timeout_s = 20;
    o.start_timeout_s = 2;
    worker_open_with(&f, 0, &o, db);
    commit_raw(&f, 1);
    uint64_t fp = nt_fp(&f.w);
    assert_int_equal(chmod(g_path[0], 0666), 0); /* anyone may reach the socket */
    nobody_job j = {g_path[0], 2};
    pid_t pid = it_fork(run_nobody_trainer, &j);
    refit_group_result res;
    int rc = receive(&f, &res);
    int child = it_wait(pid);
    if (rc != REFIT_ETIMEDOUT || !strstr(refit_errmsg(f.w.ctx), "uid 65534"))
        fail_msg("a trainer of uid 65534 (its exit %d): %d '%s'", child, rc,
                 refit_errmsg(f.w.ctx));
    assert_int_equal(child, 0);
    expect_at(&f, 1);
    assert_true(nt_fp(&f.w) == fp);
    char ev[8192], want[64];
    journal_events(db, ev);
    snprintf(want, sizeof want, "pid %d", (int)pid);
    if (!strstr(ev, "uid 65534") || !strstr(ev, want))
        fail_msg("no journal event names uid 65534 and %s: %s", want, ev);
    /* allow_uids lets it in (the list is copied at create) */
    refit_ipc_receiver_destroy(f.r);
    uint32_t allow[1] = {65534};
    o.socket_mode = 0666;
    o.allow_uids = allow;
    o.n_allow_uids = 1;
    assert_int_equal(refit_ipc_receiver_create(&f.r, f.w.m, g_path[0], &o), REFIT_OK);
    allow[0] = 1;
    pid = it_fork(run_nobody_trainer, &j);
    rc = receive(&f, &res);
    child = it_wait(pid);
    if (rc)
        fail_msg("a trainer of uid 65534 in allow_uids (its exit %d): %s", child,
                 refit_errmsg(f.w.ctx));
    assert_int_equal(child, 1);
    expect_at(&f, 2);
    worker_close(&f);
    unlink_db(db);
}

/* As uid 65534: listen at path, answer one trainer's HELLO; 1 when the
 * trainer then handed over its memory table. */
static int run_nobody_listener(void *arg)
{
    const char *path = arg;
    if (become_nobody())
        return 50;
    int lfd = raw_listen(path), fd, rc = 52;
    char err[256];
    if (lfd < 0)
        return 51;
    if (!ipc_accept(lfd, ipc_now() + 10, &fd, err, sizeof err)) {
        int mems = 0;
        (void)raw_worker_update(fd, 1, &mems);
        rc = mems ? 1 : 0;
        close(fd);
    }
    close(lfd);
    unlink(path);
    return rc;
}

/* I3: the trainer connects only to a listener of its own uid. */
static void t_listener_other_uid(void **state)
{
    (void)state;
    NEED_ROOT();
    unlink(g_path[1]);
    pid_t pid = it_fork(run_nobody_listener, g_path[1]);
    refit_ctx *ctx;
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    assert_int_equal(refit_open(&ctx, &o), REFIT_OK);
    refit_ipc_send_opts so = REFIT_IPC_SEND_OPTS_INIT;
    so.timeout_s = 5;
    refit_ipc_sender *s = NULL;
    const char *paths[1] = {g_path[1]};
    int rc = refit_ipc_sender_create(&s, ctx, paths, 1, &so);
    char msg[1024];
    ipc_copy_str(msg, sizeof msg, refit_errmsg(ctx));
    if (s) { /* would it hand over its memory? */
        int64_t shape[1] = {16};
        float x[16] = {1};
        refit_tensor t = {.data = x, .device = {REFIT_DEVICE_CPU, 0}, .ndim = 1,
                          .dtype = REFIT_F32, .shape = shape};
        refit_ipc_sender_add(s, "w", &t, REFIT_IPC_PACK);
        refit_ipc_sender_send(s, NULL);
    }
    refit_ipc_sender_destroy(s);
    int child = it_wait(pid);
    if (rc == REFIT_OK || !strstr(msg, "uid 65534"))
        fail_msg("a listener of uid 65534 (its exit %d: 1 = it got the memory table): %d "
                 "'%s'", child, rc, rc ? msg : "connected");
    assert_int_equal(child, 0);
    /* trusted when listed */
    uint32_t allow[1] = {65534};
    so.allow_uids = allow;
    so.n_allow_uids = 1;
    pid = it_fork(run_nobody_listener, g_path[1]);
    rc = refit_ipc_sender_create(&s, ctx, paths, 1, &so);
    if (rc)
        fail_msg("a listener of uid 65534 in allow_uids: %s", refit_errmsg(ctx));
    refit_ipc_sender_destroy(s);
    assert_int_equal(it_wait(pid), 0);
    refit_close(ctx);
}

typedef struct fd_checks {
    int n, writable, rw_map, unsealed, reopened_rw_map, shrunk, written, punched;
} fd_checks;

/* What a worker can do with a memory descriptor it was handed. */
static void check_fd(int fd, uint64_t bytes, fd_checks *c)
{
    c->n++;
    c->writable += (fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDONLY;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
        c->rw_map++;
        munmap(p, bytes);
    }
    int seals = fcntl(fd, F_GET_SEALS);
    c->unsealed += seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) !=
                                    (F_SEAL_SHRINK | F_SEAL_GROW);
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    int rw = open(proc, O_RDWR | O_CLOEXEC); /* root may: the seals must still hold */
    if (rw >= 0) {
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
        if (p != MAP_FAILED) {
            c->reopened_rw_map++;
            munmap(p, bytes);
        }
        c->written += pwrite(rw, "x", 1, 0) == 1;
        c->punched += fallocate(rw, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == 0;
        c->shrunk += ftruncate(rw, 0) == 0;
        close(rw);
    }
}

/* I3, I4: the real sender's memory descriptors, as a worker gets them:
 * read-only, sealed against shrinking and growing, and writes sealed off
 * even through a reopened descriptor. */
static void t_memfd_read_only(void **state)
{
    (void)state;
    int lfd = raw_listen(g_path[1]), fd = -1;
    assert_true(lfd >= 0);
    trainer_job j = {.path = {g_path[1]}, .n_workers = 1, .first = 1, .count = 1, .share = 1,
                     .expect = REFIT_EIO, .expect_failed_rank = 0};
    pid_t pid = it_fork(run_trainer, &j);
    char err[256];
    fd_checks c = {0};
    uint64_t seq = 0;
    int ok = !ipc_accept(lfd, ipc_now() + 10, &fd, err, sizeof err);
    ipc_frame f;
    if (ok && !ipc_recv(fd, &f, 64, ipc_now() + 10, err, sizeof err)) {
        ipc_frame_free(&f);
        ipc_wbuf w = {0};
        ipc_hello_encode(&w, &(ipc_hello){IPC_ROLE_WORKER, (uint32_t)getpid(), 0, 1});
        ok = !ipc_send(fd, IPC_HELLO, w.p, (uint32_t)w.len, NULL, 0, ipc_now() + 10, err,
                       sizeof err);
        ipc_wbuf_free(&w);
    }
    while (ok && !seq) {
        if (ipc_recv(fd, &f, IPC_MAX_PAYLOAD, ipc_now() + 10, err, sizeof err)) {
            ok = 0;
            break;
        }
        ipc_mems t;
        if (f.type == IPC_MEMS && !ipc_mems_decode(&t, &f, err, sizeof err)) {
            for (uint32_t i = 0; i < t.n; i++)
                if (t.m[i].kind == IPC_MEM_HOST_FD)
                    check_fd(t.m[i].fd, t.m[i].bytes, &c);
            ipc_mems_free(&t);
        }
        if (f.type == IPC_UPDATE)
            seq = bkt_le64(f.payload);
        ipc_frame_free(&f);
    }
    if (ok) { /* vote no: nothing of this is loaded anywhere */
        ok = !raw_status(fd, IPC_VOTE, seq, REFIT_EIO) &&
             !ipc_recv(fd, &f, 4096, ipc_now() + 10, err, sizeof err);
        if (ok)
            ipc_frame_free(&f);
        ok = ok && !raw_status(fd, IPC_RESULT, seq, REFIT_OK);
    }
    if (fd >= 0)
        close(fd);
    close(lfd);
    unlink(g_path[1]);
    int child = it_wait(pid);
    if (!ok)
        fail_msg("raw worker: %s", err);
    assert_int_equal(child, 0);
    assert_true(c.n >= 2); /* the shared memories and the packed buckets */
    if (c.writable || c.rw_map || c.unsealed || c.reopened_rw_map || c.shrunk || c.written ||
        c.punched)
        fail_msg("of %d memory descriptors the worker was handed, %d open for writing, %d "
                 "mapped writable, %d without F_SEAL_SHRINK|F_SEAL_GROW; reopened by "
                 "/proc/self/fd, %d mapped writable, %d written, %d holes punched, %d shrunk",
                 c.n, c.writable, c.rw_map, c.unsealed, c.reopened_rw_map, c.written,
                 c.punched, c.shrunk);
}

/* I4: a memory the trainer could shrink under the worker (SIGBUS in the
 * copy) is refused, naming it; bytes and health as they were. */
static void t_unsealed_memfd(void **state)
{
    (void)state;
    worker_fix f;
    worker_open(&f, 0, 20, 0);
    commit_raw(&f, 1);
    uint64_t fp = nt_fp(&f.w);
    raw_job j = {.path = g_path[0], .version = 2, .mode = 4};
    pid_t pid = it_fork(run_raw, &j);
    refit_group_result res;
    int rc = receive(&f, &res);
    int child = it_wait(pid);
    const char *msg = refit_errmsg(f.w.ctx);
    if (rc != REFIT_ECORRUPT || !strstr(msg, "memory 1") || !strstr(msg, "F_SEAL_SHRINK"))
        fail_msg("an unsealed memfd (the trainer's exit %d): %d '%s'", child, rc,
                 rc ? msg : "committed");
    assert_int_equal(child, 0);
    expect_at(&f, 1);
    assert_true(nt_fp(&f.w) == fp);
    commit_raw(&f, 3);
    worker_close(&f);
}

/* I5: two connections that never greet, then the trainer: each idle one
 * dropped at its greeting deadline (1 s, or greet_s), the update commits
 * in the same call, within max_s. */
static void idle_peers(double greet_s, double max_s)
{
    worker_fix f;
    refit_ipc_recv_opts o = REFIT_IPC_RECV_OPTS_INIT;
    o.timeout_s = 20;
    o.start_timeout_s = 6;
    o.greet_timeout_s = greet_s;
    worker_open_with(&f, 0, &o, NULL);
    int idle[2];
    char err[256];
    for (int i = 0; i < 2; i++)
        assert_int_equal(ipc_connect(g_path[0], ipc_now() + 2, &idle[i], err, sizeof err),
                         REFIT_OK);
    trainer_job j = {.path = {g_path[0]}, .n_workers = 1, .first = 1, .count = 1};
    pid_t pid = it_fork(run_trainer, &j);
    double t0 = ipc_now();
    refit_group_result res;
    int rc = receive(&f, &res);
    double dt = ipc_now() - t0;
    if (rc) {
        kill(pid, SIGKILL);
        it_wait(pid);
        fail_msg("two idle peers, then the trainer: %d after %.1f s: %s", rc, dt,
                 refit_errmsg(f.w.ctx));
    }
    expect_at(&f, 1);
    refit_ipc_stats st;
    refit_ipc_receiver_stats(f.r, &st);
    assert_int_equal(st.connections, 1);
    assert_int_equal(st.refused, 2); /* the idle ones */
    if (dt >= max_s)
        fail_msg("two idle peers (greeting deadline %g s), then the trainer: committed after "
                 "%.2f s", greet_s, dt);
    assert_int_equal(it_wait(pid), 0);
    close(idle[0]);
    close(idle[1]);
    worker_close(&f);
}

static void t_idle_peers(void **state) { (void)state; idle_peers(0, 6); }
static void t_idle_peers_greet_timeout(void **state) { (void)state; idle_peers(0.1, 1.8); }

/* I6: an index of many tiny tensors the model cannot take. */
typedef struct flood_job {
    const char *path;
    uint32_t n;
} flood_job;

static int run_flood(void *arg)
{
    flood_job *j = arg;
    rt t;
    int rc = rt_open_flood(&t, j->path, j->n);
    if (!rc)
        rc = rt_send_mems(&t);
    if (!rc)
        rc = rt_send_update(&t, NULL, NULL);
    int vote = 0;
    if (!rc)
        rc = rt_finish(&t, &vote);
    if (rc)
        fprintf(stderr, "flood trainer: %s\n", t.err);
    rt_close(&t);
    return rc ? 60 : vote == REFIT_EUNEXPECTED ? 0 : 61;
}

/* Heap bytes this process holds now. */
static size_t heap_in_use(void)
{
#ifdef IT_ASAN
    return __sanitizer_get_current_allocated_bytes();
#else
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
#endif
}

static void t_index_flood(void **state)
{
    (void)state;
    worker_fix f;
    worker_open(&f, 0, 20, 0);
    commit_raw(&f, 1);
    uint64_t fp = nt_fp(&f.w);
    size_t before = heap_in_use();
    flood_job j = {g_path[0], 100000};
    pid_t pid = it_fork(run_flood, &j);
    refit_group_result res;
    int rc = receive(&f, &res);
    size_t after = heap_in_use();
    int child = it_wait(pid);
    const char *msg = refit_errmsg(f.w.ctx);
    if (rc != REFIT_EUNEXPECTED || !strstr(msg, "100000 entries"))
        fail_msg("an index of 100000 tiny tensors: %d '%s'", rc, msg);
    if (after > before + ((size_t)1 << 20))
        fail_msg("%zu bytes more allocated after the refusal than before", after - before);
    assert_int_equal(child, 0);
    expect_at(&f, 1);
    assert_true(nt_fp(&f.w) == fp);
    commit_raw(&f, 2);
    worker_close(&f);
}

/* A filter may skip what this model lacks (another stage's tensors): an
 * index of more entries than the model has is then not refused at its
 * announce; the filter decides, piece by piece. */
static int skip_flood(void *user, const char *name)
{
    (void)user;
    return strncmp(name, "flood.", 6) != 0;
}

static void t_index_flood_filtered(void **state)
{
    (void)state;
    worker_fix f;
    refit_ipc_recv_opts o = REFIT_IPC_RECV_OPTS_INIT;
    o.timeout_s = 20;
    o.start_timeout_s = 20;
    o.filter = skip_flood;
    worker_open_with(&f, 0, &o, NULL);
    flood_job j = {g_path[0], 1000};
    pid_t pid = it_fork(run_flood, &j);
    refit_group_result res;
    int rc = receive(&f, &res);
    it_wait(pid);
    if (strstr(refit_errmsg(f.w.ctx), "announce lists"))
        fail_msg("an index of 1000 entries, every one filtered out: %d '%s'", rc,
                 refit_errmsg(f.w.ctx));
    assert_int_equal(res.vote_taken, 1);
    assert_int_equal(res.tensors, 1000);
    assert_int_equal(refit_worker_health(f.w.ctx), REFIT_HEALTH_EMPTY);
    worker_close(&f);
}

/* I6: the first bucket names a tensor the model does not expect, the last
 * header is corrupt: the refusal names the tensor (the walk stopped
 * there, before the rest was decoded and tabled). */
static void fix_last_header(rt *t, uint8_t *p, size_t *len)
{
    (void)len;
    uint64_t last = t->index_bytes - t->p.buckets[t->p.n_buckets - 1].header_bytes;
    p[ix_announce(t) + BKT_ANNOUNCE_BYTES + last + 40] ^= 0x10;
}

static void t_unknown_name_first(void **state)
{
    (void)state;
    worker_fix f;
    worker_open(&f, 0, 20, 0);
    commit_raw(&f, 1);
    raw_job j = {.path = g_path[0], .version = 2, .name0 = "model.nope.weight",
                 .fix_index = fix_last_header, .expect_vote = REFIT_EUNEXPECTED};
    pid_t pid = it_fork(run_raw, &j);
    refit_group_result res;
    int rc = receive(&f, &res);
    int child = it_wait(pid);
    if (rc != REFIT_EUNEXPECTED || !strstr(refit_errmsg(f.w.ctx), "model.nope.weight"))
        fail_msg("an unknown name in bucket 0, the last header corrupt: %d '%s'", rc,
                 refit_errmsg(f.w.ctx));
    assert_int_equal(child, 0);
    expect_at(&f, 1);
    worker_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(t_frame_roundtrip, fresh_paths),
        cmocka_unit_test_setup(t_frame_malformed, fresh_paths),
        cmocka_unit_test_setup(t_frame_deadline, fresh_paths),
        cmocka_unit_test_setup(t_frame_peer_reset, fresh_paths),
        cmocka_unit_test_setup(t_mems_refused, fresh_paths),
        cmocka_unit_test_setup(t_status_refused, fresh_paths),
        cmocka_unit_test_setup(t_index_update_decode, fresh_paths),
        cmocka_unit_test_setup(t_updates_packed, fresh_paths),
        cmocka_unit_test_setup(t_updates_shared, fresh_paths),
        cmocka_unit_test_setup(t_updates_checksum, fresh_paths),
        cmocka_unit_test_setup(t_unknown_tensor, fresh_paths),
        cmocka_unit_test_setup(t_raw_commit, fresh_paths),
        cmocka_unit_test_setup(t_refusals, fresh_paths),
        cmocka_unit_test_setup(t_garbage_peer, fresh_paths),
        cmocka_unit_test_setup(t_dead_trainer, fresh_paths),
        cmocka_unit_test_setup(t_stalled_trainer, fresh_paths),
        cmocka_unit_test_setup(t_dead_trainer_poisons, fresh_paths),
        cmocka_unit_test_setup(t_group_abort, fresh_paths),
        cmocka_unit_test_setup(t_spin, fresh_paths),
        cmocka_unit_test_setup(t_opts_v1, fresh_paths),
        cmocka_unit_test_setup(t_opts_v2, fresh_paths),
        cmocka_unit_test_setup(t_opts_v3, fresh_paths),
        cmocka_unit_test_setup(t_result_read_later, fresh_paths),
        cmocka_unit_test_setup(t_result_refused_later, fresh_paths),
        cmocka_unit_test_setup(t_live_socket, fresh_paths),
        cmocka_unit_test_setup(t_socket_mode, fresh_paths),
        cmocka_unit_test_setup(t_peer_other_uid, fresh_paths),
        cmocka_unit_test_setup(t_listener_other_uid, fresh_paths),
        cmocka_unit_test_setup(t_memfd_read_only, fresh_paths),
        cmocka_unit_test_setup(t_unsealed_memfd, fresh_paths),
        cmocka_unit_test_setup(t_idle_peers, fresh_paths),
        cmocka_unit_test_setup(t_idle_peers_greet_timeout, fresh_paths),
        cmocka_unit_test_setup(t_index_flood, fresh_paths),
        cmocka_unit_test_setup(t_index_flood_filtered, fresh_paths),
        cmocka_unit_test_setup(t_unknown_name_first, fresh_paths),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
