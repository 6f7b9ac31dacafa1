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
    backend_cuda_stats_get(out);
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

int refit_sys_cuda_prepare(int dev, void *stream, unsigned what)
{
#ifdef REFIT_HAVE_CUDA
    return backend_cuda_prepare(dev, stream, what);
#else
    (void)dev, (void)stream, (void)what;
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
