/*
 * refitctl convert: quantize a BF16/F16/F32 safetensors checkpoint offline.
 *
 *   refitctl convert --format NAME [--param KEY=VALUE]... IN OUT
 *
 * Each 2-D floating `*.weight` of a linear layer is quantized with the very
 * kernel the format plugin runs at post-load on an online (STAGED) weight
 * (kernels/quant_*.h), and written under the names the plugin reads a
 * serialized checkpoint by; every other tensor is copied byte for byte.
 * IN is a file or a (sharded) checkpoint directory, anything st_open
 * takes; OUT is one safetensors file, written beside itself and renamed,
 * so a refusal or a crash leaves no partial OUT. docs/convert.md has the
 * names, params and rules.
 *
 * Exit status: 0 written; 1 refused (one line on stderr: file, tensor,
 * reason; nothing written); 2 usage.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "core/safetensors.h"
#include "core/safetensors_write.h"
#include "plugins/fp8/quant_fp8.h"
#include "plugins/int8/quant_int8.h"
#include "plugins/mxfp8/quant_mx.h"
#include "plugins/mxfp4/quant_mxfp4.h"
#include "tools/cli.h"
#include "tools/refitctl.h"

/* Substrings of names kept unquantized unless --param skip= says
 * otherwise: embeddings, the output head, norms (2-D in some models) and
 * MoE routers (`mlp.gate.weight`, not `gate_proj`), which engines keep in
 * high precision. */
#define CV_DEFAULT_SKIP "embed,lm_head,norm,.gate.weight"
#define CV_WEIGHT ".weight"

/* One output tensor: a copy of an input tensor, or new bytes (a quantized
 * weight, then its scales in the next entry). */
typedef struct cv_entry {
    const st_tensor *src;      /* the input tensor it comes from */
    int quant;                 /* 1: src's quantized values; next entry: scales */
    char *name;                /* owned; NULL: src->name */
    st_dtype dtype;
    int32_t ndim;
    int64_t shape[ST_MAX_DIMS];
    void *buf;                 /* owned; NULL: src->data (a copy) */
} cv_entry;

typedef struct cv_job cv_job;

/* Quantize x ([N, K] F32/F16/BF16) into q (values) and s (scales), which
 * the function shapes and allocates (cv_new). Returns a kernel status. */
typedef int (*cv_quant_fn)(const cv_job *j, const refit_view *x, cv_entry *q, cv_entry *s);

typedef struct cv_format {
    const char *name;
    const char *const *schemes;  /* NULL-terminated; NULL: no scheme param */
    int default_scheme;
    const char *values;          /* suffix of the values tensor */
    const char *scales[3];       /* suffix of the scales, per scheme */
    cv_quant_fn quant;
    const char *missing;         /* set: cannot convert, and why */
} cv_format;

struct cv_job {
    const cv_format *fmt;
    int scheme;                  /* index into fmt->schemes; 0 when none */
    int scheme_set, skip_set;
    const char *skip;            /* comma-separated name substrings */
    const char *in, *out;
    st_set *set;
    cv_entry *e;
    size_t n_e, n_quant;
    json_t *meta;                /* the input's __metadata__, merged */
};

/* ---- messages ---- */

static const cli_opt cv_opts[] = {
    {"format", 'f', "NAME", "fp8, int8, mxfp8 or mxfp4 (required)"},
    {"param", 'p', "KEY=VALUE", "repeatable:\n"
                                "fp8:  scheme=per_tensor|per_channel|block128 (default per_tensor)\n"
                                "int8: scheme=per_channel|per_tensor (default per_channel)\n"
                                "all:  skip=SUBSTR[,SUBSTR]... names kept unquantized\n"
                                "      (default " CV_DEFAULT_SKIP ")"},
    {NULL, 0, NULL, NULL},
};

static const cli cv_cli = {
    "refitctl convert", "--format NAME [--param KEY=VALUE]... IN OUT",
    "Quantizes each 2-D floating linear-layer weight of the BF16/F16/F32\n"
    "checkpoint IN (a file or a checkpoint directory) with the kernel the format's\n"
    "plugin runs, copies every other tensor byte for byte, and writes the one\n"
    "safetensors file OUT (beside itself, then renamed: a refusal writes nothing).\n"
    "Progress on stderr when it is a terminal. docs/convert.md has the rules.\n"
    "Exit status: 0 written, 1 refused (file, tensor, reason), 2 usage.",
    cv_opts,
};

/* One line naming the file and tensor (either may be NULL); returns 1. */
static int cv_refuse(const char *file, const char *tensor, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int cv_refuse(const char *file, const char *tensor, const char *fmt, ...)
{
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return cli_error(1, "%s%s%s%s%s%s", file ? file : "", file ? ": " : "",
                     tensor ? "tensor '" : "", tensor ? tensor : "", tensor ? "': " : "", why);
}

static int cv_refuse_st(const st_error *e)
{
    char line[2048];
    return cli_error(1, "%s", st_error_line(e, line, sizeof line));
}

static int cv_refuse_at(const cv_job *j, const st_tensor *t, const char *why)
{
    return cv_refuse(st_file_path(j->set, t->file), t->name, "%s", why);
}

/* ---- output tensors ---- */

/* Shape e as [a] (ndim 1) or [a, b] and allocate its bytes. */
static int cv_new(cv_entry *e, st_dtype dt, int ndim, int64_t a, int64_t b)
{
    size_t n, bytes;
    e->dtype = dt;
    e->ndim = ndim;
    e->shape[0] = a;
    e->shape[1] = ndim == 2 ? b : 0;
    if (a < 0 || b < 0 || __builtin_mul_overflow((size_t)a, ndim == 2 ? (size_t)b : 1u, &n) ||
        __builtin_mul_overflow(n, (size_t)st_dtype_bits(dt) / 8u, &bytes))
        return REFIT_EINVAL;
    e->buf = malloc(bytes ? bytes : 1);
    return e->buf ? REFIT_OK : REFIT_ENOMEM;
}

/* A row-major 2-D CPU view. */
static refit_view cv_view(const void *data, st_dtype dt, int64_t rows, int64_t cols)
{
    refit_view v;
    memset(&v, 0, sizeof v);
    v.data = (void *)data; /* the kernels only read x; q and s are ours */
    v.device.device_type = REFIT_DEVICE_CPU;
    v.dtype = st_dtype_to_refit(dt);
    v.ndim = 2;
    v.shape[0] = rows;
    v.shape[1] = cols;
    v.strides[0] = cols;
    v.strides[1] = 1;
    return v;
}

/* ---- formats: the plugins' post-load kernels ---- */

static int cv_fp8(const cv_job *j, const refit_view *x, cv_entry *q, cv_entry *s)
{
    kern_fp8_scheme sch = (kern_fp8_scheme)j->scheme;
    int64_t n = x->shape[0], k = x->shape[1], ss[2];
    kern_fp8_scale_shape(sch, n, k, ss);
    /* per-tensor as [1], not 0-d: the core places a [1] scale at its slot
     * of a fused [S] runtime scale, a scalar it cannot (formats-fp8.md) */
    int rc = cv_new(q, ST_F8_E4M3, 2, n, k);
    if (!rc)
        rc = cv_new(s, ST_F32, sch == KERN_FP8_PER_TENSOR ? 1 : 2, ss[0], ss[1]);
    if (rc)
        return rc;
    refit_view qv = cv_view(q->buf, ST_F8_E4M3, n, k), sv = cv_view(s->buf, ST_F32, ss[0], ss[1]);
    return kern_quant_fp8(&qv, &sv, x, sch);
}

static int cv_int8(const cv_job *j, const refit_view *x, cv_entry *q, cv_entry *s)
{
    int per_channel = j->scheme == 1;
    int64_t n = x->shape[0], k = x->shape[1], rows = per_channel ? n : 1;
    int rc = cv_new(q, ST_I8, 2, n, k);
    if (!rc)
        rc = cv_new(s, ST_F32, per_channel ? 2 : 1, rows, 1);
    if (rc)
        return rc;
    refit_view qv = cv_view(q->buf, ST_I8, n, k), sv = cv_view(s->buf, ST_F32, rows, 1);
    return kern_quant_int8(&qv, &sv, x, per_channel);
}

static int cv_mxfp8(const cv_job *j, const refit_view *x, cv_entry *q, cv_entry *s)
{
    (void)j;
    int64_t n = x->shape[0], k = x->shape[1], nb = kern_mx_blocks(k);
    int rc = cv_new(q, ST_F8_E4M3, 2, n, k);
    if (!rc)
        rc = cv_new(s, ST_U8, 2, n, nb);
    if (rc)
        return rc;
    refit_view qv = cv_view(q->buf, ST_F8_E4M3, n, k), sv = cv_view(s->buf, ST_U8, n, nb);
    return kern_quant_mxfp8(&qv, &sv, x);
}

static int cv_mxfp4(const cv_job *j, const refit_view *x, cv_entry *q, cv_entry *s)
{
    (void)j;
    int64_t n = x->shape[0], k = x->shape[1], nb = kern_mx_blocks(k), kb = k / 2 + k % 2;
    int rc = cv_new(q, ST_U8, 2, n, kb);
    if (!rc)
        rc = cv_new(s, ST_U8, 2, n, nb);
    if (rc)
        return rc;
    refit_view qv = cv_view(q->buf, ST_U8, n, kb), sv = cv_view(s->buf, ST_U8, n, nb);
    return kern_quant_mxfp4(&qv, &sv, x);
}

static const char *const fp8_schemes[] = {"per_tensor", "per_channel", "block128", NULL};
static const char *const int8_schemes[] = {"per_tensor", "per_channel", NULL};

/* Scheme indexes are the kernels' values: kern_fp8_scheme, and the int8
 * per_channel flag. Names and layouts: docs/formats-fp8.md, -4bit.md. */
static const cv_format cv_formats[] = {
    {"fp8", fp8_schemes, KERN_FP8_PER_TENSOR, "weight",
     {"weight_scale", "weight_scale", "weight_scale_inv"}, cv_fp8, NULL},
    {"int8", int8_schemes, 1, "weight", {"weight_scale", "weight_scale"}, cv_int8, NULL},
    {"mxfp8", NULL, 0, "weight", {"weight_scale_inv"}, cv_mxfp8, NULL},
    {"mxfp4", NULL, 0, "weight_packed", {"weight_scale"}, cv_mxfp4, NULL},
    {"nvfp4", NULL, 0, NULL, {NULL}, NULL,
     "plugins/nvfp4/quant_nvfp4.h has no quantizer from float (no kern_quant_nvfp4: E4M3 block-16 "
     "scale selection and the FP32 global scale), so there is nothing to convert with"},
    {"int4", NULL, 0, NULL, {NULL}, NULL,
     "plugins/int4/quant_int4.h has no quantizer from float (no kern_quant_int4: group scales, zero "
     "points, int32 packing), so there is nothing to convert with"},
};

/* ---- command line ---- */

static const cv_format *cv_find_format(const char *name)
{
    for (size_t i = 0; i < sizeof cv_formats / sizeof cv_formats[0]; i++)
        if (!strcmp(cv_formats[i].name, name))
            return &cv_formats[i];
    return NULL;
}

static int cv_set_scheme(cv_job *j, const char *v)
{
    const char *const *s = j->fmt->schemes;
    if (j->scheme_set++)
        return cv_refuse(NULL, NULL, "param scheme given twice");
    for (int i = 0; s[i]; i++)
        if (!strcmp(s[i], v)) {
            j->scheme = i;
            return 0;
        }
    return cv_refuse(NULL, NULL, "format %s: param scheme is '%s'; it takes %s|%s%s%s",
                     j->fmt->name, v, s[0], s[1], s[2] ? "|" : "", s[2] ? s[2] : "");
}

/* KEY=VALUE (the '=' was checked by the parser). */
static int cv_set_param(cv_job *j, const char *kv)
{
    const char *eq = strchr(kv, '=');
    size_t klen = (size_t)(eq - kv);
    if (klen == 4 && !strncmp(kv, "skip", 4)) {
        if (j->skip_set++)
            return cv_refuse(NULL, NULL, "param skip given twice");
        j->skip = eq + 1;
        return 0;
    }
    if (klen == 6 && !strncmp(kv, "scheme", 6) && j->fmt->schemes)
        return cv_set_scheme(j, eq + 1);
    return cv_refuse(NULL, NULL, "format %s takes no param '%.*s' (it takes %s)", j->fmt->name,
                     (int)klen, kv, j->fmt->schemes ? "scheme and skip" : "skip");
}

/* Options and the two paths; 2 on a usage error, else 0. */
/* The options as given; params are applied once the format is known. */
typedef struct cv_args {
    const char *format;
    const char *params[64];
    int n_params;
} cv_args;

static int cv_opt(void *user, int key, const char *v)
{
    cv_args *a = user;
    if (key == 'f') {
        if (a->format)
            return cli_usage_error(&cv_cli, "one --format only");
        a->format = v;
        return 0;
    }
    if (!strchr(v, '=') || v[0] == '=')
        return cli_usage_error(&cv_cli, "--param takes KEY=VALUE, not '%s'", v);
    if (a->n_params == (int)(sizeof a->params / sizeof *a->params))
        return cli_usage_error(&cv_cli, "too many --param");
    a->params[a->n_params++] = v;
    return 0;
}

static int cv_parse(int argc, char **argv, cv_job *j, cv_args *a)
{
    int first, rc = cli_parse(&cv_cli, argc, argv, cv_opt, a, &first);
    if (rc)
        return rc;
    if (!a->format)
        return cli_usage_error(&cv_cli, "no --format");
    if (argc - first != 2)
        return cli_usage_error(&cv_cli, "needs IN and OUT");
    j->in = argv[first];
    j->out = argv[first + 1];
    return 0;
}

/* The format and its params, checked before any file is opened. */
static int cv_configure(cv_job *j, const cv_args *a)
{
    j->fmt = cv_find_format(a->format);
    if (!j->fmt)
        return cv_refuse(NULL, NULL, "unknown format '%s' (it converts to fp8, int8, mxfp8 "
                         "and mxfp4)", a->format);
    if (j->fmt->missing)
        return cv_refuse(NULL, NULL, "format %s: cannot convert: %s", j->fmt->name,
                         j->fmt->missing);
    j->scheme = j->fmt->default_scheme;
    j->skip = CV_DEFAULT_SKIP;
    for (int i = 0; i < a->n_params; i++)
        if (cv_set_param(j, a->params[i]))
            return 1;
    return 0;
}

/* ---- which tensors are quantized ---- */

/* 1 when name contains one of the comma-separated substrings of list. */
static int cv_skipped(const char *list, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if (n && memmem(name, len, p, n))
            return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

/* 1 quantize, 0 copy; -1 refused (reported). */
static int cv_classify(const cv_job *j, const st_tensor *t)
{
    size_t len = strlen(t->name), wl = strlen(CV_WEIGHT);
    if (t->ndim != 2 || len <= wl || strcmp(t->name + len - wl, CV_WEIGHT) ||
        cv_skipped(j->skip, t->name))
        return 0;
    if (!kern_is_float_dtype(st_dtype_to_refit(t->dtype))) {
        cv_refuse(st_file_path(j->set, t->file), t->name, "dtype %s: a weight to quantize is "
                  "BF16, F16 or F32 (already quantized? keep it with --param skip=...)",
                  st_dtype_name(t->dtype));
        return -1;
    }
    return 1;
}

/* prefix (the first plen bytes of name) + "." + suffix, malloc'd. */
static char *cv_name(const char *name, size_t plen, const char *suffix)
{
    size_t sl = strlen(suffix), n;
    if (__builtin_add_overflow(plen, sl + 2, &n))
        return NULL;
    char *s = malloc(n);
    if (s) {
        memcpy(s, name, plen);
        s[plen] = '.';
        memcpy(s + plen + 1, suffix, sl + 1);
    }
    return s;
}

/* Names of the two entries of quantized weight t; refused when the input
 * already holds one (it would be written twice). */
static int cv_name_pair(const cv_job *j, const st_tensor *t, cv_entry *q, cv_entry *s)
{
    size_t plen = strlen(t->name) - strlen(CV_WEIGHT);
    const char *vs = j->fmt->values, *ss = j->fmt->scales[j->scheme];
    if (strcmp(vs, "weight") && !(q->name = cv_name(t->name, plen, vs)))
        return cv_refuse(NULL, NULL, "out of memory");
    if (!(s->name = cv_name(t->name, plen, ss)))
        return cv_refuse(NULL, NULL, "out of memory");
    const char *taken = q->name && st_find(j->set, q->name) ? q->name
                        : st_find(j->set, s->name)          ? s->name
                                                            : NULL;
    if (taken)
        return cv_refuse_at(j, t, taken == q->name
                                      ? "its converted values go by a name the input already "
                                        "holds (already quantized?)"
                                      : "its converted scales go by a name the input already "
                                        "holds (already quantized?)");
    return 0;
}

/* Entries for every input tensor, in input order, names decided, nothing
 * quantized yet: refusals come before the long work. */
static int cv_plan(cv_job *j)
{
    size_t n = st_count(j->set), cap;
    if (__builtin_mul_overflow(n ? n : 1, 2 * sizeof(cv_entry), &cap) ||
        !(j->e = calloc(1, cap)))
        return cv_refuse(NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_tensor_at(j->set, i);
        cv_entry *e = &j->e[j->n_e++];
        int c = cv_classify(j, t);
        e->src = t;
        e->quant = c == 1;
        if (c < 0)
            return 1;
        if (c == 0) {
            e->dtype = t->dtype;
            e->ndim = t->ndim;
            memcpy(e->shape, t->shape, sizeof e->shape);
            continue;
        }
        j->e[j->n_e++].src = t;
        j->n_quant++;
        if (cv_name_pair(j, t, e, e + 1))
            return 1;
    }
    return 0;
}

/* ---- the work ---- */

static int cv_quantize(cv_job *j)
{
    st_error err;
    size_t done = 0;
    if (st_set_recheck(j->set, &err)) /* the mapping is read next */
        return cv_refuse_st(&err);
    for (size_t i = 0; i < j->n_e; i++) {
        cv_entry *q = &j->e[i];
        if (!q->quant)
            continue;
        const st_tensor *t = q->src;
        cli_progress("quantizing %zu of %zu: %s", ++done, j->n_quant, t->name);
        refit_view x = cv_view(t->data, t->dtype, t->shape[0], t->shape[1]);
        int rc = j->fmt->quant(j, &x, q, q + 1);
        if (rc == REFIT_ECORRUPT)
            return cv_refuse_at(j, t, "NaN or infinity in the weight; refusing to quantize it");
        if (rc == REFIT_ENOMEM)
            return cv_refuse_at(j, t, "out of memory");
        if (rc)
            return cv_refuse(st_file_path(j->set, t->file), t->name, "the %s kernel refused "
                             "it (%s)", j->fmt->name, refit_status_name(rc));
        i++;
    }
    return 0;
}

/* The header of one input file, parsed again: the reader validates
 * __metadata__ but only looks values up by key (see docs/convert.md). */
static json_t *cv_read_header(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    uint8_t le[8];
    json_t *root = NULL;
    if (fd < 0)
        return NULL;
    if (pread(fd, le, 8, 0) == 8) {
        uint64_t len = 0;
        for (int i = 7; i >= 0; i--)
            len = len << 8 | le[i];
        char *buf = len <= ST_MAX_HEADER ? malloc(len ? (size_t)len : 1) : NULL;
        size_t got = 0;
        while (buf && got < len) {
            ssize_t r = pread(fd, buf + got, (size_t)len - got, (off_t)(8 + got));
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        if (buf && got == len)
            root = json_loadb(buf, (size_t)len, 0, NULL);
        free(buf);
    }
    close(fd);
    return root;
}

/* Every file's __metadata__, merged into j->meta (the first file's value
 * wins a key that shards disagree on). */
static int cv_collect_meta(cv_job *j)
{
    if (!(j->meta = json_object()))
        return cv_refuse(NULL, NULL, "out of memory");
    for (size_t i = 0; i < st_file_count(j->set); i++) {
        const char *path = st_file_path(j->set, i), *key;
        json_t *root = cv_read_header(path), *m, *v;
        if (!root)
            return cv_refuse(path, NULL, "cannot read the header again (changed since it was "
                             "opened?)");
        m = json_object_get(root, "__metadata__");
        json_object_foreach(m, key, v)
        {
            if (json_is_string(v) && !json_object_get(j->meta, key) &&
                json_object_set(j->meta, key, v)) {
                json_decref(root);
                return cv_refuse(NULL, NULL, "out of memory");
            }
        }
        json_decref(root);
    }
    return 0;
}

/* The input's metadata with ours added: who quantized, the format, and
 * every param in effect (defaults included), so the file says how it was
 * made. *pairs: OUT, malloc'd; strings owned by j->meta and params. */
static int cv_meta_pairs(const cv_job *j, const char *params, const char ***pairs, size_t *n)
{
    static const char *const ours[3] = {"quantized_by", "quantization_format",
                                        "quantization_params"};
    size_t cap = json_object_size(j->meta) + 3, k = 0;
    const char **p = calloc(cap, 2 * sizeof *p), *key;
    json_t *v;
    if (!p)
        return cv_refuse(NULL, NULL, "out of memory");
    json_object_foreach(j->meta, key, v)
    {
        if (strcmp(key, ours[0]) && strcmp(key, ours[1]) && strcmp(key, ours[2])) {
            p[2 * k] = key;
            p[2 * k++ + 1] = json_string_value(v);
        }
    }
    const char *vals[3] = {"refit", j->fmt->name, params};
    for (int i = 0; i < 3; i++, k++) {
        p[2 * k] = ours[i];
        p[2 * k + 1] = vals[i];
    }
    *pairs = p;
    *n = k;
    return 0;
}

/* OUT may not be a directory nor one of the input's files. */
static int cv_check_out(const cv_job *j)
{
    struct stat o, f;
    if (stat(j->out, &o))
        return 0;
    if (S_ISDIR(o.st_mode))
        return cv_refuse(j->out, NULL, "is a directory; OUT names the file to write");
    for (size_t i = 0; i < st_file_count(j->set); i++)
        if (!stat(st_file_path(j->set, i), &f) && f.st_dev == o.st_dev && f.st_ino == o.st_ino)
            return cv_refuse(j->out, NULL, "is a file of the input; write the converted "
                             "checkpoint elsewhere");
    return 0;
}

static int cv_write(const cv_job *j, const char *const *meta, size_t n_meta)
{
    st_out_tensor *t = calloc(j->n_e ? j->n_e : 1, sizeof *t);
    st_error err;
    if (!t)
        return cv_refuse(NULL, NULL, "out of memory");
    for (size_t i = 0; i < j->n_e; i++) {
        const cv_entry *e = &j->e[i];
        t[i] = (st_out_tensor){e->name ? e->name : e->src->name, e->dtype, e->ndim, e->shape,
                               e->buf ? e->buf : e->src->data};
    }
    int rc = st_write_file(j->out, t, j->n_e, meta, n_meta, &err);
    free(t);
    return rc ? cv_refuse_st(&err) : 0;
}

static int cv_run(cv_job *j)
{
    st_error err;
    char *params = NULL;
    const char **meta = NULL;
    size_t n_meta = 0;
    if (st_open(&j->set, j->in, &err))
        return cv_refuse_st(&err);
    int rc = cv_check_out(j);
    if (!rc)
        rc = cv_plan(j);
    if (!rc)
        rc = cv_quantize(j);
    if (!rc)
        rc = cv_collect_meta(j);
    if (!rc && asprintf(&params, "%s%s%sskip=%s", j->fmt->schemes ? "scheme=" : "",
                        j->fmt->schemes ? j->fmt->schemes[j->scheme] : "",
                        j->fmt->schemes ? ";" : "", j->skip) < 0) {
        params = NULL;
        rc = cv_refuse(NULL, NULL, "out of memory");
    }
    if (!rc)
        rc = cv_meta_pairs(j, params, &meta, &n_meta);
    if (!rc)
        rc = cv_write(j, meta, n_meta);
    cli_progress_end();
    if (!rc)
        printf("refitctl convert: wrote %s: %zu weight%s quantized to %s (%s), %zu tensors "
               "copied\n", j->out, j->n_quant, j->n_quant == 1 ? "" : "s", j->fmt->name, params,
               j->n_e - 2 * j->n_quant);
    free(meta);
    free(params);
    return rc;
}

static void cv_free(cv_job *j)
{
    for (size_t i = 0; j->e && i < j->n_e; i++) {
        free(j->e[i].name);
        free(j->e[i].buf);
    }
    free(j->e);
    json_decref(j->meta);
    st_close(j->set);
}

int ctl_convert(int argc, char **argv)
{
    cv_job j;
    cv_args a = {0};
    memset(&j, 0, sizeof j);
    int rc = cv_parse(argc, argv, &j, &a);
    if (rc)
        return rc == CLI_HELP ? 0 : rc;
    rc = cv_configure(&j, &a);
    if (!rc)
        rc = cv_run(&j);
    cv_free(&j);
    return rc;
}
