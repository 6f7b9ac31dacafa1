/*
 * refit-bench nccl: a trainer on GPU 0 broadcasting a Llama-shaped model
 * to a worker on GPU 1 (two processes, one NCCL communicator refit creates
 * from a unique id), against a raw ncclBroadcast of the same bytes and a
 * per-tensor ncclBroadcast loop measured in the same run; every refit
 * reload is checked bit-exact (per-tensor fingerprints against the bytes
 * the trainer uploaded). Then two failure scenarios on the GPUs: the worker
 * failing its checks (the vote aborts the update on both ranks), and the
 * trainer killed mid-update (the worker aborts at its deadline, rolled
 * back, journaled).
 *
 *   refit-bench nccl [--layers N] [--hidden H] [--inter I] [--vocab V]
 *                    [--buckets MIB,MIB,...] [--repeat R] [--timeout S]
 *                    [--journal PATH] [--preload LIBNCCL] [--no-failures] [--json]
 *
 * --preload dlopens a libnccl.so.2 privately (RTLD_LOCAL) in each rank
 * first, as PyTorch's extension does: refit then shares that copy (the
 * "nccl" key says "already loaded").
 *
 * Writes one JSON object to stdout (docs/nccl.md lists the keys: among
 * them ratio_to_broadcast, refit's reload time against the raw broadcast's,
 * and ratio_to_per_tensor_broadcast). Where NCCL or two GPUs are missing it
 * writes {"area": "nccl", "skipped": "<why>"} and exits 0. Exit status: 0
 * ok, 1 a failure (a reload not bit-exact included), 2 usage.
 */
#ifndef REFIT_TOOLS_BENCH_NCCL_H
#define REFIT_TOOLS_BENCH_NCCL_H

int bench_nccl_main(int argc, char **argv);

#endif
