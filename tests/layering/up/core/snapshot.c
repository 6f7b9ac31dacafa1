/* Fixture for tests/layering.sh transports: a core unit that calls up
 * into a transport, which the check must refuse
 * (layering-catches-transports). */
int fx_keeper_serve(void);
int fx_snapshot_write(void) { return fx_keeper_serve() + 1; }
