/* sdk/pgpu_cudart.h's entry points over the emulator, for a format's
 * direct entries (plugins/<fmt>/<fmt>_direct.c) and its launcher
 * (plugins/<fmt>/<fmt>_launch.c), both compiled unmodified: an image is
 * the table of kernels its EMU_IMAGE registered (emu.h), a kernel is found
 * by name in the image the call began with and runs at once through
 * emu_launch; "device" memory is host memory. Like pgpu_cudart.c: the
 * current device's status word set to REFIT_STATUS_NONE at begin and read
 * back at end, 256-byte aligned scratch for the call (here each slice its
 * own allocation, filled with junk, freed at end, so that a read of what
 * the launcher did not upload or a write past a slice shows), grid 0
 * launched as 1. Also the few backend symbols the GPU tests call: one
 * device, and the direct entries' last message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"
extern "C" {
#include "sdk/pgpu_cudart.h"
}

#define PE_IMAGES 16
/* A small device: persistent grids of a few blocks, and the grid-stride
 * loops go round several times. */
#define PE_MULTIPROCESSORS 2

struct pe_image {
    const void *image;
    const char *what;
    const emu_kernel *k;
    unsigned n;
};
static pe_image pe_images[PE_IMAGES];
static uint32_t *pe_word; /* device 0's status word */
static void *pe_slices[64];
static unsigned pe_nslices;

extern "C" void emu_register_image(const void *image, const char *what, const emu_kernel *k,
                                   unsigned n)
{
    for (unsigned i = 0; i < PE_IMAGES; i++)
        if (!pe_images[i].image) {
            pe_images[i] = pe_image{image, what, k, n};
            return;
        }
    fprintf(stderr, "EMU: more than %d images\n", PE_IMAGES);
    abort();
}

static char pe_err[320];
extern "C" const char *kern_cuda_last_error(void) { return pe_err; }
extern "C" void kern_cuda_set_error(const char *m) { snprintf(pe_err, sizeof pe_err, "%s", m); }
extern "C" int backend_cuda_device_count(void) { return 1; }
extern "C" const char *backend_cuda_unavailable(void) { return ""; }

static const pe_image *of(refit_pgpu *g)
{
    return (const pe_image *)((pgpu_cudart *)(void *)g)->lib;
}

static int pe_kernel(refit_pgpu *g, const char *name, void **kernel)
{
    const pe_image *im = of(g);
    for (unsigned i = 0; i < im->n; i++)
        if (!strcmp(im->k[i].name, name)) {
            *kernel = (void *)&im->k[i];
            return REFIT_OK;
        }
    return refit_pgpu_fail(g, REFIT_EINTERNAL, "%s: no kernel %s in the emulated %s", name,
                           name, im->what);
}

static int pe_launch(refit_pgpu *g, void *kernel, uint32_t grid, uint32_t block, void **args)
{
    const pe_image *im = of(g);
    const emu_kernel *k = (const emu_kernel *)kernel;
    if (k < im->k || k >= im->k + im->n)
        return refit_pgpu_fail(g, REFIT_EINTERNAL, "launch: a kernel not of the emulated %s",
                               im->what);
    k->run(grid ? grid : 1, block ? block : 1, args);
    return REFIT_OK;
}

static void *pe_scratch(refit_pgpu *g, size_t bytes)
{
    size_t n = (bytes + 255) & ~(size_t)255;
    void *p = pe_nslices < sizeof pe_slices / sizeof pe_slices[0]
                  ? aligned_alloc(256, n ? n : 256)
                  : NULL;
    if (!p) {
        refit_pgpu_fail(g, REFIT_ENOMEM, "emulated scratch");
        return NULL;
    }
    memset(p, 0xa5, n);
    pe_slices[pe_nslices++] = p;
    return p;
}

static int pe_zero(refit_pgpu *g, void *ptr, size_t bytes)
{
    (void)g;
    memset(ptr, 0, bytes);
    return REFIT_OK;
}

static int pe_upload(refit_pgpu *g, void *dst, const void *src, size_t bytes)
{
    (void)g;
    memcpy(dst, src, bytes);
    return REFIT_OK;
}

static int pe_say(const char *fn, int rc, const char *msg)
{
    char m[320];
    snprintf(m, sizeof m, "%s: %s", fn, msg);
    kern_cuda_set_error(m);
    return rc;
}

extern "C" int pgpu_cudart_begin(pgpu_cudart *p, const char *fn, const void *image, void *stream)
{
    memset(p, 0, sizeof *p);
    p->g.kernel = pe_kernel;
    p->g.launch = pe_launch;
    p->g.scratch = pe_scratch;
    p->g.zero = pe_zero;
    p->g.upload = pe_upload;
    p->stream = stream;
    for (unsigned i = 0; i < PE_IMAGES && !p->lib; i++)
        if (pe_images[i].image == image)
            p->lib = &pe_images[i];
    if (!p->lib)
        return pe_say(fn, REFIT_EINTERNAL, "an image the emulator has no kernels of");
    if (!pe_word && !(pe_word = (uint32_t *)malloc(sizeof *pe_word)))
        return pe_say(fn, REFIT_ENOMEM, "the status word");
    *pe_word = REFIT_STATUS_NONE;
    pe_nslices = 0;
    p->g.status = pe_word;
    p->g.multiprocessors = PE_MULTIPROCESSORS;
    return REFIT_OK;
}

extern "C" int pgpu_cudart_end(pgpu_cudart *p, const char *fn, int rc, int wait, uint32_t *word)
{
    *word = REFIT_STATUS_NONE;
    if (rc && p->g.msg[0])
        pe_say(fn, rc, p->g.msg);
    if (wait && !rc)
        *word = *pe_word;
    for (unsigned i = 0; i < pe_nslices; i++)
        free(pe_slices[i]);
    pe_nslices = 0;
    return rc;
}
