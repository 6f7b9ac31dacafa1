/* Shared helpers for the core tests: host tensors the test owns, a small
 * "world" (context + model + the tensors registered in it), deterministic
 * checkpoint data, delivery of every expected checkpoint tensor in any
 * order and batching, and a transformer-shaped model used by several
 * suites. Everything a test allocates through a world is freed by
 * tw_close, so a failing assertion (which longjmps out of the test) still
 * leaves nothing behind for LeakSanitizer. */
#ifndef REFIT_TESTS_CORE_TESTUTIL_H
#define REFIT_TESTS_CORE_TESTUTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>

#include <cmocka.h>

#include <refit/format.h>
#include <refit/refit.h>

/* A host tensor owned by a test. The descriptor t points into the struct,
 * so the struct must not move (it is always heap-allocated). */
typedef struct tt_tensor {
    refit_tensor t;
    int64_t shape[REFIT_MAX_DIMS];
    int64_t strides[REFIT_MAX_DIMS]; /* row-major unless made strided */
    void *buf;                       /* the allocation */
    size_t bytes;                    /* of buf */
} tt_tensor;

#define TT_SHAPE(...) ((const int64_t[]){__VA_ARGS__})

/* Contiguous tensor, every byte set to junk (0xA5) so that a test notices
 * rows nothing wrote. */
tt_tensor *tt_new(refit_dtype dt, int ndim, const int64_t *shape);
/* Strided view into an allocation of alloc_elems elements (junk-filled);
 * t.data = buf + first * elem. */
tt_tensor *tt_new_strided(refit_dtype dt, int ndim, const int64_t *shape,
                          const int64_t *strides, size_t alloc_elems, int64_t first);
void tt_free(tt_tensor *t);
/* A descriptor over base's memory (owns nothing: buf NULL): shape, strides
 * (NULL: row-major), starting first elements into base's data. */
tt_tensor *tt_alias(const tt_tensor *base, refit_dtype dt, int ndim, const int64_t *shape,
                    const int64_t *strides, int64_t first);
int64_t tt_numel(const tt_tensor *t);
size_t tt_esize(refit_dtype dt);

/* Element at a logical multi-index, through the strides, as a double. */
double tt_get(const tt_tensor *t, const int64_t *idx);
void tt_set(tt_tensor *t, const int64_t *idx, double v);
/* Same, by row-major logical index. */
double tt_get_flat(const tt_tensor *t, int64_t i);
void tt_set_flat(tt_tensor *t, int64_t i, double v);
/* Raw bytes of an element (for bit-exact comparisons). */
void *tt_ptr(const tt_tensor *t, const int64_t *idx);

/* Deterministic data. */
uint64_t tt_mix(uint64_t x);
uint64_t tt_hash_str(const char *s);
/* A value in [-4, 4) drawn from (seed, i); arbitrary f32 bits, so casts
 * to f16/bf16 really round. */
float tt_value(uint64_t seed, int64_t i);
/* Fill element i (row-major) with tt_value(seed, i) rounded to t's dtype. */
void tt_fill(tt_tensor *t, uint64_t seed);
/* Checkpoint tensor content for (name, version). */
uint64_t tt_ckpt_seed(const char *name, uint64_t version);

/* A refit_view over a test tensor. */
refit_view tt_view(const tt_tensor *t);

/* A ckpt spec with dtype and shape filled in. */
refit_ckpt_spec tt_spec(refit_dtype dt, int ndim, const int64_t *shape);

/* Small PRNG for permutations and splits. */
typedef struct tt_rng {
    uint64_t s;
} tt_rng;
uint64_t tt_rand(tt_rng *r);
/* Uniform in [0, n). */
uint64_t tt_randn(tt_rng *r, uint64_t n);

/* Run fn(arg) in a child process and return its exit status, or 128 + the
 * signal that killed it. For scenarios that crash the core (a failed
 * assert, a sanitizer halt), so that one crash does not take the rest of
 * the suite down. fn must not use cmocka assertions (they would jump back
 * into the child's copy of the runner); it returns 0 or a failure code. */
int tt_isolated(int (*fn)(void *), void *arg);

/* A minimal sealed model built without cmocka assertions, for isolated
 * children: module "m", runtime "w" [4] f32 over buf, checkpoint "x" [4]
 * f32. Returns 0, or a nonzero code when a step failed. */
typedef struct tt_raw {
    refit_ctx *ctx;
    refit_model *m;
    float buf[4];
    int64_t shape[1];
    refit_tensor t;
    float src[4];
    int64_t src_shape[1];
    refit_tensor s;  /* a source for "x" over src */
} tt_raw;
int tt_raw_open(tt_raw *r);

/* ---- a world: one context, one model ---- */

#define TW_MAX 512

typedef struct tw_ckpt {
    char name[160];
    char module[96];
    refit_ckpt_spec spec;   /* as declared (strings point into the strings below) */
    char target[64];
    char tie[160];
} tw_ckpt;

typedef struct tw {
    refit_ctx *ctx;
    refit_model *m;
    tt_tensor *rt[TW_MAX];   /* runtime and side tensors registered */
    char rt_module[TW_MAX][96];
    char rt_name[TW_MAX][64];
    int n_rt;
    tt_tensor *tmp[TW_MAX];  /* everything else the test allocated */
    int n_tmp;
    tw_ckpt ck[TW_MAX];
    int n_ck;
    char err[1400];          /* what tw_try_load_all refused */
    int partial;             /* tw_begin's refit_update_opts.partial (a delta) */
    int keep_going;          /* tw_begin's refit_update_opts.keep_going */
} tw;

/* cmocka setup/teardown: *state becomes a tw with an open ctx and model. */
int tw_setup(void **state);
int tw_teardown(void **state);
/* Same with options (e.g. a staging budget). */
int tw_open(tw *w, const refit_options *opt);
void tw_close(tw *w);

/* A tensor freed with the world (not registered). */
tt_tensor *tw_tmp(tw *w, refit_dtype dt, int ndim, const int64_t *shape);
/* Allocate a runtime tensor and bind it to module/name; asserts success. */
tt_tensor *tw_runtime(tw *w, const char *module, const char *name, refit_dtype dt,
                      int ndim, const int64_t *shape);
/* Keep t (freed with the world); returns it. */
tt_tensor *tw_adopt(tw *w, tt_tensor *t);
/* Bind a tensor the test made (e.g. strided) as a runtime tensor; the
 * world frees it. Asserts success. */
tt_tensor *tw_bind(tw *w, const char *module, const char *name, tt_tensor *t);
/* Add a module; asserts success. */
void tw_module(tw *w, const char *name, const char *format, const char *params);
/* refit_model_expect, recorded for tw_load_all; returns the status. */
int tw_expect(tw *w, const char *module, const char *name, const refit_ckpt_spec *spec);
/* Find a registered runtime tensor of module. */
tt_tensor *tw_rt(tw *w, const char *module, const char *name);

/* Seal and assert it worked (with the message on failure). */
void tw_seal(tw *w);
/* Begin with a version label and rollback flag (and w->partial,
 * w->keep_going); asserts success. */
refit_txn *tw_begin(tw *w, const char *label, int rollback);

/* The full-shape checkpoint tensor (dtype/shape of the recorded spec, or
 * of the tied tensor) filled for (name, version). Freed with the world. */
tt_tensor *tw_ckpt_tensor(tw *w, const char *name, uint64_t version);
const tw_ckpt *tw_find_ckpt(const tw *w, const char *name);

/* How tw_load_all delivers. */
typedef struct tw_load_opts {
    uint64_t order_seed;  /* 0: declaration order; else a random permutation */
    int parts;            /* 0: refit_load; >0: refit_load_part in random splits */
    uint64_t part_seed;
    int tie_mode;         /* 0: primary names only; 1: aliases only; 2: both names */
    const char *only_module; /* deliver only this module's tensors (NULL: all) */
} tw_load_opts;

/* Deliver every recorded checkpoint tensor of version; asserts each load
 * returns REFIT_OK. */
void tw_load_all(tw *w, refit_txn *t, uint64_t version, const tw_load_opts *o);
/* Same, returning the first failing status (w->err says which load). */
int tw_try_load_all(tw *w, refit_txn *t, uint64_t version, const tw_load_opts *o);
/* Deliver one checkpoint tensor whole; returns the status. */
int tw_load(tw *w, refit_txn *t, const char *name, uint64_t version);
/* Cold start or update to version with defaults; asserts READY after. */
void tw_update(tw *w, uint64_t version, const char *label);

/* All runtime bytes concatenated (malloc'd; caller frees); tensors made
 * with tt_alias own no memory and are left out. */
void *tw_snapshot(const tw *w, size_t *bytes);
/* One module "m" (unquantized): runtime w f32 [4] from "m.w"; sealed. */
void tw_one_module(tw *w);

/* The first column of the first row of sql over the SQLite file at path,
 * opened read-only; -1 when the query gives no row. */
int tw_sql_count(const char *path, const char *sql);
/* 1 when every runtime byte of w equals snap (n bytes, from tw_snapshot). */
int tw_snapshot_equal(const tw *w, const void *snap, size_t n);
/* Model fingerprint; asserts success. */
uint64_t tw_fp(tw *w);

/* Assert the last error message contains every given substring. */
void tw_assert_msg_(tw *w, const char *file, int line, ...);
#define tw_assert_msg(w, ...) tw_assert_msg_((w), __FILE__, __LINE__, __VA_ARGS__, (const char *)NULL)
/* Close w, then fail unless rc is want and the last error message of w's
 * context (kept from before the close) contains every given substring: a
 * refusal checked with nothing of w left behind when the check fails. */
void tw_close_refused_(tw *w, int rc, int want, const char *file, int line, ...);
#define tw_close_refused(w, rc, want, ...) \
    tw_close_refused_((w), (rc), (want), __FILE__, __LINE__, __VA_ARGS__, (const char *)NULL)

/* ---- a transformer-shaped model ----
 * Embedding [V=10 padded to 12, H=8] in bf16 cast to f32, TP-sharded along
 * dim 0, tied to lm_head; per layer a fused qkv (q 8 rows, k 4, v 4, TP),
 * o_proj sharded on dim 1, fused gate_up (TP), down sharded on dim 1,
 * stacked experts (3 experts, w1 [4,8]; w2 [8,4] sharded on dim 1), norms
 * (bf16 -> f32 and f32 -> f16 casts); and, when staged is set, a module of
 * the test STAGED format "test-scale" (runtime = 2 * checkpoint, F32). */
typedef struct tt_llm_cfg {
    int rank, tp;   /* TP rank of tp (tp 1: unsharded) */
    int layers;
    int staged;     /* add a test-scale module per layer */
} tt_llm_cfg;

void tt_build_llm(tw *w, const tt_llm_cfg *cfg);

/* The STAGED test formats (formats.c-style, built into the tests):
 *   test-scale   every ckpt STAGED, WHOLE|POST_LOAD; place = 2 * staged (F32)
 *   test-accum   same, but post_load does place += 2 * staged: it reads
 *                runtime bytes (the rule-4 bug the tests must catch)
 *   test-fail    same as test-scale, then writes junk over the first
 *                target and fails with REFIT_EFORMAT
 */
extern const refit_format_v2 tt_format_scale;
extern const refit_format_v2 tt_format_accum;
extern const refit_format_v2 tt_format_fail;
/* Register all three on w's context; asserts success. */
void tw_register_test_formats(tw *w);

#endif
