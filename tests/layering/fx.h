/* A fixture for tests/layering.sh: model.c calls up into txn.c and into
 * manifest.c, and the leaf ctx.c calls up into model.c, which the check
 * must refuse (suite layering-catches); with leaf/core/model.c, which
 * calls nothing, only ctx.c's call is left (layering-leaf-catches). */
int fx_txn_begin(void);
int fx_plan_build(void);
int fx_model_free(void);
int fx_manifest_check(void);
int fx_ctx_error(void);
int fx_ctx_new(void);
