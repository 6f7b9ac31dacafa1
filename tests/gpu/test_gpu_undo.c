/* The undo log on the CUDA backend (core/undo.c, docs/core.md "Undo
 * log"): saves into device memory within refit_options.undo_device_budget
 * (rows of the batch table), pinned host memory for the rest, both queued
 * on the caller's stream ahead of the copies. An update loaded on a
 * non-blocking stream from device and pinned sources, small and large
 * tensors, is aborted: every byte comes back, bit for bit, with the log in
 * host memory, in device memory and split between them, over several
 * updates (pooled chunks), and no runtime tensor's address moves. The
 * first update after seal allocates no undo memory (seal reserved it). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <refit/sys/cuda.h>

#include "gpu_twin.h"
#include "core/cuda/backend_cuda.h"
#include "core/model.h"
#include "core/undo.h"

#define N_MOD 12

typedef struct rt {
    refit_tensor t;
    int64_t shape[1];
    void *d;                    /* runtime bytes, device */
    void *src_d;                /* a device source */
    void *src_pin;              /* a pinned source */
    size_t bytes;
} rt;

typedef struct world {
    refit_ctx *ctx;
    refit_model *m;
    rt r[N_MOD];
    cudaStream_t stream;
    int pageable;               /* sources given as CPU memory (the ring's path) */
} world;

/* Sizes around save_min (64 KiB) and the row size, odd on purpose. */
static size_t mod_bytes(int i)
{
    static const size_t sz[] = {4 * 1, 4 * 1000, 4 * 16383, 4 * 16385, 4 * 262147,
                                4 * 3000001, 4 * 77, 4 * 1048576};
    return sz[i % (int)(sizeof sz / sizeof sz[0])];
}

static void fill(void *p, size_t n, uint64_t seed)
{
    uint32_t *w = p;
    for (size_t i = 0; i < n / 4; i++)
        w[i] = (uint32_t)twin_mix(seed * 1000003u + i);
}

static void world_open(world *w, uint64_t budget)
{
    memset(w, 0, sizeof *w);
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    o.undo_device_budget = budget;
    assert_int_equal(refit_open(&w->ctx, &o), REFIT_OK);
    OK(w, refit_model_create(&w->m, w->ctx));
    CU(cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking));
    for (int i = 0; i < N_MOD; i++) {
        rt *r = &w->r[i];
        char mod[16];
        snprintf(mod, sizeof mod, "m%d", i);
        r->bytes = mod_bytes(i);
        r->shape[0] = (int64_t)(r->bytes / 4);
        CU(cudaMalloc(&r->d, r->bytes));
        CU(cudaMalloc(&r->src_d, r->bytes));
        CU(cudaHostAlloc(&r->src_pin, r->bytes, cudaHostAllocDefault));
        CU(cudaMemset(r->d, 0x5a, r->bytes));
        r->t = (refit_tensor){.data = r->d, .device = {REFIT_DEVICE_CUDA, 0}, .ndim = 1,
                              .dtype = F32, .shape = r->shape};
        OK(w, refit_model_add_module(w->m, mod, "unquantized", NULL));
        OK(w, refit_module_bind_runtime(w->m, mod, "w", &r->t));
        refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
        s.dtype = F32;
        s.ndim = 1;
        s.shape[0] = r->shape[0];
        s.target = "w";
        char name[32];
        snprintf(name, sizeof name, "m%d.weight", i);
        OK(w, refit_model_expect(w->m, mod, name, &s));
    }
    OK(w, refit_model_seal(w->m));
}

static void world_close(world *w)
{
    refit_close(w->ctx);
    for (int i = 0; i < N_MOD; i++) {
        cudaFree(w->r[i].d);
        cudaFree(w->r[i].src_d);
        cudaFreeHost(w->r[i].src_pin);
    }
    cudaStreamDestroy(w->stream);
}

/* Version v's bytes of every module, from a device source (even modules)
 * or a pinned one (odd), on the world's stream. */
static refit_txn *load(world *w, int v, const char *label, int rollback)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = label;
    o.rollback = rollback;
    refit_txn *t = NULL;
    OK(w, refit_begin(&t, w->m, &o));
    for (int i = 0; i < N_MOD; i++) {
        rt *r = &w->r[i];
        fill(r->src_pin, r->bytes, (uint64_t)v * 100 + (uint64_t)i);
        refit_tensor s = {.data = r->src_pin, .device = {REFIT_DEVICE_CUDA_HOST, 0},
                          .ndim = 1, .dtype = F32, .shape = r->shape};
        if (w->pageable) {
            s.device = (refit_device){REFIT_DEVICE_CPU, 0}; /* read as pageable memory */
        } else if (i % 2 == 0) {
            CU(cudaMemcpy(r->src_d, r->src_pin, r->bytes, cudaMemcpyHostToDevice));
            s.data = r->src_d;
            s.device = (refit_device){REFIT_DEVICE_CUDA, 0};
        }
        char name[32];
        snprintf(name, sizeof name, "m%d.weight", i);
        OK(w, refit_load(t, name, &s, w->stream));
    }
    return t;
}

/* Every runtime byte, device to host (malloc'd). */
static char *snapshot(world *w)
{
    size_t n = 0;
    for (int i = 0; i < N_MOD; i++)
        n += w->r[i].bytes;
    char *p = malloc(n), *q = p;
    assert_non_null(p);
    CU(cudaDeviceSynchronize());
    for (int i = 0; i < N_MOD; i++) {
        CU(cudaMemcpy(q, w->r[i].d, w->r[i].bytes, cudaMemcpyDeviceToHost));
        q += w->r[i].bytes;
    }
    return p;
}

static size_t total_bytes(void)
{
    size_t n = 0;
    for (int i = 0; i < N_MOD; i++)
        n += mod_bytes(i);
    return n;
}

/* Load v2 over v1 on the stream, abort: the bytes of v1, every address
 * where it was. Returns the stats the txn had before the abort. */
static refit_txn_stats abort_round(world *w, const char *v1)
{
    refit_txn *t = load(w, 2, "v2", 1);
    refit_txn_stats st;
    OK(w, refit_txn_stats_get(t, &st));
    OK(w, refit_abort(t));
    char *now = snapshot(w);
    int same = !memcmp(now, v1, total_bytes());
    free(now);
    if (!same)
        fail_msg("abort did not restore every byte (device %llu, host %llu bytes saved)",
                 (unsigned long long)st.undo_device_bytes,
                 (unsigned long long)st.undo_host_bytes);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    for (int i = 0; i < N_MOD; i++)
        assert_ptr_equal(w->r[i].t.data, w->r[i].d);
    return st;
}

static void run_budget(uint64_t budget, refit_txn_stats *out)
{
    world w;
    world_open(&w, budget);
    OK(&w, refit_finalize(load(&w, 1, "v1", 1)));
    char *v1 = snapshot(&w);
    refit_txn_stats first = abort_round(&w, v1);
    for (int k = 0; k < 2; k++) { /* pooled chunks: the same placement */
        refit_txn_stats again = abort_round(&w, v1);
        assert_int_equal(again.undo_device_bytes, first.undo_device_bytes);
        assert_int_equal(again.undo_host_bytes, first.undo_host_bytes);
    }
    /* and a committed update after the aborts: the new bytes, same addresses
     * (begin re-checks every signature) */
    OK(&w, refit_finalize(load(&w, 3, "v3", 1)));
    char *v3 = snapshot(&w), *want = malloc(total_bytes()), *q = want;
    assert_non_null(want);
    for (int i = 0; i < N_MOD; i++) {
        fill(q, w.r[i].bytes, 300 + (uint64_t)i);
        q += w.r[i].bytes;
    }
    int same = !memcmp(v3, want, total_bytes());
    free(want);
    free(v3);
    free(v1);
    assert_true(same);
    world_close(&w);
    *out = first;
}

static void test_host_placement(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    refit_txn_stats st;
    run_budget(0, &st);
    assert_int_equal(st.undo_device_bytes, 0);
    assert_int_equal(st.undo_host_bytes, total_bytes());
}

static void test_device_placement(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    refit_txn_stats st;
    run_budget(2 * total_bytes() + (64u << 20), &st);
    assert_int_equal(st.undo_device_bytes, total_bytes());
    assert_int_equal(st.undo_host_bytes, 0);
}

static void test_mixed_placement(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    refit_txn_stats st;
    uint64_t budget = (total_bytes() / 2) & ~(uint64_t)255;
    run_budget(budget, &st);
    assert_true(st.undo_device_bytes > 0 && st.undo_device_bytes <= budget);
    assert_true(st.undo_host_bytes > 0);
    assert_int_equal(st.undo_device_bytes + st.undo_host_bytes, total_bytes());
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One committed update with rollback (the defaults), waited for: seconds. */
static double timed_update(world *w, int v, const char *label)
{
    double t0 = now_s();
    OK(w, refit_finalize(load(w, v, label, 1)));
    CU(cudaStreamSynchronize(w->stream));
    return now_s() - t0;
}

/* The first update after seal allocates no undo memory: seal reserved it
 * on its own thread (core/undo.c), pinned host memory at the defaults
 * (budget 0), device memory within a budget, both when split; counted by
 * the backend's cudaHostAlloc / cudaMalloc calls for the undo log, not
 * timed. The first and a steady update's times are printed, with what
 * else the first made (stream queues, save streams, ring chunks: none
 * after refit_sys_cuda_prepare of its stream, which is asserted too). */
static void test_first_update_allocates_no_undo(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    uint64_t budgets[5] = {0, 2 * total_bytes() + (64u << 20),
                           (total_bytes() / 2) & ~(uint64_t)255, 0, 0};
    for (int b = 0; b < 5; b++) {
        world w;
        world_open(&w, budgets[b]); /* sealed: the reservation runs */
        w.pageable = b >= 3; /* sources from CPU memory: through the ring */
        int prepared = b == 4; /* the stream's queue, save stream and ring made now */
        if (prepared)
            OK(&w, refit_sys_cuda_prepare(0, w.stream, REFIT_SYS_CUDA_PREPARE_SAVES |
                                                           REFIT_SYS_CUDA_PREPARE_RING));
        undo_pool_settle(w.m->undo_pool);
        undo_pool_stats ps;
        undo_pool_stats_get(w.m->undo_pool, &ps);
        assert_false(ps.reserve_failed);
        assert_true(ps.allocs > 0);
        backend_cuda_allocs a0, a1, a2;
        backend_cuda_allocs_get(&a0);
        double first = timed_update(&w, 1, "v1");
        backend_cuda_allocs_get(&a1);
        double steady = timed_update(&w, 2, "v2");
        backend_cuda_allocs_get(&a2);
        undo_pool_stats after;
        undo_pool_stats_get(w.m->undo_pool, &after);
        print_message("# budget %llu%s%s: reserved %llu device + %llu pinned bytes in %.1f ms at "
                      "seal; first update %.2f ms, steady %.2f ms (%.2fx); the first made %llu "
                      "undo pinned, %llu undo device allocations, %llu stream queues, %llu save "
                      "streams, %llu ring chunks, %llu staging blocks\n",
                      (unsigned long long)budgets[b], w.pageable ? " (pageable sources)" : "",
                      prepared ? " (stream prepared)" : "",
                      (unsigned long long)ps.reserved[0],
                      (unsigned long long)ps.reserved[1], (double)ps.reserve_ns * 1e-6,
                      first * 1e3, steady * 1e3, first / steady,
                      (unsigned long long)(a1.undo_pinned - a0.undo_pinned),
                      (unsigned long long)(a1.undo_device - a0.undo_device),
                      (unsigned long long)(a1.queues - a0.queues),
                      (unsigned long long)(a1.side_streams - a0.side_streams),
                      (unsigned long long)(a1.ring_chunks - a0.ring_chunks),
                      (unsigned long long)(a1.staging - a0.staging));
        assert_int_equal(a1.undo_pinned, a0.undo_pinned);
        assert_int_equal(a1.undo_device, a0.undo_device);
        assert_int_equal(a2.undo_pinned, a0.undo_pinned);
        assert_int_equal(a2.undo_device, a0.undo_device);
        assert_int_equal(after.allocs, ps.allocs);
        if (prepared) { /* nothing else either */
            assert_int_equal(a1.queues, a0.queues);
            assert_int_equal(a1.side_streams, a0.side_streams);
            assert_int_equal(a1.ring_chunks, a0.ring_chunks);
        }
        world_close(&w);
    }
    /* REFIT_UNDO_RESERVE=0: the first update allocates, as before */
    setenv("REFIT_UNDO_RESERVE", "0", 1);
    world w;
    world_open(&w, 0);
    backend_cuda_allocs a0, a1;
    backend_cuda_allocs_get(&a0);
    double first = timed_update(&w, 1, "v1");
    backend_cuda_allocs_get(&a1);
    print_message("# REFIT_UNDO_RESERVE=0: first update %.2f ms, %llu undo pinned allocations\n",
                  first * 1e3, (unsigned long long)(a1.undo_pinned - a0.undo_pinned));
    assert_true(a1.undo_pinned > a0.undo_pinned);
    world_close(&w);
    unsetenv("REFIT_UNDO_RESERVE");
}

int main(void)
{
    if (twin_skip_suite_without_device())
        return 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_placement),
        cmocka_unit_test(test_device_placement),
        cmocka_unit_test(test_mixed_placement),
        cmocka_unit_test(test_first_update_allocates_no_undo),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
