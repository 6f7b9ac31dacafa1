/* What the receiver (receiver.c) asks of the keeper as an undo source
 * (keeper_restore.c) beyond the public API. */
#ifndef REFIT_CORE_IPC_KEEPER_RESTORE_H
#define REFIT_CORE_IPC_KEEPER_RESTORE_H

#include <refit/refit.h>

/* Called once an abort served by the keeper is about to wait for it, with
 * the failure the abort is for (0: none known) and why (may be NULL). */
typedef void (*keeper_undo_wait_fn)(void *arg, int status, const char *why);

/* Before an abort of m's update waits for m's armed keeper, fn(arg, ...)
 * runs (no keeper armed: nothing). A receiver votes there, since a keeper
 * following its trainer serves nothing until the group decides, and the
 * group decides after this worker's vote. fn NULL: no call. Borrowed: set
 * while the update is open, cleared before arg goes. */
void keeper_undo_before_wait(refit_model *m, keeper_undo_wait_fn fn, void *arg);

#endif
