/* The schema files, embedded at build time by schemas/embed.py, so the
 * library validates declarations and manifests without files at run time. */
#ifndef REFIT_SCHEMAS_SCHEMA_DATA_H
#define REFIT_SCHEMAS_SCHEMA_DATA_H

#include <stddef.h>

extern const char schema_text_format[];   /* schemas/format.schema.yaml */
extern const size_t schema_text_format_len;
extern const char schema_text_model[];    /* schemas/model.schema.yaml */
extern const size_t schema_text_model_len;

#endif
