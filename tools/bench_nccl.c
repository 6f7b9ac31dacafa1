/* refit-bench nccl (tools/bench_nccl.h): two processes, two GPUs. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include <refit/transport.h>
#include <refit/sys/transport.h> /* the receiver's direct-byte count */

#include "transports/nccl/bucket.h"
#include "transports/nccl/xport.h"
#include "journal/journal.h"
#include "kernels/fingerprint.h"
#include "tools/bench_nccl.h"
#include "tools/cli.h"

#define MIB ((uint64_t)1 << 20)
#define BN_PATTERN (16 * MIB)
#define BN_MAX_BUCKETS 8
#define BN_BF16 ((refit_dtype){REFIT_DTYPE_BFLOAT, 16, 1})

typedef struct bn_opts {
    int layers, repeat, failures;
    int64_t hidden, inter, vocab;
    uint64_t buckets[BN_MAX_BUCKETS];
    int n_buckets;
    double timeout;
    const char *journal;
    const char *preload;        /* a libnccl.so.2 to load first, as an engine would */
    int64_t direct_min;         /* refit_send_opts.direct_min_bytes; < 0: the default */
} bn_opts;

typedef struct bn_tensor {
    char name[96], module[64];
    int64_t shape[2];
    uint64_t bytes, off;        /* in the arena */
    refit_tensor t;
} bn_tensor;

typedef struct bn_model {
    bn_tensor *t;
    int n;
    uint64_t total;
} bn_model;

/* ---- the CUDA driver, looked up as the transport does ($REFIT_CUDA_DRIVER_LIBRARY,
 * else libcuda.so.1): the few calls the bench makes itself ---- */

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;
#define CU_SUCCESS 0

typedef struct bn_cu {
    CUresult (*Init)(unsigned int flags);
    CUresult (*DeviceGetCount)(int *n);
    CUresult (*DeviceGet)(CUdevice *dev, int ordinal);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*CtxSetCurrent)(CUcontext ctx);
    CUresult (*MemAlloc)(CUdeviceptr *p, size_t bytes);
    CUresult (*MemcpyHtoD)(CUdeviceptr dst, const void *src, size_t n);
    CUresult (*GetErrorString)(CUresult r, const char **s);
} bn_cu;

static const char *bn_cu_errstr(const bn_cu *a, CUresult r)
{
    const char *s = NULL;
    if (a->GetErrorString && a->GetErrorString(r, &s) == CU_SUCCESS && s)
        return s;
    return "unknown CUDA driver error";
}

/* Fill a from the driver and cuInit it; -1 with err saying why. */
static int bn_cu_open(bn_cu *a, char *err, size_t n)
{
    memset(a, 0, sizeof *a);
    const char *path = getenv("REFIT_CUDA_DRIVER_LIBRARY");
    if (!path || !*path)
        path = "libcuda.so.1";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, n, "cannot load the CUDA driver %s: %s", path, dlerror());
        return -1;
    }
    static const struct { const char *name; size_t at; } syms[] = {
        {"cuInit", offsetof(bn_cu, Init)},
        {"cuDeviceGetCount", offsetof(bn_cu, DeviceGetCount)},
        {"cuDeviceGet", offsetof(bn_cu, DeviceGet)},
        {"cuDevicePrimaryCtxRetain", offsetof(bn_cu, DevicePrimaryCtxRetain)},
        {"cuCtxSetCurrent", offsetof(bn_cu, CtxSetCurrent)},
        {"cuMemAlloc_v2", offsetof(bn_cu, MemAlloc)},
        {"cuMemcpyHtoD_v2", offsetof(bn_cu, MemcpyHtoD)},
        {"cuGetErrorString", offsetof(bn_cu, GetErrorString)},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *p = dlsym(h, syms[i].name);
        if (!p) {
            snprintf(err, n, "the CUDA driver %s has no %s", path, syms[i].name);
            return -1;
        }
        memcpy((char *)a + syms[i].at, &p, sizeof p);
    }
    CUresult r = a->Init(0);
    if (r != CU_SUCCESS) {
        snprintf(err, n, "the CUDA driver (%s) has no usable device: cuInit: %s", path,
                 bn_cu_errstr(a, r));
        return -1;
    }
    return 0;
}

typedef struct bn_gpu {
    bn_cu cu;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr arena[2];       /* two versions (trainer), runtime (worker) */
} bn_gpu;

/* Seconds on CLOCK_MONOTONIC: the bench's timings, and the clock of the
 * transport's deadlines (an op's deadline is now_s() + a timeout). */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- the model ---- */

static void bn_add(bn_model *L, const char *module, const char *name, int64_t r, int64_t c)
{
    bn_tensor *t = &L->t[L->n++];
    snprintf(t->module, sizeof t->module, "%s", module);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->shape[0] = r;
    t->shape[1] = c;
    t->bytes = (uint64_t)(r * (c ? c : 1)) * 2;
    t->off = L->total;
    L->total += (t->bytes + 255) & ~(uint64_t)255;
}

/* Llama-shaped, bf16: embed, per layer norms, qkv, o, gate_up, down,
 * final norm, lm_head. */
static int bn_layout(bn_model *L, const bn_opts *o)
{
    L->t = calloc((size_t)o->layers * 6 + 3, sizeof *L->t);
    if (!L->t)
        return -1;
    int64_t H = o->hidden, I = o->inter;
    bn_add(L, "embed", "model.embed_tokens.weight", o->vocab, H);
    for (int l = 0; l < o->layers; l++) {
        char m[64], n[96];
#define BN_T(part, ckpt, r, c)                                                   \
        snprintf(m, sizeof m, "layers.%d.%s", l, part);                          \
        snprintf(n, sizeof n, "model.layers.%d.%s.weight", l, ckpt);             \
        bn_add(L, m, n, r, c)
        BN_T("in_norm", "input_layernorm", H, 0);
        BN_T("qkv", "self_attn.qkv_proj", 3 * H, H);
        BN_T("o", "self_attn.o_proj", H, H);
        BN_T("post_norm", "post_attention_layernorm", H, 0);
        BN_T("gate_up", "mlp.gate_up_proj", 2 * I, H);
        BN_T("down", "mlp.down_proj", H, I);
#undef BN_T
    }
    bn_add(L, "norm", "model.norm.weight", H, 0);
    bn_add(L, "lm_head", "lm_head.weight", o->vocab, H);
    return 0;
}

/* ---- deterministic bytes: tensor i of version v reads a 16 MiB random
 * pattern from an offset of its own, wrapping around ---- */

static uint8_t *pattern(void)
{
    static uint8_t *p;
    if (!p && (p = malloc(BN_PATTERN))) {
        uint64_t z = 0x5eed;
        for (uint64_t i = 0; i < BN_PATTERN; i += 8) {
            uint64_t w = (z += 0x9e3779b97f4a7c15ull);
            w = (w ^ (w >> 30)) * 0xbf58476d1ce4e5b9ull;
            w = (w ^ (w >> 27)) * 0x94d049bb133111ebull;
            w ^= w >> 31;
            memcpy(p + i, &w, 8);
        }
    }
    return p;
}

static uint64_t pat_start(int i, int version)
{
    return ((uint64_t)i * 1048583u + (uint64_t)version * 7340033u) % BN_PATTERN;
}

/* Calls fn(user, chunk, len) over tensor i's bytes for version. */
static int pat_walk(const bn_tensor *t, int i, int version,
                    int (*fn)(void *user, uint64_t at, const uint8_t *p, size_t n), void *user)
{
    const uint8_t *P = pattern();
    if (!P)
        return -1;
    uint64_t s = pat_start(i, version);
    for (uint64_t at = 0; at < t->bytes;) {
        size_t n = (size_t)(BN_PATTERN - s < t->bytes - at ? BN_PATTERN - s : t->bytes - at);
        if (fn(user, at, P + s, n))
            return -1;
        at += n;
        s = 0;
    }
    return 0;
}

typedef struct up_ctx {
    bn_gpu *g;
    CUdeviceptr base;
} up_ctx;

static int up_chunk(void *user, uint64_t at, const uint8_t *p, size_t n)
{
    up_ctx *u = user;
    return u->g->cu.MemcpyHtoD(u->base + at, p, n) != CU_SUCCESS;
}

static int fp_chunk(void *user, uint64_t at, const uint8_t *p, size_t n)
{
    (void)at;
    kern_fp_update(user, p, n);
    return 0;
}

static int bn_upload(bn_gpu *g, const bn_model *L, CUdeviceptr arena, int version)
{
    for (int i = 0; i < L->n; i++) {
        up_ctx u = {g, arena + L->t[i].off};
        if (pat_walk(&L->t[i], i, version, up_chunk, &u))
            return -1;
    }
    return 0;
}

static uint64_t bn_expected_fp(const bn_model *L, int i, int version)
{
    kern_fp fp;
    kern_fp_init(&fp);
    pat_walk(&L->t[i], i, version, fp_chunk, &fp);
    return kern_fp_final(&fp);
}

/* ---- devices, descriptors ---- */

static int bn_gpu_open(bn_gpu *g, int device, uint64_t bytes, int arenas, char *err, size_t n)
{
    memset(g, 0, sizeof *g);
    int count = 0;
    if (bn_cu_open(&g->cu, err, n))
        return -1;
    if (g->cu.DeviceGetCount(&count) != CU_SUCCESS || count < 2) {
        snprintf(err, n, "%d CUDA device(s); two are needed", count);
        return -1;
    }
    CUresult r = g->cu.DeviceGet(&g->dev, device);
    if (r == CU_SUCCESS)
        r = g->cu.DevicePrimaryCtxRetain(&g->ctx, g->dev);
    if (r == CU_SUCCESS)
        r = g->cu.CtxSetCurrent(g->ctx);
    for (int a = 0; a < arenas && r == CU_SUCCESS; a++)
        r = g->cu.MemAlloc(&g->arena[a], bytes);
    if (r != CU_SUCCESS)
        snprintf(err, n, "device %d: %s", device, bn_cu_errstr(&g->cu, r));
    return r == CU_SUCCESS ? 0 : -1;
}

/* Descriptors of every tensor over an arena on device. */
static void bn_describe(bn_model *L, CUdeviceptr arena, int device)
{
    for (int i = 0; i < L->n; i++) {
        bn_tensor *t = &L->t[i];
        t->t = (refit_tensor){.data = (void *)(uintptr_t)(arena + t->off),
                              .device = {REFIT_DEVICE_CUDA, device},
                              .ndim = t->shape[1] ? 2 : 1, .dtype = BN_BF16, .shape = t->shape};
    }
}

static int bn_barrier(refit_transport *x, double timeout)
{
    int32_t v = 0;
    return x->ops->allreduce_min(x, &v, now_s() + timeout);
}

/* One raw broadcast of bytes at p, through the transport's stream. */
static int bn_bcast(refit_transport *x, void *p, uint64_t bytes, double timeout)
{
    uint64_t t;
    int rc = x->ops->bcast(x, p, bytes, 0, now_s() + timeout);
    if (!rc)
        rc = x->ops->mark(x, &t);
    return rc ? rc : x->ops->wait(x, t, now_s() + timeout);
}

/* The raw figures: the whole arena in one broadcast, then one per tensor;
 * best of repeat, timed on the calling rank after a barrier. */
static int bn_raw(refit_transport *x, const bn_model *L, CUdeviceptr arena, const bn_opts *o,
                  double *whole, double *per_tensor)
{
    *whole = *per_tensor = 1e30;
    for (int r = 0; r < o->repeat + 1; r++) {
        int rc = bn_barrier(x, o->timeout);
        double t0 = now_s();
        if (!rc)
            rc = bn_bcast(x, (void *)(uintptr_t)arena, L->total, o->timeout);
        double t1 = now_s();
        for (int i = 0; i < L->n && !rc; i++) {
            uint64_t t;
            rc = x->ops->bcast(x, (void *)(uintptr_t)(arena + L->t[i].off), L->t[i].bytes, 0,
                               now_s() + o->timeout);
            if (!rc && i == L->n - 1 && !(rc = x->ops->mark(x, &t)))
                rc = x->ops->wait(x, t, now_s() + o->timeout);
        }
        double t2 = now_s();
        if (rc)
            return rc;
        if (r > 0 && t1 - t0 < *whole) /* the first is a warm-up */
            *whole = t1 - t0;
        if (r > 0 && t2 - t1 < *per_tensor)
            *per_tensor = t2 - t1;
    }
    return 0;
}

/* ---- one rank ---- */

typedef struct bn_rank {
    const bn_opts *o;
    refit_ctx *ctx;
    refit_transport *x;
    bn_gpu g;
    bn_model L;
    refit_model *m;             /* worker */
    uint64_t fp[3][512];        /* worker: expected per-tensor fingerprints, per content */
    json_t *res;                /* worker: the output, one JSON object */
    json_t *rows;               /* worker: res's "refit" rows */
    double raw_whole, raw_tensor;
    int updates;
    int committed;              /* worker: the content its last commit holds */
    refit_sender *snd;          /* trainer: kept across updates of one configuration */
    uint64_t snd_bucket;
    int snd_sum, snd_direct;
    char where[600];            /* which NCCL was found (refit_nccl_probe) */
} bn_rank;

/* A figure as the output always gave it: rounded to places decimals. */
static json_t *fixed(double v, int places)
{
    double f = pow(10, places);
    return json_real(round(v * f) / f);
}

static void put(json_t *o, const char *key, json_t *v)
{
    json_object_set_new(o, key, v);
}

static json_t *jtext(const char *s)
{
    json_t *v = json_string(s ? s : "");
    return v ? v : json_string("(not UTF-8)");
}

/* The content an update number carries: 1 or 2, alternating. */
static int content_of(int update)
{
    return 1 + update % 2;
}

/* DIRECT buckets' size when --direct-min does not say (the rows that
 * compare them with the default, which sends none). */
#define BN_DIRECT_MIN ((uint64_t)16 << 20)

static void *killer(void *arg);

/* direct 0: no DIRECT buckets (direct_min_bytes 0, the default: every byte
 * packed); 1: DIRECT buckets for tensors of --direct-min bytes (16 MiB when
 * not given). */
static int trainer_send(bn_rank *k, uint64_t bucket, int checksum, int direct,
                        refit_group_result *res, double kill_after)
{
    int c = content_of(k->updates);
    char label[32];
    snprintf(label, sizeof label, "u%d", k->updates++);
    /* the descriptors the sender borrows now point at content c */
    bn_describe(&k->L, k->g.arena[c - 1], 0);
    /* a trainer keeps its sender across steps (slots and buffers reused):
     * a new one only when the configuration changes */
    if (k->snd &&
        (k->snd_bucket != bucket || k->snd_sum != checksum || k->snd_direct != direct)) {
        refit_sender_destroy(k->snd);
        k->snd = NULL;
    }
    int rc = REFIT_OK;
    if (!k->snd) {
        refit_send_opts so = REFIT_SEND_OPTS_INIT;
        so.version_label = label;
        so.bucket_bytes = bucket;
        so.checksum_payload = checksum;
        so.timeout_s = k->o->timeout;
        so.direct_min_bytes = !direct ? 0
                            : k->o->direct_min > 0 ? (uint64_t)k->o->direct_min
                                                   : BN_DIRECT_MIN;
        rc = refit_sender_create(&k->snd, k->x, &so);
        for (int i = 0; i < k->L.n && !rc; i++)
            rc = refit_sender_add(k->snd, k->L.t[i].name, &k->L.t[i].t);
        k->snd_bucket = bucket;
        k->snd_sum = checksum;
        k->snd_direct = direct;
    } else {
        rc = refit_sender_set_label(k->snd, label);
    }
    refit_sender *s = k->snd;
    if (!rc)
        rc = bn_barrier(k->x, k->o->timeout);
    static double after;
    pthread_t th;
    if (!rc && kill_after > 0 && (after = kill_after) > 0)
        pthread_create(&th, NULL, killer, &after);
    if (!rc)
        rc = refit_sender_send(s, res);
    return rc;
}

static void *killer(void *arg)
{
    double *after = arg;
    struct timespec ts = {(time_t)*after, (long)((*after - (double)(time_t)*after) * 1e9)};
    nanosleep(&ts, NULL);
    raise(SIGKILL); /* a trainer killed mid-update: no cleanup, no goodbye */
    return NULL;
}

/* The trainer's part of each scenario, in the worker's order. */
static int trainer_run(bn_rank *k)
{
    const bn_opts *o = k->o;
    refit_group_result res;
    int rc = bn_raw(k->x, &k->L, k->g.arena[0], o, &k->raw_whole, &k->raw_tensor);
    int md = o->direct_min > 0; /* the main rows' DIRECT setting, as worker_run's */
    for (int b = 0; b < o->n_buckets && !rc; b++)
        for (int r = 0; r < o->repeat && !rc; r++)
            rc = trainer_send(k, o->buckets[b] * MIB, 1, md, &res, 0);
    uint64_t last = o->buckets[o->n_buckets - 1] * MIB;
    for (int r = 0; r < o->repeat && !rc; r++)
        rc = trainer_send(k, last, 0, md, &res, 0); /* checksum off */
    for (int r = 0; r < o->repeat && !rc; r++)
        rc = trainer_send(k, last, 1, !md, &res, 0); /* the other DIRECT setting */
    if (!rc)
        rc = trainer_send(k, last, 1, md, &res, 0); /* the worker keeps an undo log */
    if (rc || !o->failures) {
        refit_sender_destroy(k->snd);
        return rc;
    }
    if (trainer_send(k, last, 1, md, &res, 0) != REFIT_EMOVED) { /* the worker fails its checks */
        fprintf(stderr, "trainer: the vote did not abort: %s\n", refit_errmsg(k->ctx));
        return 1;
    }
    /* buckets small enough that the update has several, killed once a
     * fraction of a raw broadcast's time has passed: mid-update */
    uint64_t kb = k->L.total / 8 < 16 * MIB ? k->L.total / 8 : 16 * MIB;
    trainer_send(k, kb ? kb : 1, 1, md, &res,
                 k->raw_whole * 0.4 > 0.0005 ? k->raw_whole * 0.4 : 0.0005);
    sleep(60); /* not reached: killed mid-update */
    return 1;
}

/* ---- the worker ---- */

static int worker_model(bn_rank *k)
{
    int rc = refit_model_create(&k->m, k->ctx);
    bn_describe(&k->L, k->g.arena[0], 1);
    for (int i = 0; i < k->L.n && !rc; i++) {
        bn_tensor *t = &k->L.t[i];
        refit_ckpt_spec sp = REFIT_CKPT_SPEC_INIT;
        sp.dtype = BN_BF16;
        sp.ndim = t->t.ndim;
        sp.shape[0] = t->shape[0];
        sp.shape[1] = t->shape[1];
        rc = refit_model_add_module(k->m, t->module, "unquantized", NULL);
        if (!rc)
            rc = refit_module_bind_runtime(k->m, t->module, "weight", &t->t);
        if (!rc)
            rc = refit_model_expect(k->m, t->module, t->name, &sp);
    }
    return rc ? rc : refit_model_seal(k->m);
}

/* Every runtime tensor holds content c, bit for bit (device fingerprints
 * against the host's of the bytes the trainer uploaded). */
static int worker_exact(bn_rank *k, int c, bool *exact)
{
    *exact = true;
    for (int i = 0; i < k->L.n; i++) {
        uint64_t fp = 0;
        int rc = refit_runtime_fingerprint(k->m, k->L.t[i].module, "weight", &fp);
        if (rc)
            return rc;
        if (fp != k->fp[c][i]) {
            *exact = false;
            fprintf(stderr, "worker: %s differs from content %d\n", k->L.t[i].name, c);
        }
    }
    return REFIT_OK;
}

static int worker_update(bn_rank *k, refit_receiver *r, int rollback, double *secs,
                         refit_group_result *res)
{
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.rollback = rollback;
    k->updates++;
    int rc = bn_barrier(k->x, k->o->timeout);
    double t0 = now_s();
    if (!rc)
        rc = refit_receive_update(r, &uo, res);
    *secs = now_s() - t0;
    return rc;
}

/* One figure: best of repeat reloads, the first checked bit-exact. */
/* The default bucket size (refit_send_opts.bucket_bytes 0), in MiB. */
#define BN_DEFAULT_MIB 1024

/* The rows at the default bucket: default_ratio[0]: checksum on, [1]: off,
 * [2]: checksum on with the other DIRECT setting than the main rows'. */
static int worker_case(bn_rank *k, refit_receiver *r, uint64_t mib, int checksum, int direct,
                       int rollback, int repeat, double *best_ratio, double default_ratio[3],
                       int main_direct)
{
    double best = 1e30;
    bool exact = true, e;
    refit_group_result res = {0};
    for (int rep = 0; rep < repeat; rep++) {
        double s;
        int rc = worker_update(k, r, rollback, &s, &res);
        if (!rc)
            k->committed = content_of(k->updates - 1);
        if (!rc)
            rc = worker_exact(k, k->committed, &e);
        if (rc)
            return rc;
        exact = exact && e;
        best = s < best ? s : best;
    }
    double ratio = k->raw_whole / best;
    if (checksum && direct == main_direct && !rollback && ratio > *best_ratio)
        *best_ratio = ratio;
    if (!rollback && mib == BN_DEFAULT_MIB)
        default_ratio[direct != main_direct ? 2 : checksum ? 0 : 1] = ratio;
    /* us_per_bucket: the whole reload over its buckets, what per-bucket
     * host work costs where buckets are small */
    /* direct_bytes: of the last reload, received straight into the runtime
     * tensors (DIRECT buckets whose route took them in place) */
    json_t *row = json_object();
    put(row, "bucket_mib", json_integer((json_int_t)mib));
    put(row, "checksum", json_integer(checksum));
    put(row, "direct", json_integer(direct));
    put(row, "rollback", json_integer(rollback));
    put(row, "seconds", fixed(best, 6));
    put(row, "gbps", fixed((double)k->L.total / best / 1e9, 2));
    put(row, "ratio_to_broadcast", fixed(ratio, 3));
    put(row, "ratio_to_per_tensor_broadcast", fixed(k->raw_tensor / best, 3));
    put(row, "buckets", json_integer(res.buckets));
    put(row, "us_per_bucket", fixed(res.buckets ? best / res.buckets * 1e6 : 0.0, 1));
    put(row, "direct_bytes", json_integer((json_int_t)refit_sys_receiver_direct_bytes(r)));
    put(row, "bit_exact", json_boolean(exact));
    json_array_append_new(k->rows, row);
    return exact ? REFIT_OK : REFIT_EMISMATCH;
}

/* The worker's checks fail (a registered tensor moved before the vote):
 * the vote must abort the update on both ranks, bytes rolled back. */
static int worker_failed_check(bn_rank *k, refit_receiver *r)
{
    int before = k->committed;
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    refit_txn *t = NULL;
    refit_group_result res = {0};
    k->updates++;
    int rc = bn_barrier(k->x, k->o->timeout);
    double t0 = now_s();
    if (!rc)
        rc = refit_begin(&t, k->m, &uo);
    if (rc)
        return rc;
    int lrc = refit_receive(r, t, NULL, NULL);
    void *keep = k->L.t[0].t.data;
    k->L.t[0].t.data = (char *)keep + 256; /* the engine "moved" it */
    rc = refit_group_finalize(k->x, t, lrc, &res);
    k->L.t[0].t.data = keep;
    double s = now_s() - t0;
    char msg[1100];
    snprintf(msg, sizeof msg, "%s", refit_errmsg(k->ctx)); /* before the checks clear it */
    bool exact = false;
    int crc = worker_exact(k, before, &exact);
    json_t *o = json_object();
    put(o, "status", jtext(refit_status_name(rc)));
    put(o, "vote_taken", json_integer(res.vote_taken));
    put(o, "failed_rank", json_integer(res.failed_rank));
    put(o, "seconds", fixed(s, 4));
    put(o, "health", jtext(refit_health_name(refit_worker_health(k->ctx))));
    put(o, "rolled_back", json_boolean(exact && !crc));
    put(o, "message", jtext(msg));
    put(k->res, "failed_check", o);
    return rc == REFIT_EMOVED && exact && !crc ? REFIT_OK : REFIT_EINTERNAL;
}

static int last_event(void *user, const journal_event_row *row)
{
    snprintf(user, 512, "[%s] %s", row->kind, row->message);
    return 0;
}

/* The trainer is killed mid-update: this rank must give up at its
 * deadline, abort the communicator, roll back, and journal it. */
static int worker_killed_trainer(bn_rank *k)
{
    int before = k->committed; /* the failed check's update was aborted */
    refit_recv_opts ro = REFIT_RECV_OPTS_INIT;
    ro.timeout_s = 3;
    refit_receiver *r = NULL;
    refit_group_result res = {0};
    double s = 0;
    int rc = refit_receiver_create(&r, k->m, k->x, &ro);
    if (!rc)
        rc = worker_update(k, r, 1, &s, &res);
    refit_receiver_destroy(r);
    char msg[1100];
    snprintf(msg, sizeof msg, "%s", refit_errmsg(k->ctx)); /* before the checks clear it */
    bool exact = false;
    int crc = worker_exact(k, before, &exact);
    char ev[512] = "";
    journal *j = NULL;
    journal_opts jo = JOURNAL_OPTS_INIT;
    jo.readonly = 1;
    if (k->o->journal && !journal_open(&j, k->o->journal, &jo, ev, sizeof ev)) {
        journal_events_list(j, 0, 1, last_event, ev);
        journal_close(j);
    }
    json_t *o = json_object();
    put(o, "status", jtext(refit_status_name(rc)));
    put(o, "seconds", fixed(s, 3));
    put(o, "deadline_s", json_integer(3));
    put(o, "buckets_received", json_integer(res.buckets));
    put(o, "health", jtext(refit_health_name(refit_worker_health(k->ctx))));
    put(o, "rolled_back", json_boolean(exact && !crc));
    put(o, "transport_aborted", json_integer(refit_transport_aborted(k->x)));
    put(o, "journal_event", jtext(ev));
    put(o, "message", jtext(msg));
    put(k->res, "killed_trainer", o);
    /* the deadline (REFIT_ETIMEDOUT), or NCCL noticing the dead peer first (EIO) */
    bool gave_up = rc == REFIT_ETIMEDOUT || rc == REFIT_EIO;
    return gave_up && exact && !crc && s < 10 ? REFIT_OK : REFIT_EINTERNAL;
}

static int worker_expected(bn_rank *k)
{
    if (k->L.n > 512)
        return REFIT_EINVAL;
    for (int c = 1; c <= 2; c++)
        for (int i = 0; i < k->L.n; i++)
            k->fp[c][i] = bn_expected_fp(&k->L, i, c);
    return REFIT_OK;
}

static int worker_run(bn_rank *k)
{
    const bn_opts *o = k->o;
    refit_recv_opts ro = REFIT_RECV_OPTS_INIT;
    ro.timeout_s = o->timeout;
    refit_receiver *r = NULL;
    int rc = worker_model(k);
    if (!rc)
        rc = worker_expected(k);
    if (!rc)
        rc = refit_receiver_create(&r, k->m, k->x, &ro);
    if (!rc)
        rc = bn_raw(k->x, &k->L, k->g.arena[0], o, &k->raw_whole, &k->raw_tensor);
    if (rc) {
        refit_receiver_destroy(r);
        return rc;
    }
    put(k->res, "raw_broadcast_s", fixed(k->raw_whole, 6));
    put(k->res, "raw_broadcast_gbps", fixed((double)k->L.total / k->raw_whole / 1e9, 2));
    put(k->res, "per_tensor_broadcast_s", fixed(k->raw_tensor, 6));
    k->rows = json_array();
    put(k->res, "refit", k->rows);
    /* the main rows send as the library's default does (no DIRECT
     * buckets), or with DIRECT buckets when --direct-min asks for them;
     * one row at the default bucket tries the other setting */
    int md = o->direct_min > 0;
    double best = 0, dflt[3] = {0, 0, 0};
    for (int b = 0; b < o->n_buckets && !rc; b++)
        rc = worker_case(k, r, o->buckets[b], 1, md, 0, o->repeat, &best, dflt, md);
    uint64_t last = o->buckets[o->n_buckets - 1];
    if (!rc)
        rc = worker_case(k, r, last, 0, md, 0, o->repeat, &best, dflt, md);
    if (!rc)
        rc = worker_case(k, r, last, 1, !md, 0, o->repeat, &best, dflt, md);
    if (!rc)
        rc = worker_case(k, r, last, 1, md, 1, 1, &best, dflt, md);
    put(k->res, "ratio_to_broadcast", fixed(best, 3));
    put(k->res, "ratio_to_per_tensor_broadcast", fixed(best * k->raw_tensor / k->raw_whole, 3));
    put(k->res, "default_bucket_mib", json_integer(BN_DEFAULT_MIB));
    put(k->res, "ratio_at_default_bucket", fixed(dflt[0], 3));
    put(k->res, "ratio_at_default_bucket_checksum_off", fixed(dflt[1], 3));
    put(k->res, md ? "ratio_at_default_bucket_direct_off" : "ratio_at_default_bucket_direct_on",
        fixed(dflt[2], 3));
    put(k->res, "wire_version", json_integer(BKT_VERSION));
    if (!rc && o->failures)
        rc = worker_failed_check(k, r);
    refit_receiver_destroy(r);
    if (!rc && o->failures)
        rc = worker_killed_trainer(k);
    return rc;
}

/* ---- processes ---- */

/* A message for the caller, and the result: -1 skipped, 1 failed. */
static int setup_fail(char *why, size_t n, int result, const char *fmt, const char *arg)
{
    snprintf(why, n, fmt, arg);
    return result;
}

/* Context, NCCL, devices, the trainer's tensors, the unique id handed
 * from rank 0 to rank 1 through the pipe, the transport. */
static int rank_setup(bn_rank *k, int rank, int fd, char *why, size_t n)
{
    refit_options ro = REFIT_OPTIONS_INIT;
    ro.worker_id = rank ? "worker1" : "trainer";
    ro.rank = rank;
    ro.journal_path = rank && k->o->journal ? k->o->journal : "";
    if (refit_open(&k->ctx, &ro) || refit_nccl_probe(k->ctx))
        return setup_fail(why, n, -1, "%s", k->ctx ? refit_errmsg(k->ctx) : "refit_open failed");
    snprintf(k->where, sizeof k->where, "%s", refit_errmsg(k->ctx));
    if (bn_layout(&k->L, k->o) || bn_gpu_open(&k->g, rank, k->L.total, rank ? 1 : 2, why, n))
        return -1;
    refit_nccl_id id;
    if (rank == 0) {
        if (bn_upload(&k->g, &k->L, k->g.arena[0], 1) || bn_upload(&k->g, &k->L, k->g.arena[1], 2))
            return setup_fail(why, n, 1, "%s", "uploading the trainer's tensors failed");
        if (refit_nccl_unique_id(k->ctx, &id) || write(fd, &id, sizeof id) != sizeof id)
            return setup_fail(why, n, 1, "unique id: %s", refit_errmsg(k->ctx));
    } else if (read(fd, &id, sizeof id) != sizeof id) {
        return setup_fail(why, n, 1, "%s", "the trainer process did not start (see its stderr)");
    }
    close(fd);
    refit_nccl_opts no = REFIT_NCCL_OPTS_INIT;
    no.id = &id;
    no.nranks = 2;
    no.rank = rank;
    no.device = rank;
    no.timeout_s = k->o->timeout;
    if (refit_transport_nccl(&k->x, k->ctx, &no))
        return setup_fail(why, n, 1, "%s", refit_errmsg(k->ctx));
    return 0;
}

static int rank_main(const bn_opts *o, int rank, int fd)
{
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* no NVLink multicast on shared hosts */
    /* the engine's own NCCL, loaded privately (RTLD_LOCAL) the way a
     * Python extension loads PyTorch's: refit must find and share it */
    if (o->preload && !dlopen(o->preload, RTLD_NOW | RTLD_LOCAL))
        fprintf(stderr, "refit-bench nccl: --preload %s: %s\n", o->preload, dlerror());
    bn_rank k = {.o = o};
    char why[1024] = "";
    int st = rank_setup(&k, rank, fd, why, sizeof why);
    if (rank == 0 && st == 0)
        st = trainer_run(&k) ? 1 : 0;
    else if (rank == 0 && st > 0)
        fprintf(stderr, "refit-bench nccl: trainer: %s\n", why);
    if (rank == 1) {
        k.res = json_object();
        put(k.res, "area", json_string("nccl"));
    }
    if (rank == 1 && st == 0) {
        put(k.res, "nccl", jtext(k.where));
        json_t *model = json_object();
        put(model, "layers", json_integer(o->layers));
        put(model, "hidden", json_integer((json_int_t)o->hidden));
        put(model, "tensors", json_integer(k.L.n));
        put(model, "bytes", json_integer((json_int_t)k.L.total));
        put(k.res, "model", model);
        int rc = worker_run(&k);
        if (rc)
            put(k.res, "error", jtext(refit_errmsg(k.ctx)));
        st = rc ? 1 : 0;
    } else if (rank == 1) {
        put(k.res, st < 0 ? "skipped" : "error", jtext(why));
        st = st < 0 ? 0 : 1;
    }
    if (rank == 1) {
        /* one line, as before; figures rounded where they are made */
        if (json_dumpf(k.res, stdout, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15)) ||
            fputc('\n', stdout) == EOF) {
            fprintf(stderr, "refit-bench nccl: cannot write JSON\n");
            st = 1;
        }
        json_decref(k.res);
    }
    fflush(stdout);
    refit_transport_close(k.x);
    refit_close(k.ctx);
    return st < 0 ? 0 : st;
}

static int parse_buckets(bn_opts *o, const char *s)
{
    o->n_buckets = 0;
    for (char *end; *s && o->n_buckets < BN_MAX_BUCKETS; s = *end ? end + 1 : end) {
        unsigned long long v = strtoull(s, &end, 10);
        if (v == 0 || v > 4096 || (*end && *end != ','))
            return -1;
        o->buckets[o->n_buckets++] = v;
    }
    return o->n_buckets ? 0 : -1;
}

static const cli_opt bn_cli_opts[] = {
    {"layers", 'L', "N", "decoder layers of the Llama-shaped model, 1..80 (default 4)"},
    {"hidden", 'h' + 256, "H", "hidden size (default 4096)"},
    {"inter", 'i', "I", "MLP intermediate size (default 14336)"},
    {"vocab", 'v', "V", "vocabulary rows (default 32000)"},
    {"buckets", 'b', "MIB,...", "bucket sizes to measure (default 1,64,256,1024)"},
    {"repeat", 'r', "R", "reloads per bucket; the best counts (default 3)"},
    {"timeout", 't', "S", "the worker's deadline in seconds (default 30)"},
    {"journal", 'J', "PATH", "journal the worker's updates at PATH"},
    {"preload", 'p', "LIBNCCL", "dlopen this libnccl.so.2 privately first, as PyTorch does"},
    {"direct-min", 'D', "BYTES", "smallest tensor sent directly into its destination"},
    {"no-failures", 'F', NULL, "skip the two failure scenarios"},
    {"json", 'j', NULL, "accepted for symmetry: the output is always JSON"},
    {NULL, 0, NULL, NULL},
};

static const cli bn_cli = {
    "refit-bench nccl", "[--layers N] [--hidden H] [--inter I] [--vocab V] [--buckets MIB,...]\n"
                        " [--repeat R] [--timeout S] [--journal PATH] [--preload LIBNCCL]\n"
                        " [--direct-min BYTES] [--no-failures] [--json]",
    "A trainer on GPU 0 broadcasting a Llama-shaped model to a worker on GPU 1 over\n"
    "NCCL, against a raw ncclBroadcast of the same bytes, every reload checked\n"
    "bit-exact; then the two failure scenarios. One JSON object (docs/nccl.md).\n"
    "Exit status: 0 ok (or skipped without two GPUs), 1 a failure, 2 usage.",
    bn_cli_opts,
};

static int bn_opt(void *user, int key, const char *v)
{
    bn_opts *o = user;
    char *end = NULL;
    switch (key) {
    case 'j': return 0;
    case 'F': o->failures = 0; return 0;
    case 'J': o->journal = v; return 0;
    case 'p': o->preload = v; return 0;
    case 'b': return parse_buckets(o, v) ? cli_usage_error(&bn_cli, "bad --buckets '%s'", v) : 0;
    case 't': o->timeout = strtod(v, &end); break;
    case 'L': o->layers = (int)strtol(v, &end, 10); break;
    case 'r': o->repeat = (int)strtol(v, &end, 10); break;
    case 'i': o->inter = strtoll(v, &end, 10); break;
    case 'v': o->vocab = strtoll(v, &end, 10); break;
    case 'D': o->direct_min = strtoll(v, &end, 10); break;
    default: o->hidden = strtoll(v, &end, 10); break;
    }
    return !*v || *end ? cli_usage_error(&bn_cli, "bad number '%s'", v) : 0;
}

static int parse(bn_opts *o, int argc, char **argv)
{
    *o = (bn_opts){.layers = 4, .repeat = 3, .failures = 1, .hidden = 4096, .inter = 14336,
                   .vocab = 32000, .buckets = {1, 64, 256, 1024}, .n_buckets = 4,
                   .timeout = 30, .direct_min = -1};
    int first, rc = cli_parse(&bn_cli, argc, argv, bn_opt, o, &first);
    if (rc)
        return rc;
    if (first < argc)
        return cli_usage_error(&bn_cli, "unexpected '%s'", argv[first]);
    bool ok = o->layers >= 1 && o->layers <= 80 && o->hidden >= 8 && o->inter >= 8 &&
              o->vocab >= 8 && o->repeat >= 1 && o->timeout > 0;
    return ok ? 0 : cli_usage_error(&bn_cli, "a value is out of range");
}

int bench_nccl_main(int argc, char **argv)
{
    bn_opts o;
    int prc = parse(&o, argc, argv);
    if (prc)
        return prc == CLI_HELP ? 0 : prc;
    fflush(stdout);
    int p[2];
    if (pipe(p))
        return 1;
    /* no CUDA in this process: a child of a CUDA process cannot use CUDA */
    pid_t t = fork();
    if (t == 0) {
        close(p[0]);
        _exit(rank_main(&o, 0, p[1]));
    }
    pid_t w = t < 0 ? -1 : fork();
    if (w == 0) {
        close(p[1]);
        _exit(rank_main(&o, 1, p[0]));
    }
    close(p[0]);
    close(p[1]);
    int ws = 0, ts = 0;
    if (w > 0)
        waitpid(w, &ws, 0);
    if (t > 0 && (w < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws)))
        kill(t, SIGKILL); /* the worker gave up: do not wait for the trainer's deadline */
    if (t > 0)
        waitpid(t, &ts, 0);
    bool worker_ok = w > 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
    bool trainer_ok = (WIFEXITED(ts) && WEXITSTATUS(ts) == 0) ||
                      (o.failures && WIFSIGNALED(ts) && WTERMSIG(ts) == SIGKILL);
    if (!trainer_ok && worker_ok)
        fprintf(stderr, "refit-bench nccl: the trainer process failed\n");
    return worker_ok && trainer_ok ? 0 : 1;
}
