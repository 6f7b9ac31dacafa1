/* The reader's JSON stage as it was before core/json_reader: jansson's
 * json_loadb(JSON_REJECT_DUPLICATES), then the same rules in the same
 * order. Kept here only as the reference of test_json_diff. */
#include "jansson_ref.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ref_fail(struct ref_result *o, st_rule rule, const char *fmt, ...)
{
    o->rule = rule;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->message, sizeof o->message, fmt, ap);
    va_end(ap);
    return -1;
}

static const char *kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "real number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    default: return "null";
    }
}

static int json_fail(struct ref_result *o, const json_error_t *je)
{
    switch (json_error_code(je)) {
    case json_error_invalid_utf8: return ref_fail(o, ST_R_JSON_UTF8, "%s", je->text);
    case json_error_duplicate_key: return ref_fail(o, ST_R_DUPLICATE_KEY, "%s", je->text);
    default: return ref_fail(o, ST_R_JSON_SYNTAX, "%s", je->text);
    }
}

static int entry(struct ref_result *o, const char *name, json_t *v, struct ref_tensor *t)
{
    if (!json_is_object(v))
        return ref_fail(o, ST_R_ENTRY_TYPE, "entry is a JSON %s, not an object", kind(v));
    static const char *const fields[] = {"dtype", "shape", "data_offsets"};
    for (size_t i = 0; i < 3; i++)
        if (!json_object_get(v, fields[i]))
            return ref_fail(o, ST_R_MISSING_FIELD, "missing field '%s'", fields[i]);
    json_t *d = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *of = json_object_get(v, "data_offsets");
    if (!json_is_string(d))
        return ref_fail(o, ST_R_DTYPE_TYPE, "'dtype' is a JSON %s, not a string", kind(d));
    if (st_dtype_from_name(json_string_value(d), &t->dtype))
        return ref_fail(o, ST_R_DTYPE_UNKNOWN, "unknown dtype '%s'", json_string_value(d));
    if (!json_is_array(sh))
        return ref_fail(o, ST_R_SHAPE_TYPE, "'shape' is a JSON %s, not an array", kind(sh));
    size_t n = json_array_size(sh);
    if (n > ST_MAX_DIMS)
        return ref_fail(o, ST_R_SHAPE_RANK, "shape has %zu dimensions; at most %d are supported",
                        n, ST_MAX_DIMS);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(sh, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return ref_fail(o, ST_R_SHAPE_DIM, "shape[%zu] is not a non-negative integer", i);
        t->shape[i] = json_integer_value(x);
    }
    t->ndim = (int)n;
    if (!json_is_array(of) || json_array_size(of) != 2)
        return ref_fail(o, ST_R_OFFSETS_TYPE, "'data_offsets' is not an array of two integers");
    for (size_t i = 0; i < 2; i++) {
        json_t *x = json_array_get(of, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return ref_fail(o, ST_R_OFFSET_VALUE,
                            "data_offsets[%zu] is not a non-negative integer", i);
    }
    t->begin = (uint64_t)json_integer_value(json_array_get(of, 0));
    t->end = (uint64_t)json_integer_value(json_array_get(of, 1));
    snprintf(t->name, sizeof t->name, "%s", name);
    return 0;
}

static int metadata(struct ref_result *o, json_t *v)
{
    if (json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return ref_fail(o, ST_R_METADATA_TYPE, "'__metadata__' is a JSON %s, not an object",
                        kind(v));
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        if (!json_is_string(val))
            return ref_fail(o, ST_R_METADATA_VALUE,
                            "'__metadata__' value of key '%s' is a JSON %s, not a string", key,
                            kind(val));
        if (o->nmeta < REF_MAX) {
            snprintf(o->meta_key[o->nmeta], sizeof o->meta_key[0], "%s", key);
            snprintf(o->meta_val[o->nmeta++], sizeof o->meta_val[0], "%s",
                     json_string_value(val));
        }
    }
    return 0;
}

int ref_header(const void *hdr, size_t n, struct ref_result *o)
{
    memset(o, 0, sizeof *o);
    json_error_t je;
    json_t *root = json_loadb(hdr, n, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return json_fail(o, &je);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = ref_fail(o, ST_R_HEADER_NOT_OBJECT, "header is a JSON %s, not an object",
                      kind(root));
    } else {
        const char *key;
        json_t *val;
        json_object_foreach(root, key, val) {
            if (!strcmp(key, "__metadata__"))
                rc = metadata(o, val);
            else if (o->ntensors < REF_MAX)
                rc = entry(o, key, val, &o->tensors[o->ntensors++]);
            else
                rc = ref_fail(o, ST_R_NOMEM, "too many tensors for the reference");
            if (rc)
                break;
        }
    }
    json_decref(root);
    return rc;
}

int ref_index(const void *text, size_t n, struct ref_result *o)
{
    memset(o, 0, sizeof *o);
    o->total_size = -1;
    json_error_t je;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &je), *wm = NULL;
    if (!root)
        return json_fail(o, &je);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = ref_fail(o, ST_R_INDEX_NOT_OBJECT, "index is a JSON %s, not an object", kind(root));
    } else if (!json_is_object(wm = json_object_get(root, "weight_map"))) {
        rc = ref_fail(o, ST_R_INDEX_WEIGHT_MAP,
                      wm ? "'weight_map' is not an object" : "missing 'weight_map'");
    } else {
        json_t *md = json_object_get(root, "metadata"), *ts = NULL;
        if (md && !json_is_null(md) && !json_is_object(md))
            rc = ref_fail(o, ST_R_INDEX_METADATA, "'metadata' is a JSON %s, not an object",
                          kind(md));
        else if (md && (ts = json_object_get(md, "total_size")) && !json_is_null(ts) &&
                 (!json_is_integer(ts) || json_integer_value(ts) < 0))
            rc = ref_fail(o, ST_R_INDEX_TOTAL_SIZE_TYPE,
                          "'metadata.total_size' is not a non-negative integer");
        else if (ts && json_is_integer(ts))
            o->total_size = json_integer_value(ts);
        const char *key;
        json_t *val;
        json_object_foreach(wm, key, val) {
            if (rc)
                break;
            const char *f = json_string_value(val);
            if (!f)
                rc = ref_fail(o, ST_R_INDEX_SHARD_NAME,
                              "weight_map value is a JSON %s, not a file name", kind(val));
            else if (!f[0] || !strcmp(f, ".") || !strcmp(f, "..") || strchr(f, '/'))
                rc = ref_fail(o, ST_R_INDEX_SHARD_NAME,
                              "shard '%s' is not a plain file name in the checkpoint directory",
                              f);
            else if (o->ntensors < REF_MAX) {
                struct ref_tensor *t = &o->tensors[o->ntensors++];
                snprintf(t->name, sizeof t->name, "%s", key);
                snprintf(t->shard, sizeof t->shard, "%s", f);
            }
        }
    }
    json_decref(root);
    return rc;
}
