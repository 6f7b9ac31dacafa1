/*
 * refitctl safetensors: list and verify checkpoints with the same reader
 * that loads them, so what an operator sees is what refit would load.
 *
 *   refitctl safetensors ls [--json] PATH
 *   refitctl safetensors verify [--json] PATH
 *
 * PATH is a .safetensors file or a checkpoint directory. Exit status: 0 ok,
 * 1 invalid checkpoint (one line on stderr: file, tensor, rule; a JSON
 * object on stdout under --json), 2 usage.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "tools/cli.h"
#include "tools/refitctl.h"

static const cli_opt ctl_st_opts[] = {
    {"json", 'j', NULL, "one JSON object on stdout: ls the files and tensors, verify the\n"
                        "digests; errors as {\"error\": ...}"},
    {NULL, 0, NULL, NULL},
};

static const cli ctl_st_cli = {
    "refitctl safetensors", "ls [--json] PATH\nverify [--json] PATH",
    "PATH is a .safetensors file or a checkpoint directory (sharded or one file),\n"
    "read by the reader that loads it.\n"
    "  ls      every tensor: name, dtype, shape, bytes, file\n"
    "  verify  full validation, then the SHA-256 of every file as sha256sum\n"
    "          prints it (progress on stderr when it is a terminal)\n"
    "Exit status: 0 ok, 1 invalid checkpoint, 2 usage.",
    ctl_st_opts,
};

static int ctl_st_report(const st_error *e)
{
    char line[2048];
    return cli_error(1, "%s", st_error_line(e, line, sizeof line));
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
    if (bad) {
        json_decref(root);
        root = NULL;
    }
    return cli_json_print(root);
}

/* Full validation, a re-check that nothing changed, then the SHA-256 of
 * every file in the form sha256sum prints (and the hub publishes). */
static int ctl_st_verify(st_set *s, int json)
{
    st_error e;
    if (st_set_recheck(s, &e))
        return ctl_st_report(&e);
    uint64_t total = 0;
    for (size_t i = 0; i < st_count(s); i++)
        total += st_tensor_at(s, i)->nbytes;
    json_t *files = json ? json_array() : NULL;
    for (size_t i = 0; i < st_file_count(s); i++) {
        char hex[65];
        cli_progress("hashing file %zu of %zu: %s", i + 1, st_file_count(s),
                     ctl_st_base(st_file_path(s, i)));
        if (st_file_sha256(s, i, hex, &e)) {
            json_decref(files);
            return ctl_st_report(&e);
        }
        if (json)
            json_array_append_new(files, json_pack("{s:s, s:s}", "path", st_file_path(s, i),
                                                   "sha256", hex));
        else
            printf("%s  %s\n", hex, st_file_path(s, i));
    }
    cli_progress_end();
    if (json)
        return cli_json_print(json_pack("{s:b, s:o, s:I, s:I}", "ok", 1, "files", files,
                                        "tensors", (json_int_t)st_count(s), "tensor_bytes",
                                        (json_int_t)total));
    printf("ok: %zu files, %zu tensors, %" PRIu64 " bytes of tensor data\n", st_file_count(s),
           st_count(s), total);
    return 0;
}

static int ctl_st_opt(void *user, int key, const char *value)
{
    (void)key, (void)value;
    *(int *)user = 1; /* --json */
    return 0;
}

int ctl_safetensors(int argc, char **argv)
{
    int json = 0, first;
    int rc = cli_parse(&ctl_st_cli, argc, argv, ctl_st_opt, &json, &first);
    if (rc)
        return rc == CLI_HELP ? 0 : rc;
    if (argc - first != 2)
        return cli_usage_error(&ctl_st_cli, argc == first ? "which command: ls or verify?"
                                            : argc - first == 1 ? "no PATH"
                                                                : "one PATH only");
    const char *cmd = argv[first], *path = argv[first + 1];
    if (strcmp(cmd, "ls") && strcmp(cmd, "verify"))
        return cli_usage_error(&ctl_st_cli, "unknown command '%s'", cmd);
    st_set *s;
    st_error e;
    if (st_open(&s, path, &e))
        return ctl_st_report(&e);
    rc = !strcmp(cmd, "verify") ? ctl_st_verify(s, json) : json ? ctl_st_ls_json(s)
                                                                 : ctl_st_ls_text(s);
    st_close(s);
    return rc;
}
