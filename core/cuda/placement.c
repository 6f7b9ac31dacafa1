/* Copy-thread and pinned-ring placement for the CUDA backend
 * (placement.h). */
#include "core/cuda/placement.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* A decimal CPU id at *p; advances *p. -1 when none or too large. */
static long cpu_id(const char **p)
{
    const char *s = *p;
    if (!isdigit((unsigned char)*s))
        return -1;
    long v = 0;
    while (isdigit((unsigned char)*s)) {
        v = v * 10 + (*s++ - '0');
        if (v >= CPU_SETSIZE)
            return -1;
    }
    *p = s;
    return v;
}

int placement_cpulist_parse(const char *s, cpu_set_t *out)
{
    CPU_ZERO(out);
    if (!s)
        return -1;
    const char *p = s;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '\n' || *p == '\0')
        return *p == '\0' || p[1] == '\0' ? 0 : -1;
    for (;;) {
        long lo = cpu_id(&p), hi = lo;
        if (lo < 0)
            break;
        if (*p == '-') {
            p++;
            if ((hi = cpu_id(&p)) < lo)
                break;
        }
        for (long c = lo; c <= hi; c++)
            CPU_SET((size_t)c, out);
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == '\n')
            p++;
        if (*p == '\0')
            return CPU_COUNT(out);
        break;
    }
    CPU_ZERO(out);
    return -1;
}

bool placement_pci_sysfs_name(const char *id, char *out, size_t cap)
{
    /* domain (4 or 8 hex digits), bus (2), device (2), function (1) */
    size_t n = id ? strlen(id) : 0;
    size_t dom = n == 12 ? 4 : n == 16 ? 8 : 0;
    if (dom == 0 || cap < 13)
        return false;
    for (size_t i = 0; i < n; i++) {
        bool sep = i == dom || i == dom + 3 || i == dom + 6;
        char want = i == dom + 6 ? '.' : ':';
        if (sep ? id[i] != want : !isxdigit((unsigned char)id[i]))
            return false;
    }
    const char *s = id + dom - 4; /* sysfs: the low four digits of the domain */
    for (size_t i = 0; i < dom - 4; i++)
        if (id[i] != '0')
            return false;
    for (size_t i = 0; i < 12; i++)
        out[i] = (char)tolower((unsigned char)s[i]);
    out[12] = '\0';
    return true;
}

/* The first line of a small file into buf; false when it cannot be read. */
static bool read_line(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    bool ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    return ok;
}

/* The machine has node0 and no node1. */
static bool only_node0(const char *root)
{
    char p0[512], p1[512];
    int a = snprintf(p0, sizeof p0, "%s/devices/system/node/node0", root);
    int b = snprintf(p1, sizeof p1, "%s/devices/system/node/node1", root);
    return a > 0 && (size_t)a < sizeof p0 && b > 0 && (size_t)b < sizeof p1 &&
           access(p0, F_OK) == 0 && access(p1, F_OK) != 0;
}

bool placement_device_read(const char *root, const char *bus_id, cpu_set_t *cpus, int *node)
{
    char name[16], path[512], line[4096];
    *node = -1;
    CPU_ZERO(cpus);
    if (!placement_pci_sysfs_name(bus_id, name, sizeof name))
        return false;
    int n = snprintf(path, sizeof path, "%s/bus/pci/devices/%s/local_cpulist", root, name);
    if (n < 0 || (size_t)n >= sizeof path || !read_line(path, line, sizeof line) ||
        placement_cpulist_parse(line, cpus) <= 0)
        return false;
    n = snprintf(path, sizeof path, "%s/bus/pci/devices/%s/numa_node", root, name);
    int v;
    if (n > 0 && (size_t)n < sizeof path && read_line(path, line, sizeof line) &&
        sscanf(line, "%d", &v) == 1 && v >= 0 && v < 1024)
        *node = v;
    if (*node < 0 && only_node0(root))
        *node = 0; /* a VM's -1: with one node, all memory is node 0 */
    return true;
}

static void unpinned(placement *out, const placement_in *in, const char *why)
{
    out->pin = false;
    CPU_ZERO(&out->cpus);
    out->ncpus = 0;
    out->threads = in->threads;
    out->ring_node = -1;
    snprintf(out->why, sizeof out->why, "not pinned: %s", why);
}

void placement_plan(const placement_in *in, placement *out)
{
    bool explicit = in->cpus && *in->cpus;
    cpu_set_t want;
    if (in->mode == 0)
        return unpinned(out, in, "REFIT_CUDA_NUMA=0");
    if (explicit) {
        if (placement_cpulist_parse(in->cpus, &want) <= 0)
            return unpinned(out, in, "REFIT_CUDA_CPUS is not a cpulist of at least one CPU");
    } else if (in->local) {
        want = *in->local;
    } else {
        return unpinned(out, in, "the device's local CPUs are unknown");
    }
    CPU_AND(&out->cpus, &want, in->allowed);
    out->ncpus = CPU_COUNT(&out->cpus);
    if (out->ncpus == 0)
        return unpinned(out, in, "none of those CPUs is in the process's affinity");
    if (in->mode == 1 && !explicit && CPU_EQUAL(&out->cpus, in->allowed))
        return unpinned(out, in, "the device is local to every allowed CPU");
    out->pin = true;
    out->threads = in->threads;
    if (!in->threads_explicit && out->threads > out->ncpus - 1)
        out->threads = out->ncpus > 1 ? out->ncpus - 1 : 1;
    if (in->threads == 0)
        out->threads = 0;
    out->ring_node = explicit ? -1 : in->node;
    snprintf(out->why, sizeof out->why, "%d copy threads on %d %s CPUs, pinned ring on node %d",
             out->threads, out->ncpus, explicit ? "REFIT_CUDA_CPUS" : "device-local",
             out->ring_node);
}

int placement_bind_preferred(void *p, size_t n, int node)
{
#ifdef SYS_mbind
    enum { MAX_NODES = 1024, MPOL_PREFERRED_ = 1 };
    unsigned long mask[MAX_NODES / (8 * sizeof(unsigned long))] = {0};
    const size_t bits = 8 * sizeof(unsigned long);
    if (node < 0 || node >= MAX_NODES)
        return EINVAL;
    mask[(size_t)node / bits] = 1UL << ((size_t)node % bits);
    /* maxnode counts one past the mask's bits (the kernel drops one) */
    if (syscall(SYS_mbind, p, n, MPOL_PREFERRED_, mask, (unsigned long)MAX_NODES + 1, 0UL) != 0)
        return errno;
    return 0;
#else
    (void)p;
    (void)n;
    (void)node;
    return ENOSYS;
#endif
}
