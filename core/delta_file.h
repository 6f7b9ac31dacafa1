/* Delta files (docs/delta-file.md): the patches of one delta update in a
 * safetensors file. Per checkpoint tensor NAME: NAME.delta_indices (I64,
 * flat indices or run starts), NAME.delta_counts (I64, run lengths; only
 * in the run form) and NAME.delta_values (the checkpoint dtype). The
 * header's __metadata__ holds the keys below; DELTA_KEY_SHA256 + NAME is
 * the SHA-256 of the tensor's indices, counts and values bytes, in that
 * order, as stored. Writer: delta_file_write.c; reader: delta_file.c. */
#ifndef REFIT_CORE_DELTA_FILE_H
#define REFIT_CORE_DELTA_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <refit/refit.h>

#define DELTA_KEY_FORMAT "refit.delta.format"   /* DELTA_FORMAT */
#define DELTA_FORMAT "1"
#define DELTA_KEY_BASE "refit.delta.base_version"
#define DELTA_KEY_VERSION "refit.delta.version"
#define DELTA_KEY_TENSORS "refit.delta.tensors"  /* how many, decimal */
#define DELTA_KEY_SHA256 "refit.delta.sha256."  /* + NAME: lower-case hex */
#define DELTA_SUFFIX_INDICES ".delta_indices"
#define DELTA_SUFFIX_COUNTS ".delta_counts"
#define DELTA_SUFFIX_VALUES ".delta_values"

/* The base and new version a delta file at path declares (malloc'd, the
 * caller frees both). REFIT_OK; REFIT_ENOTFOUND when path is a
 * safetensors file but not a delta file; its open error otherwise, with
 * why (n bytes) saying what. Reads the header only. */
int delta_file_versions(const char *path, char **base, char **version, char *why, size_t n);

#endif
