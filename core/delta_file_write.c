/* Writing a delta file: refit_delta_file_write (format in delta_file.h).
 *
 * The rows are refit_load_deltas' rows, in host memory. What the writer
 * can check without the model is checked here (names, one row a tensor,
 * values 1-D and contiguous of a safetensors dtype, one value an element,
 * indices and counts not negative); ranges and duplicates are the
 * reader's (refit_load_deltas) to refuse. Tensors are laid out I64 first,
 * then values by element size, so every one of them is aligned in the
 * file's mapping. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/delta_file.h"
#include "core/safetensors_write.h"
#include "core/sha256.h"

typedef struct write_plan {
    st_out_tensor *t;           /* 2 or 3 a row */
    size_t n_t;
    char **names;               /* owned: tensor names, then metadata strings */
    size_t n_names;
    const char **meta;          /* key, value pairs */
    size_t n_meta;
    int64_t *lens;              /* per row: indices (or runs), values */
} write_plan;

static char *own(write_plan *w, const char *a, const char *b)
{
    size_t na = strlen(a), nb = b ? strlen(b) : 0;
    char *s = malloc(na + nb + 1);
    if (!s)
        return NULL;
    memcpy(s, a, na);
    memcpy(s + na, b ? b : "", nb + 1);
    w->names[w->n_names++] = s;
    return s;
}

static int st_dtype_of(refit_dtype dt, st_dtype *out)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        refit_dtype s = st_dtype_to_refit((st_dtype)i);
        if (s.code == dt.code && s.bits == dt.bits && dt.lanes == 1) {
            *out = (st_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* Row i checked; *n_vals: OUT, its values. */
static int check_row(refit_ctx *ctx, const refit_delta *rows, size_t i, int64_t *n_vals,
                     st_dtype *dt)
{
    const refit_delta *r = &rows[i];
    if (!r->name || !*r->name)
        return ctx_error(ctx, REFIT_EINVAL, "delta_file_write: row %zu has no name", i);
    for (size_t j = 0; j < i; j++)
        if (!strcmp(rows[j].name, r->name))
            return ctx_error(ctx, REFIT_EDUPLICATE, "delta_file_write: row %zu (%s): rows %zu "
                             "and %zu patch the same tensor", i, r->name, j, i);
    if (r->n && !r->indices)
        return ctx_error(ctx, REFIT_EINVAL, "delta_file_write: row %zu (%s): indices NULL for "
                         "%zu entries", i, r->name, r->n);
    const refit_tensor *v = r->values;
    if (!v || v->ndim != 1 || (v->shape[0] && !v->data) ||
        (v->strides && v->shape[0] > 1 && v->strides[0] != 1))
        return ctx_error(ctx, REFIT_EINVAL, "delta_file_write: row %zu (%s): values must be "
                         "a contiguous 1-D tensor", i, r->name);
    if (v->device.device_type != REFIT_DEVICE_CPU &&
        v->device.device_type != REFIT_DEVICE_CUDA_HOST)
        return ctx_error(ctx, REFIT_EUNSUPPORTED, "delta_file_write: row %zu (%s): values "
                         "on device type %d; the writer reads host memory", i, r->name,
                         v->device.device_type);
    if (st_dtype_of(v->dtype, dt) || st_dtype_bits(*dt) % 8)
        return ctx_error(ctx, REFIT_EUNSUPPORTED, "delta_file_write: row %zu (%s): values "
                         "of dtype %s have no byte-sized safetensors dtype", i, r->name,
                         refit_dtype_name(v->dtype));
    int64_t want = 0;
    for (size_t k = 0; k < r->n; k++) {
        int64_t c = r->counts ? r->counts[k] : 1;
        if (r->indices[k] < 0 || c < 1 || want > INT64_MAX - c)
            return ctx_error(ctx, REFIT_EINVAL, "delta_file_write: row %zu (%s): %s %zu is "
                             "%lld%s", i, r->name, r->counts ? "run" : "index", k,
                             (long long)(c < 1 ? c : r->indices[k]),
                             c < 1 ? " elements (at least 1)" : " (negative)");
        want += c;
    }
    if (v->shape[0] != want)
        return ctx_error(ctx, REFIT_EMISMATCH, "delta_file_write: row %zu (%s): %lld values "
                         "for %lld elements", i, r->name, (long long)v->shape[0],
                         (long long)want);
    *n_vals = want;
    return REFIT_OK;
}

static int sha_row(const refit_delta *r, size_t vbytes, char hex[ST_SHA256_HEX])
{
    st_sha256_ctx c;
    uint8_t d[ST_SHA256_DIGEST];
    const refit_tensor *v = r->values;
    if (st_sha256_init(&c))
        return -1;
    if (st_sha256_update(&c, r->indices, r->n * sizeof(int64_t)) ||
        (r->counts && st_sha256_update(&c, r->counts, r->n * sizeof(int64_t))) ||
        st_sha256_update(&c, (const char *)v->data + v->byte_offset, vbytes)) {
        st_sha256_free(&c);
        return -1;
    }
    if (st_sha256_final(&c, d))
        return -1;
    st_sha256_hex(d, hex);
    return 0;
}

/* The tensors (indices and counts, then values, larger elements first)
 * and the metadata. */
static int plan(refit_ctx *ctx, write_plan *w, const char *base, const char *version,
                size_t n, const refit_delta *rows)
{
    st_dtype *dts = calloc(n ? n : 1, sizeof *dts);
    if (!dts)
        return ctx_error(ctx, REFIT_ENOMEM, "delta_file_write: out of memory");
    int rc = REFIT_OK;
    for (size_t i = 0; i < n && !rc; i++)
        rc = check_row(ctx, rows, i, &w->lens[2 * i + 1], &dts[i]);
    char count[32], hex[ST_SHA256_HEX];
    snprintf(count, sizeof count, "%zu", n);
    const char *fixed[] = {DELTA_KEY_FORMAT, DELTA_FORMAT, DELTA_KEY_BASE, base,
                           DELTA_KEY_VERSION, version, DELTA_KEY_TENSORS, count};
    for (size_t i = 0; i < 8 && !rc; i++)
        if (!(w->meta[i] = own(w, fixed[i], NULL)))
            rc = ctx_error(ctx, REFIT_ENOMEM, "delta_file_write: out of memory");
    w->n_meta = 4;
    for (size_t i = 0; i < n && !rc; i++) {
        const refit_delta *r = &rows[i];
        w->lens[2 * i] = (int64_t)r->n;
        size_t vbytes = (size_t)w->lens[2 * i + 1] * (st_dtype_bits(dts[i]) / 8);
        if (sha_row(r, vbytes, hex))
            rc = ctx_error(ctx, REFIT_ENOMEM, "delta_file_write: out of memory");
        const char *key = rc ? NULL : own(w, DELTA_KEY_SHA256, r->name);
        const char *val = key ? own(w, hex, NULL) : NULL;
        const char *in = val ? own(w, r->name, DELTA_SUFFIX_INDICES) : NULL;
        const char *cn = in && r->counts ? own(w, r->name, DELTA_SUFFIX_COUNTS) : in;
        if (!rc && !cn)
            rc = ctx_error(ctx, REFIT_ENOMEM, "delta_file_write: out of memory");
        if (rc)
            break;
        w->meta[2 * w->n_meta] = key;
        w->meta[2 * w->n_meta + 1] = val;
        w->n_meta++;
        w->t[w->n_t++] = (st_out_tensor){in, ST_I64, 1, &w->lens[2 * i], r->indices};
        if (r->counts)
            w->t[w->n_t++] = (st_out_tensor){cn, ST_I64, 1, &w->lens[2 * i], r->counts};
    }
    /* values after every I64, by element size, larger first */
    for (unsigned bits = 64; bits >= 8 && !rc; bits /= 2)
        for (size_t i = 0; i < n && !rc; i++) {
            if (st_dtype_bits(dts[i]) != bits)
                continue;
            const char *vn = own(w, rows[i].name, DELTA_SUFFIX_VALUES);
            if (!vn)
                rc = ctx_error(ctx, REFIT_ENOMEM, "delta_file_write: out of memory");
            else
                w->t[w->n_t++] = (st_out_tensor){vn, dts[i], 1, &w->lens[2 * i + 1],
                                                 (const char *)rows[i].values->data +
                                                     rows[i].values->byte_offset};
        }
    free(dts);
    return rc;
}

int refit_delta_file_write(refit_ctx *ctx, const char *path, const char *base_version,
                           const char *version, size_t n, const refit_delta *rows)
{
    if (!ctx)
        return REFIT_EINVAL;
    ctx_clear_error(ctx);
    if (!path || !base_version || !version || !*base_version || !*version || (n && !rows))
        return ctx_error(ctx, REFIT_EINVAL, "delta_file_write: path, base_version and version "
                         "are required (and rows for %zu rows)", n);
    if (strlen(base_version) > REFIT_VERSION_LABEL_MAX || strlen(version) > REFIT_VERSION_LABEL_MAX)
        return ctx_error(ctx, REFIT_EINVAL, "delta_file_write: a version label is longer than "
                         "%d bytes", REFIT_VERSION_LABEL_MAX);
    if (n > SIZE_MAX / 8 / sizeof(char *))
        return ctx_error(ctx, REFIT_EINVAL, "delta_file_write: %zu rows", n);
    write_plan w = {0};
    w.t = calloc(3 * n + 1, sizeof *w.t);
    w.names = calloc(6 * n + 8, sizeof *w.names);
    w.meta = calloc(2 * n + 8, sizeof *w.meta);
    w.lens = calloc(2 * n + 1, sizeof *w.lens);
    int rc = w.t && w.names && w.meta && w.lens
                 ? plan(ctx, &w, base_version, version, n, rows)
                 : ctx_error(ctx, REFIT_ENOMEM, "delta_file_write: out of memory");
    if (!rc) {
        st_error e;
        char line[2048];
        if ((rc = st_write_file(path, w.t, w.n_t, w.meta, w.n_meta, &e)))
            ctx_error(ctx, rc, "delta_file_write: %s", st_error_line(&e, line, sizeof line));
    }
    for (size_t i = 0; i < w.n_names; i++)
        free(w.names[i]);
    free(w.names);
    free(w.t);
    free(w.meta);
    free(w.lens);
    return rc;
}
