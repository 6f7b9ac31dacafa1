/* refit-bench gpu: the CUDA figures (tools/bench_gpu.c, docs/cuda.md). */
#ifndef REFIT_TOOLS_BENCH_GPU_H
#define REFIT_TOOLS_BENCH_GPU_H

/* refit-bench gpu ...: argv[0] is "gpu". */
int bench_gpu_main(int argc, char **argv);

#endif
