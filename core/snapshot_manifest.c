#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <refit/refit.h>

#include "core/sha256.h"
#include "core/snapshot_manifest.h"

/* The digest of root's canonical text (sorted keys, compact) without the
 * checksum member. 0, or -1 (out of memory). */
static int canonical_digest(const json_t *root, char hex[ST_SHA256_HEX])
{
    json_t *copy = json_copy((json_t *)root);
    if (!copy)
        return -1;
    json_object_del(copy, SNAP_CHECKSUM_KEY);
    char *text = json_dumps(copy, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(copy);
    uint8_t d[ST_SHA256_DIGEST];
    int rc = text && !st_sha256_buf(text, strlen(text), d) ? 0 : -1;
    free(text);
    if (!rc)
        st_sha256_hex(d, hex);
    return rc;
}

int snap_manifest_write(const char *path, json_t *root, char *err, size_t n)
{
    char hex[ST_SHA256_HEX];
    if (canonical_digest(root, hex) ||
        json_object_set_new(root, SNAP_CHECKSUM_KEY, json_string(hex))) {
        snprintf(err, n, "%s: out of memory", path);
        return -1;
    }
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS);
    FILE *f = text ? fopen(path, "wb") : NULL;
    int bad = !f || fputs(text, f) < 0 || fputc('\n', f) < 0 || fflush(f) || fsync(fileno(f));
    int e = errno;
    if (f && fclose(f))
        bad = 1;
    free(text);
    if (bad)
        snprintf(err, n, "%s: cannot write: %s", path, text ? strerror(e) : "out of memory");
    return bad ? -1 : 0;
}

int snap_manifest_read(const char *path, json_t **out, char *err, size_t n)
{
    *out = NULL;
    json_error_t je;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, n, "%s: cannot open: %s", path, strerror(errno));
        return REFIT_EIO;
    }
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &je);
    fclose(f);
    if (!root || !json_is_object(root)) {
        snprintf(err, n, "%s: not a snapshot manifest: %s (line %d)", path,
                 root ? "not a JSON object" : je.text, root ? 1 : je.line);
        json_decref(root);
        return REFIT_ECORRUPT;
    }
    json_int_t fmt = json_integer_value(json_object_get(root, "refit_snapshot"));
    const char *sum = json_string_value(json_object_get(root, SNAP_CHECKSUM_KEY));
    char hex[ST_SHA256_HEX];
    int rc = REFIT_OK;
    if (fmt != SNAP_FORMAT) {
        snprintf(err, n, "%s: refit_snapshot is %lld; this refit reads format %d", path,
                 (long long)fmt, SNAP_FORMAT);
        rc = fmt > SNAP_FORMAT ? REFIT_EUNSUPPORTED : REFIT_ECORRUPT;
    } else if (!sum) {
        snprintf(err, n, "%s: no %s", path, SNAP_CHECKSUM_KEY);
        rc = REFIT_ECORRUPT;
    } else if (canonical_digest(root, hex)) {
        snprintf(err, n, "%s: out of memory", path);
        rc = REFIT_ENOMEM;
    } else if (strcmp(hex, sum)) {
        snprintf(err, n, "%s: the manifest was changed: its content hashes to %.16s..., "
                 "%s says %.16s...", path, hex, SNAP_CHECKSUM_KEY, sum);
        rc = REFIT_ECORRUPT;
    }
    if (rc)
        json_decref(root);
    else
        *out = root;
    return rc;
}

/* ---- the first difference ---- */

static void value_text(const json_t *v, char *buf, size_t n)
{
    if (!v) {
        snprintf(buf, n, "(absent)");
        return;
    }
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS);
    snprintf(buf, n, "%s%s", t ? t : "?", t && strlen(t) >= n ? "..." : "");
    free(t);
}

static int differ(const char *path, const json_t *a, const json_t *b, char *out, size_t n)
{
    char va[160], vb[160];
    value_text(a, va, sizeof va);
    value_text(b, vb, sizeof vb);
    snprintf(out, n, "%s: snapshot %s, this worker %s", *path ? path : "(top)", va, vb);
    return 1;
}

static int diff_at(const char *path, const json_t *a, const json_t *b, char *out, size_t n);

/* path + suffix, then compare. */
static int diff_child(const char *path, const char *fmt, const char *arg, long long i,
                      const json_t *a, const json_t *b, char *out, size_t n)
{
    char sub[1024];
    int len = snprintf(sub, sizeof sub, "%s", path);
    if (len < 0 || (size_t)len >= sizeof sub)
        len = (int)sizeof sub - 1;
    if (arg)
        snprintf(sub + len, sizeof sub - (size_t)len, fmt, arg);
    else
        snprintf(sub + len, sizeof sub - (size_t)len, fmt, i);
    /* an element with a name says which */
    const char *name = json_string_value(json_object_get(a, "name"));
    if (!arg && name) {
        size_t l = strlen(sub);
        snprintf(sub + l, sizeof sub - l, " (%s)", name);
    }
    return diff_at(sub, a, b, out, n);
}

static int diff_at(const char *path, const json_t *a, const json_t *b, char *out, size_t n)
{
    if (!a || !b || json_typeof(a) != json_typeof(b))
        return differ(path, a, b, out, n);
    if (json_is_object(a)) {
        const json_t *na = json_object_get(a, "name"), *nb = json_object_get(b, "name");
        if ((na || nb) && !json_equal((json_t *)na, (json_t *)nb))
            return diff_child(path, "%s", *path ? ".name" : "name", 0, na, nb, out, n);
        const char *key;
        json_t *v;
        void *tmp;
        json_object_foreach_safe((json_t *)a, tmp, key, v) {
            if (diff_child(path, *path ? ".%s" : "%s", key, 0, v, json_object_get(b, key), out,
                           n))
                return 1;
        }
        json_object_foreach_safe((json_t *)b, tmp, key, v) {
            if (!json_object_get(a, key))
                return diff_child(path, *path ? ".%s" : "%s", key, 0, NULL, v, out, n);
        }
        return 0;
    }
    if (json_is_array(a)) {
        size_t la = json_array_size(a), lb = json_array_size(b);
        for (size_t i = 0; i < la && i < lb; i++)
            if (diff_child(path, "[%lld]", NULL, (long long)i, json_array_get(a, i),
                           json_array_get(b, i), out, n))
                return 1;
        if (la != lb) {
            snprintf(out, n, "%s: snapshot has %zu entries, this worker %zu",
                     *path ? path : "(top)", la, lb);
            return 1;
        }
        return 0;
    }
    return json_equal((json_t *)a, (json_t *)b) ? 0 : differ(path, a, b, out, n);
}

int snap_json_diff(const json_t *a, const json_t *b, char *out, size_t n)
{
    if (n)
        out[0] = '\0';
    return diff_at("", a, b, out, n);
}
