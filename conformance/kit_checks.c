/* The conformance checks: see kit_checks.h and docs/conformance.md. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance/kit_checks.h"
#include "conformance/kit_reference.h"

/* Versions of the checkpoint the checks deliver. */
#define VERSION_A 1
#define VERSION_B 2
#define VERSION_C 3

static void say(kit_result *r, kit_verdict v, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(kit_result *r, kit_verdict v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    r->verdict = v;
}

/* A world at rank 0 holding version (cold start), or a failed result. */
static int cold(kit_world *w, const kit_env *env, int rank, kit_layout layout,
                unsigned char junk, uint64_t version, kit_result *r)
{
    char why[2048];
    int rc = kit_world_open(w, env, rank, layout, junk, why, sizeof why);
    if (rc) {
        say(r, KIT_FAIL, "the case does not seal: %s", why);
        return rc;
    }
    kit_delivery d = {.version = version};
    rc = kit_update(w, &d, "cold", why, sizeof why);
    if (rc)
        say(r, KIT_FAIL, "a cold start at rank %d refused the case: %s", rank, why);
    return rc;
}

/* Compare two worlds' bytes (same case, same binding order). */
static int same_bytes(const kit_world *a, const kit_world *b, char *where, size_t n)
{
    size_t na, nb;
    void *x = kit_snapshot(a, &na), *y = kit_snapshot(b, &nb);
    int same = x && y && na == nb && !memcmp(x, y, na);
    if (!same && x && y && na == nb)
        kit_diff(a, x, y, where, n);
    else if (!same)
        snprintf(where, n, "snapshots of %zu and %zu bytes", na, nb);
    free(x);
    free(y);
    return same;
}

static int is_format(const kit_env *env, const mdoc_mod *mod)
{
    return !strcmp(mod->format, env->format);
}

/* ---- declaration ---- */

static void check_declaration(const kit_env *env, kit_result *r)
{
    const fdecl *f = env->decl;
    size_t mods = 0;
    char buf[64];
    for (size_t i = 0; i < env->doc->n_mods; i++) {
        const mdoc_mod *mod = &env->doc->mods[i];
        if (!is_format(env, mod))
            continue;
        mods++;
        for (size_t j = 0; j < mod->n_rt; j++) {
            const mdoc_rt *t = &mod->rt[j];
            if (!fdecl_rt_role_for(f, t->name, t->dtype))
                return say(r, KIT_FAIL, "%s:%u: runtime tensor %s/%s (%s) matches no runtime "
                           "role of %s (its globs and dtypes)", env->case_path, t->at.line,
                           mod->name, t->name, refit_dtype_name(t->dtype), f->file);
            for (int d = 0; d < t->ndim; d++)
                if (t->shape[d] <= 0)
                    return say(r, KIT_FAIL, "%s:%u: runtime tensor %s/%s has extent %lld in "
                               "dim %d", env->case_path, t->at.line, mod->name, t->name,
                               (long long)t->shape[d], d);
        }
        for (size_t j = 0; j < mod->n_ck; j++) {
            const mdoc_ck *ck = &mod->ck[j];
            if (ck->tie)
                continue;
            const fdecl_ckpt_role *role = fdecl_ckpt_role_for(f, ck->name, ck->dtype);
            if (!role)
                return say(r, KIT_FAIL, "%s:%u: checkpoint tensor %s (%s) of module %s "
                           "matches no checkpoint role of %s", env->case_path, ck->at.line,
                           ck->name, refit_dtype_name(ck->dtype), mod->name, f->file);
            const mdoc_rt *t = mdoc_target(mod, ck);
            const fdecl_rt_role *tr = t ? fdecl_rt_role_for(f, t->name, t->dtype) : NULL;
            if (role->target && tr && strcmp(tr->role, role->target))
                return say(r, KIT_FAIL, "%s:%u: checkpoint tensor %s (role %s, routes %s) "
                           "lands in runtime tensor %s of role %s, but its role targets %s",
                           env->case_path, ck->at.line, ck->name, role->role,
                           fdecl_routes_text(role->routes, buf, sizeof buf), t->name, tr->role,
                           role->target);
        }
    }
    if (!mods)
        return say(r, KIT_FAIL, "%s has no module of format %s", env->case_path, env->format);
    for (int rank = 0; rank < env->tp; rank++) {
        kit_world w = {0};
        char why[2048];
        int rc = kit_world_open(&w, env, rank, KIT_SHARDED, 0xa5, why, sizeof why);
        kit_world_close(&w);
        if (rc)
            return say(r, KIT_FAIL, "rank %d of %d: %s", rank, env->tp, why);
    }
    say(r, KIT_PASS, "%zu module(s) of %s: every runtime and checkpoint tensor has a role of "
        "the declaration; each rank of %d seals (plan() agrees with the declaration)", mods,
        env->format, env->tp);
}

/* ---- cold start ---- */

static void check_cold_start(const kit_env *env, kit_result *r)
{
    kit_world a = {0}, b = {0};
    char where[256];
    if (cold(&a, env, 0, KIT_SHARDED, 0xa5, VERSION_B, r) ||
        cold(&b, env, 0, KIT_SHARDED, 0x5a, VERSION_B, r))
        goto out;
    if (!same_bytes(&a, &b, where, sizeof where))
        say(r, KIT_FAIL, "two cold starts of the same checkpoint over runtime memory first "
            "filled with 0xa5 and with 0x5a differ at %s: the format leaves runtime bytes "
            "unwritten or reads them", where);
    else
        say(r, KIT_PASS, "the same bytes from runtime memory filled with 0xa5 and with 0x5a");
out:
    kit_world_close(&a);
    kit_world_close(&b);
}

/* ---- reload equals cold start ---- */

/* A cold start of B in c, and in h A then B (in one refit_load_many when
 * many): 0 when h then holds exactly c's bytes (both worlds left open,
 * r untouched), else r says what failed. */
static int b_over_a(const kit_env *env, kit_result *r, int many, kit_world *c, kit_world *h)
{
    char where[256], why[2048];
    memset(h, 0, sizeof *h);
    if (cold(c, env, 0, KIT_SHARDED, 0xa5, VERSION_B, r) ||
        cold(h, env, 0, KIT_SHARDED, many ? 0x5a : 0xa5, VERSION_A, r))
        return 1;
    if (same_bytes(c, h, where, sizeof where)) {
        say(r, KIT_FAIL, "versions A and B of the checkpoint give the same runtime bytes: "
            "the case cannot tell a reload from a cold start");
        return 1;
    }
    kit_delivery d = {.version = VERSION_B, .many = many};
    if (kit_update(h, &d, "B", why, sizeof why)) {
        say(r, KIT_FAIL, "reload of version B after A%s: %s",
            many ? " in one refit_load_many" : "", why);
        return 1;
    }
    if (same_bytes(c, h, where, sizeof where))
        return 0;
    if (many)
        say(r, KIT_FAIL, "A then B in one refit_load_many differs from a cold start of B "
            "loaded a tensor a call, at %s: post_load_many does not build what post_load "
            "builds, or a staged view read in place was written", where);
    else
        say(r, KIT_FAIL, "A then B differs from a cold start of B at %s: post_load reads "
            "runtime bytes (DESIGN rule 4) or leaves some of A", where);
    return 1;
}

static void check_reload(const kit_env *env, kit_result *r)
{
    kit_world c = {0}, h = {0};
    if (!b_over_a(env, r, 0, &c, &h))
        say(r, KIT_PASS, "A then B gives exactly the bytes of a cold start of B");
    kit_world_close(&c);
    kit_world_close(&h);
}

/* ---- the same bytes twice ---- */

static void check_twice(const kit_env *env, kit_result *r)
{
    kit_world w = {0};
    char where[256], why[2048];
    if (cold(&w, env, 0, KIT_SHARDED, 0xa5, VERSION_B, r))
        goto out;
    size_t n, m;
    void *before = kit_snapshot(&w, &n);
    kit_delivery d = {.version = VERSION_B};
    int rc = kit_update(&w, &d, "B again", why, sizeof why);
    void *after = kit_snapshot(&w, &m);
    if (rc)
        say(r, KIT_FAIL, "loading B a second time: %s", why);
    else if (n != m || memcmp(before, after, n))
        say(r, KIT_FAIL, "loading B a second time changed %s: a post-load kernel is not "
            "idempotent", kit_diff(&w, before, after, where, sizeof where));
    else
        say(r, KIT_PASS, "loading the same checkpoint again leaves every byte");
    free(before);
    free(after);
out:
    kit_world_close(&w);
}

/* ---- many tensors in one call ---- */

static int staged_float(const kit_env *env, const mdoc_ck *ck);
static int nan_refused(kit_world *w, uint64_t version, const mdoc_mod *mod, const mdoc_ck *ck,
                       int many, kit_result *r, char *why, size_t n);

static void check_many(const kit_env *env, kit_result *r)
{
    kit_world c = {0}, w = {0};
    char why[2048];
    if (b_over_a(env, r, 1, &c, &w))
        goto out;
    /* a NaN in the first staged float tensor of A, in one call, over B */
    for (size_t i = 0; i < env->doc->n_mods; i++) {
        const mdoc_mod *mod = &env->doc->mods[i];
        for (size_t j = 0; is_format(env, mod) && j < mod->n_ck; j++) {
            const mdoc_ck *ck = &mod->ck[j];
            if (!staged_float(env, ck))
                continue;
            if (nan_refused(&w, VERSION_A, mod, ck, 1, r, why, sizeof why))
                say(r, KIT_PASS, "one refit_load_many gives the bytes of a refit_load a "
                    "tensor; a NaN in %s in one call fails it naming %s, rolled back",
                    ck->name, mod->name);
            goto out;
        }
    }
    say(r, KIT_PASS, "one refit_load_many gives the bytes of a refit_load a tensor");
out:
    kit_world_close(&c);
    kit_world_close(&w);
}

/* ---- TP shards and cuts ---- */

static void check_tp(const kit_env *env, kit_result *r)
{
    char where[256], why[2048];
    for (int rank = 0; rank < env->tp; rank++) {
        kit_world s = {0}, t = {0};
        int rc = kit_world_open(&s, env, rank, KIT_SHARDED, 0xa5, why, sizeof why);
        if (rc) {
            say(r, KIT_FAIL, "rank %d: %s", rank, why);
            kit_world_close(&s);
            return;
        }
        rc = kit_world_open(&t, env, rank, KIT_SLICED, 0xa5, why, sizeof why);
        if (rc == REFIT_EUNSUPPORTED) {
            say(r, KIT_SKIP, "%s", why);
        } else if (rc) {
            say(r, KIT_FAIL, "rank %d's slices declared as whole tensors: %s", rank, why);
        } else {
            kit_delivery cut = {.version = VERSION_B, .cuts = 3, .poison_others = 1};
            kit_delivery whole = {.version = VERSION_B};
            if (kit_update(&s, &cut, "cuts", why, sizeof why))
                say(r, KIT_FAIL, "rank %d of %d, each tensor in 3 cuts: %s", rank, env->tp, why);
            else if (kit_update(&t, &whole, "slices", why, sizeof why))
                say(r, KIT_FAIL, "rank %d's slices as whole tensors: %s", rank, why);
            else if (!same_bytes(&s, &t, where, sizeof where))
                say(r, KIT_FAIL, "rank %d of %d, the full tensors delivered in 3 cuts (other "
                    "ranks' rows NaN) differ from rank %d's slices loaded as whole tensors, "
                    "at %s", rank, env->tp, rank, where);
            else
                r->verdict = KIT_PASS;
        }
        kit_world_close(&s);
        kit_world_close(&t);
        if (r->verdict != KIT_PASS)
            return;
    }
    say(r, KIT_PASS, "each of %d rank(s): the full tensors in 3 cuts, other ranks' rows NaN, "
        "give exactly the bytes of its slices loaded whole", env->tp);
}

/* ---- NaN -> finalize fails -> rollback ---- */

/* A f64/f32/f16/bf16 checkpoint tensor whose declared role is STAGED
 * only: the format computes from it at post-load (an online weight, a
 * scale factor), so it must refuse a NaN in it. Serialized 8-bit codes
 * (an E4M3 block scale the format only moves) are not held to it. */
static int staged_float(const kit_env *env, const mdoc_ck *ck)
{
    int wide = (ck->dtype.code == REFIT_DTYPE_FLOAT && ck->dtype.bits >= 16) ||
               ck->dtype.code == REFIT_DTYPE_BFLOAT;
    if (ck->tie || !wide)
        return 0;
    const fdecl_ckpt_role *role = fdecl_ckpt_role_for(env->decl, ck->name, ck->dtype);
    return role && role->routes == FDECL_ROUTE_BIT(REFIT_ROUTE_STAGED);
}

/* A NaN in ck (module mod) of version (another than w holds, so a
 * missing rollback shows), delivered a tensor a call or in one
 * refit_load_many (many): 1 when the update fails naming mod, rolled back
 * to the bytes before and READY (why: its message); else 0 and r says
 * what went wrong. */
static int nan_refused(kit_world *w, uint64_t version, const mdoc_mod *mod, const mdoc_ck *ck,
                       int many, kit_result *r, char *why, size_t nwhy)
{
    char where[256];
    const char *how = many ? " in one refit_load_many" : "";
    size_t n, m;
    void *before = kit_snapshot(w, &n);
    kit_delivery d = {.version = version, .nan_in = ck->name, .many = many};
    int rc = kit_update(w, &d, "nan", why, nwhy);
    void *after = kit_snapshot(w, &m);
    refit_health hl = refit_worker_health(w->ctx);
    int ok = 0;
    if (rc == REFIT_OK)
        say(r, KIT_FAIL, "a NaN in %s (module %s)%s was accepted: the update committed",
            ck->name, mod->name, how);
    else if (hl != REFIT_HEALTH_READY)
        say(r, KIT_FAIL, "after the refused NaN in %s%s the worker is %s, not READY",
            ck->name, how, refit_health_name(hl));
    else if (n != m || memcmp(before, after, n))
        say(r, KIT_FAIL, "the rollback of the NaN in %s%s left %s changed", ck->name, how,
            kit_diff(w, before, after, where, sizeof where));
    else if (!strstr(why, mod->name))
        say(r, KIT_FAIL, "the refusal of the NaN in %s%s does not name module %s: %s",
            ck->name, how, mod->name, why);
    else
        ok = 1;
    free(before);
    free(after);
    return ok;
}

static void check_nan(const kit_env *env, kit_result *r)
{
    kit_world w = {0};
    char why[2048];
    int tried = 0;
    if (cold(&w, env, 0, KIT_SHARDED, 0xa5, VERSION_A, r))
        goto out;
    for (size_t i = 0; i < env->doc->n_mods; i++) {
        const mdoc_mod *mod = &env->doc->mods[i];
        for (size_t j = 0; is_format(env, mod) && j < mod->n_ck; j++) {
            const mdoc_ck *ck = &mod->ck[j];
            if (!staged_float(env, ck))
                continue;
            tried++;
            if (!nan_refused(&w, VERSION_B, mod, ck, 0, r, why, sizeof why))
                goto out;
        }
    }
    if (!tried)
        say(r, KIT_SKIP, "no f64/f32/f16/bf16 checkpoint tensor of the case has a STAGED-only role");
    else
        say(r, KIT_PASS, "a NaN in each of %d staged float tensor(s) fails the update, which "
            "rolls back to the previous bytes, READY (last: %s)", tried, why);
out:
    kit_world_close(&w);
}

/* ---- a refused load leaves bytes and health ---- */

/* A dtype of the same width as dt that is not dt. */
static refit_dtype other_dtype(refit_dtype dt)
{
    refit_dtype o = dt;
    o.code = dt.code == REFIT_DTYPE_INT ? REFIT_DTYPE_UINT : REFIT_DTYPE_INT;
    if (dt.bits < 8)
        o = REFIT_U8;
    return o;
}

static void check_refusal(const kit_env *env, kit_result *r)
{
    kit_world w = {0};
    char where[256], why[2048];
    const mdoc_ck *ck = NULL;
    const mdoc_mod *mod = NULL;
    for (size_t i = 0; i < env->doc->n_mods && !ck; i++)
        for (size_t j = 0; is_format(env, &env->doc->mods[i]) && j < env->doc->mods[i].n_ck;
             j++)
            if (!env->doc->mods[i].ck[j].tie) {
                ck = &env->doc->mods[i].ck[j];
                mod = &env->doc->mods[i];
                break;
            }
    if (!ck)
        return say(r, KIT_FAIL, "%s has no checkpoint tensor of format %s", env->case_path,
                   env->format);
    if (cold(&w, env, 0, KIT_SHARDED, 0xa5, VERSION_B, r))
        goto out;
    static const char *const kinds[] = {"an unknown name", "another dtype", "another shape"};
    for (int k = 0; k < 3; k++) {
        char bad_name[256];
        snprintf(bad_name, sizeof bad_name, "%s.not_in_the_model", ck->name);
        int64_t shape[REFIT_MAX_DIMS];
        memcpy(shape, ck->shape, sizeof shape);
        int ndim = ck->ndim;
        refit_dtype dt = ck->dtype;
        if (k == 1)
            dt = other_dtype(dt);
        if (k == 2) {
            if (ndim == 0)
                shape[ndim++] = 2;
            else
                shape[0] += 1;
        }
        size_t elems = 1;
        for (int d = 0; d < ndim; d++)
            elems *= (size_t)shape[d];
        size_t bytes = (elems * dt.bits + 7) / 8;
        unsigned char *buf = calloc(1, bytes ? bytes : 1);
        size_t n, m;
        void *before = kit_snapshot(&w, &n);
        uint64_t fp0 = 0, fp1 = 0;
        refit_model_fingerprint(w.m, &fp0);
        refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
        o.version_label = "refused";
        refit_txn *t = NULL;
        int rc = refit_begin(&t, w.m, &o);
        kit_delivery rest = {.version = VERSION_C, .skip = ck->name};
        if (!rc)
            rc = kit_deliver(&w, t, &rest, why, sizeof why);
        if (rc) {
            say(r, KIT_FAIL, "delivering version C but %s: %s", ck->name, why);
            if (t)
                refit_abort(t);
        } else {
            refit_tensor src = {buf, {REFIT_DEVICE_CPU, 0}, ndim, dt, shape, NULL, 0};
            int lrc = refit_load(t, k == 0 ? bad_name : ck->name, &src, NULL);
            snprintf(why, sizeof why, "%s", refit_errmsg(w.ctx));
            int frc = lrc ? refit_finalize(t) : REFIT_OK;
            if (!lrc)
                refit_abort(t);
            kit_release_sources(&w);
            if (env->fault && !strcmp(env->fault, "refusal"))
                kit_flip_first_byte(&w); /* --self-test-fault=refusal */
            void *after = kit_snapshot(&w, &m);
            refit_model_fingerprint(w.m, &fp1);
            refit_health hl = refit_worker_health(w.ctx);
            if (!lrc)
                say(r, KIT_FAIL, "%s with %s was accepted", ck->name, kinds[k]);
            else if (!strstr(why, k == 0 ? bad_name : ck->name))
                say(r, KIT_FAIL, "the refusal of %s with %s does not name it: %s", ck->name,
                    kinds[k], why);
            else if (frc == REFIT_OK)
                say(r, KIT_FAIL, "after %s with %s was refused, finalize committed",
                    ck->name, kinds[k]);
            else if (hl != REFIT_HEALTH_READY)
                say(r, KIT_FAIL, "after %s with %s was refused, the worker is %s, not READY",
                    ck->name, kinds[k], refit_health_name(hl));
            else if (n != m || memcmp(before, after, n) || fp0 != fp1)
                say(r, KIT_FAIL, "after %s with %s was refused and the update rolled back, %s "
                    "changed", ck->name, kinds[k], kit_diff(&w, before, after, where,
                                                           sizeof where));
            else
                r->verdict = KIT_PASS;
            free(after);
        }
        free(before);
        free(buf);
        if (r->verdict != KIT_PASS)
            goto out;
    }
    say(r, KIT_PASS, "%s (module %s) with an unknown name, another dtype and another shape, "
        "after the rest of a new version arrived: refused, rolled back, bytes and health as "
        "they were (last: %s)", ck->name, mod->name, why);
out:
    kit_world_close(&w);
}

/* ---- the author's reference ---- */

static void check_reference(const kit_env *env, kit_result *r)
{
    if (!env->reference)
        return say(r, KIT_SKIP, "no --reference CMD given: the other checks hold the format "
                   "to consistency, only a reference to correctness");
    static const uint64_t versions[] = {VERSION_A, VERSION_B};
    int runs = 0;
    for (int rank = 0; rank < env->tp; rank++)
        for (size_t v = 0; v < 2; v++) {
            kit_world w = {0};
            char why[2048];
            int rc = cold(&w, env, rank, KIT_SHARDED, 0xa5, versions[v], r);
            if (!rc) {
                rc = kit_reference_run(&w, versions[v], why, sizeof why);
                if (rc == REFIT_EUNSUPPORTED)
                    say(r, KIT_SKIP, "%s", why);
                else if (rc)
                    say(r, KIT_FAIL, "rank %d of %d, version %c: %s", rank, env->tp,
                        v ? 'B' : 'A', why);
            }
            kit_world_close(&w);
            if (rc)
                return;
            runs++;
        }
    say(r, KIT_PASS, "at each of %d rank(s), versions A and B: every runtime byte equals the "
        "reference's (%d runs of `%s`)", env->tp, runs, env->reference);
}

static const kit_check checks[] = {
    {"declaration", "agrees with its declaration", check_declaration},
    {"cold-start", "a cold start writes every runtime byte", check_cold_start},
    {"reload", "a reload gives the bytes of a cold start", check_reload},
    {"twice", "the same checkpoint twice gives the same bytes", check_twice},
    {"many", "one refit_load_many gives the bytes of a load a tensor", check_many},
    {"tp", "TP shards and cuts load as their slices", check_tp},
    {"nan", "a NaN fails the update, which rolls back", check_nan},
    {"refusal", "a refused load leaves bytes and health", check_refusal},
    {"reference", "the bytes equal the author's reference (--reference)", check_reference},
};

const kit_check *kit_checks(size_t *n)
{
    *n = sizeof checks / sizeof checks[0];
    return checks;
}
