/* NVFP4's launcher (nvfp4_launch.h): the pieces as the kernel reads them
 * (nvfp4_gpu.h), their sets and the software pipeline of launches that
 * quant_nvfp4.cu's header describes. Host code only: the device code is
 * reached through the refit_pgpu table. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "plugins/nvfp4/nvfp4_gpu.h"
#include "plugins/nvfp4/nvfp4_launch.h"

static int qn_refuse(refit_pgpu *g, int rc, const char *what, uint32_t i)
{
    return refit_pgpu_fail(g, rc, "nvfp4 launcher: piece %u: %s", i, what);
}


static bool qn_byte(const refit_view *v)
{
    return v->dtype.bits == 8 && v->dtype.lanes == 1;
}

static bool qn_one_f32(const refit_view *v)
{
    int64_t e = 1;
    for (int i = 0; i < v->ndim; i++)
        e *= v->shape[i];
    return v->data && refit_pgpu_float_kind(v->dtype) == 0 && e == 1;
}

static int64_t qn_pad(int64_t v, int64_t m)
{
    return (v + m - 1) / m * m;
}

/* Mark an online piece dense (the dense path's conditions, at its
 * section of quant_nvfp4.cu) and set its row division: r = umulhi(g,
 * dmul) >> dshift for every g < 2^31 (Granlund-Montgomery, the round-up
 * multiplier with p = 31 + ceil(log2 cb); cb 1 is taken apart in qn_swz). */
static void qn_dense_init(qn_piece *pc)
{
    int64_t blocks = pc->n * pc->cb;
    bool rows = pc->n <= 1 || (pc->xs0 == pc->k && pc->qs0 == pc->k / 2);
    if (pc->kind == 0 || pc->k == 0 || pc->k % 16 || pc->xs1 != 1 || pc->qs1 != 1 || !rows ||
        (uintptr_t)pc->x % 16 || (uintptr_t)pc->q % 4 || blocks >= ((int64_t)1 << 30) ||
        pc->items >= ((int64_t)1 << 31))
        return;
    uint32_t d = (uint32_t)pc->cb, l = 0;
    while (l < 32 && ((uint64_t)1 << l) < d)
        l++;
    pc->nblk = (uint32_t)blocks;
    pc->dmul = d > 1 ? (uint32_t)((((uint64_t)1 << (31 + l)) + d - 1) / d) : 0;
    pc->dshift = d > 1 ? l - 1 : 0;
}

/* Piece i as the kernels read it. The caller checked the views as the
 * references do; dtypes, ranks and sizes are checked again here. */
static int qn_piece_init(refit_pgpu *g, qn_piece *pc, const refit_nvfp4_piece *v, uint32_t i)
{
    const refit_view *x = &v->src;
    bool online = v->mode == REFIT_NVFP4_ONLINE;
    int kind = online ? refit_pgpu_float_kind(x->dtype) : 0;
    if (v->mode < REFIT_NVFP4_ONLINE || v->mode > REFIT_NVFP4_CT)
        return qn_refuse(g, REFIT_EINVAL, "mode must be online, ModelOpt or compressed-tensors",
                         i);
    if (kind < 0 || (!online && !qn_byte(x)) || !qn_byte(&v->scale) || !qn_one_f32(&v->alpha) ||
        (online && !qn_byte(&v->packed)) || (!online && !qn_one_f32(&v->weight_factor)))
        return qn_refuse(g, REFIT_EUNSUPPORTED, "dtypes: src f32/f16/bf16 (online) or 8-bit, "
                         "scale and packed 8-bit, alpha and factors one f32", i);
    if (x->ndim != 2 || x->shape[0] < 0 || x->shape[1] < 0 ||
        (online && (v->packed.ndim != 2 || v->packed.shape[0] != x->shape[0] ||
                    v->packed.shape[1] != (x->shape[1] + 1) / 2)))
        return qn_refuse(g, REFIT_EMISMATCH, "src 2-D, packed [n, ceil(k/2)]", i);
    memset(pc, 0, sizeof *pc);
    pc->x = (const char *)x->data;
    pc->s = (unsigned char *)v->scale.data;
    pc->alpha = (float *)v->alpha.data;
    pc->n = x->shape[0];
    pc->k = x->shape[1];
    pc->xs0 = x->strides[0];
    pc->xs1 = x->strides[1];
    pc->cb = online ? (pc->k + 15) / 16 : pc->k;
    pc->cp = qn_pad(pc->cb, 4);
    pc->items = qn_pad(pc->n, 128) * pc->cp;
    pc->idx = (int32_t)i;
    pc->mode = (uint8_t)v->mode;
    pc->kind = (uint8_t)kind;
    if (online) {
        int64_t es = kind == 0 ? 4 : 2;
        pc->q = (unsigned char *)v->packed.data;
        pc->qs0 = v->packed.strides[0];
        pc->qs1 = v->packed.strides[1];
        bool one_row = pc->n <= 1;
        pc->vx = ((uintptr_t)pc->x % 16 == 0) && pc->xs1 == 1 &&
                 (one_row || (pc->xs0 * es) % 16 == 0);
        pc->vq = ((uintptr_t)pc->q % 8 == 0) && pc->qs1 == 1 && (one_row || pc->qs0 % 8 == 0);
        qn_dense_init(pc);
    } else {
        pc->wf = (const float *)v->weight_factor.data;
        pc->in = (const float *)v->input_factor.data;
        pc->inv = pc->in ? (float *)v->input_scale_inv.data : NULL;
    }
    return REFIT_OK;
}

/* Blocks of a piece: about QN_ITEMS_PER_THREAD items a thread, at least
 * one (which writes alpha of an empty piece). */
static int64_t qn_blocks(const qn_piece *p)
{
    if (p->nblk) { /* dense: QN_UNITS_PER_WARP units a warp, one for a small piece */
        int64_t units = (p->nblk + QN_UNIT_BLOCKS - 1) / QN_UNIT_BLOCKS, warps = QN_THREADS / 32;
        int64_t b = (units + warps * QN_UNITS_PER_WARP - 1) / (warps * QN_UNITS_PER_WARP);
        if (b < QN_SMALL_CTAS) /* a small piece (a call per weight): more SMs busy */
            b = (units + warps - 1) / warps;
        return b > QN_BLOCKS_MAX ? QN_BLOCKS_MAX : b;
    }
    int64_t per = (int64_t)QN_THREADS * QN_ITEMS_PER_THREAD;
    int64_t b = (p->items + per - 1) / per;
    return b < 1 ? 1 : b > QN_BLOCKS_MAX ? QN_BLOCKS_MAX : b;
}

/* One pass of one piece in a launch. */
typedef struct qn_entry {
    uint32_t piece;
    uint8_t pass;               /* 0 amax, 1 encode */
} qn_entry;

/* Launch nvfp4_pass over entries e[0..m) (encode entries, then amax ones:
 * qn_pipeline's order), QN_BATCH a launch, the parameters built in b. */
static int qn_launch(refit_pgpu *g, void *kern, qn_batch *b, const qn_piece *pcs, const qn_entry *e,
                     uint32_t m)
{
    int rc = REFIT_OK;
    for (uint32_t at = 0; at < m && !rc; at += QN_BATCH) {
        uint32_t np = m - at < QN_BATCH ? m - at : QN_BATCH;
        int64_t ends[2] = {0, 0}; /* blocks of the amax, encode streams */
        b->np = (int32_t)np;
        b->ne = 0;
        for (uint32_t j = 0; j < np; j++) {
            uint8_t pass = e[at + j].pass;
            b->p[j] = pcs[e[at + j].piece];
            b->p[j].pass = pass;
            b->p[j].first = ends[pass];
            ends[pass] += qn_blocks(&b->p[j]);
            b->ne += pass;
        }
        b->end = ends[0] + ends[1];
        b->na = ends[0];
        void *args[] = {b, &g->status};
        rc = g->launch(g, kern, (uint32_t)b->end, QN_THREADS, args);
    }
    return rc;
}

/* Set numbers of the online pieces ord[0..m) (about set_bytes of input
 * each, whole pieces), their amax words, and the count of sets. */
static uint32_t qn_sets(qn_piece *pcs, const uint32_t *ord, uint32_t m, unsigned int *amax,
                        uint32_t *set, int64_t set_bytes)
{
    uint32_t ns = 0;
    int64_t bytes = 0;
    for (uint32_t j = 0; j < m; j++) {
        qn_piece *p = &pcs[ord[j]];
        int64_t b = p->n * p->k * (p->kind == 0 ? 4 : 2);
        if (j == 0 || bytes + b > set_bytes) { /* a piece larger than a set is one */
            ns++;
            bytes = 0;
        }
        set[j] = ns - 1;
        bytes += b;
        p->amax = amax + j;
    }
    return ns;
}

/* Launches 0 .. sets: launch j holds the encode entries of set j - 1
 * (launch 0: the checkpoint pieces instead) and the amax entries of set
 * j. ord: online pieces [0, n_on), then checkpoint pieces. */
static int qn_pipeline(refit_pgpu *g, void *kern, qn_batch *b, qn_piece *pcs, const uint32_t *ord,
                       uint32_t n_on, uint32_t n_ck, const uint32_t *set, uint32_t sets,
                       qn_entry *e)
{
    int rc = REFIT_OK;
    uint32_t enc = 0, amx = 0; /* next online piece to encode, to take the amax of */
    for (uint32_t j = 0; j <= sets && !rc; j++) {
        uint32_t m = 0;
        if (j == 0)
            for (uint32_t c = 0; c < n_ck; c++)
                e[m++] = (qn_entry){ord[n_on + c], 1};
        for (; enc < n_on && j > 0 && set[enc] == j - 1; enc++)
            e[m++] = (qn_entry){ord[enc], 1};
        for (; amx < n_on && set[amx] == j; amx++)
            e[m++] = (qn_entry){ord[amx], 0};
        if (m)
            rc = qn_launch(g, kern, b, pcs, e, m);
    }
    return rc;
}

int nvfp4_launch(refit_pgpu *g, uint32_t n, const refit_nvfp4_piece *pieces, int64_t set_bytes,
                 int32_t *bad)
{
    *bad = -1;
    g->msg[0] = 0;
    if (n == 0)
        return REFIT_OK;
    if (!pieces || n > 0x7fffffffu)
        return refit_pgpu_fail(g, REFIT_EINVAL, "nvfp4 launcher: no pieces, or 2^31 or more");
    if (set_bytes <= 0)
        set_bytes = QN_SET_BYTES;
    qn_piece *pcs = malloc(sizeof *pcs * n);
    uint32_t *ord = malloc(sizeof *ord * n * 2);
    qn_entry *e = malloc(sizeof *e * n);
    qn_batch *b = malloc(sizeof *b);
    uint32_t *set = ord ? ord + n : NULL;
    int rc = pcs && ord && e && b ? REFIT_OK
                                  : refit_pgpu_fail(g, REFIT_ENOMEM, "nvfp4 launcher: host memory");
    uint32_t n_on = 0, n_ck = 0;
    for (uint32_t i = 0; i < n && !rc; i++) {
        if ((rc = qn_piece_init(g, &pcs[i], &pieces[i], i))) {
            *bad = (int32_t)i;
            break;
        }
        n_on += pcs[i].mode == REFIT_NVFP4_ONLINE;
    }
    /* ord: online pieces in call order, then checkpoint pieces */
    for (uint32_t i = 0; i < n && !rc; i++)
        ord[pcs[i].mode == REFIT_NVFP4_ONLINE ? i - n_ck : n_on + n_ck++] = i;
    void *kern = NULL;
    if (!rc)
        rc = g->kernel(g, "nvfp4_pass", &kern);
    unsigned int *amax = NULL;
    if (!rc && n_on) { /* one amax word an online piece, zeroed */
        size_t bytes = sizeof *amax * n_on;
        amax = g->scratch(g, bytes);
        rc = amax ? g->zero(g, amax, bytes) : REFIT_ENOMEM;
    }
    if (!rc) {
        uint32_t sets = n_on ? qn_sets(pcs, ord, n_on, amax, set, set_bytes) : 0;
        rc = qn_pipeline(g, kern, b, pcs, ord, n_on, n_ck, set, sets, e);
    }
    free(b);
    free(e);
    free(pcs);
    free(ord);
    return rc;
}
