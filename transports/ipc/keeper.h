/* The steps of a keeper's restore (keeper.c), apart for the tests that
 * stop a keeper between them (a keeper killed mid-restore). */
#ifndef REFIT_CORE_IPC_KEEPER_H
#define REFIT_CORE_IPC_KEEPER_H

#include <stddef.h>
#include <stdint.h>

#include <refit/ipc.h>

/* Accept a restorer by dl; *fd its connection. */
int keeper_accept(refit_ipc_keeper *k, double dl, int *fd);
/* The peer's credentials, its HELLO as a restorer, the keeper's HELLO. */
int keeper_greet(refit_ipc_keeper *k, int fd, uint32_t *uid, int32_t *pid);
/* MEMS and K_OFFER, or K_OFFER with the reason it serves nothing (returned). */
int keeper_offer(refit_ipc_keeper *k, int fd, double dl);
/* The restorer's K_DONE by dl, then K_CONFIRM; why: its failure. */
int keeper_confirm(refit_ipc_keeper *k, int fd, double dl, char *why, size_t n);

#endif
