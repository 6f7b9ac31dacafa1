/* INT4's launcher (int4_launch.h): the pieces as the kernels read them
 * (int4_gpu.h), the dense ones told apart, and their launches. Host code
 * only: the device code is reached through the refit_pgpu table. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugins/int4/int4_gpu.h"
#include "plugins/int4/int4_launch.h"

static int q4_refuse(refit_pgpu *g, int rc, const char *what, uint32_t i)
{
    return refit_pgpu_fail(g, rc, "int4 launcher: piece %u: %s", i, what);
}


static int64_t q4_cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* Piece i as the kernels read it, checked as kern_quant_int4_check does. */
static int q4_piece_init(refit_pgpu *g, q4_piece *pc, const refit_view *q, const refit_view *s,
                         const refit_view *x, int64_t group, uint32_t i)
{
    int kind = refit_pgpu_float_kind(x->dtype), skind = refit_pgpu_float_kind(s->dtype);
    if (kind < 0 || skind < 0 || q->dtype.bits != 32 || q->dtype.lanes != 1 ||
        (q->dtype.code != REFIT_DTYPE_INT && q->dtype.code != REFIT_DTYPE_UINT))
        return q4_refuse(g, REFIT_EUNSUPPORTED, "dtypes: x and scale f32/f16/bf16, q 32-bit",
                         i);
    if (x->ndim != 2 || q->ndim != 2 || s->ndim != 2 || x->shape[0] < 0 || x->shape[1] < 0)
        return q4_refuse(g, REFIT_EMISMATCH, "x, q and scale must be 2-D", i);
    int64_t n = x->shape[0], k = x->shape[1];
    int64_t words = q4_cdiv(k, 8), groups = group > 0 ? q4_cdiv(k, group) : 1;
    if (q->shape[0] != n || q->shape[1] != words || s->shape[0] != n || s->shape[1] != groups)
        return q4_refuse(g, REFIT_EMISMATCH, "q must be [n, ceil(k/8)], scale [n, groups]", i);
    memset(pc, 0, sizeof *pc);
    int64_t es = kind == 0 ? 4 : 2;
    pc->x = (const char *)x->data;
    pc->q = (char *)q->data;
    pc->s = (char *)s->data;
    pc->n = n;
    pc->k = k;
    pc->words = words;
    pc->groups = groups;
    pc->xs0 = x->strides[0];
    pc->xs1 = x->strides[1];
    pc->qs0 = q->strides[0];
    pc->qs1 = q->strides[1];
    pc->ss0 = s->strides[0];
    pc->ss1 = s->strides[1];
    pc->idx = (int32_t)i;
    pc->kind = (uint8_t)kind;
    pc->skind = (uint8_t)skind;
    pc->vx = ((uintptr_t)pc->x % 16 == 0) && (k <= 1 || pc->xs1 == 1) &&
             (n <= 1 || (pc->xs0 * es) % 16 == 0);
    pc->colmajor = n > 1 && pc->qs0 == 1 && pc->qs1 != 1;
    return REFIT_OK;
}

/* Lanes a group takes in k_q4_groups, or 0 for k_q4_rows. */
static int q4_lanes(int64_t group)
{
    if (group <= 0 || group % 8 || group > 256)
        return 0;
    int64_t l = group / 8;
    return (l & (l - 1)) == 0 ? (int)l : 0;
}

/* Launch kernel `base` (lanes appended, "_s" for the short block) with
 * parameter block b. */
static int q4_go(refit_pgpu *g, const char *base, int lanes, int small, unsigned grid, void *b)
{
    char name[32];
    if (lanes)
        snprintf(name, sizeof name, "%s_%d%s", base, lanes, small ? "_s" : "");
    else
        snprintf(name, sizeof name, "%s%s", base, small ? "_s" : "");
    void *k = NULL;
    int rc = g->kernel(g, name, &k);
    unsigned int *status = g->status;
    void *args[] = {b, &status};
    return rc ? rc : g->launch(g, k, grid, Q4_THREADS, args);
}

static int q4_launch_one(refit_pgpu *g, const q4_batch *b, int lanes, q4_batch_small *sb)
{
    int64_t threads = lanes ? b->end * lanes : b->end * Q4_THREADS;
    int64_t blocks = (threads + Q4_THREADS - 1) / Q4_THREADS;
    unsigned grid = (unsigned)(blocks > Q4_BLOCKS_MAX ? Q4_BLOCKS_MAX : blocks);
    const char *base = lanes ? "q4_groups" : "q4_rows";
    if (b->np <= Q4_SMALL) {
        memset(sb, 0, sizeof *sb);
        memcpy(sb, b, offsetof(q4_batch, p) + sizeof b->p[0] * (size_t)b->np);
        return q4_go(g, base, lanes, 1, grid, sb);
    }
    return q4_go(g, base, lanes, 0, grid, (void *)b);
}

/* Lanes a group takes in k_q4_dense (4..32), or 0: no dense path. */
static int q4d_lanes(int64_t group)
{
    int l = q4_lanes(group);
    return l >= 4 ? l : 0;
}

/* Piece pc as the dense kernel takes it, or 0 when it must take the
 * general path: F16/BF16 weights and scales, contiguous 16-byte aligned
 * rows, K a whole number of groups, words along N or along K, every
 * in-tile offset within 32 bits. */
static int q4d_piece_of(q4d_piece *d, const q4_piece *pc, int64_t group, int64_t first)
{
    int lanes = q4d_lanes(group);
    if (!lanes || pc->kind == 0 || pc->skind == 0 || pc->n <= 0 || pc->k < group ||
        pc->k % group || !pc->vx || pc->xs1 != 1 || pc->n > 0x7fffffff)
        return 0;
    int64_t rows = 128 / lanes, lim = 0x7fffffff;
    int64_t qs;
    int colmajor;
    if (pc->qs1 == 1) {
        qs = pc->n > 1 ? pc->qs0 : 0;
        colmajor = 0;
    } else if (pc->qs0 == 1 || pc->n == 1) {
        qs = pc->qs1;
        colmajor = 1;
    } else {
        return 0;
    }
    if (pc->xs0 < 0 || qs < 0 || pc->ss0 < 0 || pc->ss1 < 0 ||
        pc->xs0 > (lim - 16 * lanes) / (2 * rows) ||
        qs > (lim - 4 * (rows + lanes)) / (4 * (rows + lanes)))
        return 0;
    int64_t nrt = (pc->n + rows - 1) / rows;
    /* the words' and scales' offsets in a piece in 32 bits too (rows
     * rounded up to whole tiles) */
    int64_t rows_up = nrt * rows;
    if (nrt * pc->groups > lim || qs > lim / 4 / (rows_up + pc->words) ||
        (rows_up + pc->words) * (qs + 1) > lim / 4 || pc->ss0 > lim / 4 / rows_up ||
        pc->ss1 > lim / 4 / pc->groups || rows_up * pc->ss0 + pc->groups * pc->ss1 > lim / 2)
        return 0;
    memset(d, 0, sizeof *d);
    d->x = pc->x;
    d->q = pc->q;
    d->s = pc->s;
    d->first = first;
    d->xs0 = pc->xs0 * 2;
    d->qs = qs;
    d->ss0 = pc->ss0;
    d->ss1 = pc->ss1;
    d->n = (int32_t)pc->n;
    d->groups = (int32_t)pc->groups;
    d->nrt = (int32_t)nrt;
    d->idx = pc->idx;
    d->kind = pc->kind;
    d->skind = pc->skind;
    d->colmajor = (uint8_t)colmajor;
    return 1;
}

/* One dense launch: a persistent grid (Q4D_BLOCKS_PER_SM blocks an SM, or
 * fewer for a small launch), each warp a contiguous run of tiles. */
static int q4d_launch_one(refit_pgpu *g, q4d_batch *b, int lanes, q4d_batch_small *sb)
{
    int64_t warps_per_block = Q4_THREADS / 32;
    int64_t blocks = (b->end + warps_per_block - 1) / warps_per_block;
    int64_t cap = (int64_t)g->multiprocessors * Q4D_BLOCKS_PER_SM;
    if (blocks > cap)
        blocks = cap;
    int64_t warps = blocks * warps_per_block;
    b->per_warp = (b->end + warps - 1) / warps;
    if (b->np <= Q4_SMALL) {
        memset(sb, 0, sizeof *sb);
        memcpy(sb, b, offsetof(q4d_batch, p) + sizeof b->p[0] * (size_t)b->np);
        return q4_go(g, "q4_dense", lanes, 1, (unsigned)blocks, sb);
    }
    return q4_go(g, "q4_dense", lanes, 0, (unsigned)blocks, b);
}

/* The launch parameters (host memory: 31 KB each, off the stack). */
typedef struct q4_blocks {
    q4_batch b;
    q4d_batch db;
    q4_batch_small sb;
    q4d_batch_small sdb;
} q4_blocks;

/* The pieces the dense kernel takes (q4d_piece_of), Q4_BATCH a launch,
 * then the rest through the general kernels, Q4_BATCH a launch. A refusal
 * lowers the one status word from either. */
static int q4_launch(refit_pgpu *g, q4_blocks *m, const q4_piece *pcs, uint32_t n, int64_t group)
{
    q4_batch *b = &m->b;
    q4d_batch *db = &m->db;
    int lanes = q4_lanes(group), dlanes = q4d_lanes(group), rc = REFIT_OK;
    memset(db, 0, offsetof(q4d_batch, p));
    memset(b, 0, offsetof(q4_batch, p));
    b->g_len = group > 0 ? group : 0;
    for (uint32_t i = 0; i <= n && !rc; i++) {
        if (i < n && q4d_piece_of(&db->p[db->np], &pcs[i], group, db->end)) {
            q4d_piece *d = &db->p[db->np++];
            db->end += (int64_t)d->nrt * d->groups;
        } else if (i < n) {
            b->p[b->np] = pcs[i];
            b->p[b->np].first = b->end;
            b->end += lanes ? pcs[i].n * pcs[i].groups : pcs[i].n;
            b->np++;
        }
        if (db->np == Q4_BATCH || (i == n && db->np)) {
            if (db->end)
                rc = q4d_launch_one(g, db, dlanes, &m->sdb);
            memset(db, 0, offsetof(q4d_batch, p));
        }
        if (!rc && (b->np == Q4_BATCH || (i == n && b->np))) {
            if (b->end)
                rc = q4_launch_one(g, b, lanes, &m->sb);
            memset(b, 0, offsetof(q4_batch, p));
            b->g_len = group > 0 ? group : 0;
        }
    }
    return rc;
}

int int4_launch(refit_pgpu *g, uint32_t n, const refit_view *q, const refit_view *scale,
                const refit_view *x, int64_t group, int32_t *bad)
{
    *bad = -1;
    g->msg[0] = 0;
    if (group < 0 || n > 0x7fffffffu || (n && (!q || !scale || !x)))
        return refit_pgpu_fail(g, REFIT_EINVAL, "int4 launcher: group must be >= 0, pieces < 2^31 "
                               "with their views");
    if (n == 0)
        return REFIT_OK;
    q4_piece *pcs = malloc(sizeof *pcs * n);
    q4_blocks *m = malloc(sizeof *m);
    int rc = pcs && m ? REFIT_OK : refit_pgpu_fail(g, REFIT_ENOMEM, "int4 launcher: host memory");
    for (uint32_t i = 0; i < n && !rc; i++)
        if ((rc = q4_piece_init(g, &pcs[i], &q[i], &scale[i], &x[i], group, i)))
            *bad = (int32_t)i;
    if (!rc)
        rc = q4_launch(g, m, pcs, n, group);
    free(m);
    free(pcs);
    return rc;
}
