/* YAML documents with positions, diagnostics "file:line:column: message",
 * and a small arena for the strings of what is built from them. Used by
 * the schema validator, format declarations and model manifests. */
#ifndef REFIT_SCHEMAS_YDOC_H
#define REFIT_SCHEMAS_YDOC_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <yaml.h>

#include <refit/refit.h>

/* Largest YAML file read, and deepest nesting walked: a manifest of a
 * 100k-tensor model is a few MiB; anything far beyond is a mistake. */
#define YDOC_MAX_BYTES (64u << 20)
#define YDOC_MAX_DEPTH 64

/* A position in a file, 1-based (0 = unknown). */
typedef struct ypos {
    uint32_t line, col;
} ypos;

/* Diagnostics, each a whole line "file:line:column: message". */
typedef struct sdiags {
    char **lines;
    size_t n, cap;
    size_t max;                 /* keep at most this many (0: 64) */
    size_t dropped;             /* errors beyond max, counted only */
    int oom;                    /* a line could not be stored */
} sdiags;

void sdiags_add(sdiags *d, const char *file, ypos at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void sdiags_vadd(sdiags *d, const char *file, ypos at, const char *fmt, va_list ap);
/* Errors recorded, dropped ones included. */
size_t sdiags_count(const sdiags *d);
/* First line, or "" when none. */
const char *sdiags_first(const sdiags *d);
void sdiags_free(sdiags *d);

/* One loaded YAML document. */
typedef struct ydoc {
    yaml_document_t doc;
    int loaded;
    char *file;                 /* name used in messages */
} ydoc;

/* Load a file (one document). REFIT_OK; REFIT_EIO (cannot read: the
 * diagnostic says why), REFIT_ECORRUPT (not YAML, empty, or more than one
 * document: diagnostics with positions), REFIT_ENOMEM. */
int ydoc_load_file(ydoc *y, const char *path, sdiags *d);
/* The same from memory; name is used in messages. */
int ydoc_load_mem(ydoc *y, const char *name, const char *text, size_t len, sdiags *d);
void ydoc_free(ydoc *y);

yaml_node_t *ydoc_root(ydoc *y);
yaml_node_t *ydoc_node(ydoc *y, int id);
ypos ydoc_pos(const yaml_node_t *n);
/* Value node of key in a mapping node, or NULL (first occurrence). */
yaml_node_t *ydoc_get(ydoc *y, const yaml_node_t *map, const char *key);
/* Key node of key in a mapping, or NULL. */
yaml_node_t *ydoc_key(ydoc *y, const yaml_node_t *map, const char *key);
/* The scalar's text, or NULL when n is not a scalar. */
const char *ydoc_str(const yaml_node_t *n);
/* A plain (unquoted) scalar that is a decimal integer. 1 when it is. */
int ydoc_int(const yaml_node_t *n, int64_t *out);
/* A plain scalar true/false (any case). 1 when it is. */
int ydoc_bool(const yaml_node_t *n, int *out);
/* Parse a decimal integer string (optional sign, no spaces). 1 when ok. */
int ydoc_parse_int(const char *s, int64_t *out);
/* "a mapping", "a list", "a scalar". */
const char *ydoc_kind_name(const yaml_node_t *n);

/* dtype by its refit_dtype_name() ("bf16", "f8_e4m3" ...). 1 when known. */
int ydoc_dtype(const char *name, refit_dtype *out);

/* An arena: strings and arrays freed all at once. */
typedef struct yarena {
    struct yarena_block *head;
} yarena;

void *yarena_alloc(yarena *a, size_t n);   /* zeroed, aligned; NULL: no memory */
char *yarena_strdup(yarena *a, const char *s);
void yarena_free(yarena *a);

/* A growable array in an arena: *arr holds *n items of size es; makes room
 * for one more. Old blocks stay in the arena until it is freed. */
int yarena_grow(yarena *a, void **arr, size_t *cap, size_t n, size_t es);

/* Edit distance, capped at cap+1 (for "did you mean"). */
size_t ydoc_distance(const char *a, const char *b, size_t cap);

#endif
