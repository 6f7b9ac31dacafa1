/* refit-bench's areas, one file each. */
#ifndef REFIT_TOOLS_BENCH_H
#define REFIT_TOOLS_BENCH_H

#include <stdio.h>

#include "tools/bench_journal.h"
#include "tools/bench_safetensors.h"

#endif
