/* OCP MX's launcher (mx_launch.h): the pieces as the kernels read them
 * (mx_gpu.h), stacks of evenly spaced matrices merged, the dense ones told
 * apart, and their launches. Host code only: the device code is reached
 * through the refit_pgpu table. */
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "plugins/mxfp8/mx_gpu.h"
#include "plugins/mxfp8/mx_launch.h"

static int mx_refuse(refit_pgpu *g, int rc, const char *what, uint32_t i)
{
    return refit_pgpu_fail(g, rc, "mx launcher: piece %u: %s", i, what);
}


static mx_div mx_div_make(uint32_t d)
{
    mx_div r = {d, 0, 0};
    if (d <= 1) {
        r.d = 1;
        return r;
    }
    unsigned l = 0;
    while ((1ull << l) < d)
        l++;
    r.mul = (uint32_t)(((1ull << (31 + l)) + d - 1) / d);
    r.shift = l - 1;
    return r;
}

/* Piece i as the kernel reads it (one matrix). The views were checked as
 * the CPU references check them; dtypes, ranks and shapes again here. */
static int mx_piece_init(refit_pgpu *g, mx_piece *pc, const refit_view *q, const refit_view *s,
                         const refit_view *x, uint32_t i, int fp4)
{
    int kind = refit_pgpu_float_kind(x->dtype);
    if (kind < 0 || q->dtype.bits != 8 || q->dtype.lanes != 1 || s->dtype.bits != 8 ||
        s->dtype.lanes != 1)
        return mx_refuse(g, REFIT_EUNSUPPORTED, "dtypes: x f32/f16/bf16, q and scales one "
                         "byte", i);
    if (x->ndim != 2 || q->ndim != 2 || s->ndim != 2 || x->shape[0] < 0 || x->shape[1] < 0)
        return mx_refuse(g, REFIT_EMISMATCH, "x, q and scales must be 2-D", i);
    int64_t n = x->shape[0], k = x->shape[1], nb = (k + 31) / 32;
    if (q->shape[0] != n || q->shape[1] != (fp4 ? (k + 1) / 2 : k) || s->shape[0] != n ||
        s->shape[1] != nb || (fp4 && q->shape[1] > 1 && q->strides[1] != 1))
        return mx_refuse(g, REFIT_EMISMATCH, fp4 ? "q must be [n, ceil(k/2)] bytes contiguous "
                         "along k, scales [n, ceil(k/32)]" : "q must be [n, k], scales "
                         "[n, ceil(k/32)]", i);
    if (n && nb && n * nb > 0x7fffffffll - MX_TASK)
        return mx_refuse(g, REFIT_EUNSUPPORTED, "more than 2^31 - 9 blocks of 32 in one piece",
                         i);
    memset(pc, 0, sizeof *pc);
    int64_t es = kind == 0 ? 4 : 2;
    pc->x = (const char *)x->data;
    pc->q = (unsigned char *)q->data;
    pc->s = (unsigned char *)s->data;
    pc->xs0 = x->strides[0];
    pc->xs1 = x->strides[1];
    pc->qs0 = q->strides[0];
    pc->qs1 = q->strides[1];
    pc->ss0 = s->strides[0];
    pc->ss1 = s->strides[1];
    pc->k = k;
    pc->n = (uint32_t)n;
    pc->nb = (uint32_t)nb;
    pc->blocks = (uint32_t)(n * nb);
    pc->idx = (int32_t)i;
    pc->kind = (uint8_t)kind;
    bool one_row = n <= 1;
    int qa = fp4 ? 4 : 8; /* bytes a lane stores at once */
    pc->vx = (uintptr_t)pc->x % 16 == 0 && (k <= 1 || pc->xs1 == 1) &&
             (one_row || (pc->xs0 * es) % 16 == 0);
    pc->vq = (uintptr_t)pc->q % qa == 0 && (fp4 || k <= 1 || pc->qs1 == 1) &&
             (one_row || pc->qs0 % qa == 0);
    return REFIT_OK;
}

/* Append piece c to the stack at top when it is the next matrix of it:
 * same shape, strides and dtype, and the same distance from the previous
 * matrix in x, q and scales. */
static bool mx_merge(mx_piece *top, const mx_piece *c, uint32_t *mats, int fp4)
{
    if (top->kind != c->kind || top->n != c->n || top->k != c->k || top->xs0 != c->xs0 ||
        top->xs1 != c->xs1 || top->qs0 != c->qs0 || top->qs1 != c->qs1 ||
        top->ss0 != c->ss0 || top->ss1 != c->ss1 || top->idx + (int32_t)*mats != c->idx ||
        (int64_t)top->blocks + c->blocks > 0x7fffffffll - MX_TASK)
        return false;
    int64_t es = c->kind == 0 ? 4 : 2;
    const char *last_x = top->x + (int64_t)(*mats - 1) * top->xsm * es;
    int64_t dx = c->x - last_x;
    int64_t dq = (const char *)c->q - (const char *)(top->q + (int64_t)(*mats - 1) * top->qsm);
    int64_t ds = (const char *)c->s - (const char *)(top->s + (int64_t)(*mats - 1) * top->ssm);
    if (dx % es)
        return false;
    if (*mats > 1 && (dx / es != top->xsm || dq != top->qsm || ds != top->ssm))
        return false;
    top->xsm = dx / es;
    top->qsm = dq;
    top->ssm = ds;
    top->vx = top->vx && c->vx && dx % 16 == 0;
    top->vq = top->vq && c->vq && dq % (fp4 ? 4 : 8) == 0;
    top->blocks += c->blocks;
    (*mats)++;
    return true;
}

/* Launch kernel `name` with parameter block b. */
static int mx_go(refit_pgpu *g, const char *name, unsigned grid, void *b)
{
    void *k = NULL;
    int rc = g->kernel(g, name, &k);
    unsigned int *status = g->status;
    void *args[] = {b, &status};
    return rc ? rc : g->launch(g, k, grid, MX_THREADS, args);
}

/* The launch parameters (host memory: 30 KB each, off the stack). */
typedef struct mx_blocks {
    mx_batch b;
    mxd_batch db;
    mx_batch_small sb;
    mxd_batch_small sdb;
} mx_blocks;

static int mx_launch_one(refit_pgpu *g, mx_blocks *m, int fp4, unsigned grid)
{
    const mx_batch *b = &m->b;
    if (b->np <= MX_SMALL) {
        mx_batch_small *sb = &m->sb;
        memset(sb, 0, sizeof *sb);
        memcpy(sb, b, offsetof(mx_batch, p) + sizeof b->p[0] * (size_t)b->np);
        return mx_go(g, fp4 ? "mx_3" : "mx_2", grid, sb);
    }
    return mx_go(g, fp4 ? "mx_1" : "mx_0", grid, (void *)b);
}

/* Launch pieces pcs[0..n), MX_BATCH a launch. */
static int mx_launch_general(refit_pgpu *g, mx_blocks *m, const mx_piece *pcs, uint32_t n, int fp4,
                             int hw)
{
    mx_batch *b = &m->b;
    int sms = g->multiprocessors;
    int rc = REFIT_OK;
    for (uint32_t at = 0; at < n && !rc; at += MX_BATCH) {
        uint32_t np = n - at < MX_BATCH ? n - at : MX_BATCH;
        int64_t end = 0;
        b->np = (int32_t)np;
        b->hw = hw;
        for (uint32_t j = 0; j < np; j++) {
            b->p[j] = pcs[at + j];
            b->p[j].first = end;
            end += ((int64_t)b->p[j].blocks + MX_TASK - 1) / MX_TASK;
        }
        b->end = end;
        if (end == 0)
            continue;
        int64_t want = (end + 2 * MX_WARPS - 1) / (2 * MX_WARPS);
        int64_t most = (int64_t)(sms > 0 ? sms : 1) * MX_CTAS_PER_SM;
        rc = mx_launch_one(g, m, fp4, (unsigned)(want < most ? want : most));
    }
    return rc;
}

/* The dense form of merged piece pc, if it has one (the conditions are
 * the dense path's, above k_mxd): lines are its rows, or its matrices
 * where rows follow one another, or the whole stack where matrices do. */
static bool mxd_make(mxd_piece *d, const mx_piece *pc, int fp4, int hw)
{
    int64_t unit = 8 * MXD_SEGS(fp4 ? 1 : hw ? 4 : 0); /* blocks */
    int64_t k = pc->k, n = pc->n, nb = pc->nb, qk = fp4 ? k / 2 : k;
    int64_t qa = fp4 ? 4 : 8, mats = (int64_t)pc->blocks / (n * nb);
    if (pc->kind != 2 || k % 32 || pc->xs1 != 1 || (!fp4 && pc->qs1 != 1) ||
        (nb > 1 && pc->ss1 != 1))
        return false;
    bool flat = n == 1 || (pc->xs0 == k && pc->qs0 == qk && pc->ss0 == nb);
    int64_t len, lines, xp, qp, sp;
    if (flat && (mats == 1 || (pc->xsm == n * k && pc->qsm == n * qk &&
                               pc->ssm == n * nb))) {
        len = pc->blocks; /* one line */
        lines = 1;
        xp = qp = sp = 0;
    } else if (flat) {
        len = n * nb;
        lines = mats;
        xp = pc->xsm;
        qp = pc->qsm;
        sp = pc->ssm;
    } else if (mats == 1 || (pc->xsm == n * pc->xs0 && pc->qsm == n * pc->qs0 &&
                             pc->ssm == n * pc->ss0)) {
        len = nb;
        lines = mats * n;
        xp = pc->xs0;
        qp = pc->qs0;
        sp = pc->ss0;
    } else {
        return false;
    }
    if ((uintptr_t)pc->x % 16 || (uintptr_t)pc->q % qa || (xp * 2) % 16 || qp % qa)
        return false;
    memset(d, 0, sizeof *d);
    d->x = pc->x;
    d->q = pc->q;
    d->s = pc->s;
    d->xp = xp * 2;
    d->qp = qp;
    d->sp = sp;
    d->len = (uint32_t)len;
    d->upl = (uint32_t)((len + unit - 1) / unit);
    d->bpm = (uint32_t)(n * nb);
    d->idx = pc->idx;
    d->units = (uint32_t)lines * d->upl;
    d->div_upl = mx_div_make(d->upl);
    return true;
}

/* Launch dense pieces ds[0..n), MX_BATCH a launch: kernel mxd_<MODE>, MODE
 * bit 0 MXFP4, bit 1 the short block, bit 2 E4M3 by the instruction. */
static int mxd_launch(refit_pgpu *g, mx_blocks *m, const mxd_piece *ds, uint32_t n, int fp4, int hw)
{
    static const char *const names[8] = {"mxd_0", "mxd_1", "mxd_2", "mxd_3",
                                         "mxd_4", NULL,    "mxd_6", NULL};
    mxd_batch *b = &m->db;
    int rc = REFIT_OK;
    int mode = fp4 ? 1 : hw ? 4 : 0;
    for (uint32_t at = 0; at < n && !rc; at += MX_BATCH) {
        uint32_t np = n - at < MX_BATCH ? n - at : MX_BATCH;
        int64_t end = 0;
        b->np = (int32_t)np;
        for (uint32_t j = 0; j < np; j++) {
            b->p[j] = ds[at + j];
            b->p[j].first = end;
            end += b->p[j].units;
        }
        b->end = end;
        int64_t want = (end + MX_WARPS - 1) / MX_WARPS;
        int64_t most = (int64_t)(g->multiprocessors > 0 ? g->multiprocessors : 1) *
                       MX_CTAS_PER_SM;
        unsigned grid = (unsigned)(want < most ? want : most);
        b->chunk = (end + (int64_t)grid * MX_WARPS - 1) / ((int64_t)grid * MX_WARPS);
        if (b->np <= MX_SMALL) {
            mxd_batch_small *sb = &m->sdb;
            memset(sb, 0, sizeof *sb);
            memcpy(sb, b, offsetof(mxd_batch, p) + sizeof b->p[0] * (size_t)b->np);
            rc = mx_go(g, names[mode | 2], grid, sb);
        } else {
            rc = mx_go(g, names[mode], grid, b);
        }
    }
    return rc;
}

/* Pieces -> merged stacks; *out the count. */
static int mx_pieces(refit_pgpu *g, uint32_t n, const refit_view *q, const refit_view *s,
                     const refit_view *x, int fp4, mx_piece *pcs, uint32_t *out, int32_t *bad)
{
    uint32_t m = 0, mats = 0;
    for (uint32_t i = 0; i < n; i++) {
        mx_piece c = {0};
        int rc = mx_piece_init(g, &c, &q[i], &s[i], &x[i], i, fp4);
        if (rc) {
            *bad = (int32_t)i;
            return rc;
        }
        if (c.blocks == 0)
            continue; /* nothing to write */
        if (m && mx_merge(&pcs[m - 1], &c, &mats, fp4))
            continue;
        pcs[m++] = c;
        mats = 1;
    }
    for (uint32_t j = 0; j < m; j++) {
        pcs[j].div_nb = mx_div_make(pcs[j].nb);
        pcs[j].div_n = mx_div_make(pcs[j].n);
    }
    *out = m;
    return REFIT_OK;
}

int mx_launch(refit_pgpu *g, uint32_t n, const refit_view *q, const refit_view *scales,
              const refit_view *x, int elem_bits, int hw, int32_t *bad)
{
    *bad = -1;
    g->msg[0] = 0;
    if ((elem_bits != 8 && elem_bits != 4) || n > 0x7fffffffu || (n && (!q || !scales || !x)))
        return refit_pgpu_fail(g, REFIT_EINVAL, "mx launcher: elem_bits must be 8 (MXFP8) or 4 "
                               "(MXFP4), pieces < 2^31 with their views");
    if (n == 0)
        return REFIT_OK;
    int fp4 = elem_bits == 4;
    mx_piece *pcs = malloc(sizeof *pcs * n);
    mxd_piece *ds = malloc(sizeof *ds * n);
    mx_blocks *m = malloc(sizeof *m);
    int rc = pcs && ds && m ? REFIT_OK
                            : refit_pgpu_fail(g, REFIT_ENOMEM, "mx launcher: host memory");
    uint32_t np = 0, md = 0, mg = 0;
    if (!rc)
        rc = mx_pieces(g, n, q, scales, x, fp4, pcs, &np, bad);
    /* dense pieces to ds, the rest stay in pcs, in order */
    for (uint32_t j = 0; !rc && j < np; j++)
        if (!mxd_make(&ds[md], &pcs[j], fp4, !fp4 && hw))
            pcs[mg++] = pcs[j];
        else
            md++;
    if (!rc && md)
        rc = mxd_launch(g, m, ds, md, fp4, !fp4 && hw);
    if (!rc && mg)
        rc = mx_launch_general(g, m, pcs, mg, fp4, !fp4 && hw);
    free(m);
    free(pcs);
    free(ds);
    return rc;
}
