#include "tests/layering/fx.h"
int fx_txn_begin(void) { return fx_plan_build() + 1; }
