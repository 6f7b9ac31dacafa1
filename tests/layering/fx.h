/* A four-unit fixture for tests/layering.sh: model.c calls up into txn.c
 * and into manifest.c, which the check must refuse (suite layering-catches). */
int fx_txn_begin(void);
int fx_plan_build(void);
int fx_model_free(void);
int fx_manifest_check(void);
