/* pgpu.h's table over the CUDA runtime itself, for the GPU suites and
 * refit-bench, which call a format's launcher directly (test-only: no
 * plugin links it). It loads the format's embedded image with
 * cudaLibraryLoadData (once per image, kept), launches on the current
 * device, keeps one grow-only scratch buffer, status word and pinned copy
 * per device (calls are serialized by a lock held from begin to end), and
 * waits at end to report. */
#ifndef REFIT_SDK_PGPU_CUDART_H
#define REFIT_SDK_PGPU_CUDART_H

#include <refit/sdk/pgpu.h>

typedef struct pgpu_cudart {
    refit_pgpu g;                  /* first: passed as its refit_pgpu */
    void *stream;
    int dev;
    void *lib;
    size_t used;             /* scratch bytes handed out this call */
} pgpu_cudart;

/* The message of the direct entries' last failure (core/cuda/kern_cuda.h's
 * kern_cuda_last_error reads it back). */
void kern_cuda_set_error(const char *msg);

/* Take the lock, load image, set the current device's status word to
 * REFIT_STATUS_NONE on stream. On failure the lock is released and
 * kern_cuda_set_error names the step (fn: the entry point). */
int pgpu_cudart_begin(pgpu_cudart *p, const char *fn, const void *image, void *stream);
/* After the launches (rc: the launcher's result): when wait, copy the
 * status word back and wait for the stream (even after a failure), *word
 * the piece index or REFIT_STATUS_NONE. Releases the lock. A failure of
 * the launcher or the stream is named through kern_cuda_set_error (fn). */
int pgpu_cudart_end(pgpu_cudart *p, const char *fn, int rc, int wait, uint32_t *word);

#endif
