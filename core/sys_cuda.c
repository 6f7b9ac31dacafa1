/* refit/sys/cuda.h: the CUDA backend's counters and its launcher, for
 * benches; in a build without CUDA, zeros and REFIT_EUNSUPPORTED. */
#include <string.h>

#include <refit/sys/cuda.h>

#ifdef REFIT_HAVE_CUDA
#include "core/cuda/backend_cuda.h"
#endif

void refit_sys_cuda_stats_get(refit_sys_cuda_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
#ifdef REFIT_HAVE_CUDA
    backend_cuda_stats s;
    backend_cuda_stats_get(&s);
    out->batch_launches = s.batch_launches;
    out->batch_rows = s.batch_rows;
    out->memcpy_calls = s.memcpy_calls;
    out->kernel_copies = s.kernel_copies;
    out->pageable_bytes = s.pageable_bytes;
    out->ring_waits = s.ring_waits;
    out->host_copy_ns = s.host_copy_ns;
    out->prefault_ns = s.prefault_ns;
    out->ring_wait_ns = s.ring_wait_ns;
    out->queues = s.queues;
#endif
}

int refit_sys_cuda_run(int dev, void *stream, int (*launch)(void *arg, void *stream), void *arg)
{
#ifdef REFIT_HAVE_CUDA
    if (!launch)
        return REFIT_EINVAL;
    return backend_cuda_run(dev, stream, launch, arg);
#else
    (void)dev, (void)stream, (void)launch, (void)arg;
    return REFIT_EUNSUPPORTED;
#endif
}

const char *refit_sys_cuda_last_error(void)
{
#ifdef REFIT_HAVE_CUDA
    return backend_cuda_last_error();
#else
    return "built without CUDA";
#endif
}
