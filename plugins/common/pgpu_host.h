/* pgpu.h's table over the host's GPU service, for one module's post-load
 * on one CUDA device (plugins/common/pgpu_host.c). */
#ifndef REFIT_PLUGINS_COMMON_PGPU_HOST_H
#define REFIT_PLUGINS_COMMON_PGPU_HOST_H

#include "plugins/common/pgpu.h"

typedef struct pgpu_host {
    pgpu g;                  /* first: a pgpu_host is passed as its pgpu */
    const refit_host_v2 *h;
    refit_device dev;
    void *stream;
    void *module;            /* the loaded image */
} pgpu_host;

/* Load the plugin's image (once per context: the host keeps it) and take
 * module m's status word on dev: its kernels lower it to a piece index,
 * and the host fails the update at finalize naming m and names[index]
 * with `what`. Returns REFIT_OK or the host's status (message set through
 * host->error). */
int pgpu_host_init(pgpu_host *p, const refit_host_v2 *h, const refit_fmt_module *m,
                   refit_device dev, void *stream, const void *image, size_t image_size,
                   uint32_t n_names, const char *const *names, const char *what);

#endif
