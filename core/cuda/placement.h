/* Where the CUDA backend's copy threads run and its pinned ring lives: on
 * the CPUs and the NUMA node that sysfs says are local to the device, so
 * the page-cache -> pinned copies and the DMA that reads the ring stay on
 * one node (docs/cuda.md, "Placement"). No CUDA here: the backend reads
 * the device's PCI bus id, this file does the rest, and a CPU test covers
 * it (tests/core/test_placement.c). */
#ifndef REFIT_CORE_CUDA_PLACEMENT_H
#define REFIT_CORE_CUDA_PLACEMENT_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>

/* *out = the CPUs of a Linux cpulist ("0-3,8-11", "5", "" for none; a
 * trailing newline allowed). Returns how many, or -1 when s is malformed
 * or names a CPU >= CPU_SETSIZE (*out is then empty). */
int placement_cpulist_parse(const char *s, cpu_set_t *out);

/* A PCI bus id as the CUDA runtime gives it ("0000:3B:00.0") or NVML's
 * longer domain ("00000000:3B:00.0"), written as sysfs names the device
 * ("0000:3b:00.0") into out[cap]. false when id is not of that form. */
bool placement_pci_sysfs_name(const char *id, char *out, size_t cap);

/* The device's local CPUs and NUMA node, from
 * <root>/bus/pci/devices/<id>/local_cpulist and numa_node (root "/sys").
 * false when the id is malformed or local_cpulist is absent or malformed.
 * *node = -1 when numa_node is absent, malformed or -1, except that a
 * machine of one node (<root>/devices/system/node/node0 and no node1)
 * gives 0. */
bool placement_device_read(const char *root, const char *bus_id, cpu_set_t *cpus, int *node);

/* What the backend knows when it first needs its threads or its ring. */
typedef struct placement_in {
    int mode;                   /* REFIT_CUDA_NUMA: 0 off, 1 auto, 2 even when it narrows nothing */
    const char *cpus;           /* REFIT_CUDA_CPUS (the workers' CPUs), NULL or "" for the device's */
    const cpu_set_t *local;     /* the device's local CPUs; NULL when unknown */
    int node;                   /* the device's NUMA node; -1 when unknown */
    const cpu_set_t *allowed;   /* the process's CPU affinity */
    int threads;                /* copy threads configured */
    bool threads_explicit;      /* REFIT_CUDA_COPY_THREADS was set: keep it */
} placement_in;

/* The decision. */
typedef struct placement {
    bool pin;                   /* the workers keep to cpus */
    cpu_set_t cpus;
    int ncpus;
    int threads;                /* copy threads to start */
    int ring_node;              /* bind the pinned ring to this node; -1: as allocated */
    char why[200];              /* one line: what was decided and why */
} placement;

/* Decide (pure: no system call). Auto pins only when the device's CPUs
 * are a strict subset of the allowed ones (more than one node); pinned,
 * an unset thread count becomes at most ncpus - 1, leaving a CPU of the
 * node to the calling thread. An unusable input pins nothing and says why. */
void placement_plan(const placement_in *in, placement *out);

/* Ask the kernel to place the pages of [p, p + n) on node (mbind,
 * MPOL_PREFERRED) before they are first touched. 0, or the errno (ENOSYS,
 * EPERM in a container that filters mbind, EINVAL): a hint, callers go on. */
int placement_bind_preferred(void *p, size_t n, int node);

#endif
