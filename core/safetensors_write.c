#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "core/safetensors_write.h"

static int werr(st_error *e, int status, st_rule rule, const char *path, const char *tensor,
                const char *msg)
{
    e->status = status;
    e->rule = rule;
    snprintf(e->file, sizeof e->file, "%s", path);
    snprintf(e->tensor, sizeof e->tensor, "%s", tensor ? tensor : "");
    snprintf(e->message, sizeof e->message, "%s", msg);
    return status;
}

static int tensor_bytes(const st_out_tensor *t, uint64_t *out)
{
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || (t->shape[i] && n > UINT64_MAX / (uint64_t)t->shape[i]))
            return -1;
        n *= (uint64_t)t->shape[i];
    }
    unsigned bits = st_dtype_bits(t->dtype);
    if (!bits || n > UINT64_MAX / bits || (n * bits) % 8)
        return -1;
    *out = n * bits / 8;
    return 0;
}

/* The header object; *total: OUT, data bytes. */
static json_t *header_json(const st_out_tensor *t, size_t n, const char *const *meta,
                           size_t n_meta, uint64_t *total, size_t *bad)
{
    json_t *h = json_object();
    if (n_meta) {
        json_t *m = json_object();
        for (size_t i = 0; i + 1 < n_meta * 2; i += 2)
            json_object_set_new(m, meta[i], json_string(meta[i + 1]));
        json_object_set_new(h, "__metadata__", m);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t nb;
        if (tensor_bytes(&t[i], &nb) || t[i].ndim > ST_MAX_DIMS) {
            *bad = i;
            json_decref(h);
            return NULL;
        }
        json_t *e = json_object(), *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++)
            json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_object_set_new(e, "dtype", json_string(st_dtype_name(t[i].dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets",
                            json_pack("[II]", (json_int_t)off, (json_int_t)(off + nb)));
        json_object_set_new(h, t[i].name, e);
        off += nb;
    }
    *total = off;
    return h;
}

static int write_all(FILE *f, const void *p, size_t n)
{
    return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1;
}

static int write_file(const char *path, const st_out_tensor *t, size_t n,
                      const char *const *meta, size_t n_meta, st_bytes_fn bytes, void *user,
                      st_error *err);

int st_write_file(const char *path, const st_out_tensor *t, size_t n,
                  const char *const *meta, size_t n_meta, st_error *err)
{
    return write_file(path, t, n, meta, n_meta, NULL, NULL, err);
}

int st_write_file_from(const char *path, const st_out_tensor *t, size_t n,
                       const char *const *meta, size_t n_meta, st_bytes_fn bytes, void *user,
                       st_error *err)
{
    return write_file(path, t, n, meta, n_meta, bytes, user, err);
}

static int write_file(const char *path, const st_out_tensor *t, size_t n,
                      const char *const *meta, size_t n_meta, st_bytes_fn bytes, void *user,
                      st_error *err)
{
    uint64_t total = 0;
    size_t bad = 0;
    json_t *h = header_json(t, n, meta, n_meta, &total, &bad);
    if (!h)
        return werr(err, REFIT_EINVAL, ST_R_SIZE_OVERFLOW, path, n ? t[bad].name : NULL,
                    "tensor size invalid or overflows");
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!text)
        return werr(err, REFIT_ENOMEM, ST_R_NOMEM, path, NULL, "out of memory");
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    int rc = REFIT_OK;
    if (!f) {
        rc = werr(err, REFIT_EIO, ST_R_IO, path, NULL, strerror(errno));
    } else {
        uint8_t le[8];
        for (int i = 0; i < 8; i++)
            le[i] = (uint8_t)((uint64_t)padded >> (8 * i));
        static const char spaces[8] = "        ";
        int bad_io = write_all(f, le, 8) || write_all(f, text, len) ||
                     write_all(f, spaces, padded - len);
        int fill_rc = REFIT_OK;
        for (size_t i = 0; i < n && !bad_io; i++) {
            uint64_t nb = 0; /* sizes were checked above */
            tensor_bytes(&t[i], &nb);
            const void *data = bytes ? bytes(user, i, &fill_rc) : t[i].data;
            if (!data && nb) {
                rc = werr(err, fill_rc ? fill_rc : REFIT_EIO, ST_R_IO, path, t[i].name,
                          "reading the tensor's bytes failed");
                break;
            }
            bad_io = write_all(f, data, (size_t)nb);
        }
        if (!rc && !bad_io && bytes)
            bad_io = fflush(f) || fsync(fileno(f));
        if (fclose(f) || bad_io || rc || rename(tmp, path)) {
            if (!rc)
                rc = werr(err, REFIT_EIO, ST_R_IO, path, NULL, strerror(errno ? errno : EIO));
            remove(tmp);
        }
    }
    free(text);
    (void)total;
    return rc;
}
