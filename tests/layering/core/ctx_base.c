#include "tests/layering/fx.h"
int fx_ctx_error(void) { return 1; }
