/* A small YAML writer over libyaml's emitter for refitctl manifest: the
 * emitter quotes and escapes, so any string (quotes, colons, '#', leading
 * dashes, unicode, newlines) reads back as written. The first failure
 * sticks; ymw_close reports it. */
#ifndef REFIT_TOOLS_CTL_MANIFEST_YAML_H
#define REFIT_TOOLS_CTL_MANIFEST_YAML_H

#include <stdio.h>

#include <yaml.h>

typedef struct ymw {
    yaml_emitter_t e;
    int failed;
    char err[160];  /* why, when failed */
} ymw;

/* Start a stream with one document on out. -1 on failure (err set). */
int ymw_open(ymw *w, FILE *out);
/* Mappings and sequences; flow: 1 for {a: 1} / [1, 2], 0 for block style. */
void ymw_map(ymw *w, int flow);
void ymw_seq(ymw *w, int flow);
void ymw_end_map(ymw *w);
void ymw_end_seq(ymw *w);
/* A string the emitter may leave plain when that reads back the same. */
void ymw_str(ymw *w, const char *s);
/* A string from the user: always double-quoted, so "123" or "true" stay
 * strings. */
void ymw_text(ymw *w, const char *s);
void ymw_int(ymw *w, long v);
/* key: value in the open mapping. */
void ymw_kv_str(ymw *w, const char *key, const char *v);
void ymw_kv_int(ymw *w, const char *key, long v);
/* End the document and the stream, flush. 0, or -1 with err set. */
int ymw_close(ymw *w);

#endif
