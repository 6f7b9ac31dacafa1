/* Fingerprints (kernels/fingerprint.h) of contiguous host byte ranges on
 * several threads: a snapshot's file is checked before a restore writes a
 * byte, and one thread hashing a few GB took longer than the copies. */
#ifndef REFIT_CORE_FP_PARALLEL_H
#define REFIT_CORE_FP_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

/* out[i] = the fingerprint of bytes[i] bytes at data[i], each equal to
 * kern_fp_update over the range then kern_fp_final. The ranges are cut
 * into pieces of at most 32 MiB taken by up to `threads` threads (fewer
 * when there are fewer pieces; 1 or a thread that cannot start: the
 * caller's). Returns 0, or -1 out of memory (out untouched). */
int fp_ranges(const void *const *data, const size_t *bytes, size_t n, uint64_t *out,
              int threads);

#endif
