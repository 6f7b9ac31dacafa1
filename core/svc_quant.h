/* The quantizing host services (include/refit/format.h: quant_fp8,
 * quant_mx, the int4 ones), transitional in core/svc_quant_*.c; ctx.c puts
 * them in the host table. One declaration each, seen by the definition and
 * the caller, so a changed signature fails to compile. */
#ifndef REFIT_CORE_SVC_QUANT_H
#define REFIT_CORE_SVC_QUANT_H

#include <stdint.h>

#include <refit/format.h>

/* refit_host_v2.quant_fp8 (core/svc_quant_fp8.c). */
int svc_quant_fp8(void *host, uint32_t n, const refit_view *q, const refit_view *scale,
                  const refit_view *x, const char *const *names, int scheme, void *stream);
/* refit_host_v2.quant_mx (core/svc_quant_mx.c). */
int svc_quant_mx(void *host, uint32_t n, const refit_view *q, const refit_view *scales,
                 const refit_view *x, const char *const *names, int elem_bits, void *stream);
/* Fill the int4 services of h (core/svc_quant_int4.c). */
void svc_quant_int4_install(refit_host_v2 *h);

#endif
