/* Fixture for tests/layering.sh transports: the transport the core calls. */
int fx_keeper_serve(void) { return 0; }
