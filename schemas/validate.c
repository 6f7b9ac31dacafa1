/* Validation entry point: load, tell the kind, schema, checks across nodes. */
#include <string.h>

#include "schemas/format_decl.h"
#include "schemas/model_doc.h"
#include "schemas/schema.h"
#include "schemas/schema_data.h"
#include "schemas/validate.h"

const char *schema_kind_name(schema_kind k)
{
    switch (k) {
    case SCHEMA_KIND_FORMAT:
        return "format declaration";
    case SCHEMA_KIND_MODEL:
        return "model manifest";
    default:
        return "unknown";
    }
}

schema_kind schema_detect(ydoc *doc)
{
    yaml_node_t *root = ydoc_root(doc);
    const char *kind = ydoc_str(ydoc_get(doc, root, "kind"));
    if (kind)
        return !strcmp(kind, "format") ? SCHEMA_KIND_FORMAT
             : !strcmp(kind, "model")  ? SCHEMA_KIND_MODEL
                                       : SCHEMA_KIND_UNKNOWN;
    if (ydoc_key(doc, root, "modules"))
        return SCHEMA_KIND_MODEL;
    if (ydoc_key(doc, root, "checkpoint") || ydoc_key(doc, root, "abi"))
        return SCHEMA_KIND_FORMAT;
    return SCHEMA_KIND_UNKNOWN;
}

/* The schema, then the struct builder (which runs the cross-node checks);
 * the struct itself is not kept. */
static int validate_doc(ydoc *doc, schema_kind kind, sdiags *d)
{
    schema s;
    int fmt = kind == SCHEMA_KIND_FORMAT;
    int rc = schema_load(&s, fmt ? "schemas/format.schema.yaml" : "schemas/model.schema.yaml",
                         fmt ? schema_text_format : schema_text_model,
                         fmt ? schema_text_format_len : schema_text_model_len, d);
    if (rc)
        return rc == REFIT_ECORRUPT ? REFIT_EINTERNAL : rc;
    rc = schema_check(&s, doc, d);
    schema_free(&s);
    if (rc)
        return rc;
    if (fmt) {
        fdecl *f = NULL;
        rc = fdecl_from_doc(&f, doc, d);
        fdecl_free(f);
    } else {
        mdoc *m = NULL;
        rc = mdoc_from_doc(&m, doc, d);
        mdoc_free(m);
    }
    return rc;
}

int schema_validate_file(const char *path, schema_kind kind, schema_kind *found, sdiags *d)
{
    ydoc doc;
    if (found)
        *found = SCHEMA_KIND_UNKNOWN;
    int rc = ydoc_load_file(&doc, path, d);
    if (!rc && kind == SCHEMA_KIND_UNKNOWN) {
        kind = schema_detect(&doc);
        if (kind == SCHEMA_KIND_UNKNOWN) {
            yaml_node_t *root = ydoc_root(&doc);
            yaml_node_t *k = ydoc_get(&doc, root, "kind");
            sdiags_add(d, path, ydoc_pos(k ? k : root),
                       k ? "kind must be 'format' or 'model'"
                         : "cannot tell a format declaration from a model manifest: add "
                           "'kind: format' or 'kind: model'");
            rc = REFIT_ECORRUPT;
        }
    }
    if (found)
        *found = kind;
    if (!rc)
        rc = validate_doc(&doc, kind, d);
    ydoc_free(&doc);
    return rc;
}
