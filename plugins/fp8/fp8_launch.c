/* FP8's launcher (fp8_launch.h): the pieces as the kernels read them
 * (fp8_gpu.h), their launch order and classes, and the launches that
 * quant_fp8.cu's header describes. Host code only: the device code is
 * reached through the refit_pgpu table. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "plugins/fp8/fp8_launch.h"

static int qf_refuse(refit_pgpu *g, int rc, const char *what, uint32_t i)
{
    return refit_pgpu_fail(g, rc, "fp8 launcher: piece %u: %s", i, what);
}


/* 1 when a 2-D view's elements are one row-major run. */
static bool qf_contiguous(const refit_view *v)
{
    return (v->shape[0] <= 1 || v->strides[0] == v->shape[1]) &&
           (v->shape[1] <= 1 || v->strides[1] == 1);
}

/* Whether piece p takes the dense fast path of its scheme (quant_fp8.cu's
 * dense helpers say what that path assumes): the conversion instruction as
 * the encoder (hw: the integer encoder keeps the general path, so the
 * dense kernels inline one encoder only), a 16-bit weight, rows of x and q
 * aligned and contiguous, whole groups, pitches and scale strides that
 * fit the cursor's 32 bits; block-128: whole 128-column tiles too;
 * per-channel: rows of at most 8 groups a thread of the largest team
 * (2048 groups, 16384 elements); per-tensor: a flattened (contiguous)
 * piece. */
static bool qf_dense_ok(const qf_piece *p, int scheme, int hw)
{
    const int64_t lim = (int64_t)1 << 31; /* its cursor's 32-bit fields */
    if (!(hw & QF_HW) || p->kind == 0 || !p->vx || !p->vq || p->k % 8 != 0)
        return false;
    if (p->n >= lim || p->gpr >= lim || p->xs0 < 0 || p->xs0 * 2 >= lim || p->qs0 < 0 ||
        p->qs0 >= lim || p->ss0 < 0 || p->ss0 >= lim || p->ss1 < 0 || p->ss1 >= lim)
        return false;
    if (scheme == 2)
        return p->k % 128 == 0;
    if (scheme == 1)
        return p->gpr <= (int64_t)QF_THREADS * QF_DENSE_CH;
    return p->n <= 1;
}

/* Piece i as the kernels read it; a contiguous per-tensor piece is walked
 * as one row. The views were checked as kern_quant_fp8 checks them; the
 * dtype and ranks are checked again here. */
static int qf_piece_init(refit_pgpu *g, qf_piece *pc, const refit_view *q, const refit_view *s,
                         const refit_view *x, uint32_t i, int scheme, int hw)
{
    int kind = refit_pgpu_float_kind(x->dtype);
    if (kind < 0 || q->dtype.bits != 8 || q->dtype.lanes != 1 ||
        refit_pgpu_float_kind(s->dtype) != 0)
        return qf_refuse(g, REFIT_EUNSUPPORTED, "dtypes: x f32/f16/bf16, q one byte, scale f32",
                         i);
    if (x->ndim != 2 || q->ndim != 2 || s->ndim != 2 || q->shape[0] != x->shape[0] ||
        q->shape[1] != x->shape[1] || x->shape[0] < 0 || x->shape[1] < 0)
        return qf_refuse(g, REFIT_EMISMATCH, "x and q must be 2-D of one shape, scale 2-D", i);
    memset(pc, 0, sizeof *pc);
    int64_t es = kind == 0 ? 4 : 2;
    pc->x = (const char *)x->data;
    pc->q = (unsigned char *)q->data;
    pc->s = (float *)s->data;
    pc->n = x->shape[0];
    pc->k = x->shape[1];
    pc->xs0 = x->strides[0];
    pc->xs1 = x->strides[1];
    pc->qs0 = q->strides[0];
    pc->qs1 = q->strides[1];
    pc->ss0 = s->strides[0];
    pc->ss1 = s->strides[1];
    pc->idx = (int32_t)i;
    pc->kind = (uint8_t)kind;
    pc->shift = kind == 0 ? 2 : 3;
    if (scheme == 0 && qf_contiguous(x) && qf_contiguous(q)) {
        pc->k = pc->n * pc->k;
        pc->n = pc->k ? 1 : 0;
        pc->xs0 = pc->qs0 = pc->k;
        pc->xs1 = pc->qs1 = 1;
    }
    pc->gpr = (pc->k + (1 << pc->shift) - 1) >> pc->shift;
    bool one_row = pc->n <= 1;
    pc->vx = ((uintptr_t)pc->x % 16 == 0) && pc->xs1 == 1 && (one_row || (pc->xs0 * es) % 16 == 0);
    pc->vq = ((uintptr_t)pc->q % 8 == 0) && pc->qs1 == 1 && (one_row || pc->qs0 % 8 == 0);
    pc->dense = qf_dense_ok(pc, scheme, hw);
    return REFIT_OK;
}

/* Units of work of a piece: rows (per-channel), 128x128 tiles (block-128),
 * chunks (per-tensor; at least one, which writes an empty group's scale). */
static int64_t qf_units(const qf_piece *p, int scheme)
{
    if (scheme == 1)
        return p->n;
    if (scheme == 2)
        return ((p->n + 127) / 128) * ((p->k + 127) / 128);
    int64_t c = (p->n * p->gpr + QF_CHUNK - 1) / QF_CHUNK;
    return c < 1 ? 1 : c;
}

/* Dense group numbers of per-tensor pieces: pieces whose scale views start
 * at the same element share a group, numbered by first appearance. */
static uint32_t qf_groups(const refit_view *scale, uint32_t n, uint32_t *grp)
{
    uint32_t ng = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t j = 0;
        while (j < i && scale[j].data != scale[i].data)
            j++;
        grp[i] = j < i ? grp[j] : ng++;
    }
    return ng;
}

static int64_t qf_env(const char *name, int64_t dflt)
{
    const char *v = getenv(name);
    long long x = v ? atoll(v) : 0;
    return x > 0 ? (int64_t)x : dflt;
}

static size_t qf_align(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Launch kernel `name` with the k_rows/k_tiles parameters. */
static int qf_go(refit_pgpu *g, const char *name, unsigned grid, const qf_piece *P, int np,
                 int64_t t0, int64_t t1, unsigned int *status, int hw)
{
    void *k = NULL;
    int rc = g->kernel(g, name, &k);
    void *args[] = {&P, &np, &t0, &t1, &status, &hw};
    return rc ? rc : g->launch(g, k, grid, QF_THREADS, args);
}

/* k_rows over pieces a .. b - 1 (rows from pcs[a].first to t1), at the
 * depth of their longest row. */
static int qf_rows_launch(refit_pgpu *g, const qf_piece *P, const qf_piece *pcs, uint32_t a,
                          uint32_t b, int64_t t1, unsigned int *status, int hw)
{
    int64_t gr = 0, t0 = pcs[a].first, most = (int64_t)g->multiprocessors * 16;
    int64_t blocks = (t1 - t0 + QF_WARPS - 1) / QF_WARPS;
    if (blocks == 0)
        return REFIT_OK;
    for (uint32_t i = a; i < b; i++)
        gr = pcs[i].n && pcs[i].gpr > gr ? pcs[i].gpr : gr;
    unsigned grid = (unsigned)(blocks < most ? blocks : most);
    P += a;
    int np = (int)(b - a);
    const char *k = gr <= 32       ? "qf_rows_1"
                    : gr <= 2 * 32 ? "qf_rows_2"
                    : gr <= 4 * 32 ? "qf_rows_4"
                    : gr <= 8 * 32 ? "qf_rows_8"
                    : gr <= 16 * 32 ? "qf_rows_16"
                                    : "qf_rows_24"; /* QF_ROW_CH_MAX */
    return qf_go(g, k, grid, P, np, t0, t1, status, hw);
}

/* The launch of a block-128 or per-channel piece: block-128 0 dense, 1
 * general; per-channel 0 .. 4 dense (k_rows_dense<class>, a team of
 * QF_TEAM_T threads a row, QF_TEAM_CH groups a lane: rows of up to T CH
 * groups), 5 general rows of up to QF_SHORT_ROW groups, 6 longer ones.
 * Pieces go in class order, a launch a class. */
#define QF_CLASSES 7
static int qf_class(const qf_piece *p, int scheme)
{
    if (scheme == 2)
        return p->dense ? 0 : 1;
    if (p->dense) {
        int c = 0;
        while ((int64_t)QF_TEAM_T(c) * QF_TEAM_CH(c) < p->gpr)
            c++;
        return c;
    }
    return p->gpr <= QF_SHORT_ROW ? 5 : 6;
}

/* Blocks for a dense launch of `units` (tiles or row batches): every
 * block resident at once (4 an SM at 64 registers), each a run of units. */
static unsigned qf_dense_grid(const refit_pgpu *g, int64_t units)
{
    int64_t most = (int64_t)g->multiprocessors * 4;
    return (unsigned)(units < most ? units : most);
}

/* The launch of class cls over pieces P[0 .. np) (pcs: their host copy),
 * units t0 .. t1 - 1. */
static int qf_class_launch(refit_pgpu *g, const qf_piece *P, const qf_piece *pcs, int np,
                           int scheme, int cls, int64_t t0, int64_t t1, unsigned int *status,
                           int hw)
{
    static const char *const dense_rows[5] = {"qf_rows_dense_0", "qf_rows_dense_1",
                                              "qf_rows_dense_2", "qf_rows_dense_3",
                                              "qf_rows_dense_4"};
    if (scheme == 2 && cls == 0)
        return qf_go(g, "qf_tiles_dense", qf_dense_grid(g, t1 - t0), P, np, t0, t1, status, hw);
    if (scheme == 2) {
        bool f32 = false;
        for (int i = 0; i < np; i++)
            f32 = f32 || pcs[i].kind == 0;
        int64_t most = (int64_t)g->multiprocessors * 16;
        unsigned grid = (unsigned)(t1 - t0 < most ? t1 - t0 : most);
        return qf_go(g, f32 ? "qf_tiles_16" : "qf_tiles_8", grid, P, np, t0, t1, status, hw);
    }
    if (cls < 5) {
        int rows = QF_THREADS / QF_TEAM_T(cls); /* a block's rows at a time */
        unsigned grid = qf_dense_grid(g, (t1 - t0 + rows - 1) / rows);
        return qf_go(g, dense_rows[cls], grid, P, np, t0, t1, status, hw);
    }
    return qf_rows_launch(g, P, pcs, 0, (uint32_t)np, t1, status, hw);
}

/* The launches of a call over the table at dev (its head, pieces, then
 * groups): one (per-tensor), or one for each launch class present
 * (block-128, per-channel). */
static int qf_launch(refit_pgpu *g, char *dev, const qf_piece *pcs, uint32_t n, int scheme,
                     int64_t units, int64_t round, int64_t lag, int rev, int hw)
{
    const qf_piece *P = (const qf_piece *)(void *)(dev + qf_align(sizeof(qf_head)));
    qf_head *head = (qf_head *)(void *)dev;
    unsigned int *status = g->status;
    int np = (int)n, rc = REFIT_OK;
    if (scheme == 0) {
        qf_group *G = (qf_group *)(void *)(dev + qf_align(sizeof(qf_head)) +
                                           qf_align(sizeof(qf_piece) * n));
        int64_t tickets = ((units + round - 1) / round + lag) * 2 * round;
        bool all = true;
        for (uint32_t i = 0; i < n; i++)
            all = all && pcs[i].dense;
        int64_t most = (int64_t)g->multiprocessors * (all ? 3 : 2); /* all resident */
        unsigned grid = (unsigned)(tickets < most ? tickets : most);
        void *k = NULL;
        rc = g->kernel(g, all ? "qf_tensor_1" : "qf_tensor_0", &k);
        void *args[] = {&P, &np, &G, &head, &status, &units, &round, &lag, &rev, &hw};
        return rc ? rc : g->launch(g, k, grid, QF_THREADS, args);
    }
    /* a launch for each run of one class (qf_plan put them in class order) */
    for (uint32_t a = 0, b; a < n && !rc; a = b) {
        int cls = qf_class(&pcs[a], scheme);
        for (b = a + 1; b < n && qf_class(&pcs[b], scheme) == cls;)
            b++;
        int64_t t0 = pcs[a].first, t1 = b < n ? pcs[b].first : units;
        if (t1 > t0)
            rc = qf_class_launch(g, P + a, pcs + a, (int)(b - a), scheme, cls, t0, t1, status,
                                 hw);
    }
    return rc;
}

/* Pieces in launch order, each with its first unit; per-tensor: ordered by
 * group (ord: a stable counting sort, so that a group's chunks are one
 * run), the group words, and the lag that keeps every encode chunk after
 * its group's amax chunks. Returns the units of the call. */
static int64_t qf_plan(qf_piece *pcs, const qf_piece *in, uint32_t n, int scheme,
                       const uint32_t *grp, uint32_t ngroups, uint32_t *ord, qf_group *G,
                       int64_t round, int64_t *lag)
{
    int64_t units = 0;
    if (scheme != 0) { /* by launch class, each class in call order */
        uint32_t at = 0;
        for (int cls = 0; cls < QF_CLASSES; cls++)
            for (uint32_t i = 0; i < n; i++) {
                if (qf_class(&in[i], scheme) != cls)
                    continue;
                pcs[at] = in[i];
                pcs[at].first = units;
                units += qf_units(&pcs[at], scheme);
                at++;
            }
        return units;
    }
    /* ord[0..ngroups] counts, then the start of each group, then its end */
    uint32_t *start = ord + n;
    memset(start, 0, sizeof *start * ((size_t)ngroups + 1));
    for (uint32_t i = 0; i < n; i++)
        start[grp[i] + 1]++;
    for (uint32_t gi = 0; gi < ngroups; gi++)
        start[gi + 1] += start[gi];
    for (uint32_t i = 0; i < n; i++)
        ord[start[grp[i]]++] = i;
    int64_t span = 0, gf = 0;
    uint32_t lead_at = 0;
    for (uint32_t at = 0; at < n; at++) {
        uint32_t gi = grp[ord[at]];
        bool lead = at == 0 || grp[ord[at - 1]] != gi;
        if (lead) {
            gf = units;
            lead_at = at;
        }
        pcs[at] = in[ord[at]];
        pcs[at].first = units;
        pcs[at].group = gi;
        pcs[at].leader = lead;
        units += qf_units(&pcs[at], 0);
        if (at + 1 == n || grp[ord[at + 1]] != gi) { /* the group's last piece */
            bool one = true;
            for (uint32_t j = lead_at; j <= at; j++)
                one = one && pcs[j].kind == pcs[lead_at].kind;
            for (uint32_t j = lead_at; j <= at; j++) {
                pcs[j].onekind = one;
                pcs[j].gfirst = gf;
                pcs[j].gend = units;
                pcs[j].gpiece = (int32_t)lead_at;
            }
            G[gi].amax = 0;
            G[gi].done = 0;
            G[gi].need = (unsigned int)(units - gf);
            G[gi].pad = 0;
            int64_t sp = (units - 1) / round - gf / round;
            span = sp > span ? sp : span;
        }
    }
    *lag = span > *lag ? span : *lag;
    return units;
}

int fp8_launch(refit_pgpu *g, uint32_t n, const refit_view *q, const refit_view *scale,
               const refit_view *x, int scheme, int hw, int32_t *bad)
{
    *bad = -1;
    g->msg[0] = 0;
    if (scheme < 0 || scheme > 2 || n > 0x7fffffffu || (n && (!q || !scale || !x)))
        return refit_pgpu_fail(g, REFIT_EINVAL, "fp8 launcher: scheme must be 0, 1 or 2, pieces "
                               "< 2^31 with their views");
    if (n == 0)
        return REFIT_OK;
    qf_piece *in = malloc(sizeof *in * n);
    /* grp: piece -> group; ord: pieces by group, then the sort's counts */
    uint32_t *grp = malloc(sizeof *grp * (3 * (size_t)n + 1)), ngroups = 0;
    uint32_t *ord = grp ? grp + n : NULL;
    int rc = in && grp ? REFIT_OK : refit_pgpu_fail(g, REFIT_ENOMEM, "fp8 launcher: host memory");
    for (uint32_t i = 0; i < n && !rc; i++)
        if ((rc = qf_piece_init(g, &in[i], &q[i], &scale[i], &x[i], i, scheme, hw)))
            *bad = (int32_t)i;
    if (!rc && scheme == 0)
        ngroups = qf_groups(scale, n, grp);
    size_t off_p = qf_align(sizeof(qf_head)), off_g = off_p + qf_align(sizeof(qf_piece) * n);
    size_t bytes = off_g + sizeof(qf_group) * ngroups;
    char *table = rc ? NULL : calloc(1, bytes);
    if (!rc && !table)
        rc = refit_pgpu_fail(g, REFIT_ENOMEM, "fp8 launcher: host memory");
    if (!rc) {
        qf_head *h = (qf_head *)(void *)table;
        h->status = QF_NONE;
        int64_t round = qf_env("REFIT_CUDA_FP8_ROUND", QF_ROUND);
        const char *rv = getenv("REFIT_CUDA_FP8_REVERSE");
        int rev = rv && rv[0] == '1'; /* forwards measured better (docs/cuda.md) */
        int64_t lag = qf_env("REFIT_CUDA_FP8_LAG", QF_LAG);
        qf_piece *pcs = (qf_piece *)(void *)(table + off_p);
        int64_t units = qf_plan(pcs, in, n, scheme, grp, ngroups, ord,
                                (qf_group *)(void *)(table + off_g), round, &lag);
        if (units > ((int64_t)1 << 40))
            rc = refit_pgpu_fail(g, REFIT_EUNSUPPORTED, "fp8 launcher: more than 2^40 units "
                                 "of work in a call");
        char *dev = rc || units == 0 ? NULL : g->scratch(g, bytes);
        if (!rc && units > 0 && !dev)
            rc = REFIT_ENOMEM;
        if (dev && !(rc = g->upload(g, dev, table, bytes)))
            rc = qf_launch(g, dev, pcs, n, scheme, units, round, lag, rev,
                           hw & (QF_HW | QF_RECIP));
    }
    free(table);
    free(in);
    free(grp);
    return rc;
}

int fp8_cvt_launch(refit_pgpu *g, qf_cvt_result *res)
{
    void *k = NULL;
    int rc = g->kernel(g, "qf_cvt_check", &k);
    unsigned long long *count = &res->count;
    unsigned int *first = &res->first;
    void *args[] = {&count, &first};
    return rc ? rc : g->launch(g, k, QF_CVT_GRID, QF_THREADS, args);
}
