/* How an in-tree format's launcher (plugins/<fmt>/<fmt>_launch.c) runs its
 * own device code: a table of the few GPU operations it needs, so that one
 * launcher serves two callers bit for bit alike:
 *   - the plugin, through the host's GPU service (pgpu_host.c: gpu_load,
 *     gpu_kernel, gpu_launch, scratch, zero and the module's status word;
 *     the post-load never waits);
 *   - the GPU suites and refit-bench, which call a format's kernels
 *     directly (pgpu_cudart.c, a test-only library over the CUDA runtime:
 *     it loads the same embedded image and waits to report).
 * Every operation is ordered on the stream the table was made for. A
 * failing operation sets the table's message (pgpu_fail) and returns a
 * refit status. */
#ifndef REFIT_PLUGINS_COMMON_PGPU_H
#define REFIT_PLUGINS_COMMON_PGPU_H

#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>

typedef struct pgpu pgpu;
struct pgpu {
    /* the kernel `name` of the format's embedded image */
    int (*kernel)(pgpu *g, const char *name, void **kernel);
    /* launch it: grid x block threads, args as cudaLaunchKernel takes them */
    int (*launch)(pgpu *g, void *kernel, uint32_t grid, uint32_t block, void **args);
    /* `bytes` of device memory for this call's work, 256-byte aligned,
     * kept until that work is done; NULL on failure (message set) */
    void *(*scratch)(pgpu *g, size_t bytes);
    /* zero `bytes` at p (scratch memory) */
    int (*zero)(pgpu *g, void *p, size_t bytes);
    /* copy `bytes` of host memory at src into scratch memory at dst; src
     * may be reused as soon as this returns */
    int (*upload)(pgpu *g, void *dst, const void *src, size_t bytes);
    uint32_t *status;        /* the device status word (atomicMin of a piece
                                index; REFIT_STATUS_NONE when clean) */
    int multiprocessors;     /* of the device (grid sizing) */
    char msg[256];           /* the failure's message */
};

/* The element kind a launcher passes its kernels: 0 F32, 1 F16, 2 BF16;
 * -1 any other element type (or several lanes). */
static inline int pgpu_float_kind(refit_dtype d)
{
    if (d.lanes != 1)
        return -1;
    if (d.code == REFIT_DTYPE_FLOAT && (d.bits == 32 || d.bits == 16))
        return d.bits == 32 ? 0 : 1;
    return d.code == REFIT_DTYPE_BFLOAT && d.bits == 16 ? 2 : -1;
}

/* Set g->msg (printf format) and return rc. */
int pgpu_fail(pgpu *g, int rc, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif
