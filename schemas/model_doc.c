/* Model manifests: expand a schema-checked document into modules and
 * checkpoint entries, then check what one node cannot say: unique names,
 * targets and ties that exist, shards, offsets and padding that fit the
 * declared runtime shapes (the same arithmetic as core/plan.c, so a
 * manifest that passes here fails at seal only on what the engine binds). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/names.h"
#include "schemas/model_doc.h"
#include "schemas/schema.h"
#include "schemas/schema_data.h"

#define MB_MAX_VARS 8

typedef struct mb_var {
    const char *name;
    int64_t value;
} mb_var;

typedef struct mbuild {
    mdoc *m;
    ydoc *doc;
    sdiags *d;
    int status;
    mb_var env[MB_MAX_VARS];
    int n_env;
    size_t items;               /* modules + checkpoint entries so far */
    uint64_t steps;             /* repeat iterations so far, empty ones too */
    ypos last_at;               /* of the last expansion error: one per node */
} mbuild;

static void mb_error(mbuild *b, ypos at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void mb_error(mbuild *b, ypos at, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (b->n_env && at.line == b->last_at.line && at.col == b->last_at.col)
        return; /* the same node again in the next iteration */
    b->last_at = at;
    if (b->n_env) { /* say which iteration of a repeat went wrong */
        char it[120] = "";
        size_t used = 0;
        for (int i = 0; i < b->n_env && used < sizeof it; i++)
            used += (size_t)snprintf(it + used, sizeof it - used, "%s%s=%lld", i ? ", " : "",
                                     b->env[i].name, (long long)b->env[i].value);
        sdiags_add(b->d, b->doc->file, at, "%s (with %s)", msg, it);
    } else {
        sdiags_add(b->d, b->doc->file, at, "%s", msg);
    }
    if (b->status == REFIT_OK)
        b->status = REFIT_ECORRUPT;
}

static int mb_nomem(mbuild *b)
{
    b->status = REFIT_ENOMEM;
    return REFIT_ENOMEM;
}

static const int64_t *mb_lookup(const mbuild *b, const char *name, size_t len)
{
    for (int i = b->n_env - 1; i >= 0; i--)
        if (strlen(b->env[i].name) == len && !strncmp(b->env[i].name, name, len))
            return &b->env[i].value;
    return NULL;
}

/* The scalar's text with every ${var} replaced, in the arena; NULL when the
 * node is absent or on error (reported). */
static const char *mb_subst(mbuild *b, const yaml_node_t *n)
{
    const char *s = ydoc_str(n);
    if (!s)
        return NULL;
    char buf[1024];
    size_t o = 0;
    for (const char *p = s; *p; p++) {
        if (p[0] == '$' && p[1] == '{') {
            const char *end = strchr(p + 2, '}');
            const int64_t *v = end ? mb_lookup(b, p + 2, (size_t)(end - p - 2)) : NULL;
            if (!v) {
                mb_error(b, ydoc_pos(n), end ? "'%.*s' is not a repeat variable here"
                                             : "unterminated '${' in '%.*s'",
                         end ? (int)(end - p - 2) : (int)strlen(s), end ? p + 2 : s);
                return NULL;
            }
            int w = snprintf(buf + o, sizeof buf - o, "%lld", (long long)*v);
            o += w > 0 ? (size_t)w : 0;
            p = end;
        } else if (o < sizeof buf) {
            buf[o++] = *p;
        }
        if (o >= sizeof buf) {
            mb_error(b, ydoc_pos(n), "name longer than %zu bytes", sizeof buf - 1);
            return NULL;
        }
    }
    buf[o] = '\0';
    char *r = yarena_strdup(&b->m->arena, buf);
    if (!r)
        mb_nomem(b);
    return r;
}

/* An integer field: a literal or "${var}" (the schema allows no other). */
static int mb_int(mbuild *b, const yaml_node_t *n, int64_t *out)
{
    if (ydoc_int(n, out))
        return 1;
    const char *s = mb_subst(b, n);
    if (!s)
        return 0;
    if (!ydoc_parse_int(s, out)) {
        mb_error(b, ydoc_pos(n), "'%s' is not an integer", s);
        return 0;
    }
    return 1;
}

static const char *mb_iter(mbuild *b)
{
    if (!b->n_env)
        return NULL;
    char it[160];
    size_t used = 0;
    for (int i = 0; i < b->n_env && used < sizeof it; i++)
        used += (size_t)snprintf(it + used, sizeof it - used, "%s%s=%lld", i ? ", " : "",
                                 b->env[i].name, (long long)b->env[i].value);
    char *r = yarena_strdup(&b->m->arena, it);
    if (!r)
        mb_nomem(b);
    return r;
}

static size_t mb_len(const yaml_node_t *n)
{
    return n && n->type == YAML_SEQUENCE_NODE
               ? (size_t)(n->data.sequence.items.top - n->data.sequence.items.start)
               : 0;
}

static yaml_node_t *mb_at(mbuild *b, const yaml_node_t *n, size_t i)
{
    return ydoc_node(b->doc, n->data.sequence.items.start[i]);
}

static int mb_shape(mbuild *b, const yaml_node_t *list, int32_t *ndim, int64_t *shape)
{
    *ndim = (int32_t)mb_len(list);
    for (int32_t i = 0; i < *ndim && i < REFIT_MAX_DIMS; i++)
        if (!mb_int(b, mb_at(b, list, (size_t)i), &shape[i]))
            return 0;
    return 1;
}

static int mb_count(mbuild *b, ypos at)
{
    if (++b->items > MDOC_MAX_ITEMS) {
        if (b->items == MDOC_MAX_ITEMS + 1)
            mb_error(b, at, "the manifest expands to more than %u modules and checkpoint "
                            "entries (the limit on manifest size)", MDOC_MAX_ITEMS);
        return 0;
    }
    return 1;
}

typedef void (*mb_list_fn)(mbuild *b, void *ctx, const yaml_node_t *list);

/* Unroll a repeat group: run fn over group[key] once per value of var. */
static void mb_repeat(mbuild *b, const yaml_node_t *group, const char *key, mb_list_fn fn,
                      void *ctx)
{
    const yaml_node_t *rep = ydoc_get(b->doc, group, "repeat");
    const yaml_node_t *vn = ydoc_get(b->doc, rep, "var");
    const char *var = ydoc_str(vn);
    int64_t count = 0, start = 0;
    ydoc_int(ydoc_get(b->doc, rep, "count"), &count);
    ydoc_int(ydoc_get(b->doc, rep, "start"), &start);
    if (mb_lookup(b, var, strlen(var))) {
        mb_error(b, ydoc_pos(vn), "repeat variable '%s' is already used by an enclosing "
                                  "repeat", var);
        return;
    }
    if (b->n_env == MB_MAX_VARS) {
        mb_error(b, ydoc_pos(rep), "repeat groups nest more than %d deep", MB_MAX_VARS);
        return;
    }
    b->env[b->n_env].name = var;
    b->n_env++;
    for (int64_t v = start; v < start + count; v++) {
        if (++b->steps > MDOC_MAX_STEPS) {
            mb_error(b, ydoc_pos(rep), "repeat groups expand to more than %u iterations (the "
                                       "limit on repeat expansion)", MDOC_MAX_STEPS);
            break;
        }
        b->env[b->n_env - 1].value = v;
        fn(b, ctx, ydoc_get(b->doc, group, key));
        if (b->status == REFIT_ENOMEM || b->items > MDOC_MAX_ITEMS)
            break;
    }
    b->n_env--;
}

/* ---- checkpoint entries ---- */

static void mb_ck_mapping(mbuild *b, mdoc_ck *c, const yaml_node_t *n)
{
    ydoc *y = b->doc;
    const yaml_node_t *sh = ydoc_get(y, n, "shard");
    if (sh) {
        int64_t dim = 0, cnt = 1, rank = -1;
        mb_int(b, ydoc_get(y, sh, "dim"), &dim);
        ydoc_int(ydoc_get(y, sh, "count"), &cnt);
        if (ydoc_get(y, sh, "rank"))
            mb_int(b, ydoc_get(y, sh, "rank"), &rank);
        c->shard_at = ydoc_pos(sh);
        c->shard_dim = dim > REFIT_MAX_DIMS ? REFIT_MAX_DIMS : (int32_t)dim;
        c->shard_count = (int32_t)cnt;
        c->shard_rank = rank > INT32_MAX ? INT32_MAX : (int32_t)rank;
    }
    const yaml_node_t *off = ydoc_get(y, ydoc_get(y, n, "fuse"), "dst_offset");
    for (size_t i = 0; i < mb_len(off) && i < REFIT_MAX_DIMS; i++)
        mb_int(b, mb_at(b, off, i), &c->dst_offset[i]);
    if (mb_len(off) > (size_t)c->ndim)
        mb_error(b, ydoc_pos(off), "dst_offset has %zu entries; the tensor has %d dims",
                 mb_len(off), c->ndim);
    if (ydoc_get(y, n, "expert"))
        mb_int(b, ydoc_get(y, n, "expert"), &c->expert);
    const yaml_node_t *pad = ydoc_get(y, n, "padding");
    if (pad)
        mb_int(b, ydoc_get(y, pad, "pad_to"), &c->pad_to);
}

static void mb_ck(mbuild *b, mdoc_mod *mod, const yaml_node_t *n)
{
    if (!mb_count(b, ydoc_pos(n)))
        return;
    if (yarena_grow(&b->m->arena, (void **)&mod->ck, &mod->cap_ck, mod->n_ck, sizeof *mod->ck)) {
        mb_nomem(b);
        return;
    }
    mdoc_ck *c = &mod->ck[mod->n_ck];
    memset(c, 0, sizeof *c);
    c->at = ydoc_pos(n);
    c->shard_count = 1;
    c->shard_rank = -1;
    c->expert = -1;
    c->iter = mb_iter(b);
    c->name = mb_subst(b, ydoc_get(b->doc, n, "name"));
    c->tie = mb_subst(b, ydoc_get(b->doc, n, "tie"));
    c->target = mb_subst(b, ydoc_get(b->doc, n, "target"));
    if (!c->tie) {
        ydoc_dtype(ydoc_str(ydoc_get(b->doc, n, "dtype")), &c->dtype);
        mb_shape(b, ydoc_get(b->doc, n, "shape"), &c->ndim, c->shape);
        mb_ck_mapping(b, c, n);
    }
    if (c->name)
        mod->n_ck++;
}

static void mb_ck_list(mbuild *b, void *ctx, const yaml_node_t *list)
{
    mdoc_mod *mod = ctx;
    for (size_t i = 0; i < mb_len(list) && b->status != REFIT_ENOMEM; i++) {
        yaml_node_t *n = mb_at(b, list, i);
        if (ydoc_key(b->doc, n, "repeat"))
            mb_repeat(b, n, "checkpoint", mb_ck_list, mod);
        else
            mb_ck(b, mod, n);
    }
}

/* ---- modules ---- */

static void mb_params(mbuild *b, mdoc_mod *mod, const yaml_node_t *map)
{
    if (!map)
        return;
    size_t n = (size_t)(map->data.mapping.pairs.top - map->data.mapping.pairs.start);
    mod->params = yarena_alloc(&b->m->arena, n * sizeof *mod->params + 1);
    if (!mod->params) {
        mb_nomem(b);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        yaml_node_pair_t *p = &map->data.mapping.pairs.start[i];
        mdoc_param *q = &mod->params[mod->n_params];
        yaml_node_t *k = ydoc_node(b->doc, p->key);
        q->at = ydoc_pos(k);
        q->key = yarena_strdup(&b->m->arena, ydoc_str(k));
        q->value = mb_subst(b, ydoc_node(b->doc, p->value));
        if (!q->key)
            mb_nomem(b);
        if (q->key && q->value)
            mod->n_params++;
    }
}

static void mb_runtime(mbuild *b, mdoc_mod *mod, const yaml_node_t *list)
{
    for (size_t i = 0; i < mb_len(list) && b->status != REFIT_ENOMEM; i++) {
        yaml_node_t *n = mb_at(b, list, i);
        if (yarena_grow(&b->m->arena, (void **)&mod->rt, &mod->cap_rt, mod->n_rt,
                        sizeof *mod->rt)) {
            mb_nomem(b);
            return;
        }
        mdoc_rt *r = &mod->rt[mod->n_rt];
        memset(r, 0, sizeof *r);
        r->at = ydoc_pos(n);
        r->name = mb_subst(b, ydoc_get(b->doc, n, "name"));
        ydoc_dtype(ydoc_str(ydoc_get(b->doc, n, "dtype")), &r->dtype);
        mb_shape(b, ydoc_get(b->doc, n, "shape"), &r->ndim, r->shape);
        if (r->name)
            mod->n_rt++;
    }
}

static void mb_module(mbuild *b, const yaml_node_t *n)
{
    mdoc *m = b->m;
    if (!mb_count(b, ydoc_pos(n)))
        return;
    if (yarena_grow(&m->arena, (void **)&m->mods, &m->cap_mods, m->n_mods, sizeof *m->mods)) {
        mb_nomem(b);
        return;
    }
    mdoc_mod *mod = &m->mods[m->n_mods];
    memset(mod, 0, sizeof *mod);
    mod->at = ydoc_pos(n);
    mod->iter = mb_iter(b);
    mod->name = mb_subst(b, ydoc_get(b->doc, n, "name"));
    mod->format = mb_subst(b, ydoc_get(b->doc, n, "format"));
    mod->format_at = ydoc_pos(ydoc_get(b->doc, n, "format"));
    mb_params(b, mod, ydoc_get(b->doc, n, "params"));
    mb_runtime(b, mod, ydoc_get(b->doc, n, "runtime"));
    mb_ck_list(b, mod, ydoc_get(b->doc, n, "checkpoint"));
    if (mod->name && mod->format) {
        m->n_ck += mod->n_ck;
        m->n_mods++;
    }
}

static void mb_module_list(mbuild *b, void *ctx, const yaml_node_t *list)
{
    (void)ctx;
    for (size_t i = 0; i < mb_len(list) && b->status != REFIT_ENOMEM; i++) {
        yaml_node_t *n = mb_at(b, list, i);
        if (ydoc_key(b->doc, n, "repeat"))
            mb_repeat(b, n, "modules", mb_module_list, NULL);
        else
            mb_module(b, n);
    }
}

/* ---- checks across entries ---- */

static void mc_error(mbuild *b, ypos at, const char *iter, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void mc_error(mbuild *b, ypos at, const char *iter, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (iter)
        sdiags_add(b->d, b->doc->file, at, "%s (with %s)", msg, iter);
    else
        sdiags_add(b->d, b->doc->file, at, "%s", msg);
    if (b->status == REFIT_OK)
        b->status = REFIT_ECORRUPT;
}

const mdoc_rt *mdoc_target(const mdoc_mod *mod, const mdoc_ck *ck)
{
    if (!ck->target)
        return mod->n_rt == 1 ? &mod->rt[0] : NULL;
    for (size_t i = 0; i < mod->n_rt; i++)
        if (!strcmp(mod->rt[i].name, ck->target))
            return &mod->rt[i];
    return NULL;
}

/* This rank's rows of the split dim, as core/plan.c computes them. */
static int64_t split_len(const mdoc_ck *c, int split)
{
    int64_t extent = c->pad_to ? c->pad_to : c->shape[split];
    int64_t n = c->shard_count > 1 ? c->shard_count : 1;
    int64_t rank = c->shard_rank > 0 ? c->shard_rank : 0; /* unknown rank: rank 0, the largest */
    return extent / n + (rank < extent % n ? 1 : 0);
}

static int float_dtype(refit_dtype d)
{
    return (d.code == REFIT_DTYPE_FLOAT && (d.bits == 32 || d.bits == 16)) ||
           (d.code == REFIT_DTYPE_BFLOAT && d.bits == 16);
}

static void mc_fit(mbuild *b, const mdoc_ck *c, const mdoc_rt *t)
{
    int tdim = c->expert >= 0;
    if (t->ndim != c->ndim + tdim) {
        mc_error(b, c->at, c->iter, "checkpoint tensor %s has %d dims; runtime %s (line %u) "
                 "has %d%s", c->name, c->ndim, t->name, t->at.line, t->ndim,
                 tdim ? " (an expert slice needs one more)" : "");
        return;
    }
    if (tdim && c->expert >= t->shape[0])
        mc_error(b, c->at, c->iter, "expert %lld is beyond runtime %s's %lld experts",
                 (long long)c->expert, t->name, (long long)t->shape[0]);
    /* A f32/f16/bf16 tensor into a target of another kind (an online
     * weight quantized at post-load) is staged: its shape is the format's
     * to check at seal, not a placement in the target. */
    if (float_dtype(c->dtype) && !float_dtype(t->dtype))
        return;
    int split = c->shard_count > 1 ? c->shard_dim : (c->ndim > 0 ? 0 : -1);
    for (int i = 0; i < c->ndim; i++) {
        int64_t ext = i == split ? split_len(c, split) : c->shape[i];
        int64_t have = t->shape[i + tdim], off = c->dst_offset[i];
        if (ext > have || off > have - ext)
            mc_error(b, c->at, c->iter, "checkpoint tensor %s: dim %d: rows [%lld, %lld) do "
                     "not fit runtime %s's extent %lld", c->name, i, (long long)off,
                     (long long)(off + ext), t->name, (long long)have);
    }
}

/* 1 when the elements (and bits) of a shape fit in int64: the core
 * multiplies extents, so a manifest must not hand it an overflow. */
static int shape_fits(const int64_t *shape, int32_t ndim, uint8_t bits)
{
    int64_t n = bits ? bits : 1;
    for (int32_t i = 0; i < ndim; i++) {
        if (shape[i] != 0 && n > INT64_MAX / shape[i])
            return 0;
        n *= shape[i];
    }
    return 1;
}

static void mc_ck(mbuild *b, const mdoc_mod *mod, const mdoc_ck *c)
{
    if (c->tie)
        return;
    if (!shape_fits(c->shape, c->ndim, c->dtype.bits) ||
        (c->pad_to && !shape_fits(&c->pad_to, 1, c->dtype.bits))) {
        mc_error(b, c->at, c->iter, "checkpoint tensor %s: the shape is too large", c->name);
        return;
    }
    if (c->shard_count > 1 && c->shard_dim >= c->ndim) {
        /* nothing below makes sense without a valid split dim */
        mc_error(b, c->shard_at, c->iter, "shard dim %d, but %s has %d dims", c->shard_dim,
                 c->name, c->ndim);
        return;
    }
    if (c->shard_rank >= c->shard_count && c->shard_count > 1)
        mc_error(b, c->shard_at, c->iter, "shard rank %d of %d", c->shard_rank,
                 c->shard_count);
    int split = c->shard_count > 1 ? c->shard_dim : 0;
    if (c->pad_to && c->ndim == 0) {
        mc_error(b, c->at, c->iter, "a scalar cannot be padded");
        return;
    }
    if (c->pad_to && c->pad_to < c->shape[split])
        mc_error(b, c->at, c->iter, "pad_to %lld is smaller than the extent %lld",
                 (long long)c->pad_to, (long long)c->shape[split]);
    const mdoc_rt *t = mdoc_target(mod, c);
    if (!t && c->target)
        mc_error(b, c->at, c->iter, "target '%s' is not a runtime tensor of module %s",
                 c->target, mod->name);
    else if (!t)
        mc_error(b, c->at, c->iter, "module %s has %zu runtime tensors: name a target",
                 mod->name, mod->n_rt);
    else
        mc_fit(b, c, t);
}

static void mc_tie(mbuild *b, const names *ck_names, const mdoc_ck *const *all,
                   const uint32_t *owner, uint32_t mi, const mdoc_ck *c)
{
    uint32_t j = names_find(ck_names, c->tie);
    if (j == NAMES_NONE)
        mc_error(b, c->at, c->iter, "tied to %s, which no module expects", c->tie);
    else if (owner[j] != mi)
        mc_error(b, c->at, c->iter, "tied to %s of module %s; ties stay in one module", c->tie,
                 b->m->mods[owner[j]].name);
    else if (all[j]->tie)
        mc_error(b, c->at, c->iter, "tied to %s, itself tied to %s", c->tie, all[j]->tie);
}

/* Every checkpoint name once over the manifest; then ties and geometry. */
static int mc_checkpoints(mbuild *b, names *ck_names)
{
    mdoc *m = b->m;
    const mdoc_ck **all = calloc(m->n_ck + 1, sizeof *all);
    uint32_t *owner = calloc(m->n_ck + 1, sizeof *owner);
    if (!all || !owner) {
        free(all);
        free(owner);
        return mb_nomem(b);
    }
    uint32_t k = 0;
    for (uint32_t mi = 0; mi < m->n_mods; mi++)
        for (size_t i = 0; i < m->mods[mi].n_ck; i++, k++) {
            const mdoc_ck *c = &m->mods[mi].ck[i];
            all[k] = c;
            owner[k] = mi;
            int rc = names_insert(ck_names, c->name, k);
            if (rc == REFIT_EEXIST) {
                const mdoc_ck *first = all[names_find(ck_names, c->name)];
                mc_error(b, c->at, c->iter, "checkpoint tensor %s is listed twice (first at "
                         "line %u, column %u)", c->name, first->at.line, first->at.col);
            } else if (rc) {
                mb_nomem(b);
            }
        }
    k = 0;
    for (uint32_t mi = 0; mi < m->n_mods && b->status != REFIT_ENOMEM; mi++)
        for (size_t i = 0; i < m->mods[mi].n_ck; i++, k++) {
            const mdoc_ck *c = &m->mods[mi].ck[i];
            if (c->tie)
                mc_tie(b, ck_names, all, owner, mi, c);
            else
                mc_ck(b, &m->mods[mi], c);
        }
    free(all);
    free(owner);
    return b->status;
}

static void mc_modules(mbuild *b)
{
    mdoc *m = b->m;
    names mod_names = {0}, ck_names = {0};
    for (uint32_t mi = 0; mi < m->n_mods; mi++) {
        const mdoc_mod *mod = &m->mods[mi];
        int rc = names_insert(&mod_names, mod->name, mi);
        if (rc == REFIT_EEXIST) {
            const mdoc_mod *first = &m->mods[names_find(&mod_names, mod->name)];
            mc_error(b, mod->at, mod->iter, "module %s is listed twice (first at line %u, "
                     "column %u)", mod->name, first->at.line, first->at.col);
        } else if (rc) {
            mb_nomem(b);
        }
        for (size_t i = 0; i < mod->n_rt; i++)
            if (!shape_fits(mod->rt[i].shape, mod->rt[i].ndim, mod->rt[i].dtype.bits))
                mc_error(b, mod->rt[i].at, mod->iter, "runtime tensor %s: the shape is too "
                         "large", mod->rt[i].name);
        for (size_t i = 0; i < mod->n_rt; i++)
            for (size_t j = 0; j < i; j++)
                if (!strcmp(mod->rt[i].name, mod->rt[j].name))
                    mc_error(b, mod->rt[i].at, mod->iter, "module %s: runtime tensor %s is "
                             "declared twice (first at line %u)", mod->name, mod->rt[i].name,
                             mod->rt[j].at.line);
    }
    if (b->status != REFIT_ENOMEM)
        mc_checkpoints(b, &ck_names);
    names_free(&mod_names);
    names_free(&ck_names);
}

/* ---- the size of the expansion, before anything is built ---- */

/* What a list expands to: entries built (modules, runtime tensors,
 * checkpoint entries) and repeat iterations walked, saturating at
 * UINT64_MAX. The first repeat that takes either beyond its limit is
 * reported where it is, so a small file cannot cost memory or time
 * out of proportion to what it says. */
typedef struct mb_size {
    uint64_t items, steps;
} mb_size;

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static mb_size mb_measure(mbuild *b, const yaml_node_t *list, const char *key, int depth);

static mb_size mb_measure_entry(mbuild *b, const yaml_node_t *n, const char *key, int depth)
{
    if (!ydoc_key(b->doc, n, "repeat")) {
        mb_size one = {1, 0};
        if (!strcmp(key, "modules")) {
            one.items = sat_add(one.items, mb_len(ydoc_get(b->doc, n, "runtime")));
            mb_size ck = mb_measure(b, ydoc_get(b->doc, n, "checkpoint"), "checkpoint",
                                    depth + 1);
            one.items = sat_add(one.items, ck.items);
            one.steps = ck.steps;
        }
        return one;
    }
    const yaml_node_t *rep = ydoc_get(b->doc, n, "repeat");
    int64_t count = 0;
    ydoc_int(ydoc_get(b->doc, rep, "count"), &count);
    mb_size body = mb_measure(b, ydoc_get(b->doc, n, key), key, depth + 1);
    uint64_t c = count > 0 ? (uint64_t)count : 0;
    mb_size all = {sat_mul(c, body.items), sat_mul(c, sat_add(body.steps, 1))};
    if (b->status == REFIT_OK && all.items > MDOC_MAX_ITEMS)
        mb_error(b, ydoc_pos(rep), "repeat (count %lld) expands to more than %u modules, "
                 "runtime tensors and checkpoint entries (the limit on manifest expansion)",
                 (long long)count, MDOC_MAX_ITEMS);
    else if (b->status == REFIT_OK && all.steps > MDOC_MAX_STEPS)
        mb_error(b, ydoc_pos(rep), "repeat (count %lld) expands to more than %u iterations "
                 "(the limit on repeat expansion)", (long long)count, MDOC_MAX_STEPS);
    return all;
}

static mb_size mb_measure(mbuild *b, const yaml_node_t *list, const char *key, int depth)
{
    mb_size all = {0, 0};
    if (depth > YDOC_MAX_DEPTH) /* the prescan keeps this from happening */
        return (mb_size){UINT64_MAX, UINT64_MAX};
    for (size_t i = 0; i < mb_len(list) && b->status == REFIT_OK; i++) {
        mb_size one = mb_measure_entry(b, mb_at(b, list, i), key, depth);
        all.items = sat_add(all.items, one.items);
        all.steps = sat_add(all.steps, one.steps);
    }
    return all;
}

int mdoc_from_doc(mdoc **out, ydoc *doc, sdiags *d)
{
    *out = NULL;
    mdoc *m = calloc(1, sizeof *m);
    if (!m)
        return REFIT_ENOMEM;
    mbuild b = {.m = m, .doc = doc, .d = d, .status = REFIT_OK};
    yaml_node_t *root = ydoc_root(doc);
    m->file = yarena_strdup(&m->arena, doc->file);
    m->name = yarena_strdup(&m->arena, ydoc_str(ydoc_get(doc, root, "name")));
    if (!m->file)
        mb_nomem(&b);
    const yaml_node_t *mods = ydoc_get(doc, root, "modules");
    mb_size size = mb_measure(&b, mods, "modules", 0);
    if (b.status == REFIT_OK && size.items > MDOC_MAX_ITEMS)
        mb_error(&b, ydoc_pos(mods), "the manifest expands to more than %u modules, runtime "
                 "tensors and checkpoint entries (the limit on manifest expansion)",
                 MDOC_MAX_ITEMS);
    if (b.status) {
        mdoc_free(m);
        return b.status;
    }
    mb_module_list(&b, NULL, mods);
    if (b.status != REFIT_ENOMEM) /* what expanded is checked even after a mistake */
        mc_modules(&b);
    if (b.status) {
        mdoc_free(m);
        return b.status;
    }
    *out = m;
    return REFIT_OK;
}

int mdoc_load_file(mdoc **out, const char *path, sdiags *d)
{
    *out = NULL;
    ydoc doc;
    schema s;
    int rc = ydoc_load_file(&doc, path, d);
    if (!rc)
        rc = schema_load(&s, "schemas/model.schema.yaml", schema_text_model,
                         schema_text_model_len, d);
    if (!rc) {
        rc = schema_check(&s, &doc, d);
        schema_free(&s);
    }
    if (!rc)
        rc = mdoc_from_doc(out, &doc, d);
    ydoc_free(&doc);
    return rc;
}

void mdoc_free(mdoc *m)
{
    if (!m)
        return;
    yarena_free(&m->arena);
    free(m);
}
