/* refit/sdk/pgpu_host.h over a fake host: refit_pgpu_host_init_at takes
 * the module's status key where the host has status_word_at and falls
 * back to the status word where it has not; launch_dims hands a 3-D grid,
 * block and dynamic shared memory to gpu_launch as given, launch a 1-D
 * one; the REFIT_STATUS_AT key orders by piece, then element. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include <refit/format.h>
#include <refit/sdk/pgpu_host.h>

typedef struct fake {
    uint32_t word;
    unsigned long long key;
    int word_calls, key_calls;
    uint32_t n_names;
    const char *first_name, *what;
    refit_gpu_launch last;
    uint32_t grid0, block0;
    int launches;
} fake;

static int f_error(void *host, int status, const char *fmt, ...)
{
    (void)host;
    (void)fmt;
    return status;
}

static int f_device_info(void *host, refit_device dev, refit_device_info *out)
{
    (void)host;
    out->device = dev;
    out->served = 1;
    out->multiprocessors = 132;
    return REFIT_OK;
}

static int f_gpu_load(void *host, const void *image, size_t size, void **module)
{
    (void)host;
    (void)size;
    *module = (void *)image;
    return REFIT_OK;
}

static int f_gpu_kernel(void *host, void *module, const char *name, void **kernel)
{
    (void)host;
    (void)module;
    *kernel = (void *)name;
    return REFIT_OK;
}

static int f_gpu_launch(void *host, refit_device dev, void *kernel, const refit_gpu_launch *l,
                        void *stream)
{
    fake *f = host;
    (void)dev;
    (void)kernel;
    (void)stream;
    f->last = *l;
    f->launches++;
    return REFIT_OK;
}

static int f_status_word(void *host, const refit_fmt_module *m, refit_device dev, uint32_t n,
                         const char *const *names, const char *what, void *stream,
                         uint32_t **word)
{
    fake *f = host;
    (void)m;
    (void)dev;
    (void)stream;
    f->word_calls++;
    f->n_names = n;
    f->first_name = names[0];
    f->what = what;
    *word = &f->word;
    return REFIT_OK;
}

static int f_status_word_at(void *host, const refit_fmt_module *m, refit_device dev, uint32_t n,
                            const char *const *names, const char *what, void *stream,
                            unsigned long long **key)
{
    fake *f = host;
    (void)m;
    (void)dev;
    (void)stream;
    f->key_calls++;
    f->n_names = n;
    f->first_name = names[0];
    f->what = what;
    *key = &f->key;
    return REFIT_OK;
}

static refit_host_v2 host_of(fake *f, size_t struct_size)
{
    refit_host_v2 h;
    memset(&h, 0, sizeof h);
    h.abi_version = REFIT_FORMAT_ABI_VERSION;
    h.struct_size = (uint32_t)struct_size;
    h.host = f;
    h.error = f_error;
    h.device_info = f_device_info;
    h.gpu_load = f_gpu_load;
    h.gpu_kernel = f_gpu_kernel;
    h.gpu_launch = f_gpu_launch;
    h.status_word = f_status_word;
    h.status_word_at = f_status_word_at;
    return h;
}

static const char *const names[] = {"m.w0", "m.w1", "m.w2"};
static const unsigned char image[4];
static const refit_device cuda0 = {REFIT_DEVICE_CUDA, 0};

static void test_init_at_takes_the_key(void **state)
{
    (void)state;
    fake f = {0};
    refit_host_v2 h = host_of(&f, sizeof h);
    refit_fmt_module m = {.name = "m"};
    refit_pgpu_host g;
    assert_int_equal(refit_pgpu_host_init_at(&g, &h, &m, cuda0, NULL, image, sizeof image, 3,
                                             names, "NaN"), REFIT_OK);
    assert_int_equal(f.key_calls, 1);
    assert_int_equal(f.word_calls, 0);
    assert_ptr_equal(g.g.status_at, &f.key);
    assert_null(g.g.status);
    assert_int_equal(f.n_names, 3);
    assert_string_equal(f.first_name, "m.w0");
    assert_string_equal(f.what, "NaN");
    assert_int_equal(g.g.multiprocessors, 132);
}

static void test_init_at_falls_back_on_an_older_host(void **state)
{
    (void)state;
    fake f = {0};
    /* a host table that ends before status_word_at */
    refit_host_v2 h = host_of(&f, offsetof(refit_host_v2, status_word_at));
    refit_fmt_module m = {.name = "m"};
    refit_pgpu_host g;
    assert_int_equal(refit_pgpu_host_init_at(&g, &h, &m, cuda0, NULL, image, sizeof image, 3,
                                             names, "NaN"), REFIT_OK);
    assert_int_equal(f.key_calls, 0);
    assert_int_equal(f.word_calls, 1);
    assert_ptr_equal(g.g.status, &f.word);
    assert_null(g.g.status_at);
}

static void test_launch_dims_and_launch(void **state)
{
    (void)state;
    fake f = {0};
    refit_host_v2 h = host_of(&f, sizeof h);
    refit_fmt_module m = {.name = "m"};
    refit_pgpu_host g;
    assert_int_equal(refit_pgpu_host_init(&g, &h, &m, cuda0, NULL, image, sizeof image, 3, names,
                                          "NaN"), REFIT_OK);
    void *k = NULL, *args[] = {NULL};
    assert_int_equal(g.g.kernel(&g.g, "k2d", &k), REFIT_OK);
    assert_non_null(g.g.launch_dims);
    refit_gpu_launch l = {sizeof l, {7, 3, 2}, {32, 8, 1}, 4096, args};
    assert_int_equal(g.g.launch_dims(&g.g, k, &l), REFIT_OK);
    assert_int_equal(f.last.grid[0], 7);
    assert_int_equal(f.last.grid[1], 3);
    assert_int_equal(f.last.grid[2], 2);
    assert_int_equal(f.last.block[0], 32);
    assert_int_equal(f.last.block[1], 8);
    assert_int_equal(f.last.shared_bytes, 4096);
    assert_ptr_equal(f.last.args, args);
    assert_int_equal(g.g.launch(&g.g, k, 5, 256, args), REFIT_OK);
    assert_int_equal(f.last.grid[0], 5);
    assert_int_equal(f.last.grid[1], 1);
    assert_int_equal(f.last.block[0], 256);
    assert_int_equal(f.last.shared_bytes, 0);
    assert_int_equal(f.launches, 2);
}

static void test_status_at_key_order(void **state)
{
    (void)state;
    /* atomicMin keeps the lowest piece, then its lowest element */
    assert_true(REFIT_STATUS_AT(0, REFIT_STATUS_AT_ELEMENT_MAX) < REFIT_STATUS_AT(1, 0));
    assert_true(REFIT_STATUS_AT(3, 9) < REFIT_STATUS_AT(3, 10));
    assert_true(REFIT_STATUS_AT(0xfffffeu, 0) < REFIT_STATUS_AT_NONE);
    unsigned long long k = REFIT_STATUS_AT(70, 123456789012ull);
    assert_int_equal(REFIT_STATUS_AT_PIECE(k), 70);
    assert_int_equal(REFIT_STATUS_AT_ELEMENT(k), 123456789012ull);
    /* an element past the field reads as its largest, never as another piece */
    unsigned long long big = REFIT_STATUS_AT(2, 1ull << 45);
    assert_int_equal(REFIT_STATUS_AT_PIECE(big), 2);
    assert_int_equal(REFIT_STATUS_AT_ELEMENT(big), REFIT_STATUS_AT_ELEMENT_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_at_takes_the_key),
        cmocka_unit_test(test_init_at_falls_back_on_an_older_host),
        cmocka_unit_test(test_launch_dims_and_launch),
        cmocka_unit_test(test_status_at_key_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
