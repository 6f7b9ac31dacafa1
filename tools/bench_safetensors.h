/*
 * refit-bench safetensors: streaming from a page-cached safetensors file
 * into host memory, against plain memcpy of the same bytes in the same run,
 * and the per-file cost of open + header parse + validation.
 *
 * Signature, for tools/refit-bench.c:
 *
 *   int bench_safetensors(int argc, char **argv, FILE *json_out);
 *
 *   argv[0] is "safetensors"; options:
 *     --size MIB          data bytes of the streamed file (default 256)
 *     --tensors N         tensors in the streamed file (default 1024)
 *     --header-tensors N  tensors in the header-cost file (default 100000)
 *     --repeat R          runs of each measurement; the best counts (default 10)
 *     --dir DIR           where the temporary files go (default $TMPDIR, /tmp)
 *     --json              accepted for symmetry with other areas (the output
 *                         is always JSON)
 *   Writes one JSON object to json_out (keys documented in
 *   docs/safetensors.md: memcpy_gbps, stream_gbps, stream_vs_memcpy,
 *   with_open_vs_memcpy, open_parse_ms, header_open_ms,
 *   header_us_per_tensor ...); messages go to
 *   stderr. Returns the process exit status: 0 ok, 1 failure, 2 usage.
 *   Files it creates are removed before it returns.
 *
 *   int bench_safetensors_main(int argc, char **argv);
 *
 *   The same, writing to stdout (the form tools/bench.h declares).
 */
#ifndef REFIT_TOOLS_BENCH_SAFETENSORS_H
#define REFIT_TOOLS_BENCH_SAFETENSORS_H

#include <stdio.h>

int bench_safetensors(int argc, char **argv, FILE *json_out);
int bench_safetensors_main(int argc, char **argv);

#endif
