#include "tests/layering/fx.h"
/* The calls that go up: the model asks the transaction and the manifest. */
int fx_model_free(void) { return fx_txn_begin() + fx_manifest_check() - 2; }
