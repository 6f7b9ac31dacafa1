/* A FIFO where a checkpoint file, a model.safetensors.index.json or a
 * refit-fmt-*.so should be is refused at once (opened O_NONBLOCK, then
 * fstat: not a regular file), never waited on. Each case runs under an
 * alarm: a blocked open fails the suite instead of hanging it. A shard
 * that is a symbolic link out of its directory is followed, as the hub
 * cache needs (docs/safetensors.md, "Symbolic links"). */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "putil.h"

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "blocked on a FIFO\n";
    if (write(2, m, sizeof m - 1) < 0)
        _exit(3);
    _exit(2);
}

static refit_ctx *open_ctx(const char *plugin_dirs)
{
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    o.plugin_dirs = plugin_dirs;
    refit_ctx *ctx = NULL;
    signal(SIGALRM, on_alarm);
    alarm(5);
    PT_RC(NULL, refit_open(&ctx, &o), REFIT_OK);
    alarm(0);
    return ctx;
}

static void test_fifo_checkpoint_file(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    refit_ctx *ctx = open_ctx(NULL);
    refit_source *src = NULL;
    alarm(5);
    PT_RC(ctx, refit_source_open(&src, ctx, path), REFIT_EIO);
    /* the directory holding it: its one .safetensors file is the FIFO */
    PT_HAS(refit_errmsg(ctx), "not a regular file");
    assert_int_not_equal(refit_source_open(&src, ctx, dir), REFIT_OK);
    alarm(0);
    assert_null(src);
    refit_close(ctx);
    pt_rmtree(dir);
}

static void test_fifo_index(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    refit_ctx *ctx = open_ctx(NULL);
    refit_source *src = NULL;
    alarm(5);
    PT_RC(ctx, refit_source_open(&src, ctx, dir), REFIT_EIO);
    alarm(0);
    PT_HAS(refit_errmsg(ctx), "model.safetensors.index.json");
    PT_HAS(refit_errmsg(ctx), "not a regular file");
    refit_close(ctx);
    pt_rmtree(dir);
}

static void test_fifo_plugin(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/refit-fmt-fifo.so", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    refit_ctx *ctx = open_ctx(dir); /* the search finds it and refuses it */
    refit_close(ctx);
    setenv("REFIT_PLUGIN_PATH", path, 1);
    ctx = open_ctx(NULL);
    unsetenv("REFIT_PLUGIN_PATH");
    refit_close(ctx);
    pt_rmtree(dir);
}

static void test_symlinked_shard_is_followed(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    char ckpt[2048], blob[2048], link[4096];
    snprintf(ckpt, sizeof ckpt, "%s/snapshot", dir);
    snprintf(blob, sizeof blob, "%s/blob", dir);
    snprintf(link, sizeof link, "%s/model.safetensors", ckpt);
    assert_int_equal(mkdir(ckpt, 0700), 0);
    /* one U8 tensor "x" of one byte; the header padded to 8 bytes */
    const char hdr[] = "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}   ";
    unsigned char file[8 + sizeof hdr - 1 + 1];
    uint64_t n = sizeof hdr - 1;
    for (int i = 0; i < 8; i++)
        file[i] = (unsigned char)(n >> (8 * i));
    memcpy(file + 8, hdr, n);
    file[8 + n] = 7;
    FILE *f = fopen(blob, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(file, 1, sizeof file, f), sizeof file);
    fclose(f);
    assert_int_equal(symlink("../blob", link), 0);
    refit_ctx *ctx = open_ctx(NULL);
    refit_source *src = NULL;
    PT_RC(ctx, refit_source_open(&src, ctx, ckpt), REFIT_OK);
    assert_int_equal(refit_source_count(src), 1);
    refit_source_close(src);
    refit_close(ctx);
    unlink(link);
    rmdir(ckpt);
    pt_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_checkpoint_file),
        cmocka_unit_test(test_fifo_index),
        cmocka_unit_test(test_fifo_plugin),
        cmocka_unit_test(test_symlinked_shard_is_followed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
