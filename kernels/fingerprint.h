/* 64-bit content fingerprints. The hash of a byte string is
 *   mix(n ^ sum_i mix(w_i ^ (i * G)))      (sum mod 2^64)
 * over its little-endian 8-byte words w_i (the last zero-padded), so any
 * split of the work (rows, CUDA blocks) adds up to the same value. */
#ifndef REFIT_KERNELS_FINGERPRINT_H
#define REFIT_KERNELS_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>

typedef struct kern_fp {
    uint64_t acc;
    uint64_t nbytes;
    uint8_t buf[8];
    unsigned nbuf;
} kern_fp;

void kern_fp_init(kern_fp *fp);
void kern_fp_update(kern_fp *fp, const void *data, size_t n);
uint64_t kern_fp_final(const kern_fp *fp);

/* Fingerprint of a view's elements in row-major order. */
uint64_t kern_fingerprint_view(const refit_view *v);
/* Order-dependent combination of fingerprints. */
uint64_t kern_fp_combine(uint64_t h, uint64_t fp);

#endif
