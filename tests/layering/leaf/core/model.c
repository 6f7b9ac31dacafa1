#include "tests/layering/fx.h"
/* The model of a fixture whose layers are in order: it calls nothing. */
int fx_model_free(void) { return 1; }
