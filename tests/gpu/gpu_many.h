/* One refit_load_many of a paired model (gpu_pair.h), for the formats'
 * GPU suites: the bytes against a refit_load a tensor and the host's CPU
 * reference, from aligned device sources (read in place) and unaligned
 * ones (staged); through the format's own plugin file with its post-loads
 * watched (one post_load_many for the call, staged views at the caller's
 * sources); a NaN in one module of the call named at finalize, rolled
 * back. Include after <cmocka.h>. */
#ifndef REFIT_TESTS_GPU_MANY_H
#define REFIT_TESTS_GPU_MANY_H

#include "gpu_pair.h"

/* The bytes, in place and staged, and the watched plugin's calls. */
void pair_check_load_many_watched(void **state, const pair_format *f);
/* A NaN (defect 1) in tensor bads[k] of the call, each in turn: finalize
 * fails naming its module and tensor, the rollback keeps every byte. */
void pair_check_load_many_nan(void **state, const pair_format *f, const int *bads, int n_bads);
void pair_check_load_many_refused(void **state, const pair_format *f, const int *bads,
                                  int n_bads, int defect, const char *reason);

#endif
