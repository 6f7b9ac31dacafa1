/*
 * The worker side of the IPC transport (include/refit/ipc.h). One update:
 *
 *   accept      a trainer, when none is connected (HELLO both ways)
 *   MEMS        the memory table: each memory opened once and kept while
 *               the trainer sends it unchanged (same id, generation, handle)
 *   INDEX       once per layout: decoded and checked whole, the bucket map
 *               against the table (memory known, bucket inside it), the
 *               announce and every header (transports/nccl/bucket.c's decoders),
 *               then every piece against the model (name expected, dtype,
 *               shape, no duplicate); kept, or its refusal kept for the
 *               UPDATE that names it
 *   UPDATE      decoded; the index it names must be the one held, checked,
 *               of the current table, with as many buckets (and the filter
 *               asked again): a refusal votes the error, writes nothing,
 *               begins nothing
 *   begin, then the worker's stream waits on the trainer's event (device:
 *               cuStreamWaitEvent, no host round trip), checksums if sent
 *               (before any write), every piece loaded from where it lies
 *               in the trainer's memory (the core's DIRECT, VIEW or STAGED
 *               route), refit_finalize_prepare
 *   VOTE, then DECISION by the deadline: commit, or abort (rollback, or
 *               POISONED without it); the trainer gone or silent past the
 *               deadline aborts, journals why and drops the connection;
 *               RESULT
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transports/ipc/receiver.h"

#include "core/util.h"
#include "core/ctx.h"
#include "core/model.h"
#include "transports/ipc/keeper_restore.h"
#include "transports/ipc/mem.h"
#include "core/names.h"
#include "transports/nccl/xport.h"
#include "kernels/copy.h"

typedef struct rcv_mem {
    ipc_mem_desc d;             /* d.fd: not kept (-1) */
    void *base;
} rcv_mem;

typedef struct rcv_piece {
    size_t name;                /* offset in the arena */
    bool skip;                  /* the filter said no (this update) */
    refit_dtype dtype;
    int32_t ndim;
    int64_t shape[REFIT_MAX_DIMS];
    bool part;
    int64_t row_offset;
    void *data;
    refit_device dev;
    uint8_t kind;               /* BKT_E_*: a patch is its indices piece and the next */
} rcv_piece;

typedef struct rcv_bucket {
    uint8_t *payload;
    uint64_t bytes;
    refit_device dev;
} rcv_bucket;

struct refit_ipc_receiver {
    refit_model *m;
    refit_ctx *ctx;
    refit_ipc_recv_opts o;
    char *path;
    int lfd, fd;
    ipc_sock_id sock_id;        /* the socket file bound (destroy unlinks only it) */
    uint32_t *allow;            /* opts' allow_uids, copied */
    uint32_t peer_uid;          /* the connected trainer's (SO_PEERCRED) */
    int32_t peer_pid;
    char refused[320];          /* the last peer refused in this call, for the timeout */
    uint64_t max_entries;       /* index entries the model can take: a whole tensor
                                   once, or a part per row of dim 0 at most */
    rcv_mem *mems;
    uint32_t n_mems, cap_mems, epoch;
    bool has_event;
    CUevent ev;
    uint8_t ev_handle[IPC_HANDLE_BYTES];
    ipc_cuda cu;
    bkt_header h;
    /* the trainer's index (INDEX), walked and checked once per layout */
    uint32_t ix_id, ix_epoch, ix_buckets;
    bool ix_sums;               /* its announce promises a checksum per bucket */
    uint64_t ix_total;          /* payload bytes */
    int ix_rc;                  /* refused: the UPDATE naming it votes this */
    char ix_err[1024];
    rcv_bucket *bk;             /* per bucket of the index */
    uint32_t cap_bk;
    rcv_piece *pc;
    uint32_t n_pc, cap_pc;
    char *arena;
    size_t arena_len, arena_cap;
    uint8_t *seen;              /* per route: delivered whole by this index */
    int64_t *rows;              /* per route: rows delivered in parts */
    /* the whole pieces as a prepared source set, kept while the index
     * lays them out the same (names, dtypes, shapes, where they lie) */
    refit_source_set *set;
    rcv_piece *set_pc;
    uint32_t set_n;
    char *set_arena;
    size_t set_arena_len;
    char label[BKT_MAX_LABEL + 1];
    refit_ipc_stats st;
    refit_ipc_recv_profile prof;
    CUevent pev[3];             /* profile_gpu: before the wait, after it, after the copies */
    bool has_pev;
    ipc_wbuf sbuf;              /* status frames */
    uint32_t role;              /* its HELLO's: a worker, or a keeper following */
    /* this update's vote, sent once: before a local abort that waits for
     * a keeper (vote_before_keeper), else after the prepare */
    uint64_t vote_seq;
    bool voted;
    int vote_rc;                /* its send's status */
    char err[1024];
};

static double timeout_of(const refit_ipc_receiver *r)
{
    return r->o.timeout_s > 0 ? r->o.timeout_s : 300.0;
}

static double spin_of(const refit_ipc_receiver *r)
{
    return r->o.spin_s > 0 ? r->o.spin_s : r->o.spin_s < 0 ? 0 : 0.002;
}

int refit_ipc_receiver_create(refit_ipc_receiver **out, refit_model *model, const char *path,
                              const refit_ipc_recv_opts *opt)
{
    if (!out || !model)
        return REFIT_EINVAL;
    *out = NULL;
    refit_ctx *ctx = model->ctx;
    ctx_clear_error(ctx);
    if (opt && (opt->version < 1 || opt->version > REFIT_IPC_RECV_OPTS_VERSION))
        return ctx_error(ctx, REFIT_EINVAL, "invalid version %u on refit_ipc_recv_opts",
                         opt->version);
    if (!model->sealed)
        return ctx_error(ctx, REFIT_ESTATE, "ipc receiver: seal the model first");
    refit_ipc_receiver *r = calloc(1, sizeof *r);
    if (!r)
        return ctx_error(ctx, REFIT_ENOMEM, "ipc receiver: out of memory");
    r->m = model;
    r->ctx = ctx;
    r->o = (refit_ipc_recv_opts)REFIT_IPC_RECV_OPTS_INIT;
    if (opt) /* an older caller's struct ends where its version did */
        memcpy(&r->o, opt, opt->version == 1   ? offsetof(refit_ipc_recv_opts, spin_s)
                           : opt->version == 2 ? offsetof(refit_ipc_recv_opts, socket_mode)
                                               : sizeof r->o);
    r->fd = r->lfd = -1;
    r->o.allow_uids = NULL; /* borrowed: the copy is r->allow */
    int rc = REFIT_OK;
    if (opt && opt->version >= 3 && opt->n_allow_uids) {
        if (!opt->allow_uids || opt->n_allow_uids > 65536)
            rc = ctx_error(ctx, REFIT_EINVAL, "ipc receiver: %u allow_uids%s (at most 65536)",
                           opt->n_allow_uids, opt->allow_uids ? "" : " and no array");
        else if (!(r->allow = malloc(opt->n_allow_uids * sizeof *r->allow)))
            rc = ctx_error(ctx, REFIT_ENOMEM, "ipc receiver: out of memory");
        else
            memcpy(r->allow, opt->allow_uids, opt->n_allow_uids * sizeof *r->allow);
    }
    for (uint32_t i = 0; i < model->n_routes; i++) {
        const route *ro = &model->routes[i];
        const refit_ckpt_spec *sp = ro->flags & ROUTE_ALIAS ? &model->routes[ro->tie].spec
                                                            : &ro->spec;
        /* at least a patch's three entries */
        r->max_entries += sp->ndim >= 1 && sp->shape[0] > 3 ? (uint64_t)sp->shape[0] : 3;
    }
    r->path = xstrdup(path ? path : "");
    if (!rc && !r->path)
        rc = ctx_error(ctx, REFIT_ENOMEM, "ipc receiver: out of memory");
    if (!rc && (rc = ipc_listen(path, r->o.socket_mode ? r->o.socket_mode : 0600, &r->lfd,
                                &r->sock_id, r->err, sizeof r->err)))
        rc = ctx_error(ctx, rc, "ipc receiver: %s", r->err);
    if (rc) {
        free(r->allow);
        free(r->path);
        free(r);
        return rc;
    }
    *out = r;
    return REFIT_OK;
}

static void close_mem(refit_ipc_receiver *r, rcv_mem *m)
{
    ipc_mem_close(&r->cu, &m->d, m->base);
    r->st.handles_closed++;
}

/* The trainer is gone: what it shared goes with it. */
static void drop_peer(refit_ipc_receiver *r)
{
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    for (uint32_t i = 0; i < r->n_mems; i++)
        close_mem(r, &r->mems[i]);
    r->n_mems = 0;
    r->epoch = 0;
    r->ix_id = 0;
    if (r->has_event)
        r->cu.cu.EventDestroy(r->ev);
    r->has_event = false;
}

static void drop_profile_events(refit_ipc_receiver *r)
{
    for (int i = 0; r->has_pev && i < 3; i++)
        r->cu.cu.EventDestroy(r->pev[i]);
    r->has_pev = false;
}

void refit_ipc_receiver_destroy(refit_ipc_receiver *r)
{
    if (!r)
        return;
    drop_peer(r);
    if (r->lfd >= 0) {
        close(r->lfd);
        ipc_unlink_own(r->path, &r->sock_id);
    }
    free(r->path);
    free(r->allow);
    free(r->rows);
    free(r->mems);
    free(r->pc);
    free(r->bk);
    free(r->arena);
    free(r->seen);
    refit_source_set_destroy(r->set);
    free(r->set_pc);
    free(r->set_arena);
    bkt_header_free(&r->h);
    ipc_wbuf_free(&r->sbuf);
    drop_profile_events(r);
    if (r->cu.open)
        ipc_cuda_close(&r->cu);
    free(r);
}

int refit_ipc_receiver_stats(const refit_ipc_receiver *r, refit_ipc_stats *out)
{
    if (!r || !out)
        return REFIT_EINVAL;
    *out = r->st;
    return REFIT_OK;
}

int refit_ipc_receiver_profile(const refit_ipc_receiver *r, refit_ipc_recv_profile *out)
{
    if (!r || !out)
        return REFIT_EINVAL;
    *out = r->prof;
    return REFIT_OK;
}

/* ---- profile_gpu: CUDA events on the worker's stream ---- */

static void pev_record(refit_ipc_receiver *r, int i)
{
    if (!r->o.profile_gpu || !r->cu.open)
        return;
    if (!r->has_pev) {
        int k = 0;
        while (k < 3 && r->cu.cu.EventCreate(&r->pev[k], 0) == CU_SUCCESS)
            k++;
        if (k < 3) {
            while (k--)
                r->cu.cu.EventDestroy(r->pev[k]);
            return;
        }
        r->has_pev = true;
    }
    (void)r->cu.cu.EventRecord(r->pev[i], (CUstream)r->o.stream);
}

/* After the prepare (its sync): the events' times, when all were recorded
 * this update and have completed. */
static void pev_read(refit_ipc_receiver *r, bool recorded)
{
    refit_ipc_recv_profile *pf = &r->prof;
    float a = 0, b = 0;
    if (!recorded || !r->has_pev || !r->cu.EventElapsedTime ||
        r->cu.cu.EventQuery(r->pev[2]) != CU_SUCCESS ||
        r->cu.EventElapsedTime(&a, r->pev[0], r->pev[1]) != CU_SUCCESS ||
        r->cu.EventElapsedTime(&b, r->pev[1], r->pev[2]) != CU_SUCCESS)
        return;
    pf->gpu_wait_ms = a;
    pf->gpu_copy_ms = b;
    pf->copies_done_ns = pf->begun_ns + (uint64_t)(((double)a + b) * 1e6);
}

/* ---- the memory table ---- */

static rcv_mem *mem_find(refit_ipc_receiver *r, uint32_t id)
{
    for (uint32_t i = 0; i < r->n_mems; i++)
        if (r->mems[i].d.id == id)
            return &r->mems[i];
    return NULL;
}

static bool same_mem(const ipc_mem_desc *a, const ipc_mem_desc *b)
{
    return a->gen == b->gen && a->kind == b->kind && a->device == b->device &&
           a->bytes == b->bytes && !memcmp(a->handle, b->handle, IPC_HANDLE_BYTES);
}

/* Take a new table: memories kept where unchanged, the others opened; all
 * or nothing (on failure the old table stands). */
static int apply_mems(refit_ipc_receiver *r, ipc_frame *f)
{
    ipc_mems t;
    int rc = ipc_mems_decode(&t, f, r->err, sizeof r->err);
    if (rc)
        return rc;
    rcv_mem *nm = calloc((size_t)t.n + 1, sizeof *nm);
    bool *kept = calloc((size_t)r->n_mems + 1, sizeof *kept);
    uint32_t opened = 0;
    if (!nm || !kept)
        rc = REFIT_ENOMEM;
    for (uint32_t i = 0; !rc && i < t.n; i++) {
        nm[i].d = t.m[i];
        nm[i].d.fd = -1;
        rcv_mem *old = mem_find(r, t.m[i].id);
        if (old && same_mem(&old->d, &t.m[i])) {
            nm[i].base = old->base;
            kept[old - r->mems] = true;
            continue;
        }
        if ((rc = ipc_mem_open(&r->cu, &t.m[i], &nm[i].base, r->err, sizeof r->err)))
            break;
        opened = i + 1;
        nm[i].d.fd = -2; /* opened by this table */
    }
    CUevent ev = NULL;
    bool new_event = !rc && t.has_event &&
                     (!r->has_event || memcmp(t.event, r->ev_handle, IPC_HANDLE_BYTES));
    if (new_event) {
        int dev = -1;
        for (uint32_t i = 0; i < t.n && dev < 0; i++)
            if (t.m[i].kind == IPC_MEM_CUDA)
                dev = t.m[i].device;
        if (dev < 0) {
            snprintf(r->err, sizeof r->err, "MEMS: an event handle, and no CUDA memory");
            rc = REFIT_ECORRUPT;
        } else if (!(rc = ipc_cuda_open(&r->cu, dev, r->err, sizeof r->err))) {
            rc = ipc_event_open(&r->cu, t.event, &ev, r->err, sizeof r->err);
        }
    }
    if (rc) {
        for (uint32_t i = 0; i < opened; i++)
            if (nm[i].d.fd == -2)
                ipc_mem_close(&r->cu, &nm[i].d, nm[i].base);
        free(nm);
        free(kept);
        ipc_mems_free(&t);
        return rc;
    }
    for (uint32_t i = 0; i < r->n_mems; i++)
        if (!kept[i])
            close_mem(r, &r->mems[i]);
    for (uint32_t i = 0; i < t.n; i++) {
        if (nm[i].d.fd == -2)
            r->st.handles_opened++;
        else
            r->st.handles_cached++;
        nm[i].d.fd = -1;
    }
    if (new_event) {
        if (r->has_event)
            r->cu.cu.EventDestroy(r->ev);
        r->ev = ev;
        r->has_event = true;
        memcpy(r->ev_handle, t.event, IPC_HANDLE_BYTES);
        r->st.events_opened++;
    } else if (!t.has_event && r->has_event) {
        r->cu.cu.EventDestroy(r->ev);
        r->has_event = false;
    }
    free(r->mems);
    r->mems = nm;
    r->n_mems = r->cap_mems = t.n;
    r->epoch = t.epoch;
    r->ix_id = 0; /* an index lies in a table: the trainer sends it again */
    r->ix_rc = REFIT_OK;
    free(kept);
    ipc_mems_free(&t);
    return REFIT_OK;
}

/* ---- the update's index ---- */

static int add_piece(refit_ipc_receiver *r, const bkt_entry *e, uint8_t *payload,
                     refit_device dev)
{
    int rc = grow_array((void **)&r->pc, &r->cap_pc, r->n_pc, sizeof *r->pc);
    size_t nl = strlen(e->name) + 1;
    if (!rc && r->arena_len + nl > r->arena_cap) {
        size_t cap = r->arena_cap ? r->arena_cap : 4096;
        while (cap < r->arena_len + nl)
            cap *= 2;
        char *na = realloc(r->arena, cap);
        if (!na)
            return REFIT_ENOMEM;
        r->arena = na;
        r->arena_cap = cap;
    }
    if (rc)
        return rc;
    memcpy(r->arena + r->arena_len, e->name, nl);
    rcv_piece *p = &r->pc[r->n_pc++];
    memset(p, 0, sizeof *p); /* padding too: layouts are compared bytewise */
    *p = (rcv_piece){.name = r->arena_len, .dtype = e->dtype, .ndim = e->ndim, .part = e->part,
                     .row_offset = e->row_offset, .data = payload + e->offset, .dev = dev,
                     .kind = e->kind};
    memcpy(p->shape, e->shape, sizeof p->shape);
    if (e->part)
        p->shape[0] = e->rows;
    r->arena_len += nl;
    return REFIT_OK;
}

static const char *pc_name(const refit_ipc_receiver *r, const rcv_piece *p)
{
    return r->arena + p->name;
}

/* Start checking an index's pieces: no route delivered yet. */
static int pieces_begin(refit_ipc_receiver *r)
{
    size_t n = (size_t)r->m->n_routes + 1;
    uint8_t *seen = realloc(r->seen, n);
    if (seen)
        r->seen = seen;
    int64_t *rows = realloc(r->rows, n * sizeof *rows);
    if (rows)
        r->rows = rows;
    if (!seen || !rows)
        return REFIT_ENOMEM;
    memset(seen, 0, n);
    memset(rows, 0, n * sizeof *rows);
    return REFIT_OK;
}

/* A patch's piece (the header decoder checked its entries form one): its
 * indices piece names an expected tensor, delivered once; counts and
 * values go with it, skipped with it. What the patch holds is
 * refit_load_delta's to check, before it writes. */
static int check_patch_piece(refit_ipc_receiver *r, rcv_piece *p)
{
    if (p->kind == BKT_E_DELTA_COUNTS || p->kind == BKT_E_DELTA_VALUES) {
        p->skip = p[-1].skip; /* the decoder put its indices first */
        return REFIT_OK;
    }
    if (p->skip)
        return REFIT_OK;
    const char *name = pc_name(r, p);
    uint32_t ri = names_find(&r->m->route_names, name);
    if (ri == NAMES_NONE) {
        snprintf(r->err, sizeof r->err, "the index patches %.300s, which no module of worker "
                 "%s expects; nothing written", name, r->ctx->worker_id);
        return REFIT_EUNEXPECTED;
    }
    if (r->seen[ri]) {
        snprintf(r->err, sizeof r->err, "the index delivers %.300s twice (a patch); nothing "
                 "written", name);
        return REFIT_EDUPLICATE;
    }
    r->seen[ri] = 2;
    return REFIT_OK;
}

/* One piece against the model (after pieces_begin): the filter asked, the
 * name expected, dtype and shape, not delivered twice (a part's rows at
 * most the tensor's). */
static int check_piece(refit_ipc_receiver *r, rcv_piece *p)
{
    refit_model *m = r->m;
    const char *name = pc_name(r, p);
    p->skip = r->o.filter && !r->o.filter(r->o.filter_user, name);
    if (p->skip || p->kind >= BKT_E_DELTA_INDICES)
        return check_patch_piece(r, p);
    uint32_t ri = names_find(&m->route_names, name);
    if (ri == NAMES_NONE) {
        snprintf(r->err, sizeof r->err, "the index names %.300s, which no module of worker "
                 "%s expects; nothing written", name, r->ctx->worker_id);
        return REFIT_EUNEXPECTED;
    }
    const route *ro = &m->routes[ri];
    const refit_ckpt_spec *sp = ro->flags & ROUTE_ALIAS ? &m->routes[ro->tie].spec : &ro->spec;
    bool shape_ok = p->ndim == sp->ndim && kern_dtype_eq(p->dtype, sp->dtype);
    for (int d = 0; shape_ok && d < p->ndim; d++)
        shape_ok = p->part && d == 0 ? p->row_offset + p->shape[0] <= sp->shape[0]
                                     : p->shape[d] == sp->shape[d];
    if (!shape_ok) {
        snprintf(r->err, sizeof r->err, "the index gives %.300s as %s with %d dims; module %s "
                 "expects %s with %d dims of other extents; nothing written", name,
                 refit_dtype_name(p->dtype), p->ndim, m->modules[ro->module].name,
                 refit_dtype_name(sp->dtype), sp->ndim);
        return REFIT_EMISMATCH;
    }
    if (r->seen[ri] == 2 || (r->seen[ri] && !p->part) ||
        (p->part && p->shape[0] > sp->shape[0] - r->rows[ri])) {
        snprintf(r->err, sizeof r->err, "the index delivers %.300s twice%s; nothing written",
                 name, p->part ? " (more rows in parts than it has)" : "");
        return REFIT_EDUPLICATE;
    }
    r->seen[ri] = p->part ? 1 : 2;
    if (p->part)
        r->rows[ri] += p->shape[0];
    return REFIT_OK;
}

/* Every piece against the model, before anything begins. */
static int check_pieces(refit_ipc_receiver *r)
{
    int rc = pieces_begin(r);
    for (uint32_t i = 0; !rc && i < r->n_pc; i++)
        rc = check_piece(r, &r->pc[i]);
    return rc;
}

/* Walk the index (the NCCL wire's chain of headers), each bucket against
 * the memory it names and each piece against the model as it comes: an
 * index the model cannot take is refused at its announce (more entries
 * than the model has tensors, or rows for parts; without a filter) or at
 * its first piece the model refuses, never tabled whole first. Collects
 * the pieces and where each bucket lies. */
static int walk_index(refit_ipc_receiver *r, const ipc_index *u)
{
    r->n_pc = 0;
    r->arena_len = 0;
    /* a filter may skip what this model lacks (another stage's tensors):
     * then only what it keeps is bounded, by check_piece */
    if (!r->o.filter && (u->an.n_entries > r->max_entries || u->n_buckets > r->max_entries)) {
        snprintf(r->err, sizeof r->err, "INDEX: the announce lists %llu entries in %u buckets; "
                 "this model takes at most %llu (%u checkpoint tensors, each whole or in "
                 "parts of a row at least); nothing written",
                 (unsigned long long)u->an.n_entries, u->n_buckets,
                 (unsigned long long)r->max_entries, r->m->n_routes);
        return REFIT_EUNEXPECTED;
    }
    int rc = pieces_begin(r);
    if (rc)
        return rc;
    if (u->n_buckets > r->cap_bk) {
        rcv_bucket *nb = realloc(r->bk, (size_t)u->n_buckets * sizeof *nb);
        if (!nb)
            return REFIT_ENOMEM;
        r->bk = nb;
        r->cap_bk = u->n_buckets;
    }
    const uint8_t *q = u->index, *end = u->index + u->index_bytes;
    bkt_expect ex = {.index = 0, .n_buckets = u->n_buckets, .nonce = u->an.nonce,
                     .header_bytes = u->an.first_header, .total = u->an.first_total,
                     .max_total = u->an.max_total};
    uint64_t payload = 0, entries = 0;
    for (uint32_t b = 0; b < u->n_buckets; b++) {
        if (ex.header_bytes > (size_t)(end - q)) {
            snprintf(r->err, sizeof r->err, "INDEX: bucket %u's header (%u bytes) runs past "
                     "the index", b, ex.header_bytes);
            return REFIT_ECORRUPT;
        }
        if ((rc = bkt_header_decode(&r->h, q, &ex, r->err, sizeof r->err)))
            return rc;
        if (!b)
            ipc_copy_str(r->label, sizeof r->label, r->h.label);
        else if (strcmp(r->label, r->h.label)) {
            snprintf(r->err, sizeof r->err, "INDEX: bucket %u is labelled '%.200s', "
                     "bucket 0 '%.200s'", b, r->h.label, r->label);
            return REFIT_ECORRUPT;
        }
        if (r->h.n_entries > u->an.n_entries - entries) {
            snprintf(r->err, sizeof r->err, "INDEX: bucket %u brings the entries past the "
                     "%llu its announce lists", b, (unsigned long long)u->an.n_entries);
            return REFIT_ECORRUPT;
        }
        const ipc_ref *ref = &u->refs[b];
        rcv_mem *m = mem_find(r, ref->mem);
        if (!m) {
            snprintf(r->err, sizeof r->err, "INDEX: bucket %u names memory %u, which the "
                     "trainer never shared (table epoch %u)", b, ref->mem, r->epoch);
            return REFIT_ECORRUPT;
        }
        if (ref->offset > m->d.bytes || ex.total > m->d.bytes - ref->offset) {
            snprintf(r->err, sizeof r->err, "INDEX: bucket %u (%llu bytes at offset %llu) "
                     "runs past memory %u (%llu bytes)", b, (unsigned long long)ex.total,
                     (unsigned long long)ref->offset, ref->mem,
                     (unsigned long long)m->d.bytes);
            return REFIT_ECORRUPT;
        }
        refit_device dev = m->d.kind == IPC_MEM_CUDA
                               ? (refit_device){REFIT_DEVICE_CUDA, m->d.device}
                               : (refit_device){REFIT_DEVICE_CPU, 0};
        uint8_t *pl = (uint8_t *)m->base + ref->offset + r->h.payload_offset;
        r->bk[b] = (rcv_bucket){.payload = pl, .bytes = r->h.payload_bytes, .dev = dev};
        for (uint32_t k = 0; k < r->h.n_entries; k++)
            if ((rc = add_piece(r, &r->h.entries[k], pl, dev)) ||
                (rc = check_piece(r, &r->pc[r->n_pc - 1])))
                return rc;
        payload += r->h.payload_bytes;
        entries += r->h.n_entries;
        q += ex.header_bytes;
        ex = (bkt_expect){.index = b + 1, .n_buckets = u->n_buckets, .nonce = u->an.nonce,
                          .header_bytes = r->h.next_header, .total = r->h.next_total,
                          .max_total = u->an.max_total};
    }
    if (q != end || payload != u->an.total_payload || entries != u->an.n_entries) {
        snprintf(r->err, sizeof r->err, "INDEX: the index (%llu payload bytes, %llu "
                 "entries, %zu stray bytes) disagrees with its announce (%llu, %llu)",
                 (unsigned long long)payload, (unsigned long long)entries, (size_t)(end - q),
                 (unsigned long long)u->an.total_payload, (unsigned long long)u->an.n_entries);
        return REFIT_ECORRUPT;
    }
    return REFIT_OK;
}

/* After a refused index: its tables go (a flood's would otherwise stay
 * allocated until destroy). */
static void drop_index_tables(refit_ipc_receiver *r)
{
    free(r->pc);
    free(r->arena);
    free(r->bk);
    r->pc = NULL;
    r->arena = NULL;
    r->bk = NULL;
    r->n_pc = r->cap_pc = r->cap_bk = 0;
    r->arena_len = r->arena_cap = 0;
    bkt_header_free(&r->h);
}

/* Checksums, where the trainer sent them: before any write. */
static int verify_sums(refit_ipc_receiver *r, const ipc_update *u)
{
    for (uint32_t b = 0; u->sums && b < u->n_buckets; b++) {
        const rcv_bucket *bk = &r->bk[b];
        const backend *be = backend_for_device(bk->dev);
        refit_view v = {.data = bk->payload, .device = bk->dev, .dtype = REFIT_U8, .ndim = 1,
                        .shape = {(int64_t)bk->bytes}, .strides = {1}};
        uint64_t sum = 0, want = bkt_le64(u->sums + 8u * b);
        int rc;
        if (!be || (rc = be->fingerprint(&v, &sum, r->o.stream))) {
            snprintf(r->err, sizeof r->err, "bucket %u: checksum: %s", b,
                     be ? be->last_error() : "no backend for its memory");
            return be ? rc : REFIT_EUNSUPPORTED;
        }
        if (sum != want) {
            snprintf(r->err, sizeof r->err, "bucket %u: payload checksum %016llx, the update "
                     "says %016llx; nothing written", b, (unsigned long long)sum,
                     (unsigned long long)want);
            return REFIT_ECORRUPT;
        }
    }
    return REFIT_OK;
}

/* Take an INDEX: walked against the table and checked against the model
 * now, once per layout. Its refusal is kept (with the id the trainer gave
 * it) and voted by the UPDATE that names it: the connection stays. */
static void apply_index(refit_ipc_receiver *r, const ipc_frame *f)
{
    ipc_index x;
    uint64_t max = r->o.max_bucket_bytes ? r->o.max_bucket_bytes : (uint64_t)64 << 30;
    const uint8_t *q = f->payload; /* the id, even when the rest is refused */
    r->ix_id = f->len >= 4 ? (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
                                 (uint32_t)q[3] << 24
                           : 0;
    r->ix_epoch = r->epoch;
    r->ix_buckets = 0;
    int rc = ipc_index_decode(&x, f, max, r->err, sizeof r->err);
    if (!rc && x.epoch != r->epoch) {
        snprintf(r->err, sizeof r->err, "INDEX %u of memory table %u; this worker holds %u",
                 x.id, x.epoch, r->epoch);
        rc = REFIT_ECORRUPT;
    }
    if (!rc)
        rc = walk_index(r, &x);
    if (rc)
        drop_index_tables(r);
    if (!rc) {
        r->ix_buckets = x.n_buckets;
        r->ix_sums = x.an.flags & BKT_A_PAYLOAD_SUM;
        r->ix_total = x.an.total_payload;
    }
    r->ix_rc = rc;
    ipc_copy_str(r->ix_err, sizeof r->ix_err, rc ? r->err : "");
    ipc_index_free(&x);
}

/* The source set of this index's whole pieces: the last one when the
 * index lays them out exactly as before, else built anew. */
static int whole_set(refit_ipc_receiver *r, refit_source_set **out)
{
    size_t pc_bytes = (size_t)r->n_pc * sizeof *r->pc;
    if (r->set && r->set_n == r->n_pc && r->set_arena_len == r->arena_len &&
        !memcmp(r->set_pc, r->pc, pc_bytes) && !memcmp(r->set_arena, r->arena, r->arena_len)) {
        *out = r->set;
        return REFIT_OK;
    }
    refit_source_set_destroy(r->set);
    r->set = NULL;
    r->set_n = 0;
    const char **names = malloc(((size_t)r->n_pc + 1) * sizeof *names);
    refit_tensor *ts = malloc(((size_t)r->n_pc + 1) * sizeof *ts);
    rcv_piece *cp = malloc(pc_bytes + 1);
    char *ca = malloc(r->arena_len + 1);
    int rc = names && ts && cp && ca ? REFIT_OK : REFIT_ENOMEM;
    size_t n = 0;
    for (uint32_t i = 0; !rc && i < r->n_pc; i++) {
        rcv_piece *p = &r->pc[i];
        if (p->skip || p->part || p->kind >= BKT_E_DELTA_INDICES)
            continue;
        names[n] = pc_name(r, p);
        ts[n++] = (refit_tensor){.data = p->data, .device = p->dev, .ndim = p->ndim,
                                 .dtype = p->dtype, .shape = p->shape};
    }
    if (!rc && n && (rc = refit_source_set_create(&r->set, r->m, n, names, ts)))
        ipc_copy_str(r->err, sizeof r->err, refit_errmsg(r->ctx));
    if (!rc) {
        memcpy(cp, r->pc, pc_bytes);
        memcpy(ca, r->arena, r->arena_len);
        free(r->set_pc);
        free(r->set_arena);
        r->set_pc = cp;
        r->set_arena = ca;
        r->set_n = r->n_pc;
        r->set_arena_len = r->arena_len;
        r->st.source_sets_built++;
        cp = NULL;
        ca = NULL;
    }
    free(names);
    free(ts);
    free(cp);
    free(ca);
    *out = r->set;
    return rc;
}

/* The patch whose indices are piece i (g pieces): indices and counts read
 * on the host (copied there from device memory, one wait), values from
 * where they lie, refit_load_delta(_runs) into the delta update. */
static int load_patch(refit_ipc_receiver *r, refit_txn *txn, uint32_t i, uint32_t g)
{
    rcv_piece *p = &r->pc[i];
    size_t n = (size_t)p->shape[0];
    int64_t *host = NULL;
    const int64_t *idx = p->data, *cnt = g == 3 ? p[1].data : NULL;
    if (p->dev.device_type != REFIT_DEVICE_CPU && n) {
        const backend *be = backend_for_device(p->dev);
        size_t words = (g == 3 ? 2 : 1) * n;
        int rc = be && (host = malloc(words * sizeof *host)) ? REFIT_OK : REFIT_ENOMEM;
        for (uint32_t j = 0; !rc && j + 1 < g; j++)
            rc = backend_read(be, host + j * n, p[j].data, n * sizeof *host, r->o.stream);
        if (rc) {
            free(host);
            snprintf(r->err, sizeof r->err, "load_delta %.300s: its indices could not be "
                     "read (%s)", pc_name(r, p), refit_strerror(rc));
            return rc;
        }
        idx = host;
        cnt = g == 3 ? host + n : NULL;
    }
    rcv_piece *v = &p[g - 1];
    refit_tensor t = {.data = v->data, .device = v->dev, .ndim = 1, .dtype = v->dtype,
                      .shape = v->shape};
    int rc = cnt ? refit_load_delta_runs(txn, pc_name(r, p), n, idx, cnt, &t, r->o.stream)
                 : refit_load_delta(txn, pc_name(r, p), n, idx, &t, r->o.stream);
    if (rc)
        ipc_copy_str(r->err, sizeof r->err, refit_errmsg(r->ctx));
    free(host);
    return rc;
}

static int load_patches(refit_ipc_receiver *r, refit_txn *txn)
{
    int rc = REFIT_OK;
    for (uint32_t i = 0; !rc && i < r->n_pc; i++) {
        if (r->pc[i].kind != BKT_E_DELTA_INDICES || r->pc[i].skip)
            continue;
        uint32_t g = i + 2 < r->n_pc && r->pc[i + 1].kind == BKT_E_DELTA_COUNTS ? 3 : 2;
        rc = load_patch(r, txn, i, g);
    }
    return rc;
}

/* Every piece into the transaction, from where it lies: the whole ones in
 * one call (the prepared set), parts one by one. */
static int load_pieces(refit_ipc_receiver *r, refit_txn *txn)
{
    refit_source_set *set = NULL;
    int rc = whole_set(r, &set);
    if (!rc && set && (rc = refit_load_set(txn, set, r->o.stream)))
        ipc_copy_str(r->err, sizeof r->err, refit_errmsg(r->ctx));
    for (uint32_t i = 0; !rc && i < r->n_pc; i++) {
        rcv_piece *p = &r->pc[i];
        if (p->skip || !p->part)
            continue;
        refit_tensor t = {.data = p->data, .device = p->dev, .ndim = p->ndim,
                          .dtype = p->dtype, .shape = p->shape};
        if ((rc = refit_load_part(txn, pc_name(r, p), p->row_offset, &t, r->o.stream)))
            ipc_copy_str(r->err, sizeof r->err, refit_errmsg(r->ctx));
    }
    return rc ? rc : load_patches(r, txn);
}

/* ---- one update ---- */

static int send_status(refit_ipc_receiver *r, uint16_t type, uint64_t seq, int status,
                       const char *msg, double dl)
{
    ipc_wbuf *b = &r->sbuf;
    b->len = 0;
    b->failed = 0;
    ipc_status_encode(b, seq, status, msg);
    return b->failed ? REFIT_ENOMEM
                     : ipc_send(r->fd, type, b->p, (uint32_t)b->len, NULL, 0, dl, r->err,
                                sizeof r->err);
}

/* This worker's vote on the update, once (a later call returns how the
 * first send went). */
static int send_vote(refit_ipc_receiver *r, int status, const char *msg, double dl)
{
    if (!r->voted) {
        r->voted = true;
        r->vote_rc = send_status(r, IPC_VOTE, r->vote_seq, status, msg, dl);
        r->prof.voted_ns = ipc_now_ns();
    }
    return r->vote_rc;
}

/* An abort before the vote is about to wait for the keeper armed as this
 * worker's undo source. A keeper following this worker's trainer serves
 * nothing until the group decides, and the trainer decides after every
 * vote: vote "no" first, so the group aborts, the keeper rolls back to the
 * committed version and then serves it (docs/restart.md "As an undo
 * source"). */
static void vote_before_keeper(void *arg, int status, const char *why)
{
    refit_ipc_receiver *r = arg;
    char msg[IPC_MAX_MSG];
    snprintf(msg, sizeof msg, "ipc receiver: update %llu: %s", (unsigned long long)r->vote_seq,
             why ? why : "aborted on this worker");
    (void)send_vote(r, status ? status : REFIT_EINTERNAL, msg, ipc_now() + timeout_of(r));
}

static int greet(refit_ipc_receiver *r, double dl)
{
    ipc_frame f;
    int rc = ipc_recv(r->fd, &f, 64, dl, r->err, sizeof r->err);
    if (rc)
        return rc;
    ipc_hello peer;
    rc = ipc_hello_decode(&peer, &f, IPC_ROLE_TRAINER, r->err, sizeof r->err);
    ipc_frame_free(&f);
    if (rc)
        return rc;
    ipc_wbuf b = {0};
    ipc_hello me = {r->role ? r->role : IPC_ROLE_WORKER, (uint32_t)getpid(), r->ctx->rank,
                    peer.workers};
    ipc_hello_encode(&b, &me);
    rc = b.failed ? REFIT_ENOMEM
                  : ipc_send(r->fd, IPC_HELLO, b.p, (uint32_t)b.len, NULL, 0, dl, r->err,
                             sizeof r->err);
    ipc_wbuf_free(&b);
    return rc;
}

/* The connected peer may not talk to this worker (or is dropped): the
 * journal says who and why; the connection goes. */
static void refuse_peer(refit_ipc_receiver *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void refuse_peer(refit_ipc_receiver *r, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(r->refused, sizeof r->refused, "uid %u, pid %d: %s", r->peer_uid,
             (int)r->peer_pid, why);
    xport_journal(r->ctx, 0, "ipc-peer", "ipc receiver %.300s: dropped a peer, %s", r->path,
                  r->refused);
    r->st.refused++;
    drop_peer(r);
}

/* Accept peers by dl until a trainer of an allowed uid has greeted. A peer
 * of another uid is refused before a byte is read; one silent past the
 * greeting deadline, or one that leaves, is dropped; the next one is
 * accepted each time, by the same dl. */
static int accept_trainer(refit_ipc_receiver *r, double dl)
{
    double greet_s = r->o.greet_timeout_s > 0 ? r->o.greet_timeout_s : 1.0;
    for (;;) {
        int rc = ipc_accept(r->lfd, dl, &r->fd, r->err, sizeof r->err);
        if (rc) {
            size_t n = strlen(r->err);
            if (r->refused[0])
                snprintf(r->err + n, sizeof r->err - n, "; refused before: %s", r->refused);
            return rc;
        }
        if ((rc = ipc_peer_cred(r->fd, &r->peer_uid, &r->peer_pid, r->err, sizeof r->err))) {
            refuse_peer(r, "its credentials: %s", r->err);
            continue;
        }
        if (!ipc_uid_allowed(r->peer_uid, r->allow, r->o.n_allow_uids)) {
            refuse_peer(r, "not this worker's uid %u nor in its allow_uids",
                        (unsigned)geteuid());
            continue;
        }
        double now = ipc_now(), gdl = now + greet_s < dl ? now + greet_s : dl;
        if (!(rc = greet(r, gdl))) {
            r->st.connections++; /* a trainer, greeted */
            return REFIT_OK;
        }
        if (rc == REFIT_EIO) { /* it left */
            drop_peer(r);
            continue;
        }
        if (rc == REFIT_ETIMEDOUT && gdl < dl) {
            refuse_peer(r, "no HELLO within %.3g s", greet_s);
            continue;
        }
        drop_peer(r);
        r->st.refused += rc == REFIT_ECORRUPT;
        return rc;
    }
}

/* Wait (by dl) for the next UPDATE frame, taking a trainer's connection
 * and memory tables on the way. A trainer that leaves before its update
 * is not an error: the next one is awaited. */
static int next_update(refit_ipc_receiver *r, ipc_frame *f, double dl)
{
    r->refused[0] = '\0';
    for (;;) {
        int rc = REFIT_OK;
        if (r->fd < 0 && (rc = accept_trainer(r, dl)))
            return rc;
        double spin = spin_of(r);
        if (spin > 0)
            (void)ipc_spin_readable(r->fd, ipc_now() + spin);
        if ((rc = ipc_recv(r->fd, f, IPC_MAX_PAYLOAD, dl, r->err, sizeof r->err))) {
            int clean = rc == REFIT_EIO && strstr(r->err, "closed the connection");
            drop_peer(r);
            if (clean)
                continue; /* it left between updates */
            r->st.refused += rc == REFIT_ECORRUPT;
            return rc;
        }
        if (f->type == IPC_UPDATE)
            return REFIT_OK;
        if (f->type == IPC_INDEX) {
            apply_index(r, f);
        } else if (f->type == IPC_MEMS) {
            rc = apply_mems(r, f);
        } else {
            snprintf(r->err, sizeof r->err, "a %s frame while waiting for an update",
                     ipc_type_name(f->type));
            rc = REFIT_ECORRUPT;
        }
        ipc_frame_free(f);
        if (rc) {
            xport_journal(r->ctx, 0, "ipc-peer", "ipc receiver %.300s: dropped the trainer "
                          "(uid %u, pid %d): %.600s", r->path, r->peer_uid, (int)r->peer_pid,
                          r->err);
            r->st.refused++;
            drop_peer(r); /* the trainer's view and ours differ: start over */
            return rc;
        }
    }
}

/* The update as far as the vote: *txn prepared (or NULL: refused before
 * begin, or aborted). Returns this worker's vote. */
static int take_update(refit_ipc_receiver *r, const ipc_update *u, const refit_update_opts *opts,
                       refit_txn **txn, refit_group_result *res)
{
    int rc = REFIT_OK;
    if (!r->ix_id || u->index_id != r->ix_id) {
        char held[32] = "none";
        if (r->ix_id)
            snprintf(held, sizeof held, "index %u", r->ix_id);
        snprintf(r->err, sizeof r->err, "UPDATE names index %u; this worker holds %s (an "
                 "INDEX comes first)%s%.900s", u->index_id, held,
                 r->ix_rc ? "; the last INDEX was refused: " : "", r->ix_rc ? r->ix_err : "");
        rc = REFIT_ECORRUPT;
    } else if (r->ix_rc) {
        rc = r->ix_rc;
        ipc_copy_str(r->err, sizeof r->err, r->ix_err);
    } else if (u->epoch != r->epoch || r->ix_epoch != r->epoch) {
        snprintf(r->err, sizeof r->err, "UPDATE of memory table %u; this worker holds %u",
                 u->epoch, r->epoch);
        rc = REFIT_ECORRUPT;
    } else if (u->n_buckets != r->ix_buckets) {
        snprintf(r->err, sizeof r->err, "UPDATE names %u buckets; index %u has %u",
                 u->n_buckets, r->ix_id, r->ix_buckets);
        rc = REFIT_ECORRUPT;
    } else if (!!(u->flags & IPC_U_SUMS) != r->ix_sums) {
        snprintf(r->err, sizeof r->err, "UPDATE %s checksums; its index announces %s",
                 u->flags & IPC_U_SUMS ? "carries" : "lacks", r->ix_sums ? "them" : "none");
        rc = REFIT_ECORRUPT;
    } else if (r->o.filter) {
        rc = check_pieces(r); /* the filter is asked at every update */
    }
    if (!rc)
        ipc_copy_str(r->label, sizeof r->label, u->label);
    r->prof.checked_ns = ipc_now_ns();
    if (rc) {
        r->st.refused++;
        return ctx_error(r->ctx, rc, "ipc receiver: update %llu refused: %s",
                         (unsigned long long)u->seq, r->err);
    }
    ipc_copy_str(res->version_label, sizeof res->version_label, r->label);
    refit_update_opts o = opts ? *opts : (refit_update_opts)REFIT_UPDATE_OPTS_INIT;
    char uri[600];
    snprintf(uri, sizeof uri, "ipc://%s", r->path);
    if (!o.version_label)
        o.version_label = r->label;
    if (!o.source_uri)
        o.source_uri = uri;
    if ((rc = refit_begin(txn, r->m, &o)))
        return rc;
    r->prof.begun_ns = ipc_now_ns();
    bool timed = r->o.profile_gpu && (u->flags & IPC_U_EVENT) && r->has_event;
    if (timed)
        pev_record(r, 0);
    if ((u->flags & IPC_U_EVENT) && !r->has_event) {
        snprintf(r->err, sizeof r->err, "the update asks to wait on an event never shared");
        rc = REFIT_ECORRUPT;
    } else if (u->flags & IPC_U_EVENT) {
        CUresult cr = r->cu.cu.StreamWaitEvent((CUstream)r->o.stream, r->ev, 0);
        if (cr != CU_SUCCESS) {
            snprintf(r->err, sizeof r->err, "cuStreamWaitEvent on the trainer's event: %s",
                     cu_errstr(&r->cu.cu, cr));
            rc = REFIT_EIO;
        }
    }
    if (timed)
        pev_record(r, 1);
    r->prof.waited_ns = ipc_now_ns();
    if (!rc)
        rc = verify_sums(r, u);
    if (!rc)
        rc = load_pieces(r, *txn);
    if (timed)
        pev_record(r, 2);
    r->prof.enqueued_ns = ipc_now_ns();
    if (rc) {
        /* the vote first: the abort may wait for a keeper that waits on it */
        char why[1200], msg[IPC_MAX_MSG];
        snprintf(why, sizeof why, "ipc: %s", r->err);
        snprintf(msg, sizeof msg, "ipc receiver: update %llu: %.980s", (unsigned long long)u->seq,
                 r->err);
        (void)send_vote(r, rc, msg, ipc_now() + timeout_of(r));
        res->worker_status = refit_abort_reason(*txn, why);
        *txn = NULL;
        return ctx_error(r->ctx, rc, "%s", msg);
    }
    res->buckets = u->n_buckets;
    res->tensors = r->n_pc;
    res->bytes = r->ix_total;
    rc = refit_finalize_prepare(*txn);
    r->prof.prepared_ns = ipc_now_ns();
    pev_read(r, timed);
    if (rc) {
        *txn = NULL; /* aborted and freed by prepare */
        res->worker_status = refit_worker_health(r->ctx) == REFIT_HEALTH_POISONED
                                 ? REFIT_EPOISONED : REFIT_OK;
    }
    return rc;
}

int refit_ipc_receive_update(refit_ipc_receiver *r, const refit_update_opts *opts,
                             refit_group_result *out)
{
    if (!r)
        return REFIT_EINVAL;
    ctx_clear_error(r->ctx);
    refit_group_result res = {.failed_rank = -1, .vote_taken = 1};
    double t = timeout_of(r), t_start = r->o.start_timeout_s > 0 ? r->o.start_timeout_s : t;
    refit_ipc_recv_profile *pf = &r->prof;
    memset(pf, 0, sizeof *pf);
    pf->gpu_wait_ms = pf->gpu_copy_ms = -1;
    pf->call_ns = ipc_now_ns();
    r->voted = false;
    ipc_frame f;
    int rc = next_update(r, &f, ipc_now() + t_start);
    pf->update_ns = ipc_now_ns();
    if (rc) {
        res.decision = res.local_status = rc;
        res.vote_taken = 0;
        if (out)
            *out = res;
        return ctx_error(r->ctx, rc, "ipc receiver: %s", r->err);
    }
    double t0 = ipc_now();
    r->st.updates++;
    ipc_update u;
    refit_txn *txn = NULL;
    int local = ipc_update_decode(&u, &f, r->err, sizeof r->err);
    if (local) {
        /* the frame was sound, its content not: refuse, keep the channel */
        r->st.refused++;
        ctx_error(r->ctx, local, "ipc receiver: update refused: %s", r->err);
        u.seq = f.len >= 8 ? bkt_le64(f.payload) : 0;
        pf->checked_ns = ipc_now_ns();
    } else {
        r->vote_seq = u.seq;
        keeper_undo_before_wait(r->m, vote_before_keeper, r);
        local = take_update(r, &u, opts, &txn, &res);
        keeper_undo_before_wait(r->m, NULL, NULL);
    }
    ipc_frame_free(&f);
    pf->seq = u.seq;
    char msg[IPC_MAX_MSG];
    ipc_copy_str(msg, sizeof msg, local ? refit_errmsg(r->ctx) : "");
    res.local_status = local;
    double dl = ipc_now() + t;
    ipc_frame d;
    char dmsg[IPC_MAX_MSG + 1] = "";
    char after[REFIT_ERRMSG_SIZE] = ""; /* an abort that left the worker POISONED */
    r->vote_seq = u.seq;
    int trc = send_vote(r, local, msg, dl);
    if (!trc && spin_of(r) > 0)
        (void)ipc_spin_readable(r->fd, ipc_now() + spin_of(r));
    if (!trc && !(trc = ipc_recv(r->fd, &d, IPC_MAX_MSG + 64, dl, r->err, sizeof r->err))) {
        pf->decision_ns = ipc_now_ns();
        ipc_status_msg dm;
        trc = d.type == IPC_DECISION ? ipc_status_decode(&dm, &d, u.seq, r->err, sizeof r->err)
                                     : REFIT_ECORRUPT;
        if (d.type != IPC_DECISION)
            snprintf(r->err, sizeof r->err, "a %s frame where DECISION was expected",
                     ipc_type_name(d.type));
        ipc_frame_free(&d);
        if (!trc) {
            res.decision = dm.status;
            ipc_copy_str(dmsg, sizeof dmsg, dm.msg);
        }
        if (!trc && dm.status && txn) {
            char why[1300];
            snprintf(why, sizeof why, "ipc: the group aborted: %s", dm.msg);
            if ((res.worker_status = refit_abort_reason(txn, why)))
                ipc_copy_str(after, sizeof after, refit_errmsg(r->ctx));
            txn = NULL;
        } else if (!trc && txn) {
            res.worker_status = refit_commit(txn);
            txn = NULL;
        }
        pf->committed_ns = ipc_now_ns();
    }
    if (trc) {
        /* no decision: never commit without it */
        char why[1200];
        snprintf(why, sizeof why, "ipc: no decision from the trainer by the deadline: %s",
                 r->err);
        int64_t jid = txn ? refit_txn_journal_id(txn) : 0;
        xport_journal(r->ctx, jid, "transport", "update %llu: %s", (unsigned long long)u.seq,
                      why);
        if (txn && (res.worker_status = refit_abort_reason(txn, why)))
            ipc_copy_str(after, sizeof after, refit_errmsg(r->ctx));
        txn = NULL;
        pf->committed_ns = ipc_now_ns();
        res.decision = trc;
        res.vote_taken = 0;
        drop_peer(r);
        res.seconds = ipc_now() - t0;
        if (out)
            *out = res;
        return ctx_error(r->ctx, trc, "ipc receiver: update %llu aborted: %s%s%s%s%s",
                         (unsigned long long)u.seq, why + 5,
                         local ? "; before that: " : "", local ? msg : "",
                         after[0] ? "; then " : "", after);
    }
    (void)send_status(r, IPC_RESULT, u.seq, res.worker_status,
                      res.worker_status ? refit_errmsg(r->ctx) : "", dl);
    pf->result_ns = ipc_now_ns();
    res.seconds = ipc_now() - t0;
    if (out)
        *out = res;
    if (res.decision && !local)
        return ctx_error(r->ctx, res.decision, "ipc receiver: update %llu aborted by the "
                         "group: %s%s%s", (unsigned long long)u.seq,
                         dmsg[0] ? dmsg : "another worker failed", after[0] ? "; then " : "",
                         after);
    if (local)
        return ctx_error(r->ctx, local, "%s", msg);
    return res.decision;
}

int ipc_receiver_wait_fd(const refit_ipc_receiver *r)
{
    return r->fd >= 0 ? r->fd : r->lfd;
}

int ipc_receiver_ready(refit_ipc_receiver *r, double greet_dl)
{
    if (r->fd < 0) {
        r->refused[0] = '\0';
        int rc = accept_trainer(r, greet_dl);
        return rc == REFIT_ETIMEDOUT ? 0 : rc ? rc : 0;
    }
    char c;
    ssize_t n = recv(r->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0)
        return 1;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        drop_peer(r); /* it left between updates */
    return 0;
}

void ipc_receiver_set_role(refit_ipc_receiver *r, uint32_t role)
{
    r->role = role;
}
