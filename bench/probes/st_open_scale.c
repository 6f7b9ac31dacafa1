/* Cost of opening a sharded safetensors checkpoint against its tensor
 * count (issue 28, item 6): writes, under DIR, checkpoints shaped like
 * Qwen3-30B-A3B block-FP8 (48 layers; per layer 13 dense tensors and, per
 * expert, gate/up/down FP8 weights with their F32 weight_scale_inv) for
 * each expert count, as 3 shards plus model.safetensors.index.json. The
 * shards are sparse (header, then ftruncate to the full size), so only
 * headers touch the disk. Then times refit_source_open + close, best and
 * median of --runs, and prints one JSON line per checkpoint.
 *
 *   st_open_scale DIR [--experts E1,E2,...] [--runs N]
 *
 * Default experts 3,52,128: 1,491, 15,603 and 37,491 tensors. Public API
 * only (refit.h). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <refit/refit.h>

#define LAYERS 48
#define SHARDS 3

struct text {
    char *p;
    size_t n, cap;
};

static void add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void add(struct text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(t->p + t->n, t->cap - t->n, fmt, ap);
        va_end(ap);
        if (k >= 0 && (size_t)k < t->cap - t->n) {
            t->n += (size_t)k;
            return;
        }
        t->cap = t->cap ? t->cap * 2 : 1 << 16;
        if (!(t->p = realloc(t->p, t->cap))) {
            perror("realloc");
            exit(1);
        }
    }
}

struct shard {
    struct text hdr;
    uint64_t pos;
};

/* One tensor into shard s's header and the index's weight_map. */
static void tensor(struct shard *sh, int s, struct text *map, const char *name,
                   const char *dtype, unsigned bytes, int64_t d0, int64_t d1)
{
    uint64_t n = (uint64_t)bytes * (uint64_t)d0 * (uint64_t)(d1 ? d1 : 1);
    struct shard *x = &sh[s];
    add(&x->hdr, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", x->hdr.n > 1 ? "," : "", name,
        dtype, (long long)d0);
    if (d1)
        add(&x->hdr, ",%lld", (long long)d1);
    add(&x->hdr, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)x->pos,
        (unsigned long long)(x->pos + n));
    x->pos += n;
    add(map, "%s\"%s\":\"model-%05d-of-%05d.safetensors\"", map->n ? "," : "", name, s + 1,
        SHARDS);
}

/* fp8 weight [r, c] and its [r/128, c/128] F32 scale. */
static void fp8(struct shard *sh, int s, struct text *map, const char *base, int64_t r,
                int64_t c)
{
    char name[256];
    snprintf(name, sizeof name, "%s.weight", base);
    tensor(sh, s, map, name, "F8_E4M3", 1, r, c);
    snprintf(name, sizeof name, "%s.weight_scale_inv", base);
    tensor(sh, s, map, name, "F32", 4, (r + 127) / 128, (c + 127) / 128);
}

static size_t write_checkpoint(const char *dir, int experts)
{
    struct shard sh[SHARDS] = {0};
    struct text map = {0};
    size_t count = 0;
    char base[256];
    for (int s = 0; s < SHARDS; s++)
        add(&sh[s].hdr, "{");
    tensor(sh, 0, &map, "model.embed_tokens.weight", "BF16", 2, 151936, 2048);
    count++;
    for (int l = 0; l < LAYERS; l++) {
        int s = l * SHARDS / LAYERS;
        static const struct {
            const char *name;
            int64_t r, c;
        } attn[] = {{"q_proj", 4096, 2048}, {"k_proj", 512, 2048}, {"v_proj", 512, 2048},
                    {"o_proj", 2048, 4096}};
        for (int i = 0; i < 4; i++) {
            snprintf(base, sizeof base, "model.layers.%d.self_attn.%s", l, attn[i].name);
            fp8(sh, s, &map, base, attn[i].r, attn[i].c);
        }
        static const char *const norms[] = {"self_attn.q_norm", "self_attn.k_norm",
                                            "input_layernorm", "post_attention_layernorm"};
        for (int i = 0; i < 4; i++) {
            snprintf(base, sizeof base, "model.layers.%d.%s.weight", l, norms[i]);
            tensor(sh, s, &map, base, "BF16", 2, i < 2 ? 128 : 2048, 0);
        }
        snprintf(base, sizeof base, "model.layers.%d.mlp.gate.weight", l);
        tensor(sh, s, &map, base, "BF16", 2, experts, 2048);
        count += 13;
        for (int e = 0; e < experts; e++) {
            static const char *const proj[] = {"gate_proj", "up_proj", "down_proj"};
            for (int p = 0; p < 3; p++) {
                snprintf(base, sizeof base, "model.layers.%d.mlp.experts.%d.%s", l, e, proj[p]);
                fp8(sh, s, &map, base, p < 2 ? 768 : 2048, p < 2 ? 2048 : 768);
            }
            count += 6;
        }
    }
    tensor(sh, SHARDS - 1, &map, "model.norm.weight", "BF16", 2, 2048, 0);
    tensor(sh, SHARDS - 1, &map, "lm_head.weight", "BF16", 2, 151936, 2048);
    count += 2;
    uint64_t total = 0;
    for (int s = 0; s < SHARDS; s++) {
        add(&sh[s].hdr, "}");
        char path[4160];
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, s + 1, SHARDS);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        uint8_t len[8];
        for (int i = 0; i < 8; i++)
            len[i] = (uint8_t)((uint64_t)sh[s].hdr.n >> (8 * i));
        if (fd < 0 || write(fd, len, 8) != 8 ||
            write(fd, sh[s].hdr.p, sh[s].hdr.n) != (ssize_t)sh[s].hdr.n ||
            ftruncate(fd, (off_t)(8 + sh[s].hdr.n + sh[s].pos)) || close(fd)) {
            fprintf(stderr, "st_open_scale: %s: %s\n", path, strerror(errno));
            exit(1);
        }
        total += sh[s].pos;
        free(sh[s].hdr.p);
    }
    char path[4160];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "{\"metadata\":{\"total_size\":%llu},\"weight_map\":{%s}}\n",
                      (unsigned long long)total, map.p) < 0 || fclose(f)) {
        fprintf(stderr, "st_open_scale: %s: %s\n", path, strerror(errno));
        exit(1);
    }
    free(map.p);
    return count;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: st_open_scale DIR [--experts E1,E2,...] [--runs N]\n");
        return 2;
    }
    const char *root = argv[1], *list = "3,52,128";
    int runs = 5;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--experts"))
            list = argv[i + 1];
        else if (!strcmp(argv[i], "--runs"))
            runs = atoi(argv[i + 1]) > 0 ? atoi(argv[i + 1]) : 1;
    }
    refit_ctx *ctx = NULL;
    if (refit_open(&ctx, NULL)) {
        fprintf(stderr, "st_open_scale: refit_open failed\n");
        return 1;
    }
    double *t = calloc((size_t)runs, sizeof *t);
    for (const char *p = list; *p;) {
        int experts = atoi(p);
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/e%d", root, experts);
        if (mkdir(dir, 0755) && errno != EEXIST) {
            fprintf(stderr, "st_open_scale: %s: %s\n", dir, strerror(errno));
            return 1;
        }
        size_t count = write_checkpoint(dir, experts);
        for (int r = 0; r < runs; r++) {
            refit_source *src = NULL;
            double t0 = now();
            int rc = refit_source_open(&src, ctx, dir);
            size_t n = rc ? 0 : refit_source_count(src);
            refit_source_close(src);
            t[r] = now() - t0;
            if (rc || n != count) {
                fprintf(stderr, "st_open_scale: %s: %zu of %zu tensors: %s\n", dir, n, count,
                        refit_errmsg(ctx));
                return 1;
            }
        }
        qsort(t, (size_t)runs, sizeof *t, cmp_double);
        printf("{\"experts\": %d, \"tensors\": %zu, \"open_s_best\": %.5f, "
               "\"open_s_median\": %.5f, \"us_per_tensor\": %.3f}\n",
               experts, count, t[0], t[runs / 2], t[0] * 1e6 / (double)count);
        fflush(stdout);
        p = strchr(p, ',');
        if (!p)
            break;
        p++;
    }
    free(t);
    refit_close(ctx);
    return 0;
}
