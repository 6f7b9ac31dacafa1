/* The IPC transport on the host (memfd standing in for CUDA IPC memory):
 * the control channel and its framing, every malformed frame, the
 * messages' validation, and whole updates between two processes: commit,
 * reuse of handles across updates, refusals that write nothing, a trainer
 * that dies or stalls mid-update, a group that aborts together. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <refit/ipc.h>

#include "core/ipc/chan.h"
#include "core/ipc/msg.h"
#include "tests/ipc/itest.h"

static char g_path[2][108];

static int setup(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++)
        snprintf(g_path[i], sizeof g_path[i], "/tmp/refit-ipc-%d-%d.sock", (int)getpid(), i);
    signal(SIGPIPE, SIG_IGN);
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
    {"unknown version", mk_version, REFIT_ECORRUPT, "protocol version 9; this refit speaks 1"},
    {"header checksum", mk_hsum, REFIT_ECORRUPT, "header checksum"},
    {"unknown type", mk_type, REFIT_ECORRUPT, "unknown type 77"},
    {"type 0", mk_type0, REFIT_ECORRUPT, "unknown type 0"},
    {"flags", mk_flags, REFIT_ECORRUPT, "unknown flags"},
    {"descriptors on a VOTE", mk_fds, REFIT_ECORRUPT, "descriptors"},
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
        if (st != j->expect) {
            fprintf(stderr, "trainer: send %s: %d (%s)\n", label, st, refit_errmsg(ctx));
            rc = 15;
        } else if (st && res.failed_rank != j->expect_failed_rank) {
            rc = 16;
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
    void (*fix)(rt *t, uint8_t *payload, size_t len);
    int mode;                   /* 0 finish, 1 die after UPDATE, 2 stall after UPDATE,
                                   3 garbage instead of HELLO */
    int expect_vote;
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
    int rc = rt_open(&t, j->path, j->version, 1024);
    if (!rc)
        rc = rt_send_mems(&t);
    if (!rc)
        rc = rt_send_update(&t, j->fix);
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

static void fix_offset(rt *t, uint8_t *p, size_t len)
{
    (void)len;
    uint8_t *ref = p + 24 + (t->p.n_buckets - 1) * IPC_REF_REC;
    wr64le(ref + 8, rd64le(ref + 8) + 512); /* the last bucket past the end */
}
static void fix_mem(rt *t, uint8_t *p, size_t len) { (void)t; (void)len; p[24] = 9; }
static void fix_epoch(rt *t, uint8_t *p, size_t len) { (void)t; (void)len; p[8] ^= 1; }
static void fix_header(rt *t, uint8_t *p, size_t len)
{
    (void)len;
    p[24 + t->p.n_buckets * IPC_REF_REC + BKT_ANNOUNCE_BYTES + 100] ^= 0x10;
}
static void fix_sum(rt *t, uint8_t *p, size_t len)
{
    (void)len;
    p[24 + 4] = IPC_B_SUM; /* a flag on one bucket only: the announce disagrees */
    (void)t;
}
static void fix_seq_index(rt *t, uint8_t *p, size_t len)
{
    (void)len;
    /* announce: one bucket fewer than the map (its checksum then fails) */
    p[24 + t->p.n_buckets * IPC_REF_REC + 8] ^= 1;
}

typedef struct refusal {
    const char *name;
    void (*fix)(rt *, uint8_t *, size_t);
    const char *says;
} refusal;

static const refusal REFUSALS[] = {
    {"offset past the memory", fix_offset, "runs past memory 1"},
    {"unknown memory", fix_mem, "names memory 9, which the trainer never shared"},
    {"stale memory table", fix_epoch, "memory table 6; this worker holds 7"},
    {"corrupt header", fix_header, "header checksum mismatch"},
    {"checksum flag on one bucket", fix_sum, "disagrees with the bucket map (15 buckets, 1 with a sum)"},
    {"announce", fix_seq_index, "announce: checksum mismatch"},
};

static void t_refusals(void **state)
{
    (void)state;
    worker_fix f;
    worker_open(&f, 0, 20, 0);
    commit_raw(&f, 1);
    uint64_t fp = nt_fp(&f.w);
    for (size_t i = 0; i < sizeof REFUSALS / sizeof *REFUSALS; i++) {
        raw_job j = {.path = g_path[0], .version = 2, .fix = REFUSALS[i].fix,
                     .expect_vote = REFIT_ECORRUPT};
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_frame_roundtrip),
        cmocka_unit_test(t_frame_malformed),
        cmocka_unit_test(t_frame_deadline),
        cmocka_unit_test(t_mems_refused),
        cmocka_unit_test(t_status_refused),
        cmocka_unit_test(t_updates_packed),
        cmocka_unit_test(t_updates_shared),
        cmocka_unit_test(t_updates_checksum),
        cmocka_unit_test(t_unknown_tensor),
        cmocka_unit_test(t_raw_commit),
        cmocka_unit_test(t_refusals),
        cmocka_unit_test(t_garbage_peer),
        cmocka_unit_test(t_dead_trainer),
        cmocka_unit_test(t_stalled_trainer),
        cmocka_unit_test(t_dead_trainer_poisons),
        cmocka_unit_test(t_group_abort),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
