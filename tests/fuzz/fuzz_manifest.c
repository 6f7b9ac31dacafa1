/*
 * libFuzzer target for model manifests: the YAML loader (schemas/ydoc.c),
 * the schema check (schemas/schema.c) and the expansion into modules and
 * checkpoint entries (schemas/model_doc.c), as refit_model_load_manifest
 * runs them. Beyond "no crash, no sanitizer report, no timeout or memory
 * beyond libFuzzer's limits" (run.sh sets -timeout and -rss_limit_mb): a
 * refusal says why, with a position; what loads keeps its promises (names
 * present and without NUL, at most MDOC_MAX_ITEMS entries, each
 * checkpoint entry's dims in range).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "schemas/model_doc.h"
#include "schemas/schema.h"
#include "schemas/schema_data.h"

static schema model_schema;
static int schema_ready;

static void check_mdoc(const mdoc *m)
{
    size_t items = 0;
    for (size_t i = 0; i < m->n_mods; i++) {
        const mdoc_mod *mod = &m->mods[i];
        if (!mod->name || !mod->format || !mod->name[0])
            abort();
        items += 1 + mod->n_rt + mod->n_ck;
        for (size_t k = 0; k < mod->n_ck; k++) {
            const mdoc_ck *c = &mod->ck[k];
            if (!c->name || (!c->tie && (c->ndim < 0 || c->ndim > REFIT_MAX_DIMS)))
                abort();
        }
        if (mod->cap_ck > 2 * mod->n_ck + 1) /* memory in proportion */
            abort();
    }
    if (items > MDOC_MAX_ITEMS)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sdiags d = {0};
    if (!schema_ready) {
        if (schema_load(&model_schema, "schemas/model.schema.yaml", schema_text_model,
                        schema_text_model_len, &d))
            abort();
        schema_ready = 1;
    }
    ydoc doc;
    int rc = ydoc_load_mem(&doc, "fuzz.yaml", (const char *)data, size, &d);
    if (!rc)
        rc = schema_check(&model_schema, &doc, &d);
    mdoc *m = NULL;
    if (!rc)
        rc = mdoc_from_doc(&m, &doc, &d);
    if (rc == 0) {
        check_mdoc(m);
        mdoc_free(m);
    } else if (rc != REFIT_ENOMEM && (m || !sdiags_count(&d) || !strstr(sdiags_first(&d), "fuzz.yaml"))) {
        abort(); /* a refusal names the file and leaves nothing behind */
    }
    ydoc_free(&doc);
    sdiags_free(&d);
    return 0;
}
