/*
 * Validated safetensors reader. See core/safetensors.h for the contract and
 * docs/safetensors.md for the rules and why each exists.
 *
 * File layout (the safetensors spec):
 *
 *   [0, 8)        N, unsigned 64-bit little-endian
 *   [8, 8+N)      UTF-8 JSON object: name -> {dtype, shape, data_offsets},
 *                 plus an optional "__metadata__" string -> string map
 *   [8+N, size)   the data section; data_offsets are relative to its start
 *
 * Opening a file: fstat, pread the length and the header (never through
 * the mapping, so a concurrent truncation cannot fault us while we
 * validate), read it in one pass with core/json_reader (strict JSON,
 * duplicate keys refused), keeping per member only what the rules look at,
 * then judge every entry's JSON types in document order (as when a whole
 * document was parsed first: a syntax error anywhere wins over a type
 * error), sort entries by (begin, end), then walk them checking that
 * they tile the data section exactly: from 0, no gap, no overlap, each
 * span equal to elements x bits / 8, the last end equal to the data size.
 * Only then are tensors added to the set, their data pointing into a
 * read-only mapping of the file.
 */
#include "core/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/json_reader.h"
#include "core/sha256.h"

/* ---- dtypes ------------------------------------------------------------ */

static const struct {
    const char *name;
    uint8_t bits;
    uint8_t refit_code;
} st_dtypes[ST_DTYPE_COUNT] = {
#define ST_X_(id, bits, code) {#id, bits, code},
    ST_DTYPE_TABLE(ST_X_)
#undef ST_X_
};

const char *st_dtype_name(st_dtype dt)
{
    return (unsigned)dt < ST_DTYPE_COUNT ? st_dtypes[dt].name : "?";
}

unsigned st_dtype_bits(st_dtype dt)
{
    return (unsigned)dt < ST_DTYPE_COUNT ? st_dtypes[dt].bits : 0;
}

int st_dtype_from_name(const char *name, st_dtype *out)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (!strcmp(name, st_dtypes[i].name)) {
            *out = (st_dtype)i;
            return 0;
        }
    return -1;
}

refit_dtype st_dtype_to_refit(st_dtype dt)
{
    refit_dtype r = {ST_NO_REFIT, 0, 1};
    if ((unsigned)dt < ST_DTYPE_COUNT) {
        r.code = st_dtypes[dt].refit_code;
        r.bits = st_dtypes[dt].bits;
    }
    return r;
}

/* ---- errors ------------------------------------------------------------ */

static const char *const st_rule_names[ST_RULE_COUNT] = {
#define ST_X_(id, name) name,
    ST_RULE_TABLE(ST_X_)
#undef ST_X_
};

const char *st_rule_name(st_rule r)
{
    return (unsigned)r < ST_RULE_COUNT ? st_rule_names[r] : "?";
}

/* Copies src, escaping control bytes, so that names taken from an untrusted
 * header can never split an error line or drive a terminal. */
static void st_copy_escaped(char *dst, size_t n, const char *src)
{
    size_t j = 0;
    for (; src && *src && j + 5 < n; src++) {
        unsigned char c = (unsigned char)*src;
        if (c < 0x20 || c == 0x7f)
            j += (size_t)snprintf(dst + j, n - j, "\\x%02x", c);
        else
            dst[j++] = (char)c;
    }
    if (src && *src && j + 4 <= n) {
        memcpy(dst + j, "...", 3); /* truncated: say so */
        j += 3;
    }
    dst[j] = '\0';
}

/* Records an error and returns status, so call sites read
 * `return st_fail(...)`. err may be NULL. */
static int st_fail(st_error *err, int status, st_rule rule, const char *file,
                   const char *tensor, const char *fmt, ...)
{
    if (!err)
        return status;
    err->status = status;
    err->rule = rule;
    st_copy_escaped(err->file, sizeof err->file, file);
    st_copy_escaped(err->tensor, sizeof err->tensor, tensor);
    char raw[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    st_copy_escaped(err->message, sizeof err->message, raw);
    return status;
}

#define ST_CORRUPT(err, rule, file, tensor, ...) \
    st_fail(err, REFIT_ECORRUPT, ST_R_##rule, file, tensor, __VA_ARGS__)
#define ST_NOMEM(err, file) \
    st_fail(err, REFIT_ENOMEM, ST_R_NOMEM, file, NULL, "out of memory")

const char *st_error_line(const st_error *e, char *buf, size_t n)
{
    if (!n)
        return buf;
    if (e->tensor[0])
        snprintf(buf, n, "%s: tensor '%s': %s [%s]", e->file, e->tensor, e->message,
                 st_rule_name(e->rule));
    else
        snprintf(buf, n, "%s: %s [%s]", e->file, e->message, st_rule_name(e->rule));
    return buf;
}

/* ---- the set ----------------------------------------------------------- */

struct st_file {
    char *path;             /* as opened; owned */
    int fd;                 /* -1 for a caller's buffer */
    const uint8_t *base;    /* mapping or caller's buffer */
    uint64_t size;
    uint64_t data_start;    /* 8 + N */
    bool mapped;
    struct stat st;         /* at open: what st_set_recheck compares */
    const char **meta;      /* "__metadata__": key, value, key, value... */
    size_t nmeta;           /* pairs */
    char *strings;          /* the header's decoded strings: names, meta */
    bool sha_done;
    char sha[ST_SHA256_HEX];
};

struct st_set {
    struct st_file *files;
    size_t nfiles, cap_files;
    st_tensor *tensors;
    size_t ntensors, cap_tensors;
    uint32_t *slots;        /* open addressing: tensor index + 1, 0 empty */
    size_t mask;            /* slots - 1; slots is a power of two */
    uint64_t seed;          /* per set, so crafted names can't be aimed */
};

/* One header entry between parsing and the layout check. */
struct st_raw {
    const char *name;       /* in the file's strings */
    uint64_t begin, end;
    int64_t shape[ST_MAX_DIMS];
    int32_t ndim;
    st_dtype dtype;
};

static int st_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 8;
    while (n < need)
        if (__builtin_mul_overflow(n, 2, &n))
            return -1;
    size_t bytes;
    if (__builtin_mul_overflow(n, elem, &bytes))
        return -1;
    void *q = realloc(*p, bytes);
    if (!q)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

static st_set *st_set_new(void)
{
    st_set *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    s->seed = (uint64_t)(uintptr_t)s ^ ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec;
    return s;
}

void st_close(st_set *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->nfiles; i++) {
        struct st_file *f = &s->files[i];
        if (f->mapped)
            munmap((void *)f->base, (size_t)f->size);
        if (f->fd >= 0)
            close(f->fd);
        free(f->meta);
        free(f->strings);
        free(f->path);
    }
    free(s->files);
    free(s->tensors);
    free(s->slots);
    free(s);
}

size_t st_count(const st_set *s) { return s->ntensors; }
size_t st_file_count(const st_set *s) { return s->nfiles; }

const st_tensor *st_tensor_at(const st_set *s, size_t i)
{
    return i < s->ntensors ? &s->tensors[i] : NULL;
}

const char *st_file_path(const st_set *s, size_t i)
{
    return i < s->nfiles ? s->files[i].path : NULL;
}

uint64_t st_file_size(const st_set *s, size_t i)
{
    return i < s->nfiles ? s->files[i].size : 0;
}

const struct stat *st_file_stat(const st_set *s, size_t i)
{
    return i < s->nfiles && s->files[i].fd >= 0 ? &s->files[i].st : NULL;
}

const char *st_metadata_get(const st_set *s, size_t i, const char *key)
{
    if (i >= s->nfiles || !key)
        return NULL;
    const struct st_file *f = &s->files[i];
    for (size_t k = 0; k < f->nmeta; k++)
        if (!strcmp(f->meta[2 * k], key))
            return f->meta[2 * k + 1];
    return NULL;
}

/* ---- name lookup ------------------------------------------------------- */

/* FNV-1a from a per-set seed, then a 64-bit finalizer so that the slot
 * index depends on every input byte. */
static uint64_t st_hash(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

const st_tensor *st_find(const st_set *s, const char *name)
{
    if (!s->slots || !name)
        return NULL;
    for (size_t i = st_hash(s->seed, name) & s->mask;; i = (i + 1) & s->mask) {
        uint32_t v = s->slots[i];
        if (!v)
            return NULL;
        if (!strcmp(s->tensors[v - 1].name, name))
            return &s->tensors[v - 1];
    }
}

/* Builds the table over every tensor of every file; the first name found
 * twice (possible only across files) is an error. */
static int st_build_index(st_set *s, st_error *err)
{
    const char *what = s->nfiles ? s->files[0].path : NULL;
    if (s->ntensors >= UINT32_MAX / 2)
        return ST_NOMEM(err, what);
    size_t n = 16;
    while (n < 2 * s->ntensors)
        n *= 2;
    free(s->slots);
    if (!(s->slots = calloc(n, sizeof *s->slots)))
        return ST_NOMEM(err, what);
    s->mask = n - 1;
    for (size_t t = 0; t < s->ntensors; t++) {
        const char *name = s->tensors[t].name;
        size_t i = st_hash(s->seed, name) & s->mask;
        for (; s->slots[i]; i = (i + 1) & s->mask) {
            const st_tensor *o = &s->tensors[s->slots[i] - 1];
            if (!strcmp(o->name, name))
                return ST_CORRUPT(err, DUPLICATE_TENSOR, s->files[s->tensors[t].file].path,
                                  name, "tensor also present in '%s'", s->files[o->file].path);
        }
        s->slots[i] = (uint32_t)(t + 1);
    }
    return REFIT_OK;
}

/* ---- header entries ---------------------------------------------------- */

/* One header member as read: what the rules look at, judged once the
 * whole header has been read. */
struct st_member {
    struct st_raw raw;          /* name; dtype, shape, offsets once judged */
    jr_kind kind;               /* of the member's value */
    jr_kind field[3];           /* dtype, shape, data_offsets; JR_NONE absent */
    const char *dtype;          /* when a string */
    size_t dims, bad_dim;       /* shape elements; first not a size (SIZE_MAX) */
    size_t noffs, bad_off;      /* the same for data_offsets */
    int64_t offs[2];
    const char *bad_meta;       /* __metadata__: key of the first non-string */
    jr_kind bad_meta_kind;
};

static const char *const st_fields[3] = {"dtype", "shape", "data_offsets"};

/* Reads an array of sizes (shape, data_offsets): count, the first `cap`
 * values, and the first element that is not a non-negative integer. */
static int st_read_sizes(jr_reader *r, int64_t *vals, size_t cap, size_t *n, size_t *bad)
{
    *n = 0;
    *bad = SIZE_MAX;
    if (jr_array_begin(r))
        return -1;
    int more;
    while ((more = jr_array_next(r)) == 1) {
        jr_kind k = jr_peek(r);
        int64_t v = -1;
        if (k == JR_INTEGER ? jr_number(r, &k, &v) : jr_skip(r, &k))
            return -1;
        if ((k != JR_INTEGER || v < 0) && *bad == SIZE_MAX)
            *bad = *n;
        if (*n < cap)
            vals[*n] = v;
        (*n)++;
    }
    return more;
}

/* An entry's object: the three fields; other keys are read and ignored, as
 * the reference reader ignores them. */
static int st_read_entry(jr_reader *r, struct st_member *m)
{
    uint32_t id;
    const char *key;
    size_t klen;
    int more;
    if (jr_object_begin(r, &id))
        return -1;
    while ((more = jr_object_next(r, id, &key, &klen)) == 1) {
        int w = 0;
        while (w < 3 && strcmp(key, st_fields[w]))
            w++;
        jr_kind k = jr_peek(r);
        int rc;
        if (w == 0 && k == JR_STRING)
            rc = jr_string(r, &m->dtype, &klen);
        else if (w == 1 && k == JR_ARRAY)
            rc = st_read_sizes(r, m->raw.shape, ST_MAX_DIMS, &m->dims, &m->bad_dim);
        else if (w == 2 && k == JR_ARRAY)
            rc = st_read_sizes(r, m->offs, 2, &m->noffs, &m->bad_off);
        else
            rc = jr_skip(r, &k);
        if (rc)
            return -1;
        if (w < 3)
            m->field[w] = k;
    }
    return more;
}

/* "__metadata__": string values kept as pairs; the first other value is
 * remembered for the rule. */
static int st_read_metadata(jr_reader *r, struct st_file *f, struct st_member *m,
                            size_t *cap)
{
    uint32_t id;
    const char *key, *val;
    size_t klen;
    int more;
    if (jr_object_begin(r, &id))
        return -1;
    while ((more = jr_object_next(r, id, &key, &klen)) == 1) {
        jr_kind k = jr_peek(r);
        if (k != JR_STRING) {
            if (jr_skip(r, &k))
                return -1;
            if (!m->bad_meta) {
                m->bad_meta = key;
                m->bad_meta_kind = k;
            }
            continue;
        }
        if (jr_string(r, &val, &klen))
            return -1;
        if (st_grow((void **)&f->meta, cap, 2 * (f->nmeta + 1), sizeof *f->meta)) {
            r->status = JR_NOMEM;
            return -1;
        }
        f->meta[2 * f->nmeta] = key;
        f->meta[2 * f->nmeta++ + 1] = val;
    }
    return more;
}

/* The rules for one entry, in the order they were always checked. */
static int st_judge_entry(const char *file, struct st_member *m, st_error *err)
{
    const char *name = m->raw.name;
    if (m->kind != JR_OBJECT)
        return ST_CORRUPT(err, ENTRY_TYPE, file, name, "entry is a JSON %s, not an object",
                          jr_kind_name(m->kind));
    for (size_t i = 0; i < 3; i++)
        if (m->field[i] == JR_NONE)
            return ST_CORRUPT(err, MISSING_FIELD, file, name, "missing field '%s'",
                              st_fields[i]);
    if (m->field[0] != JR_STRING)
        return ST_CORRUPT(err, DTYPE_TYPE, file, name, "'dtype' is a JSON %s, not a string",
                          jr_kind_name(m->field[0]));
    if (st_dtype_from_name(m->dtype, &m->raw.dtype))
        return ST_CORRUPT(err, DTYPE_UNKNOWN, file, name, "unknown dtype '%s'", m->dtype);
    if (m->field[1] != JR_ARRAY)
        return ST_CORRUPT(err, SHAPE_TYPE, file, name, "'shape' is a JSON %s, not an array",
                          jr_kind_name(m->field[1]));
    if (m->dims > ST_MAX_DIMS)
        return ST_CORRUPT(err, SHAPE_RANK, file, name,
                          "shape has %zu dimensions; at most %d are supported", m->dims,
                          ST_MAX_DIMS);
    if (m->bad_dim != SIZE_MAX)
        return ST_CORRUPT(err, SHAPE_DIM, file, name,
                          "shape[%zu] is not a non-negative integer", m->bad_dim);
    m->raw.ndim = (int32_t)m->dims;
    if (m->field[2] != JR_ARRAY || m->noffs != 2)
        return ST_CORRUPT(err, OFFSETS_TYPE, file, name,
                          "'data_offsets' is not an array of two integers");
    if (m->bad_off != SIZE_MAX)
        return ST_CORRUPT(err, OFFSET_VALUE, file, name,
                          "data_offsets[%zu] is not a non-negative integer", m->bad_off);
    m->raw.begin = (uint64_t)m->offs[0];
    m->raw.end = (uint64_t)m->offs[1];
    return REFIT_OK;
}

/* "__metadata__": a string -> string map; null counts as absent, as the
 * reference reader's Option<HashMap> makes it. */
static int st_judge_metadata(const char *file, const struct st_member *m, st_error *err)
{
    if (m->kind == JR_NULL)
        return REFIT_OK;
    if (m->kind != JR_OBJECT)
        return ST_CORRUPT(err, METADATA_TYPE, file, NULL,
                          "'__metadata__' is a JSON %s, not an object", jr_kind_name(m->kind));
    if (m->bad_meta)
        return ST_CORRUPT(err, METADATA_VALUE, file, NULL,
                          "'__metadata__' value of key '%s' is a JSON %s, not a string",
                          m->bad_meta, jr_kind_name(m->bad_meta_kind));
    return REFIT_OK;
}

/* ---- layout ------------------------------------------------------------ */

static int st_raw_cmp(const void *a, const void *b)
{
    const struct st_raw *x = *(const struct st_raw *const *)a;
    const struct st_raw *y = *(const struct st_raw *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name); /* zero-size ties: a stable order */
}

/* elements x bits / 8, every step overflow-checked; a sub-byte dtype whose
 * elements do not fill whole bytes is refused, as the reference does. */
static int st_raw_bytes(const char *file, const struct st_raw *r, uint64_t *out,
                        st_error *err)
{
    uint64_t elems = 1, bits;
    for (int i = 0; i < r->ndim; i++)
        if (__builtin_mul_overflow(elems, (uint64_t)r->shape[i], &elems))
            return ST_CORRUPT(err, SIZE_OVERFLOW, file, r->name,
                              "element count of the shape overflows 64 bits");
    if (__builtin_mul_overflow(elems, (uint64_t)st_dtype_bits(r->dtype), &bits))
        return ST_CORRUPT(err, SIZE_OVERFLOW, file, r->name,
                          "size in bits (%llu elements of %s) overflows 64 bits",
                          (unsigned long long)elems, st_dtype_name(r->dtype));
    if (bits % 8)
        return ST_CORRUPT(err, SIZE_PARTIAL_BYTE, file, r->name,
                          "%llu elements of %s fill %llu bits, not a whole number of bytes",
                          (unsigned long long)elems, st_dtype_name(r->dtype),
                          (unsigned long long)bits);
    *out = bits / 8;
    return REFIT_OK;
}

/* Entries sorted by (begin, end) must tile [0, data_size) exactly. */
static int st_check_layout(const char *file, struct st_raw **v, size_t n, uint64_t data_size,
                           st_error *err)
{
    uint64_t pos = 0, nbytes = 0;
    for (size_t i = 0; i < n; i++) {
        const struct st_raw *r = v[i];
        if (r->end < r->begin)
            return ST_CORRUPT(err, OFFSET_ORDER, file, r->name,
                              "data_offsets [%llu, %llu] end before they begin",
                              (unsigned long long)r->begin, (unsigned long long)r->end);
        if (r->begin > pos)
            return ST_CORRUPT(err, OFFSET_GAP, file, r->name,
                              "data begins at %llu, leaving bytes [%llu, %llu) unused",
                              (unsigned long long)r->begin, (unsigned long long)pos,
                              (unsigned long long)r->begin);
        if (r->begin < pos)
            return ST_CORRUPT(err, OFFSET_OVERLAP, file, r->name,
                              "data [%llu, %llu) overlaps tensor '%s' ending at %llu",
                              (unsigned long long)r->begin, (unsigned long long)r->end,
                              v[i - 1]->name, (unsigned long long)pos);
        int rc = st_raw_bytes(file, r, &nbytes, err);
        if (rc)
            return rc;
        if (r->end - r->begin != nbytes)
            return ST_CORRUPT(err, SIZE_MISMATCH, file, r->name,
                              "data_offsets span %llu bytes but dtype %s and shape need %llu",
                              (unsigned long long)(r->end - r->begin),
                              st_dtype_name(r->dtype), (unsigned long long)nbytes);
        pos = r->end;
    }
    if (pos != data_size)
        return ST_CORRUPT(err, DATA_SIZE, file, n ? v[n - 1]->name : NULL,
                          "tensors cover %llu bytes but the data section holds %llu",
                          (unsigned long long)pos, (unsigned long long)data_size);
    return REFIT_OK;
}

/* Appends a validated file's tensors, in offset order; names stay in the
 * file's strings. */
static int st_commit(st_set *s, uint32_t fi, struct st_raw **v, size_t n, st_error *err)
{
    struct st_file *f = &s->files[fi];
    if (st_grow((void **)&s->tensors, &s->cap_tensors, s->ntensors + n, sizeof(st_tensor)))
        return ST_NOMEM(err, f->path);
    for (size_t i = 0; i < n; i++) {
        const struct st_raw *r = v[i];
        st_tensor *t = &s->tensors[s->ntensors++];
        t->name = r->name;
        t->offset = f->data_start + r->begin;
        t->data = f->base + t->offset;
        t->nbytes = r->end - r->begin;
        memcpy(t->shape, r->shape, sizeof t->shape);
        t->ndim = r->ndim;
        t->dtype = r->dtype;
        t->file = fi;
    }
    return REFIT_OK;
}

/* ---- one file ---------------------------------------------------------- */

static int st_json_error(const char *file, const char *what, const jr_reader *r,
                         st_error *err)
{
    switch (r->status) {
    case JR_NOMEM:
        return ST_NOMEM(err, file);
    case JR_UTF8:
        return ST_CORRUPT(err, JSON_UTF8, file, NULL, "%s is not valid UTF-8 (byte %zu)", what,
                          r->err_pos);
    case JR_DUPLICATE:
        return ST_CORRUPT(err, DUPLICATE_KEY, file, NULL, "%s has a duplicate key: '%s' (byte %zu)",
                          what, r->err_text, r->err_pos);
    default:
        return ST_CORRUPT(err, JSON_SYNTAX, file, NULL, "%s is not valid JSON: %s (byte %zu)",
                          what, r->err_text, r->err_pos);
    }
}

/* Reads the header object: one member per key, the file's metadata pairs.
 * *kind: the top-level value's kind. */
static int st_read_members(jr_reader *r, struct st_file *f, struct st_member **out, size_t *n,
                           jr_kind *kind)
{
    size_t cap = 0, meta_cap = 0;
    uint32_t id;
    const char *key;
    size_t klen;
    int more;
    if (jr_top(r, kind) || (*kind == JR_ARRAY ? jr_skip(r, NULL) : jr_object_begin(r, &id)))
        return -1;
    if (*kind == JR_ARRAY)
        return jr_finish(r);
    while ((more = jr_object_next(r, id, &key, &klen)) == 1) {
        if (st_grow((void **)out, &cap, *n + 1, sizeof **out)) {
            r->status = JR_NOMEM;
            return -1;
        }
        struct st_member *m = &(*out)[(*n)++];
        memset(m, 0, sizeof *m);
        m->raw.name = key;
        m->bad_dim = m->bad_off = SIZE_MAX;
        m->kind = jr_peek(r);
        int rc;
        if (m->kind == JR_OBJECT && !strcmp(key, "__metadata__"))
            rc = st_read_metadata(r, f, m, &meta_cap);
        else if (m->kind == JR_OBJECT)
            rc = st_read_entry(r, m);
        else
            rc = jr_skip(r, &m->kind);
        if (rc)
            return -1;
    }
    return more ? -1 : jr_finish(r);
}

/* Judges the members in order, then the layout, then adds the tensors. */
static int st_judge(st_set *s, uint32_t fi, struct st_member *mem, size_t n, st_error *err)
{
    struct st_file *f = &s->files[fi];
    struct st_raw **order = malloc((n ? n : 1) * sizeof *order);
    if (!order)
        return ST_NOMEM(err, f->path);
    size_t k = 0;
    int rc = REFIT_OK;
    for (size_t i = 0; !rc && i < n; i++) {
        if (!strcmp(mem[i].raw.name, "__metadata__")) {
            rc = st_judge_metadata(f->path, &mem[i], err);
        } else {
            rc = st_judge_entry(f->path, &mem[i], err);
            order[k++] = &mem[i].raw;
        }
    }
    if (!rc) {
        qsort(order, k, sizeof *order, st_raw_cmp);
        rc = st_check_layout(f->path, order, k, f->size - f->data_start, err);
    }
    if (!rc)
        rc = st_commit(s, fi, order, k, err);
    free(order);
    return rc;
}

/* hdr: the N header bytes; f->size and f->base are set. */
static int st_parse_header(st_set *s, uint32_t fi, const uint8_t *hdr, uint64_t n,
                           st_error *err)
{
    struct st_file *f = &s->files[fi];
    f->data_start = 8 + n;
    jr_reader r;
    struct st_member *mem = NULL;
    size_t count = 0;
    jr_kind kind = JR_NONE;
    int rc;
    if (jr_init(&r, hdr, (size_t)n))
        rc = ST_NOMEM(err, f->path);
    else if (st_read_members(&r, f, &mem, &count, &kind))
        rc = st_json_error(f->path, "header", &r, err);
    else if (kind != JR_OBJECT)
        rc = ST_CORRUPT(err, HEADER_NOT_OBJECT, f->path, NULL,
                        "header is a JSON %s, not an object", jr_kind_name(kind));
    else {
        f->strings = r.arena; /* names and metadata point into it */
        r.arena = NULL;
        rc = st_judge(s, fi, mem, count, err);
    }
    free(mem);
    jr_free(&r);
    return rc;
}

static uint64_t st_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* The header-length rules, in the reference reader's order. */
static int st_check_length(const struct st_file *f, const uint8_t *first8, uint64_t *n,
                           st_error *err)
{
    if (f->size < 8)
        return ST_CORRUPT(err, HEADER_TOO_SMALL, f->path, NULL,
                          "file has %llu bytes, fewer than the 8-byte header length",
                          (unsigned long long)f->size);
    *n = st_le64(first8);
    if (*n > ST_MAX_HEADER)
        return ST_CORRUPT(err, HEADER_TOO_LARGE, f->path, NULL,
                          "header length %llu exceeds the limit of %llu bytes",
                          (unsigned long long)*n, ST_MAX_HEADER);
    if (*n > f->size - 8)
        return ST_CORRUPT(err, HEADER_PAST_EOF, f->path, NULL,
                          "header length %llu runs past the end of the %llu-byte file",
                          (unsigned long long)*n, (unsigned long long)f->size);
    return REFIT_OK;
}

static int st_add_slot(st_set *s, const char *path, st_error *err)
{
    if (st_grow((void **)&s->files, &s->cap_files, s->nfiles + 1, sizeof *s->files))
        return ST_NOMEM(err, path);
    struct st_file *f = &s->files[s->nfiles];
    memset(f, 0, sizeof *f);
    f->fd = -1;
    if (!(f->path = strdup(path)))
        return ST_NOMEM(err, path);
    s->nfiles++; /* from here on st_close() releases it */
    return REFIT_OK;
}

static int st_io(st_error *err, const char *file, const char *what)
{
    return st_fail(err, REFIT_EIO, ST_R_IO, file, NULL, "%s: %s", what, strerror(errno));
}

/* pread exactly len bytes; a short read means the file shrank. */
static int st_pread_all(const struct st_file *f, void *buf, size_t len, uint64_t off,
                        st_error *err)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t r = pread(f->fd, p, len, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return st_io(err, f->path, "read failed");
        if (r == 0)
            return st_fail(err, REFIT_EIO, ST_R_FILE_CHANGED, f->path, NULL,
                           "file shrank while reading at byte %llu", (unsigned long long)off);
        p += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return REFIT_OK;
}

/* Opens, stats, reads the header and maps one file; fd and mapping are
 * recorded in the slot so that st_close() releases them on any failure. */
static int st_load_file(st_set *s, uint32_t fi, st_rule enoent_rule, st_error *err)
{
    struct st_file *f = &s->files[fi];
    /* O_NONBLOCK: a FIFO in a shard's place is refused below, not waited on */
    if ((f->fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)) < 0)
        return errno == ENOENT && enoent_rule != ST_R_IO
                   ? ST_CORRUPT(err, SHARD_MISSING, f->path, NULL,
                                "the index names this shard but it does not exist")
                   : st_io(err, f->path, "cannot open");
    if (fstat(f->fd, &f->st))
        return st_io(err, f->path, "cannot stat");
    if (!S_ISREG(f->st.st_mode))
        return st_fail(err, REFIT_EIO, ST_R_NOT_REGULAR, f->path, NULL, "not a regular file");
    f->size = (uint64_t)f->st.st_size;
    uint8_t first8[8];
    uint64_t n = 0;
    int rc = f->size >= 8 ? st_pread_all(f, first8, 8, 0, err) : REFIT_OK;
    if (!rc)
        rc = st_check_length(f, first8, &n, err);
    if (rc)
        return rc;
    void *map = mmap(NULL, (size_t)f->size, PROT_READ, MAP_SHARED, f->fd, 0);
    if (map == MAP_FAILED)
        return st_io(err, f->path, "cannot map");
    f->base = map;
    f->mapped = true;
    uint8_t *hdr = malloc(n ? (size_t)n : 1);
    if (!hdr)
        return ST_NOMEM(err, f->path);
    rc = st_pread_all(f, hdr, (size_t)n, 8, err);
    if (!rc)
        rc = st_parse_header(s, fi, hdr, n, err);
    free(hdr);
    return rc;
}

/* Opens one file into the set as its next file. */
static int st_add_file(st_set *s, const char *path, st_rule enoent_rule, st_error *err)
{
    int rc = st_add_slot(s, path, err);
    return rc ? rc : st_load_file(s, (uint32_t)(s->nfiles - 1), enoent_rule, err);
}

/* ---- index files ------------------------------------------------------- */

struct st_index {
    char *strings;               /* the index's decoded strings */
    const char **names;          /* weight_map keys, in document order */
    const char **files;          /* their values; NULL where not a string */
    uint32_t *shard;             /* per name: index into shards */
    size_t nnames, cap_names;
    uint32_t *slots;             /* names by hash: position + 1, 0 empty */
    size_t mask;
    uint64_t seed;
    const char **shards;         /* sorted, distinct; in strings */
    size_t nshards;
    int64_t total_size;          /* -1 when absent */
};

/* What the rules look at, read in one pass. */
struct st_index_read {
    jr_kind top, map, meta, total; /* JR_NONE: absent */
    int64_t total_value;
    size_t bad_value;            /* first weight_map value not a string */
    jr_kind bad_kind;
};

void st_index_free(st_index *ix)
{
    if (!ix)
        return;
    free(ix->strings);
    free(ix->names);
    free(ix->files);
    free(ix->shard);
    free(ix->slots);
    free(ix->shards);
    free(ix);
}

size_t st_index_shard_count(const st_index *ix) { return ix->nshards; }
size_t st_index_tensor_count(const st_index *ix) { return ix->nnames; }
int64_t st_index_total_size(const st_index *ix) { return ix->total_size; }

const char *st_index_shard(const st_index *ix, size_t i)
{
    return i < ix->nshards ? ix->shards[i] : NULL;
}

static int st_strptr_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

long st_index_shard_of(const st_index *ix, const char *name)
{
    if (!ix->slots || !name)
        return -1;
    for (size_t i = st_hash(ix->seed, name) & ix->mask;; i = (i + 1) & ix->mask) {
        uint32_t v = ix->slots[i];
        if (!v)
            return -1;
        if (!strcmp(ix->names[v - 1], name))
            return (long)ix->shard[v - 1];
    }
}

/* Shard names are joined to the index's directory: only plain names, so
 * an index cannot reach outside its checkpoint. */
static bool st_plain_name(const char *s)
{
    return s[0] && strcmp(s, ".") && strcmp(s, "..") && !strchr(s, '/');
}

static int st_index_read_map(jr_reader *r, st_index *ix, struct st_index_read *rd)
{
    uint32_t id;
    const char *key, *val;
    size_t len;
    int more;
    if (jr_object_begin(r, &id))
        return -1;
    while ((more = jr_object_next(r, id, &key, &len)) == 1) {
        size_t cap = ix->cap_names;
        if (st_grow((void **)&ix->names, &cap, ix->nnames + 1, sizeof *ix->names) ||
            st_grow((void **)&ix->files, &ix->cap_names, ix->nnames + 1, sizeof *ix->files)) {
            r->status = JR_NOMEM;
            return -1;
        }
        jr_kind k = jr_peek(r);
        val = NULL;
        if (k == JR_STRING ? jr_string(r, &val, &len) : jr_skip(r, &k))
            return -1;
        if (!val && rd->bad_value == SIZE_MAX) {
            rd->bad_value = ix->nnames;
            rd->bad_kind = k;
        }
        ix->names[ix->nnames] = key;
        ix->files[ix->nnames++] = val;
    }
    return more;
}

static int st_index_read_meta(jr_reader *r, struct st_index_read *rd)
{
    uint32_t id;
    const char *key;
    size_t len;
    int more;
    if (jr_object_begin(r, &id))
        return -1;
    while ((more = jr_object_next(r, id, &key, &len)) == 1) {
        jr_kind k = jr_peek(r);
        int rc = strcmp(key, "total_size") || k != JR_INTEGER
                     ? jr_skip(r, &k)
                     : jr_number(r, &k, &rd->total_value);
        if (rc)
            return -1;
        if (!strcmp(key, "total_size"))
            rd->total = k;
    }
    return more;
}

static int st_index_read(jr_reader *r, st_index *ix, struct st_index_read *rd)
{
    uint32_t id;
    const char *key;
    size_t len;
    int more;
    if (jr_top(r, &rd->top) ||
        (rd->top == JR_ARRAY ? jr_skip(r, NULL) : jr_object_begin(r, &id)))
        return -1;
    if (rd->top == JR_ARRAY)
        return jr_finish(r);
    while ((more = jr_object_next(r, id, &key, &len)) == 1) {
        bool map = !strcmp(key, "weight_map"), meta = !strcmp(key, "metadata");
        jr_kind k = jr_peek(r);
        int rc = map && k == JR_OBJECT    ? st_index_read_map(r, ix, rd)
                 : meta && k == JR_OBJECT ? st_index_read_meta(r, rd)
                                          : jr_skip(r, &k);
        if (rc)
            return -1;
        if (map)
            rd->map = k;
        else if (meta)
            rd->meta = k;
    }
    return more ? -1 : jr_finish(r);
}

/* The rules, in the order they were always checked. */
static int st_index_judge(st_index *ix, const struct st_index_read *rd, const char *label,
                          st_error *err)
{
    if (rd->top != JR_OBJECT)
        return ST_CORRUPT(err, INDEX_NOT_OBJECT, label, NULL,
                          "index is a JSON %s, not an object", jr_kind_name(rd->top));
    if (rd->map != JR_OBJECT)
        return ST_CORRUPT(err, INDEX_WEIGHT_MAP, label, NULL,
                          rd->map != JR_NONE ? "'weight_map' is not an object"
                                             : "missing 'weight_map'");
    ix->total_size = -1;
    if (rd->meta != JR_NONE && rd->meta != JR_NULL && rd->meta != JR_OBJECT)
        return ST_CORRUPT(err, INDEX_METADATA, label, NULL,
                          "'metadata' is a JSON %s, not an object", jr_kind_name(rd->meta));
    if (rd->meta == JR_OBJECT && rd->total != JR_NONE && rd->total != JR_NULL) {
        if (rd->total != JR_INTEGER || rd->total_value < 0)
            return ST_CORRUPT(err, INDEX_TOTAL_SIZE_TYPE, label, NULL,
                              "'metadata.total_size' is not a non-negative integer");
        ix->total_size = rd->total_value;
    }
    for (size_t i = 0; i < ix->nnames; i++) {
        if (i == rd->bad_value)
            return ST_CORRUPT(err, INDEX_SHARD_NAME, label, ix->names[i],
                              "weight_map value is a JSON %s, not a file name",
                              jr_kind_name(rd->bad_kind));
        if (!st_plain_name(ix->files[i]))
            return ST_CORRUPT(err, INDEX_SHARD_NAME, label, ix->names[i],
                              "shard '%s' is not a plain file name in the checkpoint directory",
                              ix->files[i]);
    }
    return REFIT_OK;
}

/* Distinct shards, sorted; each name's shard; the names' hash table. */
static int st_index_tables(st_index *ix, const char *label, st_error *err)
{
    size_t n = ix->nnames, slots = 16;
    while (slots < 2 * n)
        slots *= 2;
    if (n >= UINT32_MAX / 2 || !(ix->shards = malloc((n ? n : 1) * sizeof *ix->shards)) ||
        !(ix->shard = malloc((n ? n : 1) * sizeof *ix->shard)) ||
        !(ix->slots = calloc(slots, sizeof *ix->slots)))
        return ST_NOMEM(err, label);
    /* shard names repeat in long runs: sort only the changes */
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!k || strcmp(ix->shards[k - 1], ix->files[i]))
            ix->shards[k++] = ix->files[i];
    qsort(ix->shards, k, sizeof *ix->shards, st_strptr_cmp);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (!u || strcmp(ix->shards[u - 1], ix->shards[i]))
            ix->shards[u++] = ix->shards[i];
    ix->nshards = u;
    ix->mask = slots - 1;
    for (size_t i = 0; i < n; i++) {
        const char **hit = bsearch(&ix->files[i], ix->shards, u, sizeof *ix->shards,
                                   st_strptr_cmp);
        ix->shard[i] = (uint32_t)(hit - ix->shards);
        size_t j = st_hash(ix->seed, ix->names[i]) & ix->mask;
        while (ix->slots[j])
            j = (j + 1) & ix->mask;
        ix->slots[j] = (uint32_t)(i + 1);
    }
    return REFIT_OK;
}

int st_index_parse(st_index **out, const void *json, size_t len, const char *label,
                   st_error *err)
{
    *out = NULL;
    st_index *ix = calloc(1, sizeof *ix);
    if (!ix)
        return ST_NOMEM(err, label);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ix->seed = (uint64_t)(uintptr_t)ix ^ ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec;
    struct st_index_read rd = {.bad_value = SIZE_MAX};
    jr_reader r;
    int rc;
    if (jr_init(&r, json, len))
        rc = ST_NOMEM(err, label);
    else if (st_index_read(&r, ix, &rd))
        rc = st_json_error(label, "index", &r, err);
    else
        rc = st_index_judge(ix, &rd, label, err);
    ix->strings = r.arena; /* names and shards point into it */
    r.arena = NULL;
    jr_free(&r);
    if (!rc)
        rc = st_index_tables(ix, label, err);
    if (rc) {
        st_index_free(ix);
        return rc;
    }
    *out = ix;
    return REFIT_OK;
}

/* ---- directories ------------------------------------------------------- */

static char *st_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    }
    return p;
}

/* Reads a whole small file (the index) into a fresh buffer. */
static int st_slurp(const char *path, char **buf, size_t *len, st_error *err)
{
    struct st_file f = {.path = (char *)path,
                        .fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
    if (f.fd < 0)
        return st_io(err, path, "cannot open");
    int rc = REFIT_OK;
    if (fstat(f.fd, &f.st))
        rc = st_io(err, path, "cannot stat");
    else if (!S_ISREG(f.st.st_mode))
        rc = st_fail(err, REFIT_EIO, ST_R_NOT_REGULAR, path, NULL, "not a regular file");
    else if (f.st.st_size > (off_t)ST_MAX_HEADER)
        rc = ST_CORRUPT(err, INDEX_TOO_LARGE, path, NULL,
                        "index has %lld bytes, more than the limit of %llu",
                        (long long)f.st.st_size, ST_MAX_HEADER);
    else if (!(*buf = malloc((size_t)f.st.st_size + 1)))
        rc = ST_NOMEM(err, path);
    else if ((rc = st_pread_all(&f, *buf, (size_t)f.st.st_size, 0, err))) {
        free(*buf);
        *buf = NULL;
    }
    *len = (size_t)f.st.st_size;
    close(f.fd);
    return rc;
}

/* Every tensor of every shard sits where the index says, and the index
 * lists nothing that no shard holds. */
static int st_match_index(const st_set *s, const st_index *ix, const char *label,
                          st_error *err)
{
    uint64_t total = 0;
    for (size_t i = 0; i < s->ntensors; i++) {
        const st_tensor *t = &s->tensors[i];
        long k = st_index_shard_of(ix, t->name);
        if (k < 0)
            return ST_CORRUPT(err, SHARD_EXTRA_TENSOR, s->files[t->file].path, t->name,
                              "shard holds a tensor that the index does not list");
        if ((size_t)k != t->file)
            return ST_CORRUPT(err, SHARD_MISPLACED_TENSOR, s->files[t->file].path, t->name,
                              "the index places this tensor in '%s'", ix->shards[k]);
        if (__builtin_add_overflow(total, t->nbytes, &total))
            return ST_CORRUPT(err, INDEX_TOTAL_SIZE, label, NULL, "tensor bytes overflow");
    }
    for (size_t i = 0; i < ix->nnames; i++) {
        const char *name = ix->names[i];
        if (!st_find(s, name))
            return ST_CORRUPT(err, SHARD_MISSING_TENSOR, s->files[st_index_shard_of(ix, name)].path,
                              name, "the index places this tensor here but the shard lacks it");
    }
    if (ix->total_size >= 0 && (uint64_t)ix->total_size != total)
        return ST_CORRUPT(err, INDEX_TOTAL_SIZE, label, NULL,
                          "metadata.total_size is %lld but the shards' tensors hold %llu bytes",
                          (long long)ix->total_size, (unsigned long long)total);
    return REFIT_OK;
}

static int st_open_sharded(st_set *s, const char *dir, const char *ixpath, st_error *err)
{
    char *buf = NULL;
    size_t len = 0;
    st_index *ix = NULL;
    int rc = st_slurp(ixpath, &buf, &len, err);
    if (!rc)
        rc = st_index_parse(&ix, buf, len, ixpath, err);
    free(buf);
    for (size_t i = 0; !rc && i < ix->nshards; i++) {
        char *path = st_join(dir, ix->shards[i]);
        rc = path ? st_add_file(s, path, ST_R_SHARD_MISSING, err) : ST_NOMEM(err, dir);
        free(path);
    }
    if (!rc)
        rc = st_build_index(s, err);
    if (!rc)
        rc = st_match_index(s, ix, ixpath, err);
    st_index_free(ix);
    return rc;
}

static bool st_has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* No index: the directory must hold exactly one .safetensors file. */
static int st_open_lone(st_set *s, const char *dir, st_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return st_io(err, dir, "cannot list directory");
    char *found = NULL;
    size_t count = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (st_has_suffix(e->d_name, ".safetensors") && count++ == 0)
            found = strdup(e->d_name);
    closedir(d);
    int rc = REFIT_OK;
    if (count == 0)
        rc = ST_CORRUPT(err, DIR_EMPTY, dir, NULL, "directory has no %s and no .safetensors file",
                        ST_INDEX_NAME);
    else if (count > 1)
        rc = ST_CORRUPT(err, DIR_AMBIGUOUS, dir, NULL,
                        "directory has %zu .safetensors files and no %s", count, ST_INDEX_NAME);
    else if (!found)
        rc = ST_NOMEM(err, dir);
    char *path = rc ? NULL : st_join(dir, found);
    if (!rc)
        rc = path ? st_add_file(s, path, ST_R_IO, err) : ST_NOMEM(err, dir);
    if (!rc)
        rc = st_build_index(s, err);
    free(path);
    free(found);
    return rc;
}

static int st_open_dir(st_set *s, const char *dir, st_error *err)
{
    char *ixpath = st_join(dir, ST_INDEX_NAME);
    if (!ixpath)
        return ST_NOMEM(err, dir);
    struct stat st;
    int rc;
    if (!stat(ixpath, &st))
        rc = st_open_sharded(s, dir, ixpath, err);
    else if (errno == ENOENT)
        rc = st_open_lone(s, dir, err);
    else
        rc = st_io(err, ixpath, "cannot stat");
    free(ixpath);
    return rc;
}

/* The index file itself names its checkpoint: its shards sit beside it. */
static int st_open_index_path(st_set *s, const char *ixpath, st_error *err)
{
    char *dir = strdup(ixpath);
    if (!dir)
        return ST_NOMEM(err, ixpath);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    int rc = st_open_sharded(s, slash ? (slash == dir ? "/" : dir) : ".", ixpath, err);
    free(dir);
    return rc;
}

/* ---- entry points ------------------------------------------------------ */

static void st_clear(st_error *err)
{
    if (err)
        memset(err, 0, sizeof *err);
}

int st_open(st_set **out, const char *path, st_error *err)
{
    st_clear(err);
    if (!out || !path)
        return st_fail(err, REFIT_EINVAL, ST_R_INVALID_ARG, path, NULL, "NULL argument");
    *out = NULL;
    st_set *s = st_set_new();
    if (!s)
        return ST_NOMEM(err, path);
    struct stat st;
    int rc;
    if (stat(path, &st))
        rc = st_io(err, path, "cannot stat");
    else if (S_ISDIR(st.st_mode))
        rc = st_open_dir(s, path, err);
    else if (st_has_suffix(path, ".index.json"))
        rc = st_open_index_path(s, path, err);
    else if ((rc = st_add_file(s, path, ST_R_IO, err)) == REFIT_OK)
        rc = st_build_index(s, err);
    if (rc) {
        st_close(s);
        return rc;
    }
    *out = s;
    return REFIT_OK;
}

static int st_load_memory(st_set *s, const void *buf, size_t len, st_error *err)
{
    struct st_file *f = &s->files[0];
    f->base = buf;
    f->size = len;
    uint64_t n = 0;
    int rc = st_check_length(f, buf, &n, err);
    if (!rc)
        rc = st_parse_header(s, 0, f->base + 8, n, err);
    if (!rc)
        rc = st_build_index(s, err);
    return rc;
}

int st_open_memory(st_set **out, const void *buf, size_t len, const char *label,
                   st_error *err)
{
    st_clear(err);
    if (!out || (!buf && len))
        return st_fail(err, REFIT_EINVAL, ST_R_INVALID_ARG, label, NULL, "NULL argument");
    *out = NULL;
    if (!label)
        label = "<memory>";
    st_set *s = st_set_new();
    int rc = s ? st_add_slot(s, label, err) : ST_NOMEM(err, label);
    if (!rc)
        rc = st_load_memory(s, buf, len, err);
    if (rc) {
        st_close(s);
        return rc;
    }
    *out = s;
    return REFIT_OK;
}

/* ---- after open -------------------------------------------------------- */

static bool st_same_time(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

static int st_recheck_file(const struct st_file *f, st_error *err)
{
    struct stat now, named;
    if (fstat(f->fd, &now))
        return st_io(err, f->path, "cannot stat");
    if ((uint64_t)now.st_size != f->size)
        return st_fail(err, REFIT_EIO, ST_R_FILE_CHANGED, f->path, NULL,
                       "file size changed from %llu to %llu bytes since open",
                       (unsigned long long)f->size, (unsigned long long)now.st_size);
    if (!st_same_time(&now.st_mtim, &f->st.st_mtim))
        return st_fail(err, REFIT_EIO, ST_R_FILE_CHANGED, f->path, NULL,
                       "file was modified since open (mtime changed)");
    if (stat(f->path, &named))
        return st_fail(err, REFIT_EIO, ST_R_FILE_CHANGED, f->path, NULL,
                       "file no longer exists at its path: %s", strerror(errno));
    if (named.st_ino != f->st.st_ino || named.st_dev != f->st.st_dev)
        return st_fail(err, REFIT_EIO, ST_R_FILE_CHANGED, f->path, NULL,
                       "path now names another file (replaced since open)");
    return REFIT_OK;
}

int st_set_recheck(const st_set *s, st_error *err)
{
    st_clear(err);
    for (size_t i = 0; i < s->nfiles; i++) {
        if (s->files[i].fd < 0)
            continue; /* a caller's buffer: the caller owns its stability */
        int rc = st_recheck_file(&s->files[i], err);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

/* Hashes through pread (a file truncated meanwhile is an error, never a
 * fault), in 4 MiB reads straight into the hash: the digest covers exactly
 * the size seen at open. */
static int st_hash_fd(const struct st_file *f, uint8_t digest[ST_SHA256_DIGEST],
                      st_error *err)
{
    enum { CHUNK = 4 << 20 };
    uint8_t *buf = malloc(CHUNK);
    st_sha256_ctx c;
    if (!buf || st_sha256_init(&c)) {
        free(buf);
        return ST_NOMEM(err, f->path);
    }
    int rc = REFIT_OK;
    for (uint64_t off = 0; !rc && off < f->size; off += CHUNK) {
        size_t n = f->size - off < CHUNK ? (size_t)(f->size - off) : CHUNK;
        rc = st_pread_all(f, buf, n, off, err);
        if (!rc && st_sha256_update(&c, buf, n))
            rc = ST_NOMEM(err, f->path);
    }
    free(buf);
    if (!rc)
        rc = st_recheck_file(f, err);
    if (rc) {
        st_sha256_free(&c);
        return rc;
    }
    return st_sha256_final(&c, digest) ? ST_NOMEM(err, f->path) : REFIT_OK;
}

int st_file_sha256(st_set *s, size_t i, char hex[ST_SHA256_HEX], st_error *err)
{
    st_clear(err);
    if (i >= s->nfiles)
        return st_fail(err, REFIT_EINVAL, ST_R_INVALID_ARG, NULL, NULL,
                       "file index %zu out of range (%zu files)", i, s->nfiles);
    struct st_file *f = &s->files[i];
    if (!f->sha_done) {
        uint8_t d[ST_SHA256_DIGEST];
        if (f->fd < 0) {
            if (st_sha256_buf(f->base, (size_t)f->size, d))
                return ST_NOMEM(err, f->path);
        } else {
            int rc = st_hash_fd(f, d, err);
            if (rc)
                return rc;
        }
        st_sha256_hex(d, f->sha);
        f->sha_done = true;
    }
    memcpy(hex, f->sha, ST_SHA256_HEX);
    return REFIT_OK;
}
