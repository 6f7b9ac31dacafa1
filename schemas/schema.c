/* The schema checker (the language is described in schema.h). It walks the
 * document and the schema side by side; it never stops at the first
 * mistake, so `refitctl validate` lists them all. */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schemas/schema.h"

/* Nodes visited per document: aliases can make a small file a huge tree. */
#define CHK_MAX_VISITS (1u << 22)

typedef struct chk {
    const schema *s;
    ydoc *doc;
    sdiags *d;
    size_t visits;
    int status;                 /* worst outcome so far */
    regex_t **re;               /* compiled pattern per schema node id */
    size_t n_re;
} chk;

static void chk_fail(chk *c, int status)
{
    if (c->status == REFIT_OK || status == REFIT_ENOMEM || status == REFIT_EINTERNAL)
        c->status = status;
}

static void chk_error(chk *c, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void chk_error(chk *c, const yaml_node_t *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sdiags_vadd(c->d, c->doc->file, ydoc_pos(n), fmt, ap);
    va_end(ap);
    chk_fail(c, REFIT_ECORRUPT);
}

/* A mistake in the schema itself: reported against the schema file. */
static void schema_bug(chk *c, const yaml_node_t *spec, const char *what)
{
    sdiags_add(c->d, c->s->doc.file, ydoc_pos(spec), "schema error: %s", what);
    chk_fail(c, REFIT_EINTERNAL);
}

static yaml_node_t *sget(const chk *c, const yaml_node_t *spec, const char *key)
{
    return ydoc_get((ydoc *)&c->s->doc, spec, key);
}

static const char *sstr(const chk *c, const yaml_node_t *spec, const char *key)
{
    return ydoc_str(sget(c, spec, key));
}

static int is_builtin(const char *t)
{
    static const char *const builtin[] = {"map", "list", "string", "int", "bool", "scalar", "any"};
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
        if (!strcmp(t, builtin[i]))
            return 1;
    return 0;
}

/* Follow named types to the SPEC that says what the node must be. */
static yaml_node_t *resolve(chk *c, yaml_node_t *spec)
{
    for (int hops = 0; spec && hops < 16; hops++) {
        const char *t = sstr(c, spec, "type");
        if (!t || sget(c, spec, "one_of") || is_builtin(t))
            return spec;
        yaml_node_t *next = sget(c, c->s->types, t);
        if (!next) {
            schema_bug(c, spec, "unknown type");
            return NULL;
        }
        spec = next;
    }
    if (spec)
        schema_bug(c, spec, "named types nest too deeply");
    return NULL;
}

/* "an integer", "a list", or the spec's title. */
static const char *describe(chk *c, yaml_node_t *spec)
{
    const char *title = sstr(c, spec, "title");
    spec = resolve(c, spec);
    if (!title && spec)
        title = sstr(c, spec, "title");
    if (title)
        return title;
    const char *t = spec ? sstr(c, spec, "type") : NULL;
    if (!t)
        return "something else";
    if (!strcmp(t, "map"))
        return "a mapping";
    if (!strcmp(t, "list"))
        return "a list";
    if (!strcmp(t, "int"))
        return "an integer";
    if (!strcmp(t, "bool"))
        return "true or false";
    if (!strcmp(t, "string"))
        return "a string";
    return "a value";
}

static int is_null(const yaml_node_t *n)
{
    return n->type == YAML_SCALAR_NODE && n->data.scalar.length == 0 &&
           n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

/* Does node n have the kind spec asks for (used to pick a one_of branch)? */
static int fits(chk *c, yaml_node_t *spec, yaml_node_t *n, int depth)
{
    if (depth > 8)
        return 0;
    const char *wk = sstr(c, spec, "when_key");
    if (wk)
        return n->type == YAML_MAPPING_NODE && ydoc_key(c->doc, n, wk) != NULL;
    yaml_node_t *alts = sget(c, spec, "one_of");
    if (alts && alts->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *i = alts->data.sequence.items.start;
             i < alts->data.sequence.items.top; i++)
            if (fits(c, ydoc_node((ydoc *)&c->s->doc, *i), n, depth + 1))
                return 1;
        return 0;
    }
    spec = resolve(c, spec);
    const char *t = spec ? sstr(c, spec, "type") : NULL;
    int64_t iv;
    int bv;
    if (!t)
        return 0;
    if (!strcmp(t, "map"))
        return n->type == YAML_MAPPING_NODE;
    if (!strcmp(t, "list"))
        return n->type == YAML_SEQUENCE_NODE;
    if (!strcmp(t, "int"))
        return ydoc_int(n, &iv);
    if (!strcmp(t, "bool"))
        return ydoc_bool(n, &bv);
    if (!strcmp(t, "string") || !strcmp(t, "scalar"))
        return n->type == YAML_SCALAR_NODE && !is_null(n);
    return !strcmp(t, "any");
}

static void chk_node(chk *c, yaml_node_t *spec, yaml_node_t *n, int depth);

static void chk_one_of(chk *c, yaml_node_t *spec, yaml_node_t *alts, yaml_node_t *n, int depth)
{
    if (alts->type != YAML_SEQUENCE_NODE) {
        schema_bug(c, alts, "one_of must be a list");
        return;
    }
    char want[256] = "";
    size_t used = 0;
    for (yaml_node_item_t *i = alts->data.sequence.items.start;
         i < alts->data.sequence.items.top; i++) {
        yaml_node_t *alt = ydoc_node((ydoc *)&c->s->doc, *i);
        if (fits(c, alt, n, 0)) {
            chk_node(c, alt, n, depth + 1);
            return;
        }
        if (used < sizeof want)
            used += (size_t)snprintf(want + used, sizeof want - used, "%s%s",
                                     used ? " or " : "", describe(c, alt));
    }
    const char *title = sstr(c, spec, "title");
    chk_error(c, n, "expected %s, got %s", title ? title : want, ydoc_kind_name(n));
}

/* The compiled regular expression of spec's `which` key, or NULL. */
static regex_t *pattern(chk *c, yaml_node_t *spec, const char *which)
{
    yaml_node_t *pn = sget(c, spec, which);
    const char *p = ydoc_str(pn);
    if (!p)
        return NULL;
    size_t id = (size_t)(pn - c->s->doc.doc.nodes.start) + 1;
    if (id >= c->n_re)
        return NULL;
    if (!c->re[id]) {
        regex_t *re = malloc(sizeof *re);
        if (!re) {
            chk_fail(c, REFIT_ENOMEM);
            return NULL;
        }
        if (regcomp(re, p, REG_EXTENDED | REG_NOSUB)) {
            free(re);
            schema_bug(c, pn, "not a POSIX extended regular expression");
            return NULL;
        }
        c->re[id] = re;
    }
    return c->re[id];
}

/* "; did you mean 'x'?" for a misspelt key or enum value. */
static void suggest(const char *got, const char *cand, size_t *best, const char **pick)
{
    size_t dist = ydoc_distance(got, cand, 2);
    if (dist <= 2 && dist < *best) {
        *best = dist;
        *pick = cand;
    }
}

static void chk_enum(chk *c, yaml_node_t *en, yaml_node_t *n, const char *v)
{
    char list[512] = "";
    size_t used = 0, best = 3;
    const char *pick = NULL;
    for (yaml_node_item_t *i = en->data.sequence.items.start; i < en->data.sequence.items.top;
         i++) {
        const char *e = ydoc_str(ydoc_node((ydoc *)&c->s->doc, *i));
        if (!e)
            continue;
        if (!strcmp(e, v))
            return;
        suggest(v, e, &best, &pick);
        if (used < sizeof list)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", e);
    }
    if (pick)
        chk_error(c, n, "'%s' is not one of %s; did you mean '%s'?", v, list, pick);
    else
        chk_error(c, n, "'%s' is not one of %s", v, list);
}

static void chk_string(chk *c, yaml_node_t *spec, yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || is_null(n)) {
        chk_error(c, n, "expected %s, got %s", describe(c, spec), ydoc_kind_name(n));
        return;
    }
    const char *v = ydoc_str(n);
    yaml_node_t *en = sget(c, spec, "enum");
    if (en && en->type == YAML_SEQUENCE_NODE)
        chk_enum(c, en, n, v);
    regex_t *re = pattern(c, spec, "pattern");
    if (re && regexec(re, v, 0, NULL, 0) != 0) {
        const char *doc = sstr(c, spec, "pattern_doc");
        chk_error(c, n, "'%s' is not %s", v, doc ? doc : "of the expected form");
    }
}

static void chk_int(chk *c, yaml_node_t *spec, yaml_node_t *n)
{
    int64_t v, lim;
    if (!ydoc_int(n, &v)) {
        const char *s = ydoc_str(n);
        if (s && !is_null(n)) {
            chk_error(c, n, "expected an integer, got '%s'", s);
            return;
        }
        chk_error(c, n, "expected an integer, got %s", ydoc_kind_name(n));
        return;
    }
    if (ydoc_int(sget(c, spec, "min"), &lim) && v < lim)
        chk_error(c, n, "%lld is below the minimum %lld", (long long)v, (long long)lim);
    if (ydoc_int(sget(c, spec, "max"), &lim) && v > lim)
        chk_error(c, n, "%lld is above the maximum %lld", (long long)v, (long long)lim);
}

static void chk_list(chk *c, yaml_node_t *spec, yaml_node_t *n, int depth)
{
    if (n->type != YAML_SEQUENCE_NODE) {
        chk_error(c, n, "expected %s, got %s", describe(c, spec), ydoc_kind_name(n));
        return;
    }
    int64_t count = n->data.sequence.items.top - n->data.sequence.items.start, lim;
    const char *title = sstr(c, spec, "title");
    if (ydoc_int(sget(c, spec, "min_items"), &lim) && count < lim)
        chk_error(c, n, "%s: at least %lld item%s expected, got %lld",
                  title ? title : "list", (long long)lim, lim == 1 ? "" : "s", (long long)count);
    if (ydoc_int(sget(c, spec, "max_items"), &lim) && count > lim)
        chk_error(c, n, "%s: at most %lld item%s expected, got %lld", title ? title : "list",
                  (long long)lim, lim == 1 ? "" : "s", (long long)count);
    yaml_node_t *items = sget(c, spec, "items");
    if (!items)
        return;
    for (yaml_node_item_t *i = n->data.sequence.items.start; i < n->data.sequence.items.top; i++)
        chk_node(c, items, ydoc_node(c->doc, *i), depth + 1);
}

static void chk_unknown_key(chk *c, yaml_node_t *keys, yaml_node_t *k, const char *ks,
                            const char *title)
{
    size_t best = 3;
    const char *pick = NULL;
    char list[512] = "";
    size_t used = 0;
    for (yaml_node_pair_t *p = keys ? keys->data.mapping.pairs.start : NULL;
         p && p < keys->data.mapping.pairs.top; p++) {
        const char *cand = ydoc_str(ydoc_node((ydoc *)&c->s->doc, p->key));
        if (!cand)
            continue;
        suggest(ks, cand, &best, &pick);
        if (used < sizeof list)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "",
                                     cand);
    }
    if (pick)
        chk_error(c, k, "unknown key '%s' in %s; did you mean '%s'?", ks, title, pick);
    else
        chk_error(c, k, "unknown key '%s' in %s (allowed: %s)", ks, title, list);
}

/* One key of a mapping: a duplicate, a declared key, or any other key. */
static void chk_pair(chk *c, yaml_node_t *spec, yaml_node_t *n, yaml_node_pair_t *p, int depth)
{
    yaml_node_t *k = ydoc_node(c->doc, p->key), *v = ydoc_node(c->doc, p->value);
    const char *ks = ydoc_str(k);
    const char *title = sstr(c, spec, "title");
    if (!ks) {
        chk_error(c, k, "a key must be a plain string, not %s", ydoc_kind_name(k));
        return;
    }
    for (yaml_node_pair_t *q = n->data.mapping.pairs.start; q < p; q++) {
        const char *qs = ydoc_str(ydoc_node(c->doc, q->key));
        if (qs && !strcmp(qs, ks)) {
            ypos first = ydoc_pos(ydoc_node(c->doc, q->key));
            chk_error(c, k, "duplicate key '%s' (first at line %u, column %u)", ks,
                             first.line, first.col);
            return;
        }
    }
    yaml_node_t *keys = sget(c, spec, "keys");
    yaml_node_t *ks_spec = keys ? sget(c, keys, ks) : NULL;
    if (ks_spec) {
        chk_node(c, ks_spec, v, depth + 1);
        return;
    }
    yaml_node_t *values = sget(c, spec, "values");
    if (!values) {
        chk_unknown_key(c, keys, k, ks, title ? title : "this mapping");
        return;
    }
    regex_t *kre = pattern(c, spec, "key_pattern");
    if (kre && regexec(kre, ks, 0, NULL, 0) != 0) {
        const char *doc = sstr(c, spec, "key_doc");
        chk_error(c, k, "key '%s' is not %s", ks, doc ? doc : "of the expected form");
        return;
    }
    chk_node(c, values, v, depth + 1);
}

static void chk_map(chk *c, yaml_node_t *spec, yaml_node_t *n, int depth)
{
    if (n->type != YAML_MAPPING_NODE) {
        chk_error(c, n, "expected %s, got %s", describe(c, spec), ydoc_kind_name(n));
        return;
    }
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++)
        chk_pair(c, spec, n, p, depth);
    yaml_node_t *keys = sget(c, spec, "keys");
    if (!keys || keys->type != YAML_MAPPING_NODE)
        return;
    const char *title = sstr(c, spec, "title");
    for (yaml_node_pair_t *p = keys->data.mapping.pairs.start; p < keys->data.mapping.pairs.top;
         p++) {
        const char *kname = ydoc_str(ydoc_node((ydoc *)&c->s->doc, p->key));
        int req = 0;
        ydoc_bool(sget(c, ydoc_node((ydoc *)&c->s->doc, p->value), "required"), &req);
        if (kname && req && !ydoc_key(c->doc, n, kname))
            chk_error(c, n, "%s: missing required key '%s'", title ? title : "mapping", kname);
    }
}

static void chk_node(chk *c, yaml_node_t *spec, yaml_node_t *n, int depth)
{
    if (!spec || !n || c->status == REFIT_ENOMEM || c->status == REFIT_EINTERNAL)
        return;
    if (depth > YDOC_MAX_DEPTH) {
        chk_error(c, n, "nested more than %d levels deep", YDOC_MAX_DEPTH);
        return;
    }
    if (++c->visits > CHK_MAX_VISITS) {
        if (c->visits == CHK_MAX_VISITS + 1)
            chk_error(c, n, "more than %u nodes (aliases expanding?)", CHK_MAX_VISITS);
        return;
    }
    yaml_node_t *alts = sget(c, spec, "one_of");
    if (alts) {
        chk_one_of(c, spec, alts, n, depth);
        return;
    }
    yaml_node_t *r = resolve(c, spec);
    if (!r)
        return;
    if (r != spec && sget(c, r, "one_of")) {
        chk_node(c, r, n, depth + 1);
        return;
    }
    const char *t = sstr(c, r, "type");
    if (!t) {
        schema_bug(c, r, "a spec needs a type or one_of");
        return;
    }
    /* constraints are those of the named spec; a referring spec adds only
     * `required` and a title */
    yaml_node_t *cs = r;
    if (!strcmp(t, "map"))
        chk_map(c, cs, n, depth);
    else if (!strcmp(t, "list"))
        chk_list(c, cs, n, depth);
    else if (!strcmp(t, "string"))
        chk_string(c, cs, n);
    else if (!strcmp(t, "int"))
        chk_int(c, cs, n);
    else if (!strcmp(t, "bool")) {
        int b;
        if (!ydoc_bool(n, &b))
            chk_error(c, n, "expected true or false, got %s%s%s",
                      ydoc_str(n) && !is_null(n) ? "'" : "",
                      ydoc_str(n) && !is_null(n) ? ydoc_str(n) : ydoc_kind_name(n),
                      ydoc_str(n) && !is_null(n) ? "'" : "");
    } else if (!strcmp(t, "scalar")) {
        if (n->type != YAML_SCALAR_NODE || is_null(n))
            chk_error(c, n, "expected %s, got %s", describe(c, spec), ydoc_kind_name(n));
    }
}

int schema_check(const schema *s, ydoc *doc, sdiags *d)
{
    chk c = {.s = s, .doc = doc, .d = d, .status = REFIT_OK};
    c.n_re = (size_t)(s->doc.doc.nodes.top - s->doc.doc.nodes.start) + 1;
    c.re = calloc(c.n_re, sizeof *c.re);
    if (!c.re)
        return REFIT_ENOMEM;
    chk_node(&c, s->root, ydoc_root(doc), 0);
    for (size_t i = 0; i < c.n_re; i++)
        if (c.re[i]) {
            regfree(c.re[i]);
            free(c.re[i]);
        }
    free(c.re);
    if (c.status == REFIT_OK && d->oom)
        return REFIT_ENOMEM;
    return c.status;
}

int schema_load(schema *s, const char *name, const char *text, size_t len, sdiags *d)
{
    memset(s, 0, sizeof *s);
    int rc = ydoc_load_mem(&s->doc, name, text, len, d);
    if (rc) {
        ydoc_free(&s->doc);
        return rc;
    }
    yaml_node_t *root = ydoc_root(&s->doc);
    s->types = ydoc_get(&s->doc, root, "types");
    const char *rname = ydoc_str(ydoc_get(&s->doc, root, "root"));
    s->root = rname ? ydoc_get(&s->doc, s->types, rname) : NULL;
    if (!s->types || s->types->type != YAML_MAPPING_NODE || !s->root) {
        sdiags_add(d, name, ydoc_pos(root), "schema error: needs 'types' and a 'root' among them");
        ydoc_free(&s->doc);
        return REFIT_ECORRUPT;
    }
    return REFIT_OK;
}

void schema_free(schema *s)
{
    ydoc_free(&s->doc);
}
