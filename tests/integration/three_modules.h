/* The worker the integration suites share (test_journal_replay.c,
 * test_metrics.c): N_MOD modules "m<i>" of format unquantized, each
 * binding one f32 [ROWS, COLS] runtime tensor "w" and expecting one
 * checkpoint tensor of that shape, three_modules_name(i). */
#ifndef REFIT_TESTS_INTEGRATION_THREE_MODULES_H
#define REFIT_TESTS_INTEGRATION_THREE_MODULES_H

#include <stdint.h>

#include <refit/refit.h>

#define N_MOD 3
#define ROWS 8
#define COLS 16

/* The checkpoint name module i expects ("model.a.weight" ...). */
const char *three_modules_name(int i);

/* Add the modules to model (not sealed): module i's runtime tensor is
 * rt[i], described by desc[i] over shape (set here to {ROWS, COLS}); the
 * caller keeps all three alive while the model lives. The first refit
 * status that is not REFIT_OK, else REFIT_OK. */
int three_modules_add(refit_model *model, float rt[N_MOD][ROWS * COLS], int64_t shape[2],
                      refit_tensor desc[N_MOD]);

#endif
