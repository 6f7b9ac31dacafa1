#include <string.h>

#include "tools/ctl/ctl_manifest_yaml.h"

static void emit(ymw *w, yaml_event_t *ev, int made, const char *what)
{
    if (w->failed)
        return;
    if (!made) {
        w->failed = 1;
        snprintf(w->err, sizeof w->err, "%s is not valid UTF-8", what);
        return;
    }
    if (!yaml_emitter_emit(&w->e, ev)) {
        w->failed = 1;
        snprintf(w->err, sizeof w->err, "writing YAML: %s",
                 w->e.problem ? w->e.problem : "the emitter failed");
    }
}

int ymw_open(ymw *w, FILE *out)
{
    memset(w, 0, sizeof *w);
    if (!yaml_emitter_initialize(&w->e)) {
        snprintf(w->err, sizeof w->err, "out of memory");
        return -1;
    }
    yaml_emitter_set_output_file(&w->e, out);
    yaml_emitter_set_unicode(&w->e, 1);
    yaml_emitter_set_width(&w->e, -1); /* no folding: a line per key */
    yaml_emitter_set_indent(&w->e, 2);
    yaml_event_t ev;
    emit(w, &ev, yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING), "stream");
    emit(w, &ev, yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1), "document");
    return w->failed ? -1 : 0;
}

void ymw_map(ymw *w, int flow)
{
    yaml_event_t ev;
    emit(w, &ev, yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1,
         flow ? YAML_FLOW_MAPPING_STYLE : YAML_BLOCK_MAPPING_STYLE), "mapping");
}

void ymw_seq(ymw *w, int flow)
{
    yaml_event_t ev;
    emit(w, &ev, yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
         flow ? YAML_FLOW_SEQUENCE_STYLE : YAML_BLOCK_SEQUENCE_STYLE), "sequence");
}

void ymw_end_map(ymw *w)
{
    yaml_event_t ev;
    emit(w, &ev, yaml_mapping_end_event_initialize(&ev), "mapping");
}

void ymw_end_seq(ymw *w)
{
    yaml_event_t ev;
    emit(w, &ev, yaml_sequence_end_event_initialize(&ev), "sequence");
}

static void scalar(ymw *w, const char *s, yaml_scalar_style_t style, const char *what)
{
    yaml_event_t ev;
    emit(w, &ev, yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s,
                                              (int)strlen(s), 1, 1, style), what);
}

void ymw_str(ymw *w, const char *s)
{
    scalar(w, s, YAML_ANY_SCALAR_STYLE, s);
}

void ymw_text(ymw *w, const char *s)
{
    scalar(w, s, YAML_DOUBLE_QUOTED_SCALAR_STYLE, "the text given (--name or the CONFIG path)");
}

void ymw_int(ymw *w, long v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%ld", v);
    scalar(w, buf, YAML_PLAIN_SCALAR_STYLE, buf);
}

void ymw_kv_str(ymw *w, const char *key, const char *v)
{
    ymw_str(w, key);
    ymw_str(w, v);
}

void ymw_kv_int(ymw *w, const char *key, long v)
{
    ymw_str(w, key);
    ymw_int(w, v);
}

int ymw_close(ymw *w)
{
    yaml_event_t ev;
    emit(w, &ev, yaml_document_end_event_initialize(&ev, 1), "document");
    emit(w, &ev, yaml_stream_end_event_initialize(&ev), "stream");
    if (!w->failed && !yaml_emitter_flush(&w->e)) {
        w->failed = 1;
        snprintf(w->err, sizeof w->err, "writing YAML: %s",
                 w->e.problem ? w->e.problem : "flush failed");
    }
    yaml_emitter_delete(&w->e);
    return w->failed ? -1 : 0;
}
