/* Where the kit's buffers live: host memory, or a CUDA device's memory
 * for --device cuda (through the CUDA runtime the CUDA backend links; a
 * build without CUDA has no device and says so). */
#ifndef REFIT_CONFORMANCE_KIT_MEM_H
#define REFIT_CONFORMANCE_KIT_MEM_H

#include <stddef.h>

#include <refit/refit.h>

/* Whether CUDA device dev can hold the kit's worlds: 1, or 0 with why (no
 * CUDA in this build, no device, a device number past the count). */
int kit_mem_device_ready(int dev, char *why, size_t n);

/* bytes (at least 1) on dev (REFIT_DEVICE_CPU: 64-byte aligned host
 * memory), NULL when it cannot be had. */
void *kit_mem_alloc(refit_device dev, size_t bytes);
void kit_mem_free(refit_device dev, void *p);
/* Host bytes to p on dev / p's bytes on dev to host; 0 or -1. */
int kit_mem_put(refit_device dev, void *p, const void *src, size_t bytes);
int kit_mem_get(refit_device dev, void *dst, const void *p, size_t bytes);
/* Every byte of p set to b; 0 or -1. */
int kit_mem_fill(refit_device dev, void *p, unsigned char b, size_t bytes);

#endif
