#include "tests/layering/fx.h"
int fx_plan_build(void) { return fx_model_free() + 1; }
