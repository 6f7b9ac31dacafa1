#include "tests/layering/fx.h"
/* The manifest above the model: it calls down, as core/manifest.c does. */
int fx_manifest_check(void) { return fx_model_free() + 3; }
