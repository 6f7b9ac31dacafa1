/* Helpers of the NCCL-transport tests: a small Llama-shaped worker model
 * (TP shards on dim 0 and dim 1, a module of two tensors, bf16/f16/f32),
 * the full checkpoint a trainer holds for a version, a cold-start
 * reference fingerprint, and threads that run a sender and its receivers
 * over a loopback group. Threads never assert (CMocka's longjmp is for the
 * main thread): they record what happened, the test asserts after join. */
#ifndef REFIT_TESTS_NCCL_NTEST_H
#define REFIT_TESTS_NCCL_NTEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <refit/transport.h>

#define NT_N 7                  /* checkpoint tensors */
#define NT_MAX_RANKS 4

typedef struct nt_spec {
    const char *module, *target, *ckpt;
    refit_dtype dt;
    int ndim;
    int64_t shape[2];
    int shard_dim;              /* -1: not sharded */
} nt_spec;

extern const nt_spec NT_SPECS[NT_N];

/* One worker: a context, its model, the runtime tensors it owns. */
typedef struct nt_worker {
    refit_ctx *ctx;
    refit_model *m;
    int rank, tp;
    void *buf[NT_N];
    refit_tensor rt[NT_N];
    int64_t shape[NT_N][2];
    size_t bytes[NT_N];
} nt_worker;

/* journal: a path or NULL (none). Returns a refit status. */
int nt_worker_open(nt_worker *w, int tp_rank, int tp, const char *journal);
void nt_worker_close(nt_worker *w);

/* The trainer's full tensors for a version. */
typedef struct nt_ckpt {
    void *buf[NT_N];
    refit_tensor t[NT_N];
    int64_t shape[NT_N][2];
} nt_ckpt;

void nt_ckpt_make(nt_ckpt *c, uint64_t version);
void nt_ckpt_free(nt_ckpt *c);
/* Model fingerprint of a cold start on version (refit_load, whole). */
uint64_t nt_cold_fp(int tp_rank, int tp, uint64_t version);
uint64_t nt_fp(nt_worker *w);

/* ---- a sender and its receivers, one thread each ---- */

typedef struct nt_job {
    /* in */
    refit_transport *x;
    nt_worker *w;               /* receivers */
    const nt_ckpt *c;           /* sender */
    uint64_t bucket_bytes;
    int checksum;
    const char *label;
    uint64_t order_seed;        /* sender: 0 = spec order, else shuffled */
    int no_tensors;             /* sender: an empty update */
    const char *extra_name;     /* sender: one more tensor, sent first */
    const refit_tensor *extra;
    int rollback;               /* receivers */
    int partial;                /* receivers: refit_update_opts.partial */
    double timeout;
    refit_filter_fn filter;
    void *filter_user;
    int move_before_vote;       /* receiver: begin + refit_receive, move a
                                   registered tensor, then group finalize */
    int skip_vote;              /* receiver: receive, then stop answering */
    uint64_t corrupt_seq, corrupt_at; /* sender: byte corrupt_at of its broadcast */
    uint8_t corrupt_mask;       /* number corrupt_seq is XORed with this (0: none) */
    const char *again_label;    /* sender: then relabel the same sender and send
                                   again; receivers: receive a second update */
    uint64_t again_bucket_bytes; /* sender, with again_label: the second update
                                   from a new sender with this bucket size */
    int64_t direct_min;         /* sender: direct_min_bytes; 0 the default, < 0 none */
    uint64_t fail_fingerprint;  /* sender: its nth device checksum fails (0: none) */
    int stuck_abort;            /* receiver: its transport says an abort might not stop
                                   a broadcast (a borrowed NCCL communicator without
                                   abort_borrowed): nothing may be received in place */
    /* out */
    int rc;
    refit_group_result res;
    char msg[1100];
    double seconds;
    uint64_t direct_bytes;      /* of its last update: sent from the tensors (sender),
                                   received straight into runtime tensors (receivers) */
} nt_job;

/* Run rank 0 as sender (jobs[0]) and ranks 1..n-1 as receivers, over a
 * fresh loopback group; kill_after: rank 0 dies after that many bytes
 * (UINT64_MAX: never). Transports are made on each job's context (a
 * sender context is opened and closed here). */
void nt_run(nt_job *jobs, int n, uint64_t kill_after);
/* CMocka assertions: every one of the n jobs succeeded and the group voted
 * to commit (a failure names the rank, its status and message). */
void nt_assert_all_ok(const nt_job *jobs, int n);

/* A directory under the build root for journals; freed by nt_rmdir. */
void nt_tmpdir(char *out, size_t n);
void nt_rmdir(const char *dir);
/* A fixture's end: close workers w[0, n), free checkpoint versions 1 and 2
 * of c (c[0] unused), remove dir. */
void nt_fixture_end(nt_worker *w, int n, nt_ckpt c[3], const char *dir);

#endif
