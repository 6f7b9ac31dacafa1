#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transports/ipc/keeper_msg.h"
#include "transports/ipc/mem.h"
#include "tests/ipc/itest.h"

/* Plan t->bt (n_bt tensors) into buckets of bucket_bytes, lay them out in
 * one memfd (filled from t->c when fill), encode the index, connect and
 * greet. */
static int rt_build(rt *t, const char *path, uint64_t version, uint64_t bucket_bytes, int fill)
{
    snprintf(t->label, sizeof t->label, "v%llu", (unsigned long long)version);
    int rc = bkt_plan_build(&t->p, t->bt, t->n_bt, bucket_bytes, 0, t->err, sizeof t->err);
    if (rc)
        return rc;
    t->refs = calloc(t->p.n_buckets, sizeof *t->refs);
    for (uint32_t b = 0; b < t->p.n_buckets; b++) {
        t->refs[b] = (ipc_ref){.mem = 1, .offset = t->mem_bytes};
        t->mem_bytes += bkt_align(bkt_total(&t->p, b));
    }
    if ((rc = ipc_host_export(t->mem_bytes, &t->mfd, (void **)&t->mem, t->err, sizeof t->err)))
        return rc;
    for (uint32_t b = 0; fill && b < t->p.n_buckets; b++) {
        const bkt_span *sp = &t->p.buckets[b];
        for (uint32_t k = 0; k < sp->n; k++) {
            const bkt_piece *pc = &t->p.pieces[sp->first + k];
            uint64_t row = pc->part ? pc->bytes / (uint64_t)pc->rows : 0;
            memcpy(t->mem + t->refs[b].offset + BKT_ALIGN + pc->offset,
                   (uint8_t *)t->c.buf[pc->tensor] + (uint64_t)pc->row_offset * row, pc->bytes);
        }
    }
    t->index_bytes = bkt_index_bytes(&t->p);
    t->index = malloc(t->index_bytes);
    t->an = (bkt_announce){.n_buckets = t->p.n_buckets, .first_header = t->p.buckets[0].header_bytes,
                           .nonce = 0x1234 + version, .index_bytes = t->index_bytes,
                           .first_total = bkt_total(&t->p, 0), .max_total = t->p.max_total,
                           .total_payload = t->p.total_payload, .n_entries = t->p.n_pieces};
    uint8_t *q = t->index;
    for (uint32_t b = 0; b < t->p.n_buckets; b++) {
        bkt_header_encode(q, &t->p, b, t->bt, "", t->an.nonce); /* UPDATE has the label */
        q += t->p.buckets[b].header_bytes;
    }
    t->epoch = 7;
    t->seq = version;
    if ((rc = ipc_connect(path, ipc_now() + 10, &t->fd, t->err, sizeof t->err)))
        return rc;
    ipc_wbuf w = {0};
    ipc_hello_encode(&w, &(ipc_hello){IPC_ROLE_TRAINER, (uint32_t)getpid(), 0, 1});
    rc = ipc_send(t->fd, IPC_HELLO, w.p, (uint32_t)w.len, NULL, 0, ipc_now() + 10, t->err,
                  sizeof t->err);
    ipc_wbuf_free(&w);
    ipc_frame f;
    if (!rc && !(rc = ipc_recv(t->fd, &f, 64, ipc_now() + 10, t->err, sizeof t->err))) {
        ipc_hello h;
        rc = ipc_hello_decode_member(&h, &f, t->err, sizeof t->err); /* a keeper too */
        ipc_frame_free(&f);
    }
    return rc;
}

int rt_open_named(rt *t, const char *path, uint64_t version, uint64_t bucket_bytes,
                  const char *name0)
{
    memset(t, 0, sizeof *t);
    t->fd = t->mfd = -1;
    nt_ckpt_make(&t->c, version);
    t->n_bt = NT_N;
    t->bt = calloc(NT_N, sizeof *t->bt);
    for (int i = 0; i < NT_N; i++)
        t->bt[i] = (bkt_tensor){.name = NT_SPECS[i].ckpt, .dtype = NT_SPECS[i].dt,
                                .ndim = NT_SPECS[i].ndim, .shape = t->c.shape[i]};
    if (name0)
        t->bt[0].name = name0;
    return rt_build(t, path, version, bucket_bytes, 1);
}

int rt_open(rt *t, const char *path, uint64_t version, uint64_t bucket_bytes)
{
    return rt_open_named(t, path, version, bucket_bytes, NULL);
}

int rt_open_flood(rt *t, const char *path, uint32_t n)
{
    static const int64_t one[1] = {1};
    memset(t, 0, sizeof *t);
    t->fd = t->mfd = -1;
    nt_ckpt_make(&t->c, 1); /* unused; rt_close frees it */
    t->n_bt = n;
    t->bt = calloc(n, sizeof *t->bt);
    t->names = malloc((size_t)n * 16);
    for (uint32_t i = 0; i < n; i++) {
        char *nm = t->names + (size_t)i * 16;
        snprintf(nm, 16, "flood.%u", i % 100000000u);
        t->bt[i] = (bkt_tensor){.name = nm, .dtype = REFIT_F32, .ndim = 1, .shape = one};
    }
    return rt_build(t, path, 1, (uint64_t)1 << 30, 0);
}

int rt_unseal(rt *t)
{
    int f = memfd_create("refit-test-unsealed", MFD_CLOEXEC);
    if (f < 0 || ftruncate(f, (off_t)t->mem_bytes) ||
        pwrite(f, t->mem, t->mem_bytes, 0) != (ssize_t)t->mem_bytes) {
        snprintf(t->err, sizeof t->err, "an unsealed memfd: failed");
        if (f >= 0)
            close(f);
        return REFIT_EIO;
    }
    close(t->mfd);
    t->mfd = f;
    return REFIT_OK;
}

void rt_close(rt *t)
{
    if (t->fd >= 0)
        close(t->fd);
    if (t->mfd >= 0)
        close(t->mfd);
    if (t->mem)
        munmap(t->mem, t->mem_bytes);
    free(t->refs);
    free(t->index);
    free(t->bt);
    free(t->names);
    bkt_plan_free(&t->p);
    nt_ckpt_free(&t->c);
    memset(t, 0, sizeof *t);
}

int rt_send_mems(rt *t)
{
    ipc_mem_desc d = {.id = 1, .gen = 1, .kind = IPC_MEM_HOST_FD, .bytes = t->mem_bytes,
                      .fd = t->mfd};
    ipc_mems m = {.epoch = t->epoch, .n = 1, .m = &d};
    ipc_wbuf w = {0};
    ipc_mems_encode(&w, &m);
    int rc = ipc_send(t->fd, IPC_MEMS, w.p, (uint32_t)w.len, &t->mfd, 1, ipc_now() + 10, t->err,
                      sizeof t->err);
    ipc_wbuf_free(&w);
    return rc;
}

static int send_fixed(rt *t, uint16_t type, ipc_wbuf *w, rt_fix fix)
{
    size_t len = w->len;
    static const uint8_t room[1024];
    ipc_w_bytes(w, room, sizeof room); /* zeros a fix may grow the frame into */
    if (fix)
        fix(t, w->p, &len);
    int rc = ipc_send(t->fd, type, w->p, (uint32_t)len, NULL, 0, ipc_now() + 10, t->err,
                      sizeof t->err);
    ipc_wbuf_free(w);
    return rc;
}

int rt_send_update(rt *t, rt_fix fix_index, rt_fix fix_update)
{
    uint8_t an[BKT_ANNOUNCE_BYTES];
    bkt_announce_encode(an, &t->an);
    ipc_index x = {.id = 1, .epoch = t->epoch, .n_buckets = t->p.n_buckets, .refs = t->refs,
                   .index = t->index, .index_bytes = t->index_bytes};
    ipc_wbuf w = {0};
    ipc_index_encode(&w, &x, an);
    int rc = send_fixed(t, IPC_INDEX, &w, fix_index);
    ipc_update u = {.seq = t->seq, .epoch = t->epoch, .index_id = 1,
                    .n_buckets = t->p.n_buckets};
    ipc_copy_str(u.label, sizeof u.label, t->label);
    ipc_update_encode(&w, &u, NULL);
    return rc ? rc : send_fixed(t, IPC_UPDATE, &w, fix_update);
}

int rt_finish(rt *t, int *vote)
{
    ipc_frame f;
    ipc_status_msg m;
    int rc = ipc_recv(t->fd, &f, 4096, ipc_now() + 10, t->err, sizeof t->err);
    if (rc)
        return rc;
    rc = ipc_status_decode(&m, &f, t->seq, t->err, sizeof t->err);
    ipc_frame_free(&f);
    if (rc)
        return rc;
    *vote = m.status;
    ipc_wbuf w = {0};
    ipc_status_encode(&w, t->seq, m.status, m.msg);
    rc = ipc_send(t->fd, IPC_DECISION, w.p, (uint32_t)w.len, NULL, 0, ipc_now() + 10, t->err,
                  sizeof t->err);
    ipc_wbuf_free(&w);
    if (!rc && !(rc = ipc_recv(t->fd, &f, 4096, ipc_now() + 10, t->err, sizeof t->err))) {
        rc = f.type == IPC_RESULT ? ipc_status_decode(&m, &f, t->seq, t->err, sizeof t->err)
                                  : REFIT_ECORRUPT;
        ipc_frame_free(&f);
    }
    return rc;
}

pid_t it_fork(int (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(fn(arg) & 0x7f);
    return pid;
}

int it_wait(pid_t pid)
{
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
