#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <yaml.h>

#include <refit/refit.h>

#include "core/params.h"
#include "core/util.h"

static int params_add(params *p, const char *k, const char *v)
{
    char **keys = realloc(p->keys, (p->n + 1) * sizeof *keys);
    if (!keys)
        return REFIT_ENOMEM;
    p->keys = keys;
    char **values = realloc(p->values, (p->n + 1) * sizeof *values);
    if (!values)
        return REFIT_ENOMEM;
    p->values = values;
    p->keys[p->n] = xstrdup(k);
    p->values[p->n] = xstrdup(v);
    if (!p->keys[p->n] || !p->values[p->n]) {
        free(p->keys[p->n]);
        free(p->values[p->n]);
        return REFIT_ENOMEM;
    }
    p->n++;
    return REFIT_OK;
}

static int where(char *err, size_t n, const yaml_mark_t *m, const char *why)
{
    snprintf(err, n, "line %zu, column %zu: %s", m->line + 1, m->column + 1, why);
    return REFIT_EINVAL;
}

/* Walk the events of "key: value" pairs inside one mapping. */
static int params_events(params *p, yaml_parser_t *y, char *err, size_t errlen)
{
    yaml_event_t ev;
    char *key = NULL;
    int depth = 0, rc = REFIT_OK;
    for (;;) {
        if (!yaml_parser_parse(y, &ev)) {
            rc = where(err, errlen, &y->problem_mark, y->problem ? y->problem : "bad YAML");
            break;
        }
        yaml_event_type_t t = ev.type;
        if (t == YAML_MAPPING_START_EVENT && ++depth > 1)
            rc = where(err, errlen, &ev.start_mark, "nested mappings are not parameters");
        else if (t == YAML_SEQUENCE_START_EVENT)
            rc = where(err, errlen, &ev.start_mark, "sequences are not parameters");
        else if (t == YAML_SCALAR_EVENT && depth == 0)
            rc = where(err, errlen, &ev.start_mark, "parameters must be a mapping");
        else if (t == YAML_SCALAR_EVENT && !key) {
            const char *k = (const char *)ev.data.scalar.value;
            key = params_get(p, k) ? NULL : xstrdup(k);
            if (!key)
                rc = params_get(p, k) ? where(err, errlen, &ev.start_mark, "duplicate key")
                                      : REFIT_ENOMEM;
        } else if (t == YAML_SCALAR_EVENT) {
            rc = params_add(p, key, (const char *)ev.data.scalar.value);
            free(key);
            key = NULL;
        }
        yaml_event_delete(&ev);
        if (rc || t == YAML_STREAM_END_EVENT)
            break;
    }
    free(key);
    return rc;
}

int params_parse(params *p, const char *text, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (!text || !*text)
        return REFIT_OK;
    yaml_parser_t y;
    if (!yaml_parser_initialize(&y))
        return REFIT_ENOMEM;
    yaml_parser_set_input_string(&y, (const unsigned char *)text, strlen(text));
    int rc = params_events(p, &y, err, errlen);
    yaml_parser_delete(&y);
    if (rc)
        params_free(p);
    return rc;
}

const char *params_get(const params *p, const char *key)
{
    for (size_t i = 0; i < p->n; i++)
        if (!strcmp(p->keys[i], key))
            return p->values[i];
    return NULL;
}

int params_bool(const params *p, const char *key)
{
    const char *v = params_get(p, key);
    if (!v)
        return -1;
    static const char *yes[] = {"true", "yes", "on", "1"};
    static const char *no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (!strcasecmp(v, yes[i]))
            return 1;
        if (!strcasecmp(v, no[i]))
            return 0;
    }
    return -1;
}

void params_free(params *p)
{
    for (size_t i = 0; i < p->n; i++) {
        free(p->keys[i]);
        free(p->values[i]);
    }
    free(p->keys);
    free(p->values);
    memset(p, 0, sizeof *p);
}
