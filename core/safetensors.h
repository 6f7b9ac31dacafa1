/*
 * Validated safetensors reader.
 *
 * Reads a single .safetensors file, a directory holding a sharded checkpoint
 * (model.safetensors.index.json plus its shards), a directory with exactly
 * one .safetensors file, or a caller's buffer. Every file is checked as
 * strictly as the reference reader (Hugging Face safetensors, Rust) checks
 * it, plus the rules listed in docs/safetensors.md; a checkpoint that opens
 * is one whose every tensor lies exactly where its header says.
 *
 * Lifecycle: st_open() -> st_count()/st_tensor_at()/st_find() ... ->
 * st_close(). Everything returned (tensors, names, data pointers, paths,
 * metadata strings) is owned by the set and valid until st_close().
 *
 * Data: files are mapped read-only and each tensor's `data` points into the
 * mapping; nothing is copied. Another process that truncates a mapped file
 * would make a later read of the lost pages fault (SIGBUS), so a reader that
 * is about to stream calls st_set_recheck() first: it fails, without
 * touching the mapping, when any file changed size, mtime or identity since
 * it was opened. Headers are read with pread(), never through the mapping,
 * so opening and validating cannot fault whatever happens to the file.
 *
 * Errors: functions return a refit status (REFIT_OK, REFIT_ECORRUPT,
 * REFIT_EIO, REFIT_ENOMEM, REFIT_EINVAL) and fill an st_error, which names
 * the file, the tensor where there is one, the rule broken (st_rule) and a
 * message. A failing st_open() leaves *out NULL and frees what it took.
 *
 * Threading: a set may be read by several threads at once; st_file_sha256()
 * caches its result in the set, so it needs the caller to serialize calls.
 */
#ifndef REFIT_CORE_SAFETENSORS_H
#define REFIT_CORE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include <refit/refit.h>

#define ST_MAX_DIMS 8                   /* same as REFIT_MAX_DIMS */
#define ST_MAX_HEADER 100000000ull      /* the reference reader's limit */
#define ST_INDEX_NAME "model.safetensors.index.json"

/* ---- dtypes ------------------------------------------------------------ */

/* X(ID, bits per element, refit dtype code or ST_NO_REFIT) for every dtype
 * of the current safetensors spec, under their spec names. */
#define ST_NO_REFIT 0xff
#define ST_DTYPE_TABLE(X)                                  \
    X(BOOL, 8, REFIT_DTYPE_BOOL)                           \
    X(F4, 4, REFIT_DTYPE_FLOAT4_E2M1FN)                    \
    X(F6_E2M3, 6, ST_NO_REFIT)                             \
    X(F6_E3M2, 6, ST_NO_REFIT)                             \
    X(U8, 8, REFIT_DTYPE_UINT)                             \
    X(I8, 8, REFIT_DTYPE_INT)                              \
    X(F8_E5M2, 8, REFIT_DTYPE_FLOAT8_E5M2)                 \
    X(F8_E4M3, 8, REFIT_DTYPE_FLOAT8_E4M3FN)               \
    X(F8_E8M0, 8, REFIT_DTYPE_FLOAT8_E8M0FNU)              \
    X(F8_E4M3FNUZ, 8, ST_NO_REFIT)                         \
    X(F8_E5M2FNUZ, 8, ST_NO_REFIT)                         \
    X(I16, 16, REFIT_DTYPE_INT)                            \
    X(U16, 16, REFIT_DTYPE_UINT)                           \
    X(F16, 16, REFIT_DTYPE_FLOAT)                          \
    X(BF16, 16, REFIT_DTYPE_BFLOAT)                        \
    X(I32, 32, REFIT_DTYPE_INT)                            \
    X(U32, 32, REFIT_DTYPE_UINT)                           \
    X(F32, 32, REFIT_DTYPE_FLOAT)                          \
    X(C64, 64, ST_NO_REFIT)                                \
    X(F64, 64, REFIT_DTYPE_FLOAT)                          \
    X(I64, 64, REFIT_DTYPE_INT)                            \
    X(U64, 64, REFIT_DTYPE_UINT)

typedef enum st_dtype {
#define ST_X_(id, bits, code) ST_##id,
    ST_DTYPE_TABLE(ST_X_)
#undef ST_X_
    ST_DTYPE_COUNT
} st_dtype;

/* Spec name ("BF16"); "?" for a value outside the enum. */
const char *st_dtype_name(st_dtype dt);
/* Bits per element (4, 6, 8, 16, 32, 64); 0 outside the enum. */
unsigned st_dtype_bits(st_dtype dt);
/* Exact, case-sensitive spec name to dtype; -1 when unknown. */
int st_dtype_from_name(const char *name, st_dtype *out);
/* The refit (DLPack) dtype: {code, bits, 1}, code ST_NO_REFIT where refit
 * has none (F6_*, FNUZ FP8, C64). */
refit_dtype st_dtype_to_refit(st_dtype dt);

/* ---- errors ------------------------------------------------------------ */

/* X(ID, short name): one entry per rule; the name is what refitctl prints
 * and what tests match on. */
#define ST_RULE_TABLE(X)                                  \
    X(OK, "ok")                                           \
    X(INVALID_ARG, "invalid-argument")                    \
    X(NOMEM, "out-of-memory")                             \
    X(IO, "io")                                           \
    X(NOT_REGULAR, "not-a-regular-file")                  \
    X(HEADER_TOO_SMALL, "header-too-small")               \
    X(HEADER_TOO_LARGE, "header-too-large")               \
    X(HEADER_PAST_EOF, "header-past-eof")                 \
    X(JSON_UTF8, "json-utf8")                             \
    X(JSON_SYNTAX, "json-syntax")                         \
    X(DUPLICATE_KEY, "duplicate-key")                     \
    X(HEADER_NOT_OBJECT, "header-not-object")             \
    X(METADATA_TYPE, "metadata-type")                     \
    X(METADATA_VALUE, "metadata-value")                   \
    X(ENTRY_TYPE, "entry-type")                           \
    X(MISSING_FIELD, "missing-field")                     \
    X(DTYPE_TYPE, "dtype-type")                           \
    X(DTYPE_UNKNOWN, "dtype-unknown")                     \
    X(SHAPE_TYPE, "shape-type")                           \
    X(SHAPE_DIM, "shape-dim")                             \
    X(SHAPE_RANK, "shape-rank")                           \
    X(OFFSETS_TYPE, "offsets-type")                       \
    X(OFFSET_VALUE, "offset-value")                       \
    X(OFFSET_ORDER, "offset-order")                       \
    X(OFFSET_GAP, "offset-gap")                           \
    X(OFFSET_OVERLAP, "offset-overlap")                   \
    X(SIZE_OVERFLOW, "size-overflow")                     \
    X(SIZE_PARTIAL_BYTE, "size-partial-byte")             \
    X(SIZE_MISMATCH, "size-mismatch")                     \
    X(DATA_SIZE, "data-size")                             \
    X(DUPLICATE_TENSOR, "duplicate-tensor")               \
    X(INDEX_TOO_LARGE, "index-too-large")                 \
    X(INDEX_NOT_OBJECT, "index-not-object")               \
    X(INDEX_WEIGHT_MAP, "index-weight-map")               \
    X(INDEX_SHARD_NAME, "index-shard-name")               \
    X(INDEX_METADATA, "index-metadata")                   \
    X(INDEX_TOTAL_SIZE_TYPE, "index-total-size-type")     \
    X(INDEX_TOTAL_SIZE, "index-total-size")               \
    X(SHARD_MISSING, "shard-missing")                     \
    X(SHARD_EXTRA_TENSOR, "shard-extra-tensor")           \
    X(SHARD_MISPLACED_TENSOR, "shard-misplaced-tensor")   \
    X(SHARD_MISSING_TENSOR, "shard-missing-tensor")       \
    X(DIR_EMPTY, "dir-no-safetensors")                    \
    X(DIR_AMBIGUOUS, "dir-ambiguous")                     \
    X(FILE_CHANGED, "file-changed")

typedef enum st_rule {
#define ST_X_(id, name) ST_R_##id,
    ST_RULE_TABLE(ST_X_)
#undef ST_X_
    ST_RULE_COUNT
} st_rule;

/* Short rule name ("offset-gap"); "?" outside the enum. */
const char *st_rule_name(st_rule r);

typedef struct st_error {
    int status;         /* REFIT_OK or the refit status returned */
    st_rule rule;       /* which rule was broken */
    char file[1024];    /* path of the file at fault; "" when none */
    char tensor[256];   /* tensor name, "" when the fault is not a tensor's */
    char message[512];  /* what was found, in words */
} st_error;             /* control characters are escaped: one line each */

/* One line, no newline: "FILE: tensor 'T': MESSAGE [RULE]". Returns buf. */
const char *st_error_line(const st_error *e, char *buf, size_t n);

/* ---- sets of tensors --------------------------------------------------- */

typedef struct st_tensor {
    const char *name;          /* NUL-terminated; owned by the set */
    const void *data;          /* into the file's mapping; nbytes readable */
    uint64_t nbytes;           /* elements x bits / 8 */
    uint64_t offset;           /* of data from the start of its file */
    int64_t shape[ST_MAX_DIMS];
    int32_t ndim;              /* 0 for a scalar */
    st_dtype dtype;
    uint32_t file;             /* index for st_file_path() */
} st_tensor;

typedef struct st_set st_set;

/* Opens PATH: a .safetensors file; a directory with ST_INDEX_NAME (shards
 * it does not name are ignored); an index file itself (*.index.json, its
 * shards beside it); or a directory without an index holding exactly one
 * *.safetensors file. Validates everything before returning.
 * OUT: *out, NULL on failure. */
int st_open(st_set **out, const char *path, st_error *err);
/* Same checks over a whole file held in memory (borrowed: buf must outlive
 * the set). label names it in errors and st_file_path(). */
int st_open_memory(st_set **out, const void *buf, size_t len, const char *label,
                   st_error *err);
/* Unmaps and frees everything; NULL is a no-op. */
void st_close(st_set *s);

/* Tensors ordered by file, then by data offset: the order to stream in. */
size_t st_count(const st_set *s);
const st_tensor *st_tensor_at(const st_set *s, size_t i);
/* O(1) lookup by exact name; NULL when absent. */
const st_tensor *st_find(const st_set *s, const char *name);

/* Files, in index order (shards sorted by name). */
size_t st_file_count(const st_set *s);
const char *st_file_path(const st_set *s, size_t i);
uint64_t st_file_size(const st_set *s, size_t i);
/* The file's stat at open (what st_set_recheck compares); NULL for a
 * caller's buffer or an index out of range. */
const struct stat *st_file_stat(const st_set *s, size_t i);
/* A value of file i's "__metadata__" map; NULL when absent. */
const char *st_metadata_get(const st_set *s, size_t i, const char *key);

/* Fails with ST_R_FILE_CHANGED when any mapped file changed size or mtime
 * since st_open(), or its path now names another file. Call before reading
 * tensor data that may have been written by someone else meanwhile. */
int st_set_recheck(const st_set *s, st_error *err);

/* SHA-256 of file i's whole bytes, lower-case hex (what the hub publishes).
 * Read with pread() (a truncation is an error, not a fault) on first call,
 * then cached. */
int st_file_sha256(st_set *s, size_t i, char hex[65], st_error *err);

/* ---- index files (exposed for tests and the fuzz target) -------------- */

typedef struct st_index st_index;

/* Parses model.safetensors.index.json text; label names it in errors. */
int st_index_parse(st_index **out, const void *json, size_t len, const char *label,
                   st_error *err);
void st_index_free(st_index *ix);
/* Distinct shard file names, sorted. */
size_t st_index_shard_count(const st_index *ix);
const char *st_index_shard(const st_index *ix, size_t i);
/* Tensors in the weight map; shard of a name, -1 when not listed. */
size_t st_index_tensor_count(const st_index *ix);
long st_index_shard_of(const st_index *ix, const char *name);
/* metadata.total_size, or -1 when the index has none. */
int64_t st_index_total_size(const st_index *ix);

#endif
