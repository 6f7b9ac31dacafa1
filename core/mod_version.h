/* The version label each module holds: shared by the modules one commit
 * delivered (reference counted), so a partial update's modules keep
 * theirs and the worker can say which version each holds. */
#ifndef REFIT_CORE_MOD_VERSION_H
#define REFIT_CORE_MOD_VERSION_H

#include <stdint.h>

typedef struct mod_version {
    uint64_t refs;
    char label[];
} mod_version;

/* A label with one reference (the txn's); NULL: no memory. */
mod_version *mod_version_new(const char *label);
void mod_version_hold(mod_version *v);
/* Drop one reference; frees at zero. NULL is ok. */
void mod_version_drop(mod_version *v);

#endif
