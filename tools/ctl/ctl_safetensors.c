/*
 * refitctl safetensors: list and verify checkpoints with the same reader
 * that loads them, so what an operator sees is what refit would load.
 *
 *   refitctl safetensors ls PATH [--json]
 *   refitctl safetensors verify PATH
 *
 * PATH is a .safetensors file or a checkpoint directory. Exit status: 0 ok,
 * 1 invalid checkpoint (one line on stderr: file, tensor, rule), 2 usage.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "tools/refitctl.h"

static int ctl_st_usage(void)
{
    fprintf(stderr, "usage: refitctl safetensors ls PATH [--json]\n"
                    "       refitctl safetensors verify PATH\n");
    return 2;
}

static int ctl_st_report(const st_error *e)
{
    char line[2048];
    fprintf(stderr, "refitctl safetensors: %s\n", st_error_line(e, line, sizeof line));
    return 1;
}

static void ctl_st_shape(const st_tensor *t, char *buf, size_t n)
{
    size_t j = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->ndim && j < n; d++)
        j += (size_t)snprintf(buf + j, n - j, "%s%" PRId64, d ? ", " : "", t->shape[d]);
    if (j < n)
        snprintf(buf + j, n - j, "]");
}

static const char *ctl_st_base(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* A name from the file, printable on a terminal: control bytes (and DEL)
 * as \xHH, a backslash as \\, so a name cannot move the cursor, clear the
 * screen or fake a line. NULL: out of memory. */
static char *ctl_st_escape(const char *in)
{
    size_t n = strlen(in);
    char *out = malloc(4 * n + 1), *o = out;
    if (!out)
        return NULL;
    for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
        if (*p < 0x20 || *p == 0x7f)
            o += sprintf(o, "\\x%02x", *p);
        else if (*p == '\\')
            o += sprintf(o, "\\\\");
        else
            *o++ = (char)*p;
    }
    *o = '\0';
    return out;
}

static int ctl_st_ls_text(const st_set *s)
{
    uint64_t total = 0;
    printf("%-56s %-11s %-20s %12s  %s\n", "NAME", "DTYPE", "SHAPE", "BYTES", "FILE");
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *t = st_tensor_at(s, i);
        char shape[8 * 22 + 4];
        ctl_st_shape(t, shape, sizeof shape);
        char *name = ctl_st_escape(t->name);
        char *file = ctl_st_escape(ctl_st_base(st_file_path(s, t->file)));
        if (!name || !file) {
            free(name);
            free(file);
            fprintf(stderr, "refitctl safetensors: out of memory\n");
            return 1;
        }
        printf("%-56s %-11s %-20s %12" PRIu64 "  %s\n", name, st_dtype_name(t->dtype), shape,
               t->nbytes, file);
        free(name);
        free(file);
        total += t->nbytes;
    }
    printf("%zu tensors, %" PRIu64 " bytes, %zu files\n", st_count(s), total, st_file_count(s));
    return 0;
}

static json_t *ctl_st_tensor_json(const st_set *s, const st_tensor *t)
{
    json_t *shape = json_array();
    for (int d = 0; shape && d < t->ndim; d++)
        json_array_append_new(shape, json_integer(t->shape[d]));
    return json_pack("{s:s, s:s, s:o, s:I, s:s}", "name", t->name, "dtype",
                     st_dtype_name(t->dtype), "shape", shape, "bytes", (json_int_t)t->nbytes,
                     "file", st_file_path(s, t->file));
}

static int ctl_st_ls_json(const st_set *s)
{
    json_t *files = json_array(), *tensors = json_array();
    json_t *root = json_pack("{s:o, s:o}", "files", files, "tensors", tensors);
    int bad = !root;
    for (size_t i = 0; !bad && i < st_file_count(s); i++)
        bad = json_array_append_new(files, json_string(st_file_path(s, i)));
    for (size_t i = 0; !bad && i < st_count(s); i++) {
        json_t *t = ctl_st_tensor_json(s, st_tensor_at(s, i));
        bad = !t || json_array_append_new(tensors, t);
    }
    if (!bad)
        bad = json_dumpf(root, stdout, JSON_COMPACT) || fputc('\n', stdout) == EOF;
    json_decref(root);
    if (bad)
        fprintf(stderr, "refitctl safetensors: cannot write JSON (out of memory?)\n");
    return bad ? 1 : 0;
}

/* Full validation, a re-check that nothing changed, then the SHA-256 of
 * every file in the form sha256sum prints (and the hub publishes). */
static int ctl_st_verify(st_set *s)
{
    st_error e;
    if (st_set_recheck(s, &e))
        return ctl_st_report(&e);
    uint64_t total = 0;
    for (size_t i = 0; i < st_count(s); i++)
        total += st_tensor_at(s, i)->nbytes;
    for (size_t i = 0; i < st_file_count(s); i++) {
        char hex[65];
        if (st_file_sha256(s, i, hex, &e))
            return ctl_st_report(&e);
        printf("%s  %s\n", hex, st_file_path(s, i));
    }
    printf("ok: %zu files, %zu tensors, %" PRIu64 " bytes of tensor data\n", st_file_count(s),
           st_count(s), total);
    return 0;
}

int ctl_safetensors(int argc, char **argv)
{
    if (argc < 3)
        return ctl_st_usage();
    const char *cmd = argv[1], *path = argv[2];
    int json = 0;
    if (!strcmp(cmd, "ls") && argc == 4 && !strcmp(argv[3], "--json"))
        json = 1;
    else if (argc != 3 || (strcmp(cmd, "ls") && strcmp(cmd, "verify")))
        return ctl_st_usage();
    st_set *s;
    st_error e;
    if (st_open(&s, path, &e))
        return ctl_st_report(&e);
    int rc = !strcmp(cmd, "verify") ? ctl_st_verify(s) : json ? ctl_st_ls_json(s)
                                                               : ctl_st_ls_text(s);
    st_close(s);
    return rc;
}
