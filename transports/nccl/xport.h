/*
 * Transports: what the sender, the receiver and the group vote need from
 * a communicator, as one small table. Two implementations: NCCL
 * (xport_nccl.c: device memory, a stream, events polled against a
 * deadline) and an in-process loopback (xport_loopback.c: threads,
 * condition variables, host memory) that the CPU tests run on.
 *
 * Ordering: bcast, to_host and mark are ordered among themselves, in call
 * order (NCCL: one stream). Work is complete only when wait() says so.
 * Every wait has a deadline (CLOCK_MONOTONIC seconds, xport_now()); past
 * it, the caller aborts the transport: a transport that timed out is never
 * used again (NCCL gives no way to cancel one collective).
 */
#ifndef REFIT_CORE_NCCL_XPORT_H
#define REFIT_CORE_NCCL_XPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>
#include <refit/transport.h>

typedef struct xport_ops {
    const char *name;
    /* Memory that bcast reads and writes (device memory for NCCL). */
    int (*mem_alloc)(refit_transport *x, void **out, size_t bytes);
    void (*mem_free)(refit_transport *x, void *p);
    /* Host memory for to_host and from_host (pinned for NCCL, so copies
     * stay asynchronous and every wait keeps its deadline). */
    int (*host_alloc)(refit_transport *x, void **out, size_t bytes);
    void (*host_free)(refit_transport *x, void *p);
    /* Broadcast bytes at buf on root into buf on every rank. NCCL only
     * enqueues; the loopback blocks (up to deadline) until the data is
     * there (receivers) or queued (root). */
    int (*bcast)(refit_transport *x, void *buf, size_t bytes, int root, double deadline);
    /* Enqueue a copy of n bytes of transport memory into host memory. */
    int (*to_host)(refit_transport *x, void *host, const void *src, size_t n);
    /* Enqueue a copy of n bytes of host memory from host_alloc into
     * transport memory. The host bytes must stay as they are until a
     * later ticket completes (NCCL: an asynchronous copy on the stream, so
     * no host wait can hang without a deadline). */
    int (*from_host)(refit_transport *x, void *dst, const void *host, size_t n);
    /* A ticket for everything enqueued so far. */
    int (*mark)(refit_transport *x, uint64_t *ticket);
    /* Work enqueued from now on (bcast, to_host, from_host) waits, on the
     * device and not the host, for everything already queued on stream
     * (another stream of the transport's device: the engine's, or the
     * sender's packing stream; NULL is the default stream). Never blocks.
     * The loopback runs everything at the call: nothing to do. */
    int (*wait_stream)(refit_transport *x, void *stream);
    /* Enqueue on stream (another stream of the transport's device, after
     * the copies queued there; NULL is the default stream) the content
     * fingerprint (kernels/fingerprint.h) of v, a view of transport
     * memory, into the 8 bytes of transport memory at dst (8-byte aligned)
     * as a little-endian word. Never waits: NCCL runs it on the device (the
     * CUDA backend's fingerprint_to), the loopback at the call. */
    int (*fingerprint_to)(refit_transport *x, void *dst, const refit_view *v, void *stream);
    /* Until the ticket's work is done: REFIT_OK; REFIT_EIO past deadline
     * or on a communicator error (message in x->err). */
    int (*wait)(refit_transport *x, uint64_t ticket, double deadline);
    /* *v <- the minimum of *v over every rank; blocks up to deadline. */
    int (*allreduce_min)(refit_transport *x, int32_t *v, double deadline);
    /* Stop: what is pending is abandoned, later calls fail at once. */
    void (*abort)(refit_transport *x);
    void (*destroy)(refit_transport *x);
} xport_ops;

struct refit_transport {
    const xport_ops *ops;
    refit_ctx *ctx;             /* messages go here */
    int rank, nranks;
    refit_device device;        /* where mem_alloc memory lives */
    refit_device host_device;   /* what host_alloc memory is, for a backend's copy (pinned
                                 * CUDA host memory for NCCL: device-readable) */
    void *stream;               /* where the transport's work is ordered (NCCL), or NULL */
    double timeout_s;           /* default deadline of each wait */
    bool writes_outside;        /* a broadcast may target memory that is not the
                                 * transport's (a runtime tensor): an abort is
                                 * sure to stop it (NCCL: a communicator it may
                                 * abort; the loopback completes at the call) */
    bool aborted;
    char why[512];              /* why it was aborted */
    char err[512];              /* the last failing operation's message */
    void *impl;
};

/* Monotonic seconds. */
double xport_now(void);
/* Set x->err and return status. */
int xport_fail(refit_transport *x, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Abort x (once) and remember why: later operations fail with that text. */
void xport_abort(refit_transport *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* REFIT_EIO with "transport aborted earlier: why" when x was aborted. */
int xport_check(refit_transport *x);

/* Journal an event (kind "transport" or "group") for the update with the
 * given journal id (0: none) on the context's journal, if it has one. */
void xport_journal(refit_ctx *ctx, int64_t update_id, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Test hook of the loopback: rank's broadcasts as root stop after
 * after_bytes more bytes, mid-buffer, and that rank is dead from then on
 * (its calls fail, what it posted never completes): a killed sender. */
void xport_loopback_kill_after(refit_loopback *g, int rank, uint64_t after_bytes);
/* Test hook of the loopback: byte at of broadcast number seq (0-based, in
 * the order rank sends them as root) is XORed with mask on the way: a
 * corrupt header, stamp or payload on the wire. */
void xport_loopback_corrupt(refit_loopback *g, int rank, uint64_t seq, uint64_t at, uint8_t mask);

/* Test hook of the loopback: rank's nth fingerprint_to from now on (1:
 * the next) fails with REFIT_EIO: a device checksum that could not run. */
void xport_loopback_fail_fingerprint(refit_loopback *g, int rank, uint64_t nth);

/* Payload bytes of the last update that went as DIRECT buckets, sent from
 * the tensors themselves; for tests (a receiver's count is
 * refit_sys_receiver_direct_bytes, refit/sys/transport.h). */
uint64_t sender_direct_bytes(const refit_sender *s);

/* Take one vote over x: *res gets the decision. REFIT_OK when the vote
 * was taken (whatever it decided); REFIT_EIO when it could not be (x is
 * then aborted, vote_taken 0). */
int group_vote(refit_transport *x, int local_status, double deadline, refit_group_result *res);

/* A strided view over a borrowed tensor (byte_offset applied, strides
 * filled in row-major when NULL). REFIT_EINVAL when it has no data. */
int xport_view(const refit_tensor *t, refit_view *v);
/* 1 when v is row-major contiguous. */
bool xport_view_contiguous(const refit_view *v);

/* Vote encoding: min over ranks picks the worst status, then the lowest
 * rank that voted it. Status in [-2047, 0], rank below 2^20. */
int32_t group_vote_encode(int status, int rank);
void group_vote_decode(int32_t v, int *status, int *rank);

#endif
