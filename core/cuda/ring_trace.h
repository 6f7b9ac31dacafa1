/* A timeline of the ring's pageable reads, for benches and probes: with
 * REFIT_CUDA_RING_TRACE=<path> (a "%p" in it becomes the process id), every
 * slice a thread copies into the ring, every run of slices the caller
 * issues, every tensor it queues, every wait of the caller, and every time
 * an idle worker found its clock had jumped (it did not run) is one
 * record, with the thread's CPU time over it, written to <path> as text
 * when the process exits (bench/probes/ring_trace.py reads it). Off (the default), each call is
 * one predictable branch. No CUDA here. */
#ifndef REFIT_CORE_CUDA_RING_TRACE_H
#define REFIT_CORE_CUDA_RING_TRACE_H

#include <stdbool.h>
#include <stdint.h>

typedef enum ring_trace_kind {
    RT_FILL = 0,        /* a: slice index, b: bytes, c: prefault ns */
    RT_ISSUE = 1,       /* a: first slice, b: bytes, c: slices */
    RT_FILL_WAIT = 2,   /* the caller waits for a chunk's slices to be filled */
    RT_DRAIN_WAIT = 3,  /* the caller waits for a chunk's copies to finish */
    RT_SETTLE = 4,      /* the caller waits until every slice is issued */
    RT_GAP = 5,         /* an idle worker's clock jumped by more than 0.5 ms */
    RT_COPY = 6,        /* the caller queues a tensor's slices: a: call, b: bytes */
} ring_trace_kind;

extern bool ring_trace_on;

/* Read REFIT_CUDA_RING_TRACE once (idempotent, any thread). */
void ring_trace_init(void);

/* This thread's name in the records: worker k (0..), or -1 (a caller). */
void ring_trace_worker(int k);

/* This thread's CPU time (ns), when tracing; 0 when not. */
uint64_t ring_trace_cpu_ns(void);

/* One record: [t0, t1] on CLOCK_MONOTONIC, the kind's a, b, c, and cpu,
 * the thread's CPU time in it (ring_trace_cpu_ns at t1 minus at t0). */
void ring_trace_add(ring_trace_kind kind, uint64_t t0, uint64_t t1, uint64_t a, uint64_t b,
                    uint64_t c, uint64_t cpu);

#endif
