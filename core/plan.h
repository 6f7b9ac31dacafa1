/* The plan (plan.c), built at seal: routes, validation against the
 * formats, recorded signatures; freed with the model. Calls model, never
 * txn. */
#ifndef REFIT_CORE_PLAN_H
#define REFIT_CORE_PLAN_H

#include <refit/refit.h>

#include "core/model.h"

/* Build routes, validate, record signatures. */
int plan_build(refit_model *m);
/* Compare every signature with the live descriptors; message names the
 * first that moved. when: "begin" or "finalize". */
int model_check_signatures(refit_model *m, const char *when);
int signature_take(signature *sig, const refit_tensor *t);
void view_from_signature(refit_view *v, const signature *sig);
void model_free_plan(refit_model *m);

#endif
