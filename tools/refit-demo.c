/*
 * refit-demo: a real reload on an embedded default worker, no GPU needed.
 *
 * The worker is transformer-shaped and lives in host memory: a replicated
 * embedding with its vocabulary padded (1000 -> 1024 rows) and tied to the
 * lm_head, 4 layers whose q/k/v land in one fused qkv tensor and gate/up in
 * one gate_up tensor, this worker holding tensor-parallel rank 0 of 2, and
 * norms kept in F32 from a BF16 checkpoint. Checkpoint-named weights for
 * versions A, B and C are generated deterministically.
 *
 * The model (modules, checkpoint names, shards, fusion, padding, ties) is
 * described by the manifest tools/demo/demo.yaml; this file allocates the
 * engine's runtime tensors and binds them by name, as an engine would.
 *
 * Phases: 1 cold start on A; 2 update to B, compared bit for bit with a
 * cold start on B; 3 an update to C that fails half-way with rollback (READY
 * at B, bytes identical); 4 the same without rollback (POISONED, serving
 * refused); 5 a retry that succeeds (READY at C, equal to a cold start on C).
 *
 * Versions A and B are sent from memory, as a trainer would; version C is
 * written to a safetensors file and streamed from it, so that with a journal
 * ($REFIT_JOURNAL) the failed update of phase 4 is recovered in phase 5 by
 * replaying it from that durable source, as an operator's tool would.
 *
 * Options: --json (one JSON object on stdout), --crash-during-update (the
 * process SIGKILLs itself half-way through phase 2, for journal tests).
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <refit/refit.h>

#include "core/safetensors_write.h" /* to write the demo's checkpoint file */
#include "tools/cli.h"

#define VOCAB 1000
#define VOCAB_PAD 1024
#define HIDDEN 256
#define KV 128          /* k and v rows (grouped-query attention) */
#define INTER 512
#define LAYERS 4
#define TP 2
#define RANK 0
#define MAX_CKPT 64
#define MAX_RT 48

/* ---- deterministic checkpoint weights ---- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t name_seed(const char *version, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = version; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    h = (h ^ '/') * 0x100000001b3ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    return h;
}

/* BF16 values in [-0.5, 0.5): a float's top 16 bits, rounded. */
static void fill_bf16(uint16_t *out, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = mix64(seed + i * 0x9e3779b97f4a7c15ull);
        float f = (float)((double)(r >> 11) / 9007199254740992.0 - 0.5);
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        u += 0x7fffu + ((u >> 16) & 1u);
        out[i] = (uint16_t)(u >> 16);
    }
}

/* ---- the worker: runtime tensors and the checkpoint they expect ---- */

typedef struct rt_tensor {
    char module[64], name[32];
    int64_t shape[2];
    int ndim;
    refit_dtype dtype;
    void *data;
    refit_tensor t;
} rt_tensor;

typedef struct ckpt_tensor {
    char name[96];
    int ndim;
    int64_t shape[2];           /* full (unsharded) */
    const char *tie_of;         /* the same values as this name (tied) */
    uint16_t *data;             /* full checkpoint tensor of one version */
    size_t numel;
} ckpt_tensor;

typedef struct worker {
    refit_ctx *ctx;
    refit_model *model;
    rt_tensor rt[MAX_RT];
    int n_rt;
    ckpt_tensor ck[MAX_CKPT];
    int n_ck;
} worker;

static int add_rt(worker *w, const char *module, const char *name, int ndim, int64_t d0,
                  int64_t d1, refit_dtype dt)
{
    rt_tensor *r = &w->rt[w->n_rt++];
    snprintf(r->module, sizeof r->module, "%s", module);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->ndim = ndim;
    r->shape[0] = d0;
    r->shape[1] = d1;
    r->dtype = dt;
    size_t numel = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    r->data = calloc(numel, dt.bits / 8);
    if (!r->data)
        return REFIT_ENOMEM;
    r->t = (refit_tensor){.data = r->data, .device = {REFIT_DEVICE_CPU, 0}, .ndim = ndim,
                          .dtype = dt, .shape = r->shape, .strides = NULL};
    return refit_module_bind_runtime(w->model, module, name, &r->t);
}

/* The trainer's side: a checkpoint tensor it will send (name, shape). */
static ckpt_tensor *expect(worker *w, const char *name, int ndim, int64_t d0, int64_t d1)
{
    ckpt_tensor *c = &w->ck[w->n_ck++];
    snprintf(c->name, sizeof c->name, "%s", name);
    c->ndim = ndim;
    c->shape[0] = d0;
    c->shape[1] = d1;
    c->numel = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    return c;
}

/* The engine's side: its runtime tensors for one layer, bound by name. */
static int build_layer(worker *w, int l)
{
    char mod[64], n[96];
    int rc;
    snprintf(mod, sizeof mod, "layers.%d.attn", l);
    if ((rc = add_rt(w, mod, "qkv", 2, (HIDDEN + 2 * KV) / TP, HIDDEN, REFIT_BF16)) ||
        (rc = add_rt(w, mod, "o", 2, HIDDEN, HIDDEN / TP, REFIT_BF16)))
        return rc;
    snprintf(mod, sizeof mod, "layers.%d.mlp", l);
    if ((rc = add_rt(w, mod, "gate_up", 2, 2 * INTER / TP, HIDDEN, REFIT_BF16)) ||
        (rc = add_rt(w, mod, "down", 2, HIDDEN, INTER / TP, REFIT_BF16)))
        return rc;
    snprintf(mod, sizeof mod, "layers.%d.norms", l);
    if ((rc = add_rt(w, mod, "input", 1, HIDDEN, 0, REFIT_F32)) ||
        (rc = add_rt(w, mod, "post_attention", 1, HIDDEN, 0, REFIT_F32)))
        return rc;
    /* what the trainer sends for this layer, in checkpoint names */
    const char *attn[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    int64_t rows[4] = {HIDDEN, KV, KV, HIDDEN};
    for (int i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "model.layers.%d.self_attn.%s.weight", l, attn[i]);
        expect(w, n, 2, rows[i], HIDDEN);
    }
    snprintf(n, sizeof n, "model.layers.%d.mlp.gate_proj.weight", l);
    expect(w, n, 2, INTER, HIDDEN);
    snprintf(n, sizeof n, "model.layers.%d.mlp.up_proj.weight", l);
    expect(w, n, 2, INTER, HIDDEN);
    snprintf(n, sizeof n, "model.layers.%d.mlp.down_proj.weight", l);
    expect(w, n, 2, HIDDEN, INTER);
    snprintf(n, sizeof n, "model.layers.%d.input_layernorm.weight", l);
    expect(w, n, 1, HIDDEN, 0);
    snprintf(n, sizeof n, "model.layers.%d.post_attention_layernorm.weight", l);
    expect(w, n, 1, HIDDEN, 0);
    return REFIT_OK;
}

/* The manifest describing the worker's model: beside the executable in the
 * build tree, else where it is installed. */
static const char *manifest_path(void)
{
    static char path[4096];
    const char *env = getenv("REFIT_DEMO_MANIFEST");
    if (env)
        return env;
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 16);
    if (n > 0) {
        path[n] = '\0';
        char *slash = strrchr(path, '/');
        if (slash) {
            strcpy(slash + 1, "demo.yaml");
            if (access(path, R_OK) == 0)
                return path;
        }
    }
    return REFIT_DEMO_MANIFEST_INSTALLED;
}

static int worker_build(worker *w, const char *id, bool journaled)
{
    memset(w, 0, sizeof *w);
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = id;
    o.journal_path = journaled ? NULL : ""; /* NULL: $REFIT_JOURNAL */
    o.rank = RANK;
    int rc = refit_open(&w->ctx, &o);
    if (rc)
        return rc;
    /* modules, their checkpoint names and mappings: tools/demo/demo.yaml */
    if ((rc = refit_model_create(&w->model, w->ctx)) ||
        (rc = refit_model_load_manifest(w->model, manifest_path())))
        return rc;
    /* embedding, vocabulary padded to 1024 rows, tied to the lm_head */
    if ((rc = add_rt(w, "embed", "table", 2, VOCAB_PAD, HIDDEN, REFIT_BF16)))
        return rc;
    expect(w, "model.embed_tokens.weight", 2, VOCAB, HIDDEN);
    expect(w, "lm_head.weight", 2, VOCAB, HIDDEN)->tie_of = "model.embed_tokens.weight";
    for (int l = 0; l < LAYERS && !rc; l++)
        rc = build_layer(w, l);
    if (rc || (rc = add_rt(w, "norm", "weight", 1, HIDDEN, 0, REFIT_F32)))
        return rc;
    expect(w, "model.norm.weight", 1, HIDDEN, 0);
    return refit_model_seal(w->model);
}

static void worker_free(worker *w)
{
    refit_close(w->ctx);
    for (int i = 0; i < w->n_rt; i++)
        free(w->rt[i].data);
    for (int i = 0; i < w->n_ck; i++)
        free(w->ck[i].data);
}

/* Generate every checkpoint tensor of a version (the trainer's side). */
static int make_version(worker *w, const char *version)
{
    for (int i = 0; i < w->n_ck; i++) {
        ckpt_tensor *c = &w->ck[i];
        free(c->data);
        c->data = malloc(c->numel * 2);
        if (!c->data)
            return REFIT_ENOMEM;
        /* a tied name carries the same values as the name it is tied to */
        const char *same = c->tie_of ? c->tie_of : c->name;
        fill_bf16(c->data, c->numel, name_seed(version, same));
    }
    return REFIT_OK;
}

/* ---- output ---- */

typedef struct phase {
    int n;
    const char *title;
    const char *version;
    int status;
    const char *health;
    char holds[64];             /* version held after the phase, "" when none */
    uint64_t tensors, bytes;
    double ms;
    int bit_exact;              /* -1: not checked */
    char note[256];
} phase;

static bool json_out;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void progress(int done, int total, uint64_t bytes)
{
    if (json_out)
        return;
    if (!isatty(STDOUT_FILENO)) { /* a log: one line per quarter, no \r */
        if (done * 4 / total != (done - 1) * 4 / total)
            printf("  %2d/%d tensors, %6.2f MiB\n", done, total, bytes / 1048576.0);
        return;
    }
    int width = 30, fill = total ? done * width / total : width;
    printf("\r  [%.*s%*s] %2d/%d tensors, %6.2f MiB", fill, "##############################",
           width - fill, "", done, total, bytes / 1048576.0);
    if (done == total)
        printf("\n");
    fflush(stdout);
}

static void phase_print(const phase *p, bool ok)
{
    if (json_out)
        return;
    printf("  -> %s: worker %s", ok ? "ok" : "FAILED", p->health);
    if (p->holds[0])
        printf(" at %s", p->holds);
    if (p->bit_exact >= 0)
        printf(", bit-exact vs cold start: %s", p->bit_exact ? "yes" : "NO");
    if (p->tensors)
        printf(" (%llu tensors, %.2f MiB, %.1f ms)\n", (unsigned long long)p->tensors,
               p->bytes / 1048576.0, p->ms);
    else
        printf(" (%.1f ms)\n", p->ms);
    if (p->note[0])
        printf("     %s\n", p->note);
    printf("\n");
}

/* ---- an update: deliver a version's tensors, maybe stop half-way ---- */

/* RUN_FAIL_HALF: the sender dies half-way; RUN_CRASH_HALF: so does the worker. */
typedef enum { RUN_ALL, RUN_FAIL_HALF, RUN_CRASH_HALF } run_mode;

static int run_update(worker *w, const char *version, int rollback, run_mode mode, phase *p)
{
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = version;
    uo.source_uri = "memory://refit-demo";
    uo.rollback = rollback;
    refit_txn *txn;
    double t0 = now_ms();
    int rc = refit_begin(&txn, w->model, &uo);
    if (rc)
        return rc;
    /* the tied lm_head is sent too, as a trainer's state dict would */
    for (int i = 0; i < w->n_ck; i++) {
        ckpt_tensor *c = &w->ck[i];
        if (mode == RUN_CRASH_HALF && i == w->n_ck / 2) {
            if (!json_out)
                printf("\n  !! crashing with SIGKILL half-way (--crash-during-update)\n");
            fflush(stdout);
            raise(SIGKILL);
        }
        refit_tensor src = {.data = c->data, .device = {REFIT_DEVICE_CPU, 0},
                            .ndim = c->ndim, .dtype = REFIT_BF16,
                            .shape = c->shape, .strides = NULL};
        rc = refit_load(txn, c->name, &src, NULL);
        if (rc) {
            refit_abort(txn);
            return rc;
        }
        p->tensors++;
        p->bytes += c->numel * 2;
        progress(i + 1, w->n_ck, p->bytes);
    }
    rc = refit_finalize(txn);
    p->ms = now_ms() - t0;
    return rc;
}

/* Write the current version's checkpoint as one safetensors file. */
static int write_checkpoint(worker *w, const char *path)
{
    st_out_tensor t[MAX_CKPT];
    for (int i = 0; i < w->n_ck; i++)
        t[i] = (st_out_tensor){w->ck[i].name, ST_BF16, w->ck[i].ndim, w->ck[i].shape,
                               w->ck[i].data};
    static const char *const meta[] = {"format", "pt", "written_by", "refit-demo"};
    st_error err;
    if (st_write_file(path, t, (size_t)w->n_ck, meta, 2, &err)) {
        char line[2048];
        cli_error(1, "%s", st_error_line(&err, line, sizeof line));
        return REFIT_EIO;
    }
    return REFIT_OK;
}

/* Source streaming: a filter that plays a sender dying half-way. */
typedef struct stream_state {
    int sent, limit, total;
    uint64_t bytes;
} stream_state;

static int stop_half_way(void *user, const char *name)
{
    (void)name;
    stream_state *s = user;
    return s->limit < 0 || s->sent++ < s->limit;
}

static void source_progress(void *user, uint64_t bytes, uint64_t tensors, const char *current)
{
    (void)current;
    stream_state *s = user;
    s->bytes = bytes;
    progress((int)tensors, s->total, bytes);
}

/* An update streamed from a safetensors file; *journal_id: OUT. */
static int run_update_source(worker *w, refit_source *src, const char *version, int rollback,
                             run_mode mode, phase *p, int64_t *journal_id)
{
    char digest[65];
    int rc = refit_source_digest(src, digest);
    if (rc)
        return rc;
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = version;
    uo.source_uri = refit_source_uri(src);
    uo.source_digest = digest;
    uo.rollback = rollback;
    uo.fingerprint = 1;
    refit_txn *txn;
    double t0 = now_ms();
    if ((rc = refit_begin(&txn, w->model, &uo)))
        return rc;
    *journal_id = refit_txn_journal_id(txn);
    int total = (int)refit_source_count(src);
    stream_state st = {0, mode == RUN_ALL ? -1 : total / 2, total, 0};
    rc = refit_load_source_filtered(txn, src, stop_half_way, &st, source_progress, &st, NULL);
    p->tensors = (uint64_t)(st.limit < 0 ? total : st.sent > st.limit ? st.limit : st.sent);
    p->bytes = st.bytes;
    if (rc) {
        refit_abort(txn);
        return rc;
    }
    if (mode != RUN_ALL) {
        snprintf(p->note, sizeof p->note, "the sender died after %d of %d tensors; abort with "
                 "rollback %s", st.limit, total, rollback ? "on" : "off");
        if (!json_out)
            printf("\n  !! sender lost after %d of %d tensors: aborting\n", st.limit, total);
        rc = refit_abort(txn);
    } else {
        rc = refit_finalize(txn);
    }
    p->ms = now_ms() - t0;
    return rc;
}

/* Fingerprint of a fresh worker cold-started on version. */
static int cold_start_fingerprint(const char *version, uint64_t *fp)
{
    worker ref;
    phase scratch = {0};
    int rc = worker_build(&ref, "reference", false);
    bool was_json = json_out;
    json_out = true; /* keep the reference run quiet */
    if (!rc)
        rc = make_version(&ref, version);
    if (!rc)
        rc = run_update(&ref, version, 0, RUN_ALL, &scratch);
    if (!rc)
        rc = refit_model_fingerprint(ref.model, fp);
    json_out = was_json;
    worker_free(&ref);
    return rc;
}

static void phase_state(worker *w, phase *p)
{
    p->health = refit_health_name(refit_worker_health(w->ctx));
    const char *v = refit_worker_version(w->ctx);
    snprintf(p->holds, sizeof p->holds, "%s", v ? v : "");
}

static int fail(worker *w, const char *what, int rc)
{
    return cli_error(1, "%s: %s (%s): %s", what, refit_status_name(rc), refit_strerror(rc),
                     refit_errmsg(w->ctx));
}

static void json_phases(const phase *ph, int n, bool ok, uint64_t fp)
{
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fp);
    json_t *phases = json_array();
    json_t *root = json_pack("{s:s, s:b, s:s, s:o}", "demo", "refit", "ok", ok, "fingerprint",
                             hex, "phases", phases);
    for (int i = 0; root && i < n; i++) {
        const phase *p = &ph[i];
        json_t *o = json_pack("{s:i, s:s, s:s, s:s, s:s, s:s?, s:I, s:I, s:f, s:o}", "phase",
                              p->n, "title", p->title, "version", p->version, "status",
                              refit_status_name(p->status), "health", p->health, "holds",
                              p->holds[0] ? p->holds : NULL, "tensors", (json_int_t)p->tensors,
                              "bytes", (json_int_t)p->bytes, "ms", p->ms, "bit_exact",
                              p->bit_exact < 0 ? json_null() : json_boolean(p->bit_exact));
        if (!o || json_array_append_new(phases, o))
            root = (json_decref(root), NULL);
    }
    cli_json_print(root);
}

static void header(const phase *p)
{
    if (!json_out)
        printf("Phase %d: %s\n", p->n, p->title);
}

static const cli_opt demo_opts[] = {
    {"json", 'j', NULL, "one JSON object of the phases on stdout; errors too"},
    {"crash-during-update", 'c', NULL, "die in the middle of an update (the journal then\n"
                                       "shows it interrupted)"},
    {NULL, 0, NULL, NULL},
};

static const cli demo_cli = {
    "refit-demo", "[--json] [--crash-during-update]",
    "A real reload on an embedded default worker (no GPU needed): cold start, an\n"
    "update, a failed update rolled back and one not, then a replay; every phase\n"
    "checked bit-exact. REFIT_JOURNAL=PATH journals it.\n"
    "Exit status: 0 every phase as expected, 1 otherwise, 2 usage.",
    demo_opts,
};

static int demo_opt(void *user, int key, const char *v)
{
    (void)v;
    if (key == 'j')
        json_out = true;
    else
        *(bool *)user = true;
    return 0;
}

int main(int argc, char **argv)
{
    bool crash = false;
    int first, prc = cli_parse(&demo_cli, argc, argv, demo_opt, &crash, &first);
    if (prc)
        return prc == CLI_HELP ? 0 : prc;
    if (first < argc)
        return cli_usage_error(&demo_cli, "unexpected '%s'", argv[first]);
    worker w;
    int rc = worker_build(&w, "demo-worker-0", true);
    if (rc)
        return fail(&w, "building the worker", rc);
    refit_model_stats st;
    refit_model_stats_get(w.model, &st);
    if (!json_out)
        printf("refit demo: worker demo-worker-0, TP rank %d of %d, %u modules, %u runtime "
               "tensors (%.2f MiB), %u checkpoint tensors; health %s\n\n",
               RANK, TP, st.modules, st.runtime_tensors, st.runtime_bytes / 1048576.0,
               st.ckpt_tensors, refit_health_name(refit_worker_health(w.ctx)));

    phase ph[5] = {
        {.n = 1, .title = "cold start on A", .version = "A", .bit_exact = -1},
        {.n = 2, .title = "update to B", .version = "B", .bit_exact = -1},
        {.n = 3, .title = "update to C fails half-way, rollback on", .version = "C",
         .bit_exact = -1},
        {.n = 4, .title = "update to C fails half-way, rollback off", .version = "C",
         .bit_exact = -1},
        {.n = 5, .title = "retry the update to C", .version = "C", .bit_exact = -1},
    };
    bool ok = true;
    uint64_t fp = 0, ref = 0, before = 0;

    /* 1: cold start */
    header(&ph[0]);
    if ((rc = make_version(&w, "A")) ||
        (rc = ph[0].status = run_update(&w, "A", 1, RUN_ALL, &ph[0])))
        return fail(&w, "phase 1", rc);
    phase_state(&w, &ph[0]);
    ok &= refit_check_serving(w.ctx) == REFIT_OK;
    phase_print(&ph[0], ok);

    /* 2: update to B, then bit-exact against a cold start on B */
    header(&ph[1]);
    if ((rc = make_version(&w, "B")) ||
        (rc = ph[1].status = run_update(&w, "B", 1, crash ? RUN_CRASH_HALF : RUN_ALL, &ph[1])))
        return fail(&w, "phase 2", rc);
    if ((rc = refit_model_fingerprint(w.model, &fp)) || (rc = cold_start_fingerprint("B", &ref)))
        return fail(&w, "fingerprints", rc);
    ph[1].bit_exact = fp == ref;
    phase_state(&w, &ph[1]);
    ok &= ph[1].bit_exact && refit_check_serving(w.ctx) == REFIT_OK;
    phase_print(&ph[1], ok);

    /* version C goes to a file: a durable source the journal can replay */
    char dir[] = "/tmp/refit-demo-XXXXXX", path[64];
    if (!mkdtemp(dir))
        return fail(&w, "creating a temporary directory", REFIT_EIO);
    snprintf(path, sizeof path, "%s/model-C.safetensors", dir);
    refit_source *src = NULL;
    if ((rc = make_version(&w, "C")) || (rc = write_checkpoint(&w, path)) ||
        (rc = refit_source_open(&src, w.ctx, path)))
        return fail(&w, "writing version C", rc);
    if (!json_out)
        printf("(version C written to %s)\n\n", path);

    /* 3: half an update to C, then abort with rollback: READY at B, same bytes */
    header(&ph[2]);
    before = fp;
    int64_t jid = 0;
    ph[2].status = run_update_source(&w, src, "C", 1, RUN_FAIL_HALF, &ph[2], &jid);
    refit_model_fingerprint(w.model, &fp);
    phase_state(&w, &ph[2]);
    ok &= ph[2].status == REFIT_OK && fp == before &&
          refit_worker_health(w.ctx) == REFIT_HEALTH_READY;
    if (!json_out)
        printf("  worker bytes identical to B after rollback: %s\n", fp == before ? "yes" : "NO");
    phase_print(&ph[2], ok);

    /* 4: the same without rollback: POISONED, serving refused */
    header(&ph[3]);
    ph[3].status = run_update_source(&w, src, "C", 0, RUN_FAIL_HALF, &ph[3], &jid);
    phase_state(&w, &ph[3]);
    rc = refit_check_serving(w.ctx);
    ok &= ph[3].status == REFIT_EPOISONED && rc == REFIT_EPOISONED;
    if (!json_out)
        printf("  serving check: %s: %s\n", refit_status_name(rc), refit_errmsg(w.ctx));
    phase_print(&ph[3], ok);

    /* 5: recover: replay the failed update from the journal, or retry in full */
    if (jid > 0) {
        ph[4].title = "replay the failed update from the journal";
        header(&ph[4]);
        refit_replay_opts ro = REFIT_REPLAY_OPTS_INIT;
        double t0 = now_ms();
        ph[4].status = rc = refit_replay(w.model, jid, &ro);
        ph[4].ms = now_ms() - t0;
        snprintf(ph[4].note, sizeof ph[4].note, "replayed journal update %lld from %s",
                 (long long)jid, refit_source_uri(src));
    } else {
        header(&ph[4]);
        int64_t none;
        ph[4].status = rc = run_update_source(&w, src, "C", 1, RUN_ALL, &ph[4], &none);
    }
    refit_source_close(src);
    remove(path);
    rmdir(dir);
    if (rc)
        return fail(&w, "phase 5", rc);
    if ((rc = refit_model_fingerprint(w.model, &fp)) || (rc = cold_start_fingerprint("C", &ref)))
        return fail(&w, "fingerprints", rc);
    ph[4].bit_exact = fp == ref;
    phase_state(&w, &ph[4]);
    ok &= ph[4].bit_exact && refit_check_serving(w.ctx) == REFIT_OK;
    phase_print(&ph[4], ok);

    if (json_out)
        json_phases(ph, 5, ok, fp);
    else
        printf("%s: all five phases %s; worker %s at version %s, fingerprint %016llx\n",
               ok ? "OK" : "FAILED", ok ? "passed" : "did not pass",
               refit_health_name(refit_worker_health(w.ctx)),
               refit_worker_version(w.ctx) ? refit_worker_version(w.ctx) : "-",
               (unsigned long long)fp);
    worker_free(&w);
    return ok ? 0 : 1;
}
