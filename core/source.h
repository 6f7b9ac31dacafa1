/* Checkpoint sources (source.c), as the core keeps one past its caller:
 * the undo source "previous update's files" (core/undo_source_files.c)
 * holds the source an update was loaded from, so its files stay open and
 * mapped (a replaced file's inode stays readable) until the model drops it. */
#ifndef REFIT_CORE_SOURCE_H
#define REFIT_CORE_SOURCE_H

#include <refit/refit.h>

#include "core/safetensors.h"

/* One more reference to src; refit_source_close drops one, the last frees. */
refit_source *source_hold(refit_source *src);
/* The validated, mapped files of src. */
st_set *source_set(const refit_source *src);

#endif
