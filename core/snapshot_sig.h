/* The plan signature of a sealed model (snapshot_sig.c): everything that
 * decides what its runtime bytes mean, as a JSON object. A snapshot
 * records it; a restore is allowed only where the worker's is equal
 * (docs/restart.md lists the members). */
#ifndef REFIT_CORE_SNAPSHOT_SIG_H
#define REFIT_CORE_SNAPSHOT_SIG_H

#include <jansson.h>

#include "core/model.h"

/* NULL with the context's message set (out of memory, a plugin file that
 * cannot be read). */
json_t *snap_signature(refit_model *m);

#endif
