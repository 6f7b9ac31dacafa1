/* Several modules of one 4-bit format in a test world, each from its own
 * ref4.py set, delivered through one refit_load_many or one refit_load a
 * tensor, from sources the test owns: 64-byte aligned (a format that sets
 * REFIT_MODULE_STAGED_IN_PLACE has them read where they lie) or 16 bytes
 * past a 64-byte boundary (always staged). The format's plan and
 * post-loads are watched, so a suite can tell which path ran. Names no
 * plugin symbol (tests/formats/meson.build links it into every formats4
 * suite). */
#ifndef REFIT_TESTS_FORMATS4_F4BATCH_H
#define REFIT_TESTS_FORMATS4_F4BATCH_H

#include "core/safetensors.h"
#include "tests/core/testutil.h"
#include "tests/formats/common/f4set.h"

#define F4B_MAX 64 /* checkpoint tensors of a batch */

/* What the watched format saw since f4b_watch_reset. */
typedef struct f4b_watch {
    int plans, plans_in_place;      /* plans, and of them STAGED_IN_PLACE ones */
    int many_calls, many_modules;   /* post_load_many calls, modules they took */
    int one_calls;                  /* post_load calls */
    int n_staged;                   /* staged views the post-loads read */
    char staged_name[F4B_MAX][128];
    const void *staged_at[F4B_MAX];
} f4b_watch;
extern f4b_watch f4b_seen;
void f4b_watch_reset(void);

/* plugin with its plan and post-loads watched (one format at a time): its
 * post_load_many calls plugin's and fails the test when plugin has none.
 * Register it in place of plugin. */
const refit_format_v2 *f4b_watched(const refit_format_v2 *plugin);

/* Name of set tensor `name` as module k's checkpoint tensor: "lK.NAME"
 * (the suffix after the last '.', which the formats read, is kept). */
void f4b_name(char *out, size_t size, int k, const char *name);
/* Expect every checkpoint tensor of s, renamed for module k, in module
 * mod; fn (may be NULL) adjusts each spec. The first failing status. */
int f4b_expect(tw *w, const char *mod, int k, const st_set *s, f4_spec_fn fn, void *user);

/* Copies of every checkpoint tensor of sets s[0 .. n) (set k: module k's),
 * each in memory of its own. */
typedef struct f4b_sources {
    int n;
    const char *names[F4B_MAX];
    refit_tensor t[F4B_MAX];
    void *buf[F4B_MAX];
    char name[F4B_MAX][128];
} f4b_sources;
void f4b_sources_make(f4b_sources *src, st_set *const *s, int n, int misaligned);
void f4b_sources_free(f4b_sources *src);
/* The bytes of source `name` (module k's set tensor, as f4b_name names
 * it), to spoil; fails the test when absent. */
void *f4b_bytes(f4b_sources *src, int k, const char *name);

/* Deliver every source, in one refit_load_many (many) or one refit_load
 * each; asserts each call succeeds. */
void f4b_load(tw *w, refit_txn *t, const f4b_sources *src, int many);
/* begin (rollback on), f4b_load, finalize: finalize's status. */
int f4b_update(tw *w, const f4b_sources *src, int many, const char *label);
/* Every staged view the post-loads read (since the last reset) was the
 * caller's source itself (in_place) or a staged copy (!in_place); at
 * least one was read. Returns how many were. */
int f4b_assert_read(const f4b_sources *src, int in_place);

/* The runtime bytes of a and b are equal (what: the failure's message). */
void f4b_assert_same_bytes(const tw *a, const tw *b, const char *what);

/* A suite's batch: n modules (n <= F4B_MAX tensors in all), each from a
 * set of its own. */
typedef struct f4b_batch {
    int n;
    void (*sets)(st_set **s, int seed);     /* s[0 .. n), from seed */
    void (*close)(st_set **s);
    void (*build)(tw *w, st_set *const *s); /* every module, sealed */
    void (*check)(tw *w, st_set *const *s); /* the runtime is s's reference */
    void (*spoil)(tw *w);                   /* NULL, or scribble on bytes the load rewrites */
    int staged_in_place;                    /* staged views read in place from a batch */
} f4b_batch;

/* Every module in one refit_load_many: one post_load_many for all, the
 * aligned sources read in place (b->staged_in_place of them), the
 * reference's bytes; one refit_load a tensor gives the same bytes; so does
 * B over A from unaligned (staged) sources, and B again in place changes
 * nothing. */
void f4b_check_load_many(const refit_format_v2 *plugin, const f4b_batch *b);

#endif
