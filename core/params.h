/* A module's format parameters: a flat YAML mapping of scalars. */
#ifndef REFIT_CORE_PARAMS_H
#define REFIT_CORE_PARAMS_H

#include <stddef.h>

typedef struct params {
    char **keys;
    char **values;
    size_t n;
} params;

/* Parse text (NULL or empty: no parameters). On error returns a refit
 * status and writes "line L, column C: why" into err. */
int params_parse(params *p, const char *text, char *err, size_t errlen);
/* Value of key or NULL. */
const char *params_get(const params *p, const char *key);
/* 1 for true/yes/on/1, 0 for false/no/off/0, -1 otherwise or absent. */
int params_bool(const params *p, const char *key);
void params_free(params *p);

#endif
