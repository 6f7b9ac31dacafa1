/*
 * refit-bench safetensors (see tools/bench_safetensors.h for the options).
 *
 * Streaming: the same bytes are moved three ways per run, best of R runs each:
 *   memcpy  - from one warm anonymous buffer into another, in the same
 *             tensor-sized pieces as the stream (the peer);
 *   whole   - the same, in one memcpy call (reported, see bst_report);
 *   stream  - st_open the page-cached file, st_set_recheck, copy every
 *             tensor from its mapping into the destination, st_close. The
 *             mapping is fresh every run, so every page fault is paid inside
 *             the figure, as a real reload pays it.
 * stream_vs_memcpy (recheck + copies, the part that scales with bytes) is
 * what the issue asks to be >= 0.8; with_open_vs_memcpy also counts st_open
 * and st_close, whose cost open_parse_ms reports on its own.
 *
 * Header cost: st_open (open, fstat, pread, parse, validate, index) of a
 * file whose header lists --header-tensors tiny tensors, best of R runs,
 * reported per file and per tensor.
 */
#include "tools/bench_safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "core/safetensors.h"
#include "tools/cli.h"

struct bst_opts {
    uint64_t data_bytes;
    size_t tensors, header_tensors;
    int repeat;
    const char *dir;
};

static double bst_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const cli_opt bst_opts[] = {
    {"size", 's', "MIB", "data bytes of the streamed file (default 256)"},
    {"tensors", 't', "N", "tensors in the streamed file (default 1024)"},
    {"header-tensors", 'H', "N", "tensors in the header-cost file (default 100000)"},
    {"repeat", 'r', "R", "runs of each measurement; the best counts (default 10)"},
    {"dir", 'd', "DIR", "where the temporary files go (default $TMPDIR, /tmp)"},
    {"json", 'j', NULL, "accepted for symmetry: the output is always JSON"},
    {NULL, 0, NULL, NULL},
};

static const cli bst_cli = {
    "refit-bench safetensors", "[--size MIB] [--tensors N] [--header-tensors N] [--repeat R]\n"
                               " [--dir DIR] [--json]",
    "Streaming from a page-cached safetensors file into host memory against plain\n"
    "memcpy of the same bytes in the same run, and the per-file cost of open +\n"
    "header parse + validation. One JSON object (docs/safetensors.md has the keys).",
    bst_opts,
};

static int bst_opt(void *user, int key, const char *v)
{
    struct bst_opts *o = user;
    char *end = NULL;
    if (key == 'j')
        return 0;
    if (key == 'd') {
        o->dir = v;
        return 0;
    }
    unsigned long long n = strtoull(v, &end, 10);
    if (!*v || *end || *v == '-' || n > (1ull << 30))
        return cli_usage_error(&bst_cli, "bad number '%s'", v);
    if (key == 's')
        o->data_bytes = n << 20;
    else if (key == 't')
        o->tensors = (size_t)n;
    else if (key == 'H')
        o->header_tensors = (size_t)n;
    else
        o->repeat = (int)(n > 1000 ? 1000 : n);
    return 0;
}

static int bst_parse(int argc, char **argv, struct bst_opts *o)
{
    const char *tmp = getenv("TMPDIR");
    int first;
    *o = (struct bst_opts){256ull << 20, 1024, 100000, 10, tmp && *tmp ? tmp : "/tmp"};
    int rc = cli_parse(&bst_cli, argc, argv, bst_opt, o, &first);
    if (rc)
        return rc;
    if (first < argc)
        return cli_usage_error(&bst_cli, "unexpected '%s'", argv[first]);
    if (!o->data_bytes || !o->tensors || o->repeat < 1 || o->data_bytes > (64ull << 30))
        return cli_usage_error(&bst_cli, "need 1 MiB <= size <= 64 GiB, tensors >= 1, "
                                         "repeat >= 1");
    return 0;
}

/* A header listing n BF16 tensors that tile `bytes` bytes, the last one
 * taking the remainder (bytes must be even). Returns malloc'd text. */
static char *bst_header(size_t n, uint64_t bytes)
{
    size_t cap = 100 * n + 64, len = 1;
    char *h = malloc(cap);
    if (!h)
        return NULL;
    h[0] = '{';
    uint64_t per = bytes / n / 2 * 2, off = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t nb = i + 1 == n ? bytes - off : per;
        len += (size_t)snprintf(h + len, cap - len,
                                "%s\"layers.%zu.w\":{\"dtype\":\"BF16\",\"shape\":[%" PRIu64
                                "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                                i ? "," : "", i, nb / 2, off, off + nb);
        off += nb;
    }
    snprintf(h + len, cap - len, "}");
    return h;
}

static int bst_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Writes a safetensors file of n tensors over `bytes` data bytes; the data
 * comes from src (bytes long) or is zero when src is NULL. */
static int bst_make_file(const char *path, size_t n, uint64_t bytes, const uint8_t *src)
{
    char *h = bst_header(n, bytes);
    int fd = h ? open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600) : -1;
    uint64_t hl = h ? strlen(h) : 0;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)(hl >> (8 * i));
    int rc = fd < 0 || bst_write_all(fd, len8, 8) || bst_write_all(fd, h, (size_t)hl);
    if (!rc && src)
        rc = bst_write_all(fd, src, (size_t)bytes);
    else if (!rc)
        rc = ftruncate(fd, (off_t)(8 + hl + bytes));
    if (fd >= 0 && close(fd))
        rc = -1;
    free(h);
    return rc ? -1 : 0;
}

/* Tensor spans relative to the data section, as the file lays them out. */
struct bst_layout {
    uint64_t *off, *len;
    size_t n;
};

static double bst_memcpy_pieces(uint8_t *dst, const uint8_t *src, const struct bst_layout *l)
{
    double t0 = bst_now();
    for (size_t i = 0; i < l->n; i++)
        memcpy(dst + l->off[i], src + l->off[i], (size_t)l->len[i]);
    return bst_now() - t0;
}

static double bst_memcpy_whole(uint8_t *dst, const uint8_t *src, size_t n)
{
    double t0 = bst_now();
    memcpy(dst, src, n);
    return bst_now() - t0;
}

static int bst_fail(const char *what, const st_error *e)
{
    char line[2048];
    cli_error(1, "%s: %s", what, e ? st_error_line(e, line, sizeof line) : strerror(errno));
    return -1;
}

/* One streaming run: open (a fresh mapping), recheck, copy every tensor
 * into dst, close. *open_s: the st_open part; *copy_s: recheck + copies. */
static int bst_stream_once(const char *path, uint8_t *dst, double *total_s, double *open_s,
                           double *copy_s)
{
    st_set *s;
    st_error e;
    double t0 = bst_now();
    if (st_open(&s, path, &e))
        return bst_fail("open", &e);
    double t1 = bst_now();
    if (st_set_recheck(s, &e)) {
        st_close(s);
        return bst_fail("recheck", &e);
    }
    uint64_t base = st_count(s) ? st_tensor_at(s, 0)->offset : 0;
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *t = st_tensor_at(s, i);
        memcpy(dst + (t->offset - base), t->data, (size_t)t->nbytes);
    }
    double t2 = bst_now();
    st_close(s);
    *total_s = bst_now() - t0;
    *open_s = t1 - t0;
    *copy_s = t2 - t1;
    return 0;
}

struct bst_result {
    double memcpy_s, whole_s, stream_s, open_s, copy_s, header_s;
    size_t header_bytes;
};

static int bst_layout_of(const char *path, struct bst_layout *l)
{
    st_set *s;
    st_error e;
    if (st_open(&s, path, &e))
        return bst_fail("open", &e);
    l->n = st_count(s);
    l->off = calloc(l->n, sizeof *l->off);
    l->len = calloc(l->n, sizeof *l->len);
    for (size_t i = 0; l->off && l->len && i < l->n; i++) {
        l->off[i] = st_tensor_at(s, i)->offset - st_tensor_at(s, 0)->offset;
        l->len[i] = st_tensor_at(s, i)->nbytes;
    }
    st_close(s);
    return l->off && l->len ? 0 : bst_fail("out of memory", NULL);
}

static void bst_keep_min(double *best, double t)
{
    *best = t < *best ? t : *best;
}

/* Interleaved runs, so that every side sees the same machine: on a shared
 * host, bandwidth drifts between runs by more than the differences. */
static int bst_stream_runs(const struct bst_opts *o, const char *path, uint8_t *dst,
                           const uint8_t *src, const struct bst_layout *l,
                           struct bst_result *r)
{
    double total, open_s, copy_s;
    int rc = bst_stream_once(path, dst, &total, &open_s, &copy_s); /* warm the cache */
    r->memcpy_s = r->whole_s = r->stream_s = r->open_s = r->copy_s = 1e30;
    for (int k = 0; !rc && k < o->repeat; k++) {
        bst_keep_min(&r->memcpy_s, bst_memcpy_pieces(dst, src, l));
        bst_keep_min(&r->whole_s, bst_memcpy_whole(dst, src, (size_t)o->data_bytes));
        rc = bst_stream_once(path, dst, &total, &open_s, &copy_s);
        bst_keep_min(&r->stream_s, total);
        bst_keep_min(&r->open_s, open_s);
        bst_keep_min(&r->copy_s, copy_s);
    }
    if (!rc && memcmp(dst, src, (size_t)o->data_bytes))
        rc = bst_fail("streamed bytes differ from the file's", NULL);
    return rc;
}

static int bst_stream(const struct bst_opts *o, const char *path, struct bst_result *r)
{
    size_t n = (size_t)o->data_bytes;
    uint8_t *src = malloc(n), *dst = malloc(n);
    struct bst_layout l = {0};
    int rc = src && dst ? 0 : bst_fail("out of memory", NULL);
    for (size_t i = 0; !rc && i < n; i++)
        src[i] = (uint8_t)(i * 131 + (i >> 12));
    if (!rc && bst_make_file(path, o->tensors, o->data_bytes, src))
        rc = bst_fail("cannot create the streamed file", NULL);
    if (!rc)
        rc = bst_layout_of(path, &l);
    if (!rc) {
        memset(dst, 0, n); /* fault the destination in once, for every side */
        rc = bst_stream_runs(o, path, dst, src, &l, r);
    }
    free(l.off);
    free(l.len);
    free(src);
    free(dst);
    return rc;
}

static int bst_header_cost(const struct bst_opts *o, const char *path, struct bst_result *r)
{
    if (bst_make_file(path, o->header_tensors, 2 * (uint64_t)o->header_tensors, NULL))
        return bst_fail("cannot create the header file", NULL);
    r->header_s = 1e30;
    for (int k = 0; k <= o->repeat; k++) { /* the first run warms the cache */
        st_set *s;
        st_error e;
        double t0 = bst_now();
        if (st_open(&s, path, &e))
            return bst_fail("open", &e);
        double t = bst_now() - t0;
        r->header_bytes = (size_t)(st_count(s) ? st_tensor_at(s, 0)->offset - 8 : 0);
        st_close(s);
        if (k)
            r->header_s = t < r->header_s ? t : r->header_s;
    }
    return 0;
}

/* memcpy: the same tensor-sized pieces between anonymous buffers (the
 * peer); memcpy_whole: one call over all bytes (glibc then switches to
 * non-temporal stores, which per-tensor copies of a few MiB never reach).
 * stream: recheck + copies out of a fresh mapping (page faults included);
 * with_open: the whole run, st_open and st_close included. */
static int bst_report(FILE *out, const struct bst_opts *o, const struct bst_result *r)
{
    double gb = (double)o->data_bytes / 1e9;
    json_t *root = json_pack(
        "{s:s, s:i, s:{s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}, s:{s:I, s:I, s:f, s:f}}",
        "bench", "safetensors", "repeat", o->repeat, "stream", "bytes",
        (json_int_t)o->data_bytes, "tensors", (json_int_t)o->tensors, "memcpy_gbps",
        gb / r->memcpy_s, "stream_gbps", gb / r->copy_s, "stream_vs_memcpy",
        r->memcpy_s / r->copy_s, "with_open_gbps", gb / r->stream_s, "with_open_vs_memcpy",
        r->memcpy_s / r->stream_s, "memcpy_whole_gbps", gb / r->whole_s,
        "stream_vs_memcpy_whole", r->whole_s / r->copy_s, "open_parse_ms", r->open_s * 1e3,
        "header", "tensors", (json_int_t)o->header_tensors, "header_bytes",
        (json_int_t)r->header_bytes, "header_open_ms", r->header_s * 1e3,
        "header_us_per_tensor",
        o->header_tensors ? r->header_s * 1e6 / (double)o->header_tensors : 0.0);
    int bad = !root || json_dumpf(root, out, JSON_INDENT(1) | JSON_PRESERVE_ORDER) ||
              fputc('\n', out) == EOF;
    json_decref(root);
    return bad ? cli_error(1, "cannot write JSON (out of memory?)") : 0;
}

int bench_safetensors(int argc, char **argv, FILE *json_out)
{
    struct bst_opts o;
    int prc = bst_parse(argc, argv, &o);
    if (prc)
        return prc == CLI_HELP ? 0 : prc;
    char stream_path[4096], header_path[4096];
    snprintf(stream_path, sizeof stream_path, "%s/refit-bench-stream-%ld.safetensors", o.dir,
             (long)getpid());
    snprintf(header_path, sizeof header_path, "%s/refit-bench-header-%ld.safetensors", o.dir,
             (long)getpid());
    struct bst_result r = {0};
    int rc = bst_stream(&o, stream_path, &r);
    unlink(stream_path);
    if (!rc && o.header_tensors)
        rc = bst_header_cost(&o, header_path, &r);
    unlink(header_path);
    if (rc)
        return 1;
    return bst_report(json_out, &o, &r);
}

int bench_safetensors_main(int argc, char **argv)
{
    return bench_safetensors(argc, argv, stdout);
}
