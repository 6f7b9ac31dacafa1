/* The host services of format ABI 2 (include/refit/format.h,
 * refit_host_v2): format-neutral copy, zero, fetch, device_info, scratch,
 * logging, the GPU service and the post-load status words. They keep the
 * per-context state below; the txn and the plan say which module is in a
 * format's hands, so every view a service gets is checked against that
 * module's own runtime tensors, staged bytes and scratch. */
#ifndef REFIT_CORE_HOST_SERVICES_H
#define REFIT_CORE_HOST_SERVICES_H

#include <refit/format.h>

struct refit_ctx;

/* Fill ctx->host and make the service state (NULL state on no memory: the
 * services that need it then refuse with REFIT_ENOMEM). */
void host_services_init(struct refit_ctx *ctx);
/* Free the state: scratch, status words, loaded device images. */
void host_services_free(struct refit_ctx *ctx);

/* The module a format is working on (plan or post_load), or NULL: views
 * handed to copy/zero/fetch must lie inside its memory. */
void host_services_enter(struct refit_ctx *ctx, const refit_fmt_module *m);
/* The n modules of a post_load_many (m stays the caller's until leave):
 * a view may lie in any of them. */
void host_services_enter_many(struct refit_ctx *ctx, const refit_fmt_module *const *m,
                              uint32_t n);
void host_services_leave(struct refit_ctx *ctx);

/* The update ended: free the scratch it was lent and forget its status
 * words (call after the update's last wait). */
void host_services_update_end(struct refit_ctx *ctx);

/* Module m's post-load found bad data (it returned status, REFIT_ECORRUPT,
 * with message msg naming module and tensor): held in the update's status
 * area beside the device words, in post-load order, and reported at
 * finalize like a lowered word. Returns REFIT_OK, or REFIT_ENOMEM when
 * it cannot be held (the caller then fails at once). */
int host_services_post_load_failed(struct refit_ctx *ctx, const refit_fmt_module *m,
                                   int status, const char *msg);

/* Read every status word the update's post-loads took, once; REFIT_OK
 * when none was lowered and no post-load failed, else the first failure
 * in post-load order: REFIT_ECORRUPT (or the device's failure) with a
 * message naming the module and tensor in ctx's errmsg. Waits for the
 * devices. */
int host_services_check_status(struct refit_ctx *ctx);

/* The CUDA side (core/cuda/gpu_service.c; core/host_services.c answers
 * REFIT_EUNSUPPORTED in a build without CUDA). Every call names its
 * failure in msg. */
int gpusvc_device_cc(int dev, int *major, int *minor);
int gpusvc_device_sms(int dev); /* multiprocessors; 0 when unknown */
void *gpusvc_alloc(int dev, size_t bytes, char *msg, size_t n);
void gpusvc_free(int dev, void *p);
int gpusvc_memset_word(int dev, uint32_t *word, uint32_t count, void *stream, char *msg,
                       size_t n);
int gpusvc_read(int dev, void *host_dst, const void *src, size_t bytes, char *msg, size_t n);
int gpusvc_load(const void *image, size_t size, void **lib, char *msg, size_t n);
void gpusvc_unload(void *lib);
int gpusvc_kernel(void *lib, const char *name, void **kernel, char *msg, size_t n);
int gpusvc_launch(int dev, void *kernel, const refit_gpu_launch *l, void *stream, char *msg,
                  size_t n);
int gpusvc_run(int dev, void *stream, int (*fn)(void *arg, void *stream), void *arg, char *msg,
               size_t n);

#endif
