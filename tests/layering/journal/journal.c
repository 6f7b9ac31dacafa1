/* Fixture for tests/layering.sh journal: the handle (floor 0) calls up into
 * the transaction (floor 4), the circle journal.c had before issue 34; the
 * check must refuse it (suite layering-catches-journal). */
int fx_journal_tx_rollback(void);
int fx_journal_fail(void) { return fx_journal_tx_rollback() - 1; }
