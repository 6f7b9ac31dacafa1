/* See cvutil.h. */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/convert/cvutil.h"
#include "tools/refitctl.h"

#define CV_MAX_ARGS 32

int cv_setup(void **state)
{
    const char *root = getenv("REFIT_BUILD_ROOT");
    char *dir = malloc(4096);
    if (!dir)
        return -1;
    snprintf(dir, 4096, "%s/tests/convert/scratch-XXXXXX", root && *root ? root : ".");
    if (!mkdtemp(dir)) {
        print_error("cannot make a scratch directory %s\n", dir);
        free(dir);
        return -1;
    }
    *state = dir;
    return 0;
}

/* The scratch directory is flat: files only. */
int cv_teardown(void **state)
{
    char *dir = *state, path[8192];
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    if (d)
        closedir(d);
    rmdir(dir);
    free(dir);
    return 0;
}

char *cv_join(char *buf, size_t n, const char *dir, const char *name)
{
    int k = snprintf(buf, n, "%s/%s", dir, name);
    assert_true(k > 0 && (size_t)k < n);
    return buf;
}

void cv_write(const char *path, const st_out_tensor *t, size_t n, const char *const *meta,
              size_t n_meta)
{
    st_error e;
    char line[2048];
    if (st_write_file(path, t, n, meta, n_meta, &e))
        fail_msg("write %s: %s", path, st_error_line(&e, line, sizeof line));
}

st_out_tensor cv_from(const char *name, const st_tensor *t)
{
    return (st_out_tensor){name, t->dtype, t->ndim, t->shape, t->data};
}

st_set *cv_open(const char *path)
{
    st_set *s = NULL;
    st_error e;
    char line[2048];
    if (st_open(&s, path, &e))
        fail_msg("open %s: %s", path, st_error_line(&e, line, sizeof line));
    return s;
}

const st_tensor *cv_get(const st_set *s, const char *name)
{
    const st_tensor *t = st_find(s, name);
    if (!t)
        fail_msg("no tensor %s", name);
    return t;
}

void cv_assert_same(const st_tensor *want, const st_tensor *got)
{
    if (want->dtype != got->dtype || want->ndim != got->ndim ||
        memcmp(want->shape, got->shape, sizeof(int64_t) * (size_t)want->ndim))
        fail_msg("%s: %s %d-D, want %s %d-D of %s's shape", got->name, st_dtype_name(got->dtype),
                 got->ndim, st_dtype_name(want->dtype), want->ndim, want->name);
    assert_int_equal(want->nbytes, got->nbytes);
    const unsigned char *a = want->data, *b = got->data;
    for (uint64_t i = 0; i < want->nbytes; i++)
        if (a[i] != b[i])
            fail_msg("%s: byte %llu is 0x%02x, want 0x%02x (%s)", got->name,
                     (unsigned long long)i, b[i], a[i], want->name);
}

/* ---- running the converter ---- */

/* Read all of f from the start, malloc'd and NUL-terminated. */
static char *slurp(FILE *f)
{
    long n;
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    return s;
}

/* fd 1 and 2 point at files for the call; the old ones come back after. */
static int run_captured(int argc, char **argv, char **err)
{
    FILE *o = tmpfile(), *e = tmpfile();
    assert_non_null(o);
    assert_non_null(e);
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    assert_true(so >= 0 && se >= 0);
    assert_true(dup2(fileno(o), 1) >= 0 && dup2(fileno(e), 2) >= 0);
    int rc = ctl_convert(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    if (err)
        *err = slurp(e);
    fclose(o);
    fclose(e);
    return rc;
}

int cv_convert(char **err, ...)
{
    char *argv[CV_MAX_ARGS + 1];
    int argc = 0;
    va_list ap;
    argv[argc++] = "convert";
    va_start(ap, err);
    for (char *a; (a = va_arg(ap, char *));) {
        assert_true(argc < CV_MAX_ARGS);
        argv[argc++] = a;
    }
    va_end(ap);
    argv[argc] = NULL;
    return run_captured(argc, argv, err);
}

void cv_convert_ok(const char *format, const char *param, const char *in, const char *out)
{
    char *err = NULL;
    char *f = (char *)format, *p = (char *)param, *i = (char *)in, *o = (char *)out;
    int rc = param ? cv_convert(&err, "--format", f, "--param", p, i, o, (char *)NULL)
                   : cv_convert(&err, "--format", f, i, o, (char *)NULL);
    if (rc) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", err);
        free(err);
        fail_msg("convert --format %s %s: exit %d: %s", format, param ? param : "", rc, msg);
    }
    free(err);
}

void cv_assert_line_(const char *err, const char *file, int line, ...)
{
    const char *nl = strchr(err, '\n');
    if (!nl || nl[1])
        fail_msg("%s:%d: want one line on stderr, got: %s", file, line, err);
    va_list ap;
    va_start(ap, line);
    for (const char *s; (s = va_arg(ap, const char *));)
        if (!strstr(err, s)) {
            va_end(ap);
            fail_msg("%s:%d: stderr lacks '%s': %s", file, line, s, err);
        }
    va_end(ap);
}

/* ---- serialized vs online ---- */

refit_tensor cv_desc(const st_tensor *t)
{
    refit_tensor d;
    memset(&d, 0, sizeof d);
    d.data = (void *)t->data;
    d.device.device_type = REFIT_DEVICE_CPU;
    d.ndim = t->ndim;
    d.dtype = st_dtype_to_refit(t->dtype);
    d.shape = (int64_t *)t->shape;
    return d;
}

static void expect(tw *w, const char *mod, const char *name, const st_tensor *t,
                   const char *target)
{
    refit_ckpt_spec sp = tt_spec(st_dtype_to_refit(t->dtype), t->ndim, t->shape);
    sp.target = target;
    int rc = tw_expect(w, mod, name, &sp);
    if (rc)
        fail_msg("expect %s/%s: %s: %s", mod, name, refit_status_name(rc), refit_errmsg(w->ctx));
}

/* Runtime weight and weight_scale of module mod shaped as the converted
 * values and scales; the module's params. */
static void module(tw *w, const char *mod, const char *fmt, const char *params,
                   const st_tensor *v, const st_tensor *s)
{
    tw_module(w, mod, fmt, params);
    tw_runtime(w, mod, "weight", st_dtype_to_refit(v->dtype), v->ndim, v->shape);
    tw_runtime(w, mod, "weight_scale", st_dtype_to_refit(s->dtype), s->ndim, s->shape);
}

void cv_update(tw *w, const st_set *set, const char *const *names, int n)
{
    refit_txn *t = tw_begin(w, "v1", 1);
    for (int i = 0; i < n; i++) {
        refit_tensor d = cv_desc(cv_get(set, names[i]));
        int rc = refit_load(t, names[i], &d, NULL);
        if (rc) {
            refit_abort(t);
            fail_msg("load %s: %s: %s", names[i], refit_status_name(rc), refit_errmsg(w->ctx));
        }
    }
    int rc = refit_finalize(t);
    if (rc)
        fail_msg("finalize: %s: %s", refit_status_name(rc), refit_errmsg(w->ctx));
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
}

static void assert_rt(tw *w, const char *mod, const char *name, const void *want, size_t n,
                      const char *what)
{
    const tt_tensor *t = tw_rt(w, mod, name);
    assert_int_equal(t->bytes, n);
    const unsigned char *a = want, *b = t->buf;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            fail_msg("%s/%s: byte %zu is 0x%02x, %s has 0x%02x", mod, name, i, b[i], what, a[i]);
}

void cv_same_kernels(const refit_format_v2 *plugin, const st_set *conv, const st_set *orig,
                     const cv_pair *p, int n)
{
    const char *fmt = plugin->name;
    tw ser, onl;
    const char *names[64] = {NULL};
    char mod[16];
    assert_true(n <= 32);
    assert_int_equal(tw_open(&ser, NULL), REFIT_OK);
    assert_int_equal(tw_open(&onl, NULL), REFIT_OK);
    assert_int_equal(refit_format_register(ser.ctx, plugin), REFIT_OK);
    assert_int_equal(refit_format_register(onl.ctx, plugin), REFIT_OK);
    for (int i = 0; i < n; i++) {
        const st_tensor *v = cv_get(conv, p[i].values), *s = cv_get(conv, p[i].scales);
        snprintf(mod, sizeof mod, "m%d", i);
        module(&ser, mod, fmt, p[i].ser_params, v, s);
        expect(&ser, mod, p[i].values, v, "weight");
        expect(&ser, mod, p[i].scales, s, "weight_scale");
        names[2 * i] = p[i].values;
        names[2 * i + 1] = p[i].scales;
        if (orig) {
            module(&onl, mod, fmt, p[i].onl_params, v, s);
            expect(&onl, mod, p[i].weight, cv_get(orig, p[i].weight), "weight");
        }
    }
    tw_seal(&ser);
    cv_update(&ser, conv, names, 2 * n);
    if (orig) {
        tw_seal(&onl);
        for (int i = 0; i < n; i++)
            names[i] = p[i].weight;
        cv_update(&onl, orig, names, n);
    }
    for (int i = 0; i < n; i++) {
        const st_tensor *v = cv_get(conv, p[i].values), *s = cv_get(conv, p[i].scales);
        snprintf(mod, sizeof mod, "m%d", i);
        assert_rt(&ser, mod, "weight", v->data, v->nbytes, "the converted file");
        assert_rt(&ser, mod, "weight_scale", s->data, s->nbytes, "the converted file");
        if (orig) {
            const tt_tensor *ow = tw_rt(&onl, mod, "weight"), *os = tw_rt(&onl, mod,
                                                                         "weight_scale");
            assert_rt(&ser, mod, "weight", ow->buf, ow->bytes, "the online runtime");
            assert_rt(&ser, mod, "weight_scale", os->buf, os->bytes, "the online runtime");
        }
    }
    tw_close(&ser);
    tw_close(&onl);
}
