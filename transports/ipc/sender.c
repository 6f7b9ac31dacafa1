/*
 * The trainer side of the IPC transport (include/refit/ipc.h). A send:
 *
 *   layout   once, and again only when a tensor's storage or shape changed:
 *            PACK tensors into flat buckets (refit's memory, [256 | payload],
 *            whole tensors at 256-aligned offsets), every SHARE tensor one
 *            DIRECT bucket at its offset in its own allocation; the memory
 *            table (ids, handles) built, its epoch bumped
 *   pack     backend copies of the PACK tensors on the trainer's stream,
 *            then the interprocess event recorded on it (device)
 *   index    announce + one bucket header per bucket (transports/nccl/bucket.h),
 *            encoded once per layout (INDEX, its headers' label empty)
 *   per worker: the RESULT of the last commit (read here, not waited for
 *            by the send that committed), MEMS when its table is older than
 *            the epoch, INDEX when it has not this layout's, UPDATE (seq,
 *            the index's id, the label, the checksums)
 *   votes    every worker's (busy-polled for spin_s, then poll), then one
 *            DECISION to all; after an abort, their RESULTs
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <refit/ipc.h>

#include "core/backend.h"
#include "core/names.h"
#include "core/util.h"
#include "core/ctx.h"
#include "transports/ipc/keeper_msg.h"
#include "transports/ipc/mem.h"
#include "transports/nccl/xport.h"
#include "kernels/copy.h"

typedef struct snd_tensor {
    char *name;
    const refit_tensor *t;      /* borrowed, or own */
    int how;
    uint8_t kind;               /* BKT_E_WHOLE, or an entry of a patch (one send only) */
    refit_tensor *own;          /* a patch's indices or counts, described here */
    /* as laid out: */
    void *data;
    uint64_t bytes;
    uint32_t bucket;
    uint64_t offset;            /* in the bucket's payload */
} snd_tensor;

typedef struct snd_mem {
    ipc_mem_desc d;             /* d.fd owned here (host kinds) */
    void *base;                 /* host address, or the device pointer */
    bool owned;                 /* refit allocated it (a bucket or a host_alloc) */
    bool bucket;                /* a packed bucket of the current layout */
    bool used;
} snd_mem;

typedef struct snd_worker {
    char *path;
    int fd;                     /* -1: not connected */
    uint32_t epoch;             /* the memory table it holds; 0: none */
    int32_t rank;
    uint32_t ix_id;             /* the INDEX it holds; 0: none */
    uint64_t result_seq;        /* a commit whose RESULT is still to read; 0: none */
    bool keeper;                /* a keeper following the group: decided last */
} snd_worker;

struct refit_ipc_sender {
    refit_ctx *ctx;
    refit_ipc_send_opts o;
    uint32_t *allow;            /* opts' allow_uids, copied */
    refit_device dev;
    char label[BKT_MAX_LABEL + 1];
    snd_tensor *ts;
    uint32_t n, cap;
    names by_name;
    snd_mem *mems;
    uint32_t n_mems, cap_mems, next_id, epoch;
    bool laid_out, laid_out_once;
    uint32_t n_packed;          /* packed buckets of the layout (they come first) */
    bkt_plan plan;
    bkt_tensor *bt;
    uint8_t *kinds;             /* per tensor, for the headers; NULL until a patch */
    uint32_t n_patches;         /* patches added for the next send */
    ipc_ref *refs;              /* per bucket */
    uint64_t *sums;             /* per bucket, when checksummed */
    ipc_wbuf frame;             /* this send's UPDATE */
    ipc_wbuf iframe;            /* the layout's INDEX */
    uint32_t ix_id, ix_epoch;   /* its id, and the table epoch it was made for */
    uint8_t *index;
    size_t index_cap;
    ipc_cuda cu;
    CUevent ev;
    bool has_event;
    uint8_t ev_handle[IPC_HANDLE_BYTES];
    snd_worker *w;
    int n_w;
    int *vote;                  /* per worker, for one send */
    char (*why)[256];
    ipc_wbuf sbuf;              /* status frames */
    uint64_t seq;
    refit_ipc_send_profile prof;
    char err[1024];
};

static int s_err(refit_ipc_sender *s, int rc)
{
    return ctx_error(s->ctx, rc, "ipc sender: %s", s->err);
}

static double deadline_of(const refit_ipc_sender *s)
{
    return ipc_now() + (s->o.timeout_s > 0 ? s->o.timeout_s : 300.0);
}

static double spin_of(const refit_ipc_sender *s)
{
    return s->o.spin_s > 0 ? s->o.spin_s : s->o.spin_s < 0 ? 0 : 0.005;
}

/* ---- connections ---- */

static int connect_worker(refit_ipc_sender *s, snd_worker *w)
{
    double dl = deadline_of(s);
    int rc = ipc_connect(w->path, dl, &w->fd, s->err, sizeof s->err);
    if (rc)
        return rc;
    /* the listener's credentials before a byte goes: another user who
     * bound this path first would get the memory table */
    uint32_t uid = 0;
    int32_t pid = 0;
    if (!(rc = ipc_peer_cred(w->fd, &uid, &pid, s->err, sizeof s->err)) &&
        !ipc_uid_allowed(uid, s->allow, s->o.n_allow_uids)) {
        snprintf(s->err, sizeof s->err, "the listener at %.300s runs as uid %u (pid %d), "
                 "neither this trainer's uid %u nor in its allow_uids; not connected",
                 w->path, uid, (int)pid, (unsigned)geteuid());
        xport_journal(s->ctx, 0, "ipc-peer", "ipc sender: %s", s->err);
        rc = REFIT_EIO;
    }
    if (rc) {
        close(w->fd);
        w->fd = -1;
        return rc;
    }
    ipc_wbuf b = {0};
    ipc_hello me = {IPC_ROLE_TRAINER, (uint32_t)getpid(), (int32_t)(w - s->w), (uint32_t)s->n_w};
    ipc_hello_encode(&b, &me);
    rc = b.failed ? REFIT_ENOMEM
                  : ipc_send(w->fd, IPC_HELLO, b.p, (uint32_t)b.len, NULL, 0, dl, s->err,
                             sizeof s->err);
    ipc_wbuf_free(&b);
    ipc_frame f;
    if (!rc && !(rc = ipc_recv(w->fd, &f, 64, dl, s->err, sizeof s->err))) {
        ipc_hello peer;
        rc = ipc_hello_decode_member(&peer, &f, s->err, sizeof s->err);
        w->rank = peer.rank;
        w->keeper = !rc && peer.role == IPC_ROLE_KEEPER;
        ipc_frame_free(&f);
    }
    if (rc) {
        close(w->fd);
        w->fd = -1;
    }
    w->epoch = 0;
    w->ix_id = 0;
    w->result_seq = 0;
    return rc;
}

static void drop_worker(snd_worker *w)
{
    if (w->fd >= 0)
        close(w->fd);
    w->fd = -1;
    w->epoch = 0;
    w->ix_id = 0;
    w->result_seq = 0;
}

int refit_ipc_sender_create(refit_ipc_sender **out, refit_ctx *ctx, const char *const *paths,
                            int n_workers, const refit_ipc_send_opts *opt)
{
    if (!out || !ctx)
        return REFIT_EINVAL;
    *out = NULL;
    ctx_clear_error(ctx);
    if (!paths || n_workers < 1 || n_workers > 4096)
        return ctx_error(ctx, REFIT_EINVAL, "ipc sender: %d workers (1 to 4096, with a path "
                         "each)", n_workers);
    if (opt && (opt->version < 1 || opt->version > REFIT_IPC_SEND_OPTS_VERSION))
        return ctx_error(ctx, REFIT_EINVAL, "invalid version %u on refit_ipc_send_opts",
                         opt->version);
    refit_ipc_sender *s = calloc(1, sizeof *s);
    if (!s || !(s->w = calloc((size_t)n_workers, sizeof *s->w)) ||
        !(s->vote = calloc((size_t)n_workers, sizeof *s->vote)) ||
        !(s->why = calloc((size_t)n_workers, sizeof *s->why))) {
        if (s) {
            free(s->w);
            free(s->vote);
        }
        free(s);
        return ctx_error(ctx, REFIT_ENOMEM, "ipc sender: out of memory");
    }
    s->ctx = ctx;
    s->o = (refit_ipc_send_opts)REFIT_IPC_SEND_OPTS_INIT;
    if (opt) /* an older caller's struct ends where its version did */
        memcpy(&s->o, opt, opt->version == 1   ? offsetof(refit_ipc_send_opts, spin_s)
                           : opt->version == 2 ? offsetof(refit_ipc_send_opts, allow_uids)
                                               : sizeof s->o);
    s->o.allow_uids = NULL; /* borrowed: the copy is s->allow */
    s->dev = s->o.device >= 0 ? (refit_device){REFIT_DEVICE_CUDA, s->o.device}
                              : (refit_device){REFIT_DEVICE_CPU, 0};
    ipc_copy_str(s->label, sizeof s->label, s->o.version_label ? s->o.version_label : "unnamed");
    s->n_w = n_workers;
    s->next_id = 1;
    int rc = REFIT_OK;
    for (int i = 0; i < n_workers; i++)
        s->w[i].fd = -1;
    if (s->o.n_allow_uids) {
        if (!opt->allow_uids || s->o.n_allow_uids > 65536)
            rc = ctx_error(ctx, REFIT_EINVAL, "ipc sender: %u allow_uids%s (at most 65536)",
                           s->o.n_allow_uids, opt->allow_uids ? "" : " and no array");
        else if (!(s->allow = malloc(s->o.n_allow_uids * sizeof *s->allow)))
            rc = ctx_error(ctx, REFIT_ENOMEM, "ipc sender: out of memory");
        else
            memcpy(s->allow, opt->allow_uids, s->o.n_allow_uids * sizeof *s->allow);
    }
    if (!rc && s->o.device >= 0 &&
        (rc = ipc_cuda_open(&s->cu, s->o.device, s->err, sizeof s->err)))
        rc = s_err(s, rc);
    for (int i = 0; !rc && i < n_workers; i++) {
        if (!paths[i] || !(s->w[i].path = xstrdup(paths[i])))
            rc = ctx_error(ctx, REFIT_EINVAL, "ipc sender: worker %d has no socket path", i);
        else if ((rc = connect_worker(s, &s->w[i])))
            rc = ctx_error(ctx, rc, "ipc sender: worker %d (%s): %s", i, paths[i], s->err);
    }
    if (rc) {
        refit_ipc_sender_destroy(s);
        return rc;
    }
    *out = s;
    return REFIT_OK;
}

static void mem_release(refit_ipc_sender *s, snd_mem *m)
{
    if (!m->owned)
        ; /* the trainer's own storage */
    else if (m->d.kind == IPC_MEM_HOST_FD)
        munmap(m->base, m->d.bytes);
    else if (s->cu.open)
        s->cu.cu.MemFree((CUdeviceptr)(uintptr_t)m->base);
    if (m->d.fd >= 0)
        close(m->d.fd);
}

void refit_ipc_sender_destroy(refit_ipc_sender *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_w; i++) {
        drop_worker(&s->w[i]);
        free(s->w[i].path);
    }
    free(s->w);
    free(s->vote);
    free(s->why);
    free(s->allow);
    ipc_wbuf_free(&s->sbuf);
    for (uint32_t i = 0; i < s->n_mems; i++)
        mem_release(s, &s->mems[i]);
    free(s->mems);
    for (uint32_t i = 0; i < s->n; i++) {
        free(s->ts[i].name);
        free(s->ts[i].own);
    }
    free(s->ts);
    names_free(&s->by_name);
    bkt_plan_free(&s->plan);
    free(s->bt);
    free(s->kinds);
    free(s->refs);
    free(s->sums);
    free(s->index);
    ipc_wbuf_free(&s->frame);
    ipc_wbuf_free(&s->iframe);
    if (s->has_event)
        s->cu.cu.EventDestroy(s->ev);
    if (s->cu.open)
        ipc_cuda_close(&s->cu);
    free(s);
}

int refit_ipc_sender_set_label(refit_ipc_sender *s, const char *label)
{
    if (!s || !label)
        return REFIT_EINVAL;
    if (strlen(label) > BKT_MAX_LABEL)
        return ctx_error(s->ctx, REFIT_EINVAL, "ipc sender: a version label of %zu bytes "
                         "(at most %d)", strlen(label), BKT_MAX_LABEL);
    ipc_copy_str(s->label, sizeof s->label, label);
    return REFIT_OK;
}

int refit_ipc_sender_add(refit_ipc_sender *s, const char *name, const refit_tensor *t, int how)
{
    if (!s)
        return REFIT_EINVAL;
    ctx_clear_error(s->ctx);
    if (!name || !*name || strlen(name) > BKT_MAX_NAME || !t)
        return ctx_error(s->ctx, REFIT_EINVAL, "ipc sender: add: a name of 1 to %d bytes and "
                         "a tensor are needed", BKT_MAX_NAME);
    if (how != REFIT_IPC_SHARE && how != REFIT_IPC_PACK)
        return ctx_error(s->ctx, REFIT_EINVAL, "ipc sender: add %s: how %d is neither "
                         "REFIT_IPC_SHARE nor REFIT_IPC_PACK", name, how);
    if (t->device.device_type != s->dev.device_type && how == REFIT_IPC_SHARE)
        return ctx_error(s->ctx, REFIT_EINVAL, "ipc sender: add %s: a SHARE tensor must be in "
                         "the sender's memory (device type %d, the sender's %d)", name,
                         t->device.device_type, s->dev.device_type);
    int rc = grow_array((void **)&s->ts, &s->cap, s->n, sizeof *s->ts);
    if (rc)
        return ctx_error(s->ctx, rc, "ipc sender: out of memory");
    char *nm = xstrdup(name);
    if (!nm)
        return ctx_error(s->ctx, REFIT_ENOMEM, "ipc sender: out of memory");
    if ((rc = names_insert(&s->by_name, nm, s->n))) {
        free(nm);
        return ctx_error(s->ctx, rc, "ipc sender: add %s: %s", name,
                         rc == REFIT_EEXIST ? "added twice" : "out of memory");
    }
    s->ts[s->n++] = (snd_tensor){.name = nm, .t = t, .how = how};
    s->laid_out = false;
    return REFIT_OK;
}

/* One entry of a patch: PACK, its indices or counts (a) described here. */
static int add_patch_entry(refit_ipc_sender *s, const char *name, uint8_t kind, size_t n,
                           const int64_t *a, const refit_tensor *values)
{
    int rc = grow_array((void **)&s->ts, &s->cap, s->n, sizeof *s->ts);
    if (rc)
        return rc;
    snd_tensor st = {.name = xstrdup(name), .t = values, .how = REFIT_IPC_PACK, .kind = kind};
    if (a && (st.own = calloc(1, sizeof *st.own + sizeof(int64_t)))) {
        int64_t *shape = (int64_t *)(st.own + 1);
        shape[0] = (int64_t)n;
        *st.own = (refit_tensor){.data = (void *)a, .device = {REFIT_DEVICE_CPU, 0},
                                 .ndim = 1, .dtype = {REFIT_DTYPE_INT, 64, 1}, .shape = shape};
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

/* What the sender checks of a patch without the model. */
static int check_patch(refit_ipc_sender *s, const char *name, size_t n, const int64_t *idx,
                       const int64_t *counts, const refit_tensor *values)
{
    char why[160];
    int64_t nv = values && values->ndim == 1 && values->shape ? values->shape[0] : -1;
    int rc = bkt_patch_check(name, n, idx, counts, nv, why, sizeof why);
    return rc ? ctx_error(s->ctx, rc, "ipc sender: add_delta %s: %s", name ? name : "(null)",
                          why)
              : REFIT_OK;
}

int refit_ipc_sender_add_delta(refit_ipc_sender *s, const char *name, size_t n,
                               const int64_t *indices, const int64_t *counts,
                               const refit_tensor *values)
{
    if (!s)
        return REFIT_EINVAL;
    ctx_clear_error(s->ctx);
    int rc = check_patch(s, name, n, indices, counts, values);
    if (rc)
        return rc;
    if (names_find(&s->by_name, name) != NAMES_NONE)
        return ctx_error(s->ctx, REFIT_EEXIST, "ipc sender: add_delta %s: added twice", name);
    static const int64_t none[1];
    uint32_t first = s->n;
    rc = add_patch_entry(s, name, BKT_E_DELTA_INDICES, n, indices ? indices : none, NULL);
    if (!rc && counts)
        rc = add_patch_entry(s, name, BKT_E_DELTA_COUNTS, n, counts, NULL);
    if (!rc)
        rc = add_patch_entry(s, name, BKT_E_DELTA_VALUES, 0, NULL, values);
    if (!rc)
        rc = names_insert(&s->by_name, s->ts[first].name, first);
    if (rc) {
        while (s->n > first) {
            s->n--;
            free(s->ts[s->n].name);
            free(s->ts[s->n].own);
        }
        return ctx_error(s->ctx, REFIT_ENOMEM, "ipc sender: out of memory");
    }
    s->n_patches++;
    s->laid_out = false;
    return REFIT_OK;
}

/* After a send: its patches go (the next step adds its own), the names
 * table rebuilt over what stays. */
static void drop_patches(refit_ipc_sender *s)
{
    if (!s->n_patches)
        return;
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        if (s->ts[i].kind != BKT_E_WHOLE) {
            free(s->ts[i].name);
            free(s->ts[i].own);
            continue;
        }
        s->ts[k++] = s->ts[i];
    }
    s->n = k;
    s->n_patches = 0;
    names_free(&s->by_name);
    for (uint32_t i = 0; i < s->n; i++)
        (void)names_insert(&s->by_name, s->ts[i].name, i); /* fewer than before: room */
    s->laid_out = false;
}

int refit_ipc_host_alloc(refit_ipc_sender *s, size_t bytes, void **out)
{
    if (!s || !out || !bytes)
        return REFIT_EINVAL;
    if (s->o.device >= 0)
        return ctx_error(s->ctx, REFIT_EINVAL, "ipc sender: host_alloc serves a host sender "
                         "(device -1); this one is on CUDA device %d", s->o.device);
    int rc = grow_array((void **)&s->mems, &s->cap_mems, s->n_mems, sizeof *s->mems);
    snd_mem m = {.d = {.id = s->next_id, .gen = 1, .kind = IPC_MEM_HOST_FD, .bytes = bytes,
                       .fd = -1}, .owned = true};
    if (!rc)
        rc = ipc_host_export(bytes, &m.d.fd, &m.base, s->err, sizeof s->err);
    if (rc)
        return s_err(s, rc);
    s->next_id++;
    s->mems[s->n_mems++] = m;
    *out = m.base;
    return REFIT_OK;
}

/* ---- layout: buckets and the memory table ---- */

static snd_mem *mem_holding(refit_ipc_sender *s, const void *p, uint64_t n)
{
    uintptr_t a = (uintptr_t)p;
    for (uint32_t i = 0; i < s->n_mems; i++) {
        snd_mem *m = &s->mems[i];
        uintptr_t b = (uintptr_t)m->base;
        if (!m->bucket && a >= b && a - b <= m->d.bytes && n <= m->d.bytes - (a - b))
            return m;
    }
    return NULL;
}

static int add_mem(refit_ipc_sender *s, snd_mem m, snd_mem **out)
{
    int rc = grow_array((void **)&s->mems, &s->cap_mems, s->n_mems, sizeof *s->mems);
    if (rc) {
        mem_release(s, &m);
        return rc;
    }
    m.d.id = s->next_id++;
    m.d.gen = 1;
    s->mems[s->n_mems] = m;
    *out = &s->mems[s->n_mems++];
    return REFIT_OK;
}

/* The memory a SHARE tensor lives in: a host_alloc region, or its device
 * allocation (exported once, kept while a tensor lives in it). */
static int share_mem(refit_ipc_sender *s, snd_tensor *st, snd_mem **out)
{
    if ((*out = mem_holding(s, st->data, st->bytes)))
        return REFIT_OK;
    if (s->o.device < 0) {
        snprintf(s->err, sizeof s->err, "%s: a SHARE tensor of a host sender must live in "
                 "memory from refit_ipc_host_alloc (or add it with REFIT_IPC_PACK)", st->name);
        return REFIT_EINVAL;
    }
    snd_mem m = {.d = {.kind = IPC_MEM_CUDA, .device = s->o.device, .fd = -1}};
    CUdeviceptr base;
    size_t size;
    int rc = ipc_cuda_share(&s->cu, (CUdeviceptr)(uintptr_t)st->data, &base, &size, m.d.handle,
                            s->err, sizeof s->err);
    if (rc)
        return rc;
    m.base = (void *)(uintptr_t)base;
    m.d.bytes = size;
    return add_mem(s, m, out);
}

/* A packed bucket of total bytes: the one this slot had when the size is
 * the same (kept: its handle stays valid in the workers), else a new one. */
static int bucket_mem(refit_ipc_sender *s, uint32_t b, uint64_t total, uint32_t *old,
                      uint32_t n_old, snd_mem **out)
{
    if (b < n_old && old[b] != UINT32_MAX && s->mems[old[b]].d.bytes == total) {
        *out = &s->mems[old[b]];
        old[b] = UINT32_MAX;
        return REFIT_OK;
    }
    snd_mem m = {.d = {.kind = s->o.device >= 0 ? IPC_MEM_CUDA : IPC_MEM_HOST_FD,
                       .device = s->o.device, .bytes = total, .fd = -1},
                 .owned = true, .bucket = true};
    int rc;
    if (s->o.device >= 0) {
        CUdeviceptr p;
        rc = ipc_cuda_alloc_export(&s->cu, total, &p, m.d.handle, s->err, sizeof s->err);
        m.base = (void *)(uintptr_t)p;
    } else {
        rc = ipc_host_export(total, &m.d.fd, &m.base, s->err, sizeof s->err);
    }
    return rc ? rc : add_mem(s, m, out);
}

static int plan_room(bkt_plan *p, uint32_t pieces, uint32_t buckets)
{
    bkt_piece *np = realloc(p->pieces, ((size_t)pieces + 1) * sizeof *np);
    if (np)
        p->pieces = np;
    bkt_span *nb = realloc(p->buckets, ((size_t)buckets + 1) * sizeof *nb);
    if (nb)
        p->buckets = nb;
    if (!np || !nb)
        return REFIT_ENOMEM;
    p->cap_pieces = pieces;
    p->cap_buckets = buckets;
    return REFIT_OK;
}

/* Each tensor's bytes and where its data is now; sets *moved when the
 * layout no longer fits them. */
static int take_views(refit_ipc_sender *s, bool *moved)
{
    for (uint32_t i = 0; i < s->n; i++) {
        snd_tensor *st = &s->ts[i];
        refit_view v;
        if (xport_view(st->t, &v)) {
            snprintf(s->err, sizeof s->err, "%s: bad tensor (dims, shape or dtype)", st->name);
            return REFIT_EINVAL;
        }
        int64_t numel = kern_view_numel(&v);
        uint64_t bytes = bkt_bytes(v.dtype, numel);
        if (bytes == UINT64_MAX) {
            snprintf(s->err, sizeof s->err, "%s: shape overflows", st->name);
            return REFIT_EINVAL;
        }
        if (st->how == REFIT_IPC_SHARE && bytes && !xport_view_contiguous(&v)) {
            snprintf(s->err, sizeof s->err, "%s: a SHARE tensor must be contiguous (add it "
                     "with REFIT_IPC_PACK)", st->name);
            return REFIT_EINVAL;
        }
        bool share = st->how == REFIT_IPC_SHARE && bytes;
        *moved |= st->bytes != bytes || (share && st->data != v.data);
        st->data = v.data;
        st->bytes = bytes;
    }
    return REFIT_OK;
}

static int lay_out_kinds(refit_ipc_sender *s);

/* Bytes from off to the end of the patch whose indices are tensor i: its
 * entries stay in one bucket. */
static uint64_t patch_bytes(const refit_ipc_sender *s, uint32_t i, uint64_t off)
{
    uint64_t end = off + s->ts[i].bytes;
    for (uint32_t j = i + 1; j < s->n && (s->ts[j].kind == BKT_E_DELTA_COUNTS ||
                                         s->ts[j].kind == BKT_E_DELTA_VALUES); j++)
        end = bkt_align(end) + s->ts[j].bytes;
    return end - off;
}

static int lay_out(refit_ipc_sender *s)
{
    uint64_t cap = s->o.bucket_bytes ? s->o.bucket_bytes : BKT_DEFAULT_BYTES;
    uint32_t n_old = 0;
    uint32_t *old = malloc((s->n_packed + 1u) * sizeof *old);
    if (!old)
        return REFIT_ENOMEM;
    for (uint32_t b = 0; s->laid_out_once && b < s->n_packed; b++, n_old++) {
        old[n_old] = UINT32_MAX; /* the memory bucket b of the last layout had */
        for (uint32_t i = 0; i < s->n_mems; i++)
            if (s->mems[i].bucket && s->mems[i].d.id == s->refs[b].mem)
                old[n_old] = i;
    }
    /* packed buckets: whole tensors, 256-aligned, a new bucket when full */
    uint32_t nb = 0, n_pack = 0;
    uint64_t at = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        snd_tensor *st = &s->ts[i];
        if (st->how == REFIT_IPC_SHARE && st->bytes)
            continue;
        uint64_t off = bkt_align(at);
        uint64_t need = st->kind == BKT_E_DELTA_INDICES ? patch_bytes(s, i, off) : st->bytes;
        if (n_pack && off + need > cap && (st->kind == BKT_E_WHOLE ||
                                           st->kind == BKT_E_DELTA_INDICES)) {
            nb++;
            off = 0;
        }
        st->bucket = nb;
        st->offset = off;
        at = off + st->bytes;
        n_pack++;
    }
    uint32_t n_packed = n_pack ? nb + 1 : 0, n_share = s->n - n_pack;
    uint32_t n_buckets = n_packed + n_share;
    int rc = REFIT_OK;
    if (n_buckets == 0) {
        snprintf(s->err, sizeof s->err, "nothing to send: add tensors first");
        rc = REFIT_EINVAL;
    }
    if (!rc && (rc = plan_room(&s->plan, s->n, n_buckets)) == REFIT_OK) {
        ipc_ref *nr = realloc(s->refs, (size_t)n_buckets * sizeof *nr);
        uint64_t *ns = realloc(s->sums, (size_t)n_buckets * sizeof *ns);
        bkt_tensor *nt = realloc(s->bt, ((size_t)s->n + 1) * sizeof *nt);
        if (nr)
            s->refs = nr;
        if (ns)
            s->sums = ns;
        if (nt)
            s->bt = nt;
        rc = nr && ns && nt ? REFIT_OK : REFIT_ENOMEM;
    }
    for (uint32_t i = 0; i < s->n_mems; i++)
        s->mems[i].used = false;
    bkt_plan *p = &s->plan;
    p->n_pieces = 0;
    p->n_buckets = n_buckets;
    p->n_direct = n_share;
    for (uint32_t b = 0; !rc && b < n_packed; b++)
        p->buckets[b] = (bkt_span){.first = UINT32_MAX};
    /* the packed tensors' pieces first, in order (each bucket's pieces are
     * consecutive), then one DIRECT bucket per SHARE tensor */
    uint32_t sb = n_packed;
    for (int pass = 0; !rc && pass < 2; pass++)
        for (uint32_t i = 0; !rc && i < s->n; i++) {
            snd_tensor *st = &s->ts[i];
            const refit_tensor *t = st->t;
            bool share = st->how == REFIT_IPC_SHARE && st->bytes;
            if (share != (pass == 1))
                continue;
            s->bt[i] = (bkt_tensor){.name = st->name, .dtype = t->dtype, .ndim = t->ndim,
                                    .shape = t->shape};
            uint32_t b = share ? sb++ : st->bucket;
            bkt_span *sp = &p->buckets[b];
            if (share) {
                snd_mem *m;
                if ((rc = share_mem(s, st, &m)))
                    break;
                m->used = true;
                *sp = (bkt_span){.first = p->n_pieces, .n = 1, .payload_bytes = st->bytes,
                                 .direct = true};
                s->refs[b] = (ipc_ref){.mem = m->d.id,
                                       .offset = (uint64_t)((char *)st->data - (char *)m->base)};
                st->offset = 0;
            } else {
                if (sp->first == UINT32_MAX)
                    sp->first = p->n_pieces;
                sp->n++;
                sp->payload_bytes = st->offset + st->bytes;
            }
            int64_t rows = t->ndim ? t->shape[0] : 1;
            p->pieces[p->n_pieces++] = (bkt_piece){.tensor = i, .rows = rows,
                                                   .offset = st->offset, .bytes = st->bytes};
        }
    /* packed tensors were added in order, so each bucket's pieces are
     * consecutive; their memory */
    for (uint32_t b = 0; !rc && b < n_packed; b++) {
        snd_mem *m;
        rc = bucket_mem(s, b, BKT_ALIGN + p->buckets[b].payload_bytes, old, n_old, &m);
        if (!rc) {
            m->used = true;
            m->bucket = true;
            s->refs[b] = (ipc_ref){.mem = m->d.id};
        }
    }
    /* buckets of an older layout no longer used are freed; compact */
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->n_mems; i++) {
        snd_mem *m = &s->mems[i];
        if (!m->used && (m->bucket || !m->owned)) {
            mem_release(s, m);
            continue;
        }
        s->mems[k++] = *m;
    }
    s->n_mems = k;
    free(old);
    if (rc) {
        s->n_packed = 0;
        s->laid_out = false;
        s->epoch++; /* the workers' tables are stale either way */
        return rc;
    }
    p->max_total = p->total_payload = 0;
    for (uint32_t b = 0; b < n_buckets; b++) {
        uint64_t t = bkt_total(p, b);
        p->max_total = t > p->max_total ? t : p->max_total;
        p->total_payload += p->buckets[b].payload_bytes;
    }
    s->n_packed = n_packed;
    s->epoch++;
    s->laid_out = s->laid_out_once = true;
    return lay_out_kinds(s);
}

/* The patches' entry kinds, for the headers (bkt_header_encode). */
static int lay_out_kinds(refit_ipc_sender *s)
{
    s->plan.kinds = NULL;
    if (!s->n_patches)
        return REFIT_OK;
    uint8_t *k = realloc(s->kinds, (size_t)s->n + 1);
    if (!k) {
        s->laid_out = false;
        snprintf(s->err, sizeof s->err, "out of memory");
        return REFIT_ENOMEM;
    }
    s->kinds = k;
    for (uint32_t i = 0; i < s->n; i++)
        k[i] = s->ts[i].kind;
    s->plan.kinds = k;
    return REFIT_OK;
}

/* ---- one send ---- */

static snd_mem *mem_by_id(refit_ipc_sender *s, uint32_t id)
{
    for (uint32_t i = 0; i < s->n_mems; i++)
        if (s->mems[i].d.id == id)
            return &s->mems[i];
    return NULL;
}

static uint8_t *payload_of(refit_ipc_sender *s, uint32_t b)
{
    snd_mem *m = mem_by_id(s, s->refs[b].mem);
    return (uint8_t *)m->base + s->refs[b].offset + (s->plan.buckets[b].direct ? 0 : BKT_ALIGN);
}

/* PACK tensors into their buckets on the trainer's stream, then the event
 * after them (and after whatever the trainer queued there before: its
 * optimizer's writes to SHARE tensors). */
static int pack(refit_ipc_sender *s)
{
    const backend *be = backend_for_device(s->dev);
    if (!be) {
        snprintf(s->err, sizeof s->err, "no backend serves device type %d here (built "
                 "without CUDA?)", s->dev.device_type);
        return REFIT_EUNSUPPORTED;
    }
    uint32_t queued = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        snd_tensor *st = &s->ts[i];
        if ((st->how == REFIT_IPC_SHARE && st->bytes) || !st->bytes)
            continue;
        queued++;
        refit_view src, dst;
        (void)xport_view(st->t, &src);
        if (xport_view_contiguous(&src)) {
            src.dtype = REFIT_U8;
            src.ndim = 1;
            src.shape[0] = (int64_t)st->bytes;
            src.strides[0] = 1;
        } else if (!kern_dtype_size(src.dtype)) {
            snprintf(s->err, sizeof s->err, "%s: a strided tensor of sub-byte elements cannot "
                     "be packed", st->name);
            return REFIT_EUNSUPPORTED;
        }
        dst = src;
        dst.data = payload_of(s, st->bucket) + st->offset;
        dst.device = s->dev;
        int64_t stride = 1;
        for (int d = dst.ndim - 1; d >= 0; d--) {
            dst.strides[d] = stride;
            stride *= dst.shape[d] > 0 ? dst.shape[d] : 1;
        }
        int rc = be->can_read(src.device) ? be->copy(&dst, &src, s->o.stream)
                                          : REFIT_EUNSUPPORTED;
        if (rc) {
            (void)be->sync(s->o.stream);
            snprintf(s->err, sizeof s->err, "packing %s: %s (%s)", st->name, refit_strerror(rc),
                     be->last_error());
            return rc;
        }
    }
    int rc = !queued ? REFIT_OK : s->o.device < 0 ? be->sync(s->o.stream)
                                                  : be->flush(s->o.stream);
    if (rc) {
        snprintf(s->err, sizeof s->err, "packing copies: %s (%s)", refit_strerror(rc),
                 be->last_error());
        return rc;
    }
    if (s->o.device < 0)
        return REFIT_OK;
    if (!s->has_event) {
        if ((rc = ipc_cuda_event_export(&s->cu, &s->ev, s->ev_handle, s->err, sizeof s->err)))
            return rc;
        s->has_event = true;
        s->epoch++; /* the table carries the event handle */
    }
    CUresult r = s->cu.cu.EventRecord(s->ev, (CUstream)s->o.stream);
    if (r != CU_SUCCESS) {
        snprintf(s->err, sizeof s->err, "cuEventRecord: %s", cu_errstr(&s->cu.cu, r));
        return REFIT_EIO;
    }
    return REFIT_OK;
}

static int checksums(refit_ipc_sender *s)
{
    const backend *be = backend_for_device(s->dev);
    for (uint32_t b = 0; b < s->plan.n_buckets; b++) {
        s->sums[b] = 0;
        if (!s->o.checksum)
            continue;
        refit_view v = {.data = payload_of(s, b), .device = s->dev, .dtype = REFIT_U8,
                        .ndim = 1, .shape = {(int64_t)s->plan.buckets[b].payload_bytes},
                        .strides = {1}};
        int rc = be->fingerprint(&v, &s->sums[b], s->o.stream);
        if (rc) {
            snprintf(s->err, sizeof s->err, "bucket %u: checksum: %s", b, be->last_error());
            return rc;
        }
    }
    return REFIT_OK;
}

static uint64_t fresh_nonce(uint64_t seq)
{
    uint64_t n = 0;
    if (getrandom(&n, sizeof n, GRND_NONBLOCK) != (ssize_t)sizeof n) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        n = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 48);
    }
    return n ^ seq;
}

/* The INDEX frame of this layout into s->iframe: the NCCL wire's index
 * (version label empty: each UPDATE carries it), encoded once per layout
 * and table. */
static int encode_index(refit_ipc_sender *s)
{
    bkt_plan *p = &s->plan;
    uint64_t total = 0;
    for (uint32_t b = 0; b < p->n_buckets; b++) {
        bkt_span *sp = &p->buckets[b];
        uint64_t hb = BKT_FIXED_HEADER + 8;
        for (uint32_t k = 0; k < sp->n; k++) {
            const bkt_tensor *t = &s->bt[p->pieces[sp->first + k].tensor];
            hb += BKT_FIXED_ENTRY + 8u * (uint64_t)t->ndim + strlen(t->name);
        }
        if (hb > BKT_MAX_HEADER) {
            snprintf(s->err, sizeof s->err, "bucket %u: a header of %llu bytes (at most %u): "
                     "use smaller buckets", b, (unsigned long long)hb, BKT_MAX_HEADER);
            return REFIT_EINVAL;
        }
        sp->header_bytes = (uint32_t)hb;
        total += hb;
    }
    if (total > BKT_MAX_INDEX || total + (uint64_t)p->n_buckets * IPC_REF_REC + 1024 >
                                     IPC_MAX_PAYLOAD) {
        snprintf(s->err, sizeof s->err, "an index of %llu bytes for %u buckets is too large",
                 (unsigned long long)total, p->n_buckets);
        return REFIT_EINVAL;
    }
    if (total > s->index_cap) {
        uint8_t *ni = realloc(s->index, total);
        if (!ni)
            return REFIT_ENOMEM;
        s->index = ni;
        s->index_cap = total;
    }
    uint64_t nonce = fresh_nonce(s->seq);
    uint8_t *q = s->index;
    for (uint32_t b = 0; b < p->n_buckets; b++) {
        bkt_header_encode(q, p, b, s->bt, "", nonce);
        q += p->buckets[b].header_bytes;
    }
    bkt_announce an = {.flags = s->o.checksum ? BKT_A_PAYLOAD_SUM : 0,
                       .n_buckets = p->n_buckets, .first_header = p->buckets[0].header_bytes,
                       .nonce = nonce, .index_bytes = total, .first_total = bkt_total(p, 0),
                       .max_total = p->max_total, .total_payload = p->total_payload,
                       .n_entries = p->n_pieces};
    uint8_t ab[BKT_ANNOUNCE_BYTES];
    bkt_announce_encode(ab, &an);
    s->ix_id = s->ix_id == UINT32_MAX ? 1 : s->ix_id + 1;
    ipc_index x = {.id = s->ix_id, .epoch = s->epoch, .n_buckets = p->n_buckets,
                   .refs = s->refs, .index = s->index, .index_bytes = total};
    s->iframe.len = 0;
    ipc_index_encode(&s->iframe, &x, ab);
    if (s->iframe.failed) {
        ipc_wbuf_free(&s->iframe);
        s->ix_epoch = 0;
        return REFIT_ENOMEM;
    }
    s->ix_epoch = s->epoch;
    return REFIT_OK;
}

/* The UPDATE frame of this send into s->frame (the index made first when
 * the layout or the table changed). */
static int encode_update(refit_ipc_sender *s)
{
    int rc = s->ix_epoch != s->epoch ? encode_index(s) : REFIT_OK;
    if (rc)
        return rc;
    ipc_update u = {.seq = s->seq, .epoch = s->epoch,
                    .flags = (s->o.device >= 0 ? IPC_U_EVENT : 0) |
                             (s->o.checksum ? IPC_U_SUMS : 0),
                    .index_id = s->ix_id, .n_buckets = s->plan.n_buckets};
    ipc_copy_str(u.label, sizeof u.label, s->label);
    s->frame.len = 0;
    s->frame.failed = 0;
    ipc_update_encode(&s->frame, &u, s->sums);
    return s->frame.failed ? REFIT_ENOMEM : REFIT_OK;
}

static int send_mems(refit_ipc_sender *s, snd_worker *w, double dl)
{
    ipc_mems t = {.epoch = s->epoch, .n = 0, .has_event = s->has_event};
    memcpy(t.event, s->ev_handle, IPC_HANDLE_BYTES);
    t.m = malloc(((size_t)s->n_mems + 1) * sizeof *t.m);
    if (!t.m)
        return REFIT_ENOMEM;
    for (uint32_t i = 0; i < s->n_mems; i++)
        if (s->mems[i].used)
            t.m[t.n++] = s->mems[i].d;
    int fds[IPC_MAX_FDS];
    uint16_t nf = 0;
    for (uint32_t i = 0; i < t.n; i++)
        nf += t.m[i].kind == IPC_MEM_HOST_FD;
    int rc = REFIT_OK;
    if (nf > IPC_MAX_FDS) {
        snprintf(s->err, sizeof s->err, "%u host memories: at most %d (use larger buckets)",
                 nf, IPC_MAX_FDS);
        rc = REFIT_EUNSUPPORTED;
    }
    ipc_wbuf b = {0};
    if (!rc) {
        nf = ipc_mems_fds(&t, fds, IPC_MAX_FDS);
        ipc_mems_encode(&b, &t);
        rc = b.failed ? REFIT_ENOMEM
                      : ipc_send(w->fd, IPC_MEMS, b.p, (uint32_t)b.len, fds, nf, dl, s->err,
                                 sizeof s->err);
    }
    ipc_wbuf_free(&b);
    free(t.m);
    if (!rc)
        w->epoch = s->epoch;
    return rc;
}

static int send_status(refit_ipc_sender *s, snd_worker *w, uint16_t type, int status,
                       const char *msg, double dl)
{
    ipc_wbuf *b = &s->sbuf;
    b->len = 0;
    b->failed = 0;
    ipc_status_encode(b, s->seq, status, msg);
    return b->failed ? REFIT_ENOMEM
                     : ipc_send(w->fd, type, b->p, (uint32_t)b->len, NULL, 0, dl, s->err,
                                sizeof s->err);
}

/* The status frame of update seq from w: busy-polled for spin_s (a reply
 * expected soon), then waited for in poll by dl. */
static int recv_status(refit_ipc_sender *s, snd_worker *w, uint16_t type, uint64_t seq,
                       ipc_status_msg *m, double dl)
{
    ipc_frame f;
    double spin = spin_of(s);
    if (spin > 0)
        (void)ipc_spin_readable(w->fd, ipc_now() + spin);
    int rc = ipc_recv(w->fd, &f, IPC_MAX_MSG + 64, dl, s->err, sizeof s->err);
    if (rc)
        return rc;
    if (f.type != type) {
        snprintf(s->err, sizeof s->err, "a %s frame where %s was expected",
                 ipc_type_name(f.type), ipc_type_name(type));
        rc = REFIT_ECORRUPT;
    } else {
        rc = ipc_status_decode(m, &f, seq, s->err, sizeof s->err);
    }
    ipc_frame_free(&f);
    return rc;
}

/* The RESULT of w's last commit, which that send did not wait for: it was
 * written right after the commit, so it is here (or the worker is gone:
 * dropped, reconnected by the caller). */
static void take_result(refit_ipc_sender *s, snd_worker *w, double dl)
{
    if (w->fd < 0 || !w->result_seq)
        return;
    ipc_status_msg m;
    if (recv_status(s, w, IPC_RESULT, w->result_seq, &m, dl))
        drop_worker(w);
    w->result_seq = 0;
}

/* Phase one to every worker: (re)connect, MEMS when stale, UPDATE. A
 * worker that cannot be reached votes the failure. */
static void post_update(refit_ipc_sender *s, int *vote, char (*why)[256], double dl)
{
    for (int i = 0; i < s->n_w; i++)
        take_result(s, &s->w[i], dl);
    s->prof.results_ns = ipc_now_ns();
    for (int i = 0; i < s->n_w; i++) {
        snd_worker *w = &s->w[i];
        int rc = w->fd < 0 ? connect_worker(s, w) : REFIT_OK;
        if (!rc && w->epoch != s->epoch) {
            rc = send_mems(s, w, dl);
            w->ix_id = 0; /* a new table: the index again */
        }
        if (!rc && w->ix_id != s->ix_id) {
            rc = ipc_send(w->fd, IPC_INDEX, s->iframe.p, (uint32_t)s->iframe.len, NULL, 0, dl,
                          s->err, sizeof s->err);
            w->ix_id = rc ? 0 : s->ix_id;
        }
        if (!rc)
            rc = ipc_send(w->fd, IPC_UPDATE, s->frame.p, (uint32_t)s->frame.len, NULL, 0, dl,
                          s->err, sizeof s->err);
        if (rc) {
            vote[i] = rc;
            ipc_copy_str(why[i], sizeof why[i], s->err);
            drop_worker(w);
        }
    }
}

static int send_update(refit_ipc_sender *s, refit_group_result *out);

int refit_ipc_sender_send(refit_ipc_sender *s, refit_group_result *out)
{
    if (!s)
        return REFIT_EINVAL;
    int rc = send_update(s, out);
    uint64_t extra = 0; /* a patch is one tensor, not its two or three entries */
    for (uint32_t i = 0; s->n_patches && i < s->n; i++)
        extra += s->ts[i].kind == BKT_E_DELTA_COUNTS || s->ts[i].kind == BKT_E_DELTA_VALUES;
    if (out && out->tensors >= extra)
        out->tensors -= extra;
    drop_patches(s);
    return rc;
}

static int send_update(refit_ipc_sender *s, refit_group_result *out)
{
    ctx_clear_error(s->ctx);
    refit_ipc_send_profile *pf = &s->prof;
    memset(pf, 0, sizeof *pf);
    pf->start_ns = ipc_now_ns();
    double t0 = ipc_now();
    refit_group_result res = {.decision = REFIT_OK, .failed_rank = -1, .vote_taken = 1};
    ipc_copy_str(res.version_label, sizeof res.version_label, s->label);
    s->seq++;
    pf->seq = s->seq;
    bool moved = !s->laid_out;
    int rc = s->cu.open ? ipc_cuda_enter(&s->cu, s->err, sizeof s->err) : REFIT_OK;
    if (!rc)
        rc = take_views(s, &moved);
    if (!rc && moved)
        rc = lay_out(s);
    if (!rc)
        rc = pack(s);
    if (!rc)
        rc = checksums(s);
    pf->packed_ns = ipc_now_ns();
    if (!rc)
        rc = encode_update(s);
    pf->encoded_ns = ipc_now_ns();
    if (rc) {
        res.decision = res.local_status = rc;
        if (out)
            *out = res;
        pf->end_ns = ipc_now_ns();
        return s_err(s, rc);
    }
    int *vote = s->vote;
    char (*why)[256] = s->why;
    memset(vote, 0, (size_t)s->n_w * sizeof *vote);
    double dl = deadline_of(s);
    post_update(s, vote, why, dl);
    pf->posted_ns = ipc_now_ns();
    for (int i = 0; i < s->n_w; i++) {
        ipc_status_msg m;
        if (s->w[i].fd < 0)
            continue;
        if ((rc = recv_status(s, &s->w[i], IPC_VOTE, s->seq, &m, dl))) {
            vote[i] = rc;
            ipc_copy_str(why[i], sizeof why[i], s->err);
            drop_worker(&s->w[i]);
            res.vote_taken = 0;
        } else {
            vote[i] = m.status;
            ipc_copy_str(why[i], sizeof why[i], m.msg);
        }
    }
    pf->voted_ns = ipc_now_ns();
    for (int i = 0; i < s->n_w; i++)
        if (vote[i] && res.decision == REFIT_OK) {
            res.decision = vote[i];
            res.failed_rank = i;
        }
    /* keepers last: a keeper holds a commit only once every worker was
     * sent it (a trainer that dies in between leaves the keeper without a
     * decision, so it keeps the version before and serves nothing) */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < s->n_w; i++)
            if (s->w[i].fd >= 0 && s->w[i].keeper == (pass == 1) &&
                send_status(s, &s->w[i], IPC_DECISION, res.decision,
                            res.decision ? why[res.failed_rank] : "", dl))
                drop_worker(&s->w[i]);
    pf->decided_ns = ipc_now_ns();
    res.worker_status = REFIT_OK;
    for (int i = 0; i < s->n_w; i++) {
        ipc_status_msg m;
        if (s->w[i].fd < 0)
            continue;
        if (!res.decision) {
            /* every worker prepared, so its reads of this memory are done
             * and its commit cannot fail: the next send reads the RESULT */
            s->w[i].result_seq = s->seq;
            continue;
        }
        if (recv_status(s, &s->w[i], IPC_RESULT, s->seq, &m, dl))
            drop_worker(&s->w[i]);
        else if (m.status && !res.worker_status)
            res.worker_status = m.status; /* a worker POISONED by the abort */
    }
    res.buckets = s->plan.n_buckets;
    res.tensors = s->plan.n_pieces;
    res.bytes = s->plan.total_payload;
    res.seconds = ipc_now() - t0;
    rc = res.decision;
    if (rc)
        ctx_error(s->ctx, rc, "ipc sender: update %llu aborted: worker %d voted %s: %s",
                  (unsigned long long)s->seq, res.failed_rank, refit_status_name(rc),
                  why[res.failed_rank]);
    if (out)
        *out = res;
    pf->end_ns = ipc_now_ns();
    return rc;
}

int refit_ipc_sender_profile(const refit_ipc_sender *s, refit_ipc_send_profile *out)
{
    if (!s || !out)
        return REFIT_EINVAL;
    *out = s->prof;
    return REFIT_OK;
}
