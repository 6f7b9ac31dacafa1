/* What the keeper (keeper.c) asks of a receiver beyond its public API. */
#ifndef REFIT_CORE_IPC_RECEIVER_H
#define REFIT_CORE_IPC_RECEIVER_H

#include <refit/ipc.h>

/* The descriptor that becomes readable when the receiver has work: its
 * trainer's connection, or its listening socket while none is connected. */
int ipc_receiver_wait_fd(const refit_ipc_receiver *r);
/* Progress without waiting for an update: no trainer connected, accept
 * and greet one (by greet_dl); its connection closed, drop it. 1: frames
 * of an update are there (refit_ipc_receive_update takes them), 0: not,
 * or a refit status (a peer refused or dropped is not one: journaled). */
int ipc_receiver_ready(refit_ipc_receiver *r, double greet_dl);
/* The HELLO role it answers a trainer with (IPC_ROLE_WORKER unless set). */
void ipc_receiver_set_role(refit_ipc_receiver *r, uint32_t role);

#endif
