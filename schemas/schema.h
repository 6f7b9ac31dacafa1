/* A small schema language written in YAML, and its checker.
 *
 * A schema file has `root: TYPE` and `types: {NAME: SPEC, ...}`. A SPEC is
 * a mapping:
 *
 *   type: map | list | string | int | bool | scalar | any | NAME
 *   title: what the thing is called in messages ("module")
 *   map:    keys: {KEY: SPEC}  (a SPEC there may say `required: true`)
 *           values: SPEC        (any other key, its value checked by SPEC;
 *           key_pattern: ERE     keys then must match key_pattern)
 *   list:   items: SPEC, min_items: N, max_items: N
 *   string: enum: [...], pattern: ERE (POSIX, anchor it), pattern_doc: text
 *   int:    min: N, max: N
 *   one_of: [SPEC, ...]  the first alternative that fits the node's kind
 *                        (an alternative with `when_key: K` fits a mapping
 *                        that has key K) is the one checked.
 *
 * Unknown keys in a mapping without `values` are errors (with a "did you
 * mean"); duplicate keys are errors; every error carries the position of
 * the node it is about. */
#ifndef REFIT_SCHEMAS_SCHEMA_H
#define REFIT_SCHEMAS_SCHEMA_H

#include "schemas/ydoc.h"

typedef struct schema {
    ydoc doc;
    yaml_node_t *types;         /* mapping NAME -> SPEC */
    yaml_node_t *root;          /* SPEC of a document's root */
} schema;

/* Load a schema from text. REFIT_OK, REFIT_ECORRUPT (diagnostics),
 * REFIT_ENOMEM. */
int schema_load(schema *s, const char *name, const char *text, size_t len, sdiags *d);
void schema_free(schema *s);

/* Check doc against s, appending a diagnostic per mistake. REFIT_OK when
 * there is none, REFIT_ECORRUPT when there are, REFIT_EINTERNAL when the
 * schema itself is broken, REFIT_ENOMEM. */
int schema_check(const schema *s, ydoc *doc, sdiags *d);

#endif
