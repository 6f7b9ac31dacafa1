/* Helpers of the plugin suites (putil.h). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "putil.h"

const char *const PT_DECL_DIRECT =
    "name: @NAME@\n"
    "abi: 2\n"
    "checkpoint:\n"
    "  - {role: weight, match: \"*.weight\", dtypes: [f32, f16, bf16], route: DIRECT}\n"
    "runtime:\n"
    "  - {role: out, dtypes: [f32, bf16]}\n";

const char *const PT_DECL_STAGED =
    "name: @NAME@\n"
    "abi: 2\n"
    "checkpoint:\n"
    "  - {role: weight, dtypes: [f32, f16, bf16], route: [DIRECT, STAGED]}\n"
    "runtime:\n"
    "  - {role: out, dtypes: [f32, f16, bf16]}\n"
    "post_load:\n"
    "  - {kernel: identity, idempotent: true, reads: [weight], writes: [out]}\n";

const char *pt_env(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v)
        fail_msg("%s is not set: run the tests through meson", name);
    return v;
}

char *pt_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char *t = NULL;
    if (asprintf(&t, "%s/refit-plugins-XXXXXX", base && *base ? base : "/tmp") < 0)
        fail_msg("out of memory");
    if (!mkdtemp(t))
        fail_msg("mkdtemp %s: %s", t, strerror(errno));
    return t;
}

void pt_rmtree(char *dir)
{
    if (!dir)
        return;
    DIR *d = opendir(dir);
    chmod(dir, 0700);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlink(pt_path(dir, e->d_name));
    if (d)
        closedir(d);
    rmdir(dir);
    free(dir);
}

const char *pt_path(const char *dir, const char *name)
{
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

const char *pt_fmt(const char *fmt, ...)
{
    static char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

void pt_copy(const char *src, const char *dst, mode_t mode)
{
    FILE *in = fopen(src, "rb");
    if (!in)
        fail_msg("open %s: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out)
        fail_msg("create %s: %s", dst, strerror(errno));
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n)
            fail_msg("write %s", dst);
    fclose(in);
    if (fclose(out) || chmod(dst, mode))
        fail_msg("close/chmod %s: %s", dst, strerror(errno));
}

void pt_write(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) || chmod(path, mode))
        fail_msg("write %s: %s", path, strerror(errno));
}

/* text with every @NAME@ replaced by name. */
static char *subst_name(const char *text, const char *name)
{
    size_t cap = strlen(text) * 2 + strlen(name) * 8 + 1, o = 0;
    char *out = malloc(cap);
    if (!out)
        fail_msg("out of memory");
    for (const char *p = text; *p;) {
        if (!strncmp(p, "@NAME@", 6) && o + strlen(name) < cap) {
            memcpy(out + o, name, strlen(name));
            o += strlen(name);
            p += 6;
        } else if (o + 1 < cap) {
            out[o++] = *p++;
        } else {
            fail_msg("declaration too long");
        }
    }
    out[o] = '\0';
    return out;
}

void pt_stage_fake(const char *dir, const char *name, const char *yaml)
{
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/refit-fmt-%s.so", pt_env("REFIT_TEST_FAKE_DIR"), name);
    snprintf(dst, sizeof dst, "%s/refit-fmt-%s.so", dir, name);
    pt_copy(src, dst, 0755);
    if (!yaml)
        return;
    char *text = subst_name(yaml, name);
    snprintf(dst, sizeof dst, "%s/%s.yaml", dir, name);
    pt_write(dst, text, 0644);
    free(text);
}

void pt_stage_built(const char *dir, const char *name)
{
    char src[4096], dst[4096];
    const char *from = pt_env("REFIT_TEST_PLUGIN_BUILD_DIR");
    snprintf(src, sizeof src, "%s/refit-fmt-%s.so", from, name);
    snprintf(dst, sizeof dst, "%s/refit-fmt-%s.so", dir, name);
    pt_copy(src, dst, 0755);
    snprintf(src, sizeof src, "%s/%s.yaml", from, name);
    snprintf(dst, sizeof dst, "%s/%s.yaml", dir, name);
    pt_copy(src, dst, 0644);
}
