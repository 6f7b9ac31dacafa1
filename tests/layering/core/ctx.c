#include "tests/layering/fx.h"
/* A leaf that calls up: ctx.c may call ctx_base.c, not the model, as
 * core/ctx.c did when it wired the context at refit_open. */
int fx_ctx_new(void) { return fx_ctx_error() + fx_model_free(); }
