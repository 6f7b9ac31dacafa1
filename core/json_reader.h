/*
 * A small strict JSON pull reader for the safetensors header and index:
 * one pass over a borrowed buffer, no tree. The caller walks the document
 * (jr_object_next, jr_array_next, jr_string, jr_number, jr_skip) and keeps
 * only what it needs; every string it reads is decoded into one arena the
 * size of the input, so returned strings stay valid until jr_free().
 *
 * Strict as jansson's json_loadb(JSON_REJECT_DUPLICATES) is, and with the
 * same error classes: invalid UTF-8 anywhere read (JR_UTF8), a duplicate
 * key in any object (JR_DUPLICATE), everything else (JR_SYNTAX): a bad
 * token, a raw control character or \u0000 in a string, a lone surrogate,
 * an integer outside int64, a real that overflows a double, nesting deeper
 * than JR_MAX_DEPTH, anything after the top-level value. The first error
 * wins and sticks: every later call fails.
 */
#ifndef REFIT_CORE_JSON_READER_H
#define REFIT_CORE_JSON_READER_H

#include <stddef.h>
#include <stdint.h>

#define JR_MAX_DEPTH 2048 /* as jansson's parser */

typedef enum jr_kind {
    JR_NONE, JR_OBJECT, JR_ARRAY, JR_STRING, JR_INTEGER, JR_REAL, JR_TRUE, JR_FALSE, JR_NULL
} jr_kind;

typedef enum jr_status { JR_OK, JR_SYNTAX, JR_UTF8, JR_DUPLICATE, JR_NOMEM } jr_status;

struct jr_key;
struct jr_frame;

typedef struct jr_reader {
    const uint8_t *buf;
    size_t len, pos;
    char *arena;             /* decoded strings; len + 1 bytes suffice */
    size_t used;
    unsigned depth;          /* open containers */
    struct jr_frame *frames; /* open objects, innermost last */
    size_t nframes, cap_frames;
    struct jr_key *keys;     /* open objects' keys, for duplicate checks */
    size_t nkeys, cap_keys;
    uint64_t seed;           /* of the key hash: crafted keys can't aim */
    jr_status status;
    size_t err_pos;          /* byte offset of the error */
    char err_text[160];      /* what was wrong, in words */
} jr_reader;

/* -1 when out of memory (status JR_NOMEM). */
int jr_init(jr_reader *r, const void *buf, size_t len);
void jr_free(jr_reader *r);

/* Kind of the next value from its first byte (after whitespace), without
 * consuming it; JR_NONE (and an error) when no value can start there. A
 * number reads as JR_INTEGER and any word as JR_NULL here: jr_number and
 * jr_skip say what it is, or refuse it. */
jr_kind jr_peek(jr_reader *r);

/* Consumes '{'; *id names the object for jr_object_next (objects are
 * read innermost first: the id checks it). */
int jr_object_begin(jr_reader *r, uint32_t *id);
/* 1: a member follows, its key in *key (NUL-terminated, *klen bytes) and
 * its ':' consumed, the value next; 0: '}' consumed; -1: error. */
int jr_object_next(jr_reader *r, uint32_t id, const char **key, size_t *klen);
/* Consumes '['. */
int jr_array_begin(jr_reader *r);
/* 1: an element follows; 0: ']' consumed; -1: error. */
int jr_array_next(jr_reader *r);
/* A string value, decoded, NUL-terminated. */
int jr_string(jr_reader *r, const char **s, size_t *len);
/* A number: *kind JR_INTEGER with *value, or JR_REAL. */
int jr_number(jr_reader *r, jr_kind *kind, int64_t *value);
/* Any value, checked and dropped; *kind what it was (kind may be NULL). */
int jr_skip(jr_reader *r, jr_kind *kind);
/* The top-level value must be an object or an array (jansson's rule
 * without JSON_DECODE_ANY): its kind, not consumed. */
int jr_top(jr_reader *r, jr_kind *kind);
/* Only whitespace may follow the top-level value. */
int jr_finish(jr_reader *r);

/* "object", "array", "string", "integer", "real number", "boolean", "null". */
const char *jr_kind_name(jr_kind k);

#endif
