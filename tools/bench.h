/* refit-bench's areas, one file each. */
#ifndef REFIT_TOOLS_BENCH_H
#define REFIT_TOOLS_BENCH_H

#include "tools/bench_journal.h"

/* refit-bench safetensors ...: argv[0] is "safetensors". */
int bench_safetensors_main(int argc, char **argv);

#endif
