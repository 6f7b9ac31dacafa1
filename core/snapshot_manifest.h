/* A snapshot's manifest (docs/restart.md): path/manifest.json, a JSON
 * object that carries a SHA-256 of itself, so a changed byte anywhere in
 * it is refused rather than believed. Below the core (a component): the
 * core writes and reads it, refitctl reads it. */
#ifndef REFIT_CORE_SNAPSHOT_MANIFEST_H
#define REFIT_CORE_SNAPSHOT_MANIFEST_H

#include <stddef.h>

#include <jansson.h>

#define SNAP_FORMAT 1                       /* "refit_snapshot" */
#define SNAP_MANIFEST_NAME "manifest.json"
#define SNAP_TENSORS_NAME "runtime.safetensors"
#define SNAP_CHECKSUM_KEY "manifest_sha256"

/* Add SNAP_CHECKSUM_KEY to root (the digest of root's canonical text
 * without it) and write it to path, flushed to disk. 0, or -1 with the
 * reason in err. */
int snap_manifest_write(const char *path, json_t *root, char *err, size_t n);
/* Read and check path: JSON, the format number, the checksum. *out: the
 * object (the caller's reference). 0, or a refit status (REFIT_EIO,
 * REFIT_ECORRUPT) with the reason in err, naming the file. */
int snap_manifest_read(const char *path, json_t **out, char *err, size_t n);
/* The first place where a (the snapshot's) and b (this worker's) differ,
 * as "modules[3] (layers.0.qkv).checkpoint[1] (k.weight).shard.rank:
 * snapshot 0, this worker 1"; 0 when equal, 1 when they differ. */
int snap_json_diff(const json_t *a, const json_t *b, char *out, size_t n);

#endif
