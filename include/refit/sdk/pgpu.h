/* refit format SDK: how a format's launcher (in-tree,
 * plugins/<fmt>/<fmt>_launch.c, or a plugin built outside refit) runs its
 * own device code: a table of the few GPU operations it needs, so that one
 * launcher serves two callers bit for bit alike:
 *   - the plugin, through the host's GPU service (refit/sdk/pgpu_host.h:
 *     gpu_load, gpu_kernel, gpu_launch, scratch, zero and the module's
 *     status word; the post-load never waits);
 *   - a test or benchmark calling the launcher directly with a table of
 *     its own (refit's is sdk/pgpu_cudart.c over the CUDA
 *     runtime: it loads the same embedded image and waits to report).
 * Every operation is ordered on the stream the table was made for. A
 * failing operation sets the table's message (refit_pgpu_fail) and returns
 * a refit status. Header-only. */
#ifndef REFIT_SDK_PGPU_H
#define REFIT_SDK_PGPU_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <refit/format.h>

typedef struct refit_pgpu refit_pgpu;
struct refit_pgpu {
    /* the kernel `name` of the format's embedded image */
    int (*kernel)(refit_pgpu *g, const char *name, void **kernel);
    /* launch it: grid x block threads, 1-D, no dynamic shared memory; args
     * as cudaLaunchKernel takes them (launch_dims below for more) */
    int (*launch)(refit_pgpu *g, void *kernel, uint32_t grid, uint32_t block, void **args);
    /* `bytes` of device memory for this call's work, 256-byte aligned,
     * kept until that work is done; NULL on failure (message set) */
    void *(*scratch)(refit_pgpu *g, size_t bytes);
    /* zero `bytes` at p (scratch memory) */
    int (*zero)(refit_pgpu *g, void *p, size_t bytes);
    /* copy `bytes` of host memory at src into scratch memory at dst; src
     * may be reused as soon as this returns */
    int (*upload)(refit_pgpu *g, void *dst, const void *src, size_t bytes);
    uint32_t *status;        /* the device status word (atomicMin of a piece
                                index; REFIT_STATUS_NONE when clean) */
    int multiprocessors;     /* of the device (grid sizing) */
    char msg[256];           /* the failure's message */
    /* appended: NULL in a table that lacks them (refit_pgpu_host fills both) */
    /* launch with l's 3-D grid and block and l->shared_bytes of dynamic
     * shared memory (refit/format.h's refit_gpu_launch; l->args the args) */
    int (*launch_dims)(refit_pgpu *g, void *kernel, const refit_gpu_launch *l);
    unsigned long long *status_at; /* the module's status_word_at key
                                (REFIT_STATUS_AT(piece, element), atomicMin;
                                REFIT_STATUS_AT_NONE when clean) when the
                                table took one, else NULL: lower status */
};

/* The element kind a launcher passes its kernels (refit/sdk/minifloat.h's
 * REFIT_MF_F32 0, REFIT_MF_F16 1, REFIT_MF_BF16 2); -1 any other element
 * type (or several lanes). */
static inline int refit_pgpu_float_kind(refit_dtype d)
{
    if (d.lanes != 1)
        return -1;
    if (d.code == REFIT_DTYPE_FLOAT && (d.bits == 32 || d.bits == 16))
        return d.bits == 32 ? 0 : 1;
    return d.code == REFIT_DTYPE_BFLOAT && d.bits == 16 ? 2 : -1;
}

/* Set g->msg (printf format) and return rc. */
REFIT_PRINTF_LIKE(3, 4)
static inline int refit_pgpu_fail(refit_pgpu *g, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->msg, sizeof g->msg, fmt, ap);
    va_end(ap);
    return rc;
}

#endif
