/*
 * Plans: the module list of an update (names, expected counts), stored once
 * and shared by every update with the same list, so that begin writes one
 * row per 256 modules instead of one per module. A plan is found by a
 * digest of the list; the core may write it ahead of the first update
 * (journal_plan_prepare at seal) to keep its cost off the reload.
 */
#include <stdio.h>
#include <string.h>

#include "journal/journal_int.h"

/* A word-at-a-time multiply-xorshift hash: begin hashes every name of the
 * model (hundreds of KiB for 10,000 modules), and a byte-at-a-time FNV-1a
 * took a third of begin's time. Not cryptographic: plans are written by
 * the worker itself, there is no adversary to collide them. */
#define MIX_K 0x9e3779b97f4a7c15ull

static uint64_t mix(uint64_t h, uint64_t w)
{
    h = (h ^ w) * MIX_K;
    return h ^ (h >> 29);
}

static uint64_t hash_bytes(uint64_t h, const char *p, size_t n)
{
    uint64_t w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        h = mix(h, w);
    }
    w = 0;
    memcpy(&w, p, n);
    return mix(h, w ^ ((uint64_t)n << 56));
}

/* The hash over names and counts, with the module count and the total
 * name length spelled out: two lists that collide must agree on both. */
static void plan_digest(size_t n, const journal_module_info *m, char *out,
                        size_t len)
{
    uint64_t h = MIX_K;
    size_t name_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(m[i].name);
        h = hash_bytes(h, m[i].name, l);
        h = mix(mix(h, m[i].expected_tensors), m[i].expected_bytes);
        name_bytes += l;
    }
    snprintf(out, len, "w64:%016llx:%zu:%zu", (unsigned long long)h, n,
             name_bytes);
}

static int plan_find(journal *j, const char *digest, int64_t *id)
{
    sqlite3_stmt *s = jr_stmt(j, JS_PLAN_FIND);
    if (!s)
        return SQLITE_ERROR;
    sqlite3_bind_text(s, 1, digest, -1, SQLITE_STATIC);
    int rc = jr_step(j, s);
    *id = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
    sqlite3_reset(s);
    return rc == SQLITE_ROW ? SQLITE_DONE : rc;
}

static int plan_write(journal *j, const char *digest, size_t n,
                      const journal_module_info *m, int64_t *id)
{
    char now[32];
    sqlite3_stmt *p = jr_stmt(j, JS_PLAN_INSERT);
    sqlite3_stmt *s = jr_stmt(j, JS_PLAN_MODULE_INSERT);
    if (!p || !s)
        return SQLITE_ERROR;
    jr_now(now, sizeof now);
    sqlite3_bind_text(p, 1, digest, -1, SQLITE_STATIC);
    sqlite3_bind_int64(p, 2, (sqlite3_int64)n);
    sqlite3_bind_text(p, 3, now, -1, SQLITE_STATIC);
    int rc = jr_step_done(j, p);
    if (rc != SQLITE_DONE)
        return rc;
    *id = sqlite3_last_insert_rowid(j->db);
    sqlite3_bind_int64(s, 1, *id);
    for (size_t i = 0; i < n && rc == SQLITE_DONE; i++) {
        sqlite3_bind_int64(s, 2, (sqlite3_int64)i);
        sqlite3_bind_text(s, 3, m[i].name, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 4, (sqlite3_int64)m[i].expected_tensors);
        sqlite3_bind_int64(s, 5, (sqlite3_int64)m[i].expected_bytes);
        rc = jr_step_done(j, s);
    }
    return rc;
}

int jr_plan_get(journal *j, size_t n, const journal_module_info *m,
                int64_t *plan_id)
{
    char digest[80];
    plan_digest(n, m, digest, sizeof digest);
    int rc = plan_find(j, digest, plan_id);
    /* No cache of the id in the handle: the lookup costs one indexed read,
     * and a cached id could outlive the rollback of the transaction that
     * wrote it. */
    if (rc == SQLITE_DONE && *plan_id == 0)
        rc = plan_write(j, digest, n, m, plan_id);
    return rc;
}

int jr_plan_check(journal *j, int64_t plan_id, size_t n)
{
    sqlite3_stmt *s = jr_stmt(j, JS_PLAN_CHECK);
    if (!s)
        return SQLITE_ERROR;
    sqlite3_bind_int64(s, 1, plan_id);
    int rc = jr_step(j, s);
    if (rc == SQLITE_ROW)
        rc = sqlite3_column_int64(s, 0) == (sqlite3_int64)n ? SQLITE_DONE
                                                             : SQLITE_MISMATCH;
    else if (rc == SQLITE_DONE)
        rc = SQLITE_MISMATCH;
    sqlite3_reset(s);
    return rc;
}

int journal_plan_prepare(journal *j, size_t n_modules,
                         const journal_module_info *modules,
                         int64_t *plan_id)
{
    const char *what = "recording a plan";
    int64_t id = 0;
    if (!j || (n_modules && !modules))
        return REFIT_EINVAL;
    for (size_t i = 0; i < n_modules; i++)
        if (!modules[i].name)
            return jr_fail(j, REFIT_EINVAL, "journal: plan: module %zu has "
                           "no name", i);
    int rc = jr_check_writable(j, what);
    if (rc != REFIT_OK || (rc = jr_tx_begin(j, what)))
        return rc;
    if (jr_plan_get(j, n_modules, modules, &id) != SQLITE_DONE)
        return jr_fail_sqlite(j, what);
    rc = jr_tx_commit(j, what);
    if (rc == REFIT_OK && plan_id)
        *plan_id = id;
    return rc;
}
