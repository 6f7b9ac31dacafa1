/* Module version labels (mod_version.h). */
#include <stdlib.h>
#include <string.h>

#include "core/mod_version.h"

mod_version *mod_version_new(const char *label)
{
    size_t n = strlen(label) + 1;
    mod_version *v = malloc(sizeof *v + n);
    if (!v)
        return NULL;
    v->refs = 1;
    memcpy(v->label, label, n);
    return v;
}

void mod_version_hold(mod_version *v)
{
    v->refs++;
}

void mod_version_drop(mod_version *v)
{
    if (v && --v->refs == 0)
        free(v);
}
