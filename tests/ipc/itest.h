/* Helpers of the IPC transport's tests: a raw trainer speaking the control
 * protocol frame by frame (so a test can corrupt, stall or die at any
 * point), built from the same encoders the sender uses, and a forked
 * process to run it. The worker side is tests/nccl/ntest's model. */
#ifndef REFIT_TESTS_IPC_ITEST_H
#define REFIT_TESTS_IPC_ITEST_H

#include <stdint.h>
#include <sys/types.h>

#include "transports/ipc/msg.h"
#include "tests/nccl/ntest.h"

/* A trainer holding version's checkpoint in one memfd, packed as the NCCL
 * planner cuts it (bucket_bytes: small enough to split tensors in parts). */
typedef struct rt {
    int fd;
    int mfd;
    uint8_t *mem;
    uint64_t mem_bytes;
    nt_ckpt c;
    bkt_tensor *bt;             /* n_bt; the model's NT_N, or a flood's */
    uint32_t n_bt;
    char *names;                /* a flood's names */
    bkt_plan p;
    ipc_ref *refs;
    uint8_t *index;
    uint64_t index_bytes;
    bkt_announce an;
    char label[32];
    uint64_t seq;
    uint32_t epoch;
    char err[512];
} rt;

int rt_open(rt *t, const char *path, uint64_t version, uint64_t bucket_bytes);
/* As rt_open, tensor 0 named name0 instead (one the model does not expect). */
int rt_open_named(rt *t, const char *path, uint64_t version, uint64_t bucket_bytes,
                  const char *name0);
/* n tiny f32 tensors "flood.0" .. (none the model expects), one bucket,
 * their memory left unwritten (sparse). */
int rt_open_flood(rt *t, const char *path, uint32_t n);
void rt_close(rt *t);
/* Swap the memfd for an unsealed copy of it (a trainer that could shrink
 * the memory under the worker). */
int rt_unseal(rt *t);
/* MEMS with the one memfd (id 1). */
int rt_send_mems(rt *t);
/* Changes a frame's payload (its bytes, or *len shorter) before it is sealed. */
typedef void (*rt_fix)(rt *t, uint8_t *payload, size_t *len);
/* INDEX, then UPDATE, as planned; either changed by its fix first (NULL: none). */
int rt_send_update(rt *t, rt_fix fix_index, rt_fix fix_update);
/* Read the VOTE, send DECISION (its status), read the RESULT. */
int rt_finish(rt *t, int *vote);

/* Run fn(arg) in a child; its exit status is fn's return (0 ok). */
pid_t it_fork(int (*fn)(void *), void *arg);
/* Wait for the child: its exit status, or 128 + signal. */
int it_wait(pid_t pid);

#endif
