/* Fixture for tests/layering.sh journal: the transaction calls the handle
 * below it, as it may. */
int fx_journal_fail(void);
int fx_journal_tx_rollback(void) { return fx_journal_fail() ? 0 : 1; }
