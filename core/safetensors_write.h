/* Writing safetensors files: for the demo's durable checkpoints, tests and
 * `refitctl convert`. The header is JSON with names escaped by jansson, its
 * length padded with spaces to a multiple of 8 (as Hugging Face writes it);
 * tensors follow in the order given, contiguous. The file is written to a
 * temporary name beside PATH and renamed, so readers never see half. */
#ifndef REFIT_CORE_SAFETENSORS_WRITE_H
#define REFIT_CORE_SAFETENSORS_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "core/safetensors.h"

typedef struct st_out_tensor {
    const char *name;
    st_dtype dtype;
    int32_t ndim;
    const int64_t *shape;
    const void *data;          /* contiguous, elements x bits / 8 bytes */
} st_out_tensor;

/* meta: n_meta key/value pairs for "__metadata__" (keys at even indexes). */
int st_write_file(const char *path, const st_out_tensor *t, size_t n,
                  const char *const *meta, size_t n_meta, st_error *err);

/* The same, for tensors too large to hold at once: t[i].data is ignored
 * and bytes(user, i, &rc) gives tensor i's contiguous bytes (valid until
 * the next call; NULL with rc set on failure, which fails the write).
 * The file is flushed to disk (fsync) before the rename. */
typedef const void *(*st_bytes_fn)(void *user, size_t i, int *rc);
int st_write_file_from(const char *path, const st_out_tensor *t, size_t n,
                       const char *const *meta, size_t n_meta, st_bytes_fn bytes, void *user,
                       st_error *err);

#endif
