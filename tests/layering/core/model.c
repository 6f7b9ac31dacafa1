#include "tests/layering/fx.h"
/* The call that goes up: the model asks the transaction for something. */
int fx_model_free(void) { return fx_txn_begin() - 2; }
