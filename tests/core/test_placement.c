/* The CUDA backend's placement of its copy threads and pinned ring
 * (core/cuda/placement.c), on the CPU: the cpulist parser, the PCI name
 * sysfs uses, reading a device's CPUs and node from a sysfs tree made
 * here, the decision on one node, two nodes, a 2-CPU machine and a
 * restricted affinity, and the mbind hint. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/cuda/placement.h"

static cpu_set_t range(int lo, int hi)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    for (int c = lo; c <= hi; c++)
        CPU_SET((size_t)c, &s);
    return s;
}

static void test_cpulist_parse_accepts_sysfs_forms(void **state)
{
    (void)state;
    cpu_set_t s, want = range(0, 3);
    for (int c = 8; c <= 11; c++)
        CPU_SET((size_t)c, &want);
    assert_int_equal(placement_cpulist_parse("0-3,8-11\n", &s), 8);
    assert_true(CPU_EQUAL(&s, &want));
    assert_int_equal(placement_cpulist_parse("5", &s), 1);
    assert_true(CPU_ISSET(5, &s));
    assert_int_equal(placement_cpulist_parse("7,3,3-4", &s), 3);
    assert_true(CPU_ISSET(3, &s) && CPU_ISSET(4, &s) && CPU_ISSET(7, &s));
    assert_int_equal(placement_cpulist_parse("", &s), 0);
    assert_int_equal(placement_cpulist_parse("\n", &s), 0);
    char last[16];
    snprintf(last, sizeof last, "%d", CPU_SETSIZE - 1);
    assert_int_equal(placement_cpulist_parse(last, &s), 1);
}

static void test_cpulist_parse_refuses_malformed_and_leaves_none(void **state)
{
    (void)state;
    const char *bad[] = {"3-1", "a", "1,", ",1", "1-", "0-3\n5", "0 -3", "-1", "1;2", "0-3 "};
    cpu_set_t s;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(placement_cpulist_parse(bad[i], &s), -1);
        assert_int_equal(CPU_COUNT(&s), 0);
    }
    char big[16];
    snprintf(big, sizeof big, "0-%d", CPU_SETSIZE);
    assert_int_equal(placement_cpulist_parse(big, &s), -1);
    assert_int_equal(placement_cpulist_parse(NULL, &s), -1);
}

static void test_pci_name_as_sysfs_writes_it(void **state)
{
    (void)state;
    char out[16];
    assert_true(placement_pci_sysfs_name("0000:3B:00.0", out, sizeof out));
    assert_string_equal(out, "0000:3b:00.0");
    assert_true(placement_pci_sysfs_name("00000000:C1:1f.7", out, sizeof out));
    assert_string_equal(out, "0000:c1:1f.7");
    const char *bad[] = {"0000:3B:00", "0000-3B:00.0", "0000:3G:00.0", "00010000:3B:00.0",
                         "000:3B:00.0a", "", "0000:3B:00:0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(placement_pci_sysfs_name(bad[i], out, sizeof out));
    assert_false(placement_pci_sysfs_name(NULL, out, sizeof out));
    assert_false(placement_pci_sysfs_name("0000:3B:00.0", out, 12));
}

/* A sysfs tree with one device: <root>/bus/pci/devices/0000:3b:00.0/. */
static void put(const char *dir, const char *file, const char *text)
{
    char p[1100];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    if (!text) {
        unlink(p);
        return;
    }
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_device_read_from_a_sysfs_tree(void **state)
{
    (void)state;
    char root[] = "/tmp/refit-placement-XXXXXX", dev[512], p[512];
    assert_non_null(mkdtemp(root));
    const char *parts[] = {"bus", "bus/pci", "bus/pci/devices", "bus/pci/devices/0000:3b:00.0"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", root, parts[i]);
        assert_int_equal(mkdir(p, 0700), 0);
    }
    snprintf(dev, sizeof dev, "%s/%s", root, parts[3]);
    cpu_set_t s, want = range(8, 15);
    int node = 7;

    put(dev, "local_cpulist", "8-15\n");
    put(dev, "numa_node", "1\n");
    assert_true(placement_device_read(root, "00000000:3B:00.0", &s, &node));
    assert_true(CPU_EQUAL(&s, &want));
    assert_int_equal(node, 1);

    put(dev, "numa_node", "-1\n"); /* a VM without NUMA information */
    assert_true(placement_device_read(root, "0000:3B:00.0", &s, &node));
    assert_int_equal(node, -1);
    put(dev, "numa_node", NULL);
    node = 7;
    assert_true(placement_device_read(root, "0000:3B:00.0", &s, &node));
    assert_int_equal(node, -1);

    /* with one node, -1 or nothing is node 0; with two it stays unknown */
    const char *nodes[] = {"devices", "devices/system", "devices/system/node",
                           "devices/system/node/node0", "devices/system/node/node1"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", root, nodes[i]);
        assert_int_equal(mkdir(p, 0700), 0);
    }
    assert_true(placement_device_read(root, "0000:3B:00.0", &s, &node));
    assert_int_equal(node, 0);
    put(dev, "numa_node", "-1\n");
    assert_true(placement_device_read(root, "0000:3B:00.0", &s, &node));
    assert_int_equal(node, 0);
    snprintf(p, sizeof p, "%s/%s", root, nodes[4]);
    assert_int_equal(mkdir(p, 0700), 0);
    assert_true(placement_device_read(root, "0000:3B:00.0", &s, &node));
    assert_int_equal(node, -1);
    for (int i = 4; i >= 0; i--) {
        snprintf(p, sizeof p, "%s/%s", root, nodes[i]);
        assert_int_equal(rmdir(p), 0);
    }
    put(dev, "numa_node", NULL);

    assert_false(placement_device_read(root, "0000:3C:00.0", &s, &node)); /* no such device */
    put(dev, "local_cpulist", "8-x\n");
    assert_false(placement_device_read(root, "0000:3B:00.0", &s, &node));
    put(dev, "local_cpulist", "\n");
    assert_false(placement_device_read(root, "0000:3B:00.0", &s, &node));
    put(dev, "local_cpulist", NULL);
    assert_false(placement_device_read(root, "0000:3B:00.0", &s, &node));
    assert_int_equal(CPU_COUNT(&s), 0);
    assert_false(placement_device_read(root, "junk", &s, &node));

    for (int i = 3; i >= 0; i--) {
        snprintf(p, sizeof p, "%s/%s", root, parts[i]);
        assert_int_equal(rmdir(p), 0);
    }
    assert_int_equal(rmdir(root), 0);
}

static placement plan(int mode, const char *cpus, const cpu_set_t *local, int node,
                      cpu_set_t allowed, int threads, bool explicit)
{
    placement_in in = {mode, cpus, local, node, &allowed, threads, explicit};
    placement out;
    memset(&out, 0x5a, sizeof out);
    placement_plan(&in, &out);
    assert_true(strlen(out.why) > 0);
    return out;
}

static void test_plan_two_nodes_pins_to_the_device_node(void **state)
{
    (void)state;
    cpu_set_t node1 = range(8, 15);
    placement p = plan(1, NULL, &node1, 1, range(0, 15), 12, false);
    assert_true(p.pin);
    assert_true(CPU_EQUAL(&p.cpus, &node1));
    assert_int_equal(p.ncpus, 8);
    assert_int_equal(p.threads, 7); /* one CPU of the node left to the caller */
    assert_int_equal(p.ring_node, 1);
    assert_non_null(strstr(p.why, "7 copy threads on 8"));

    p = plan(1, NULL, &node1, 1, range(0, 15), 12, true); /* REFIT_CUDA_COPY_THREADS=12 */
    assert_true(p.pin);
    assert_int_equal(p.threads, 12);

    p = plan(1, NULL, &node1, 1, range(0, 11), 12, false); /* taskset 0-11 */
    assert_true(p.pin);
    assert_int_equal(p.ncpus, 4);
    assert_true(CPU_ISSET(8, &p.cpus) && CPU_ISSET(11, &p.cpus) && !CPU_ISSET(12, &p.cpus));
    assert_int_equal(p.threads, 3);

    p = plan(1, NULL, &node1, 1, range(0, 7), 12, false); /* taskset to the other node */
    assert_false(p.pin);
    assert_int_equal(p.threads, 12);
    assert_int_equal(p.ring_node, -1);
    assert_non_null(strstr(p.why, "affinity"));

    p = plan(0, NULL, &node1, 1, range(0, 15), 12, false); /* REFIT_CUDA_NUMA=0 */
    assert_false(p.pin);
    assert_int_equal(p.threads, 12);
    assert_int_equal(p.ring_node, -1);
    assert_non_null(strstr(p.why, "REFIT_CUDA_NUMA=0"));

    p = plan(1, NULL, &node1, 1, range(0, 15), 0, false); /* REFIT_CUDA_COPY_THREADS=0 */
    assert_true(p.pin);
    assert_int_equal(p.threads, 0);
}

static void test_plan_one_node_pins_only_when_forced(void **state)
{
    (void)state;
    cpu_set_t all = range(0, 15);
    placement p = plan(1, NULL, &all, 0, all, 12, false);
    assert_false(p.pin);
    assert_int_equal(p.threads, 12);
    assert_int_equal(p.ring_node, -1);

    p = plan(2, NULL, &all, 0, all, 12, false); /* REFIT_CUDA_NUMA=2 */
    assert_true(p.pin);
    assert_int_equal(p.ncpus, 16);
    assert_int_equal(p.threads, 12);
    assert_int_equal(p.ring_node, 0);

    p = plan(2, NULL, &all, -1, all, 12, false); /* VM: numa_node -1 */
    assert_true(p.pin);
    assert_int_equal(p.ring_node, -1);

    p = plan(1, NULL, NULL, -1, all, 12, false); /* no sysfs entry */
    assert_false(p.pin);
    assert_non_null(strstr(p.why, "unknown"));
}

static void test_plan_two_cpu_machine(void **state)
{
    (void)state;
    cpu_set_t two = range(0, 1);
    placement p = plan(1, NULL, &two, 0, two, 1, false);
    assert_false(p.pin);
    assert_int_equal(p.threads, 1);
    p = plan(2, NULL, &two, 0, two, 1, false);
    assert_true(p.pin);
    assert_int_equal(p.ncpus, 2);
    assert_int_equal(p.threads, 1);
    cpu_set_t one = range(1, 1);
    p = plan(2, NULL, &one, 0, two, 1, false);
    assert_true(p.pin);
    assert_int_equal(p.ncpus, 1);
    assert_int_equal(p.threads, 1); /* at least one worker */
}

static void test_plan_explicit_cpus(void **state)
{
    (void)state;
    cpu_set_t all = range(0, 15), two = range(2, 3);
    placement p = plan(1, "2-3", &all, 0, all, 12, false);
    assert_true(p.pin);
    assert_true(CPU_EQUAL(&p.cpus, &two));
    assert_int_equal(p.threads, 1);
    assert_int_equal(p.ring_node, -1); /* the node of a list is not known */
    assert_non_null(strstr(p.why, "REFIT_CUDA_CPUS"));
    p = plan(1, "0-15", NULL, -1, all, 12, false); /* explicit: pins though it narrows nothing */
    assert_true(p.pin);
    assert_int_equal(p.threads, 12);
    p = plan(1, "0-x", &all, 0, all, 12, false);
    assert_false(p.pin);
    assert_non_null(strstr(p.why, "REFIT_CUDA_CPUS"));
    p = plan(1, "20-23", &all, 0, all, 12, false);
    assert_false(p.pin);
    p = plan(0, "2-3", &all, 0, all, 12, false);
    assert_false(p.pin);
}

static void test_bind_preferred_places_pages(void **state)
{
    (void)state;
    assert_int_equal(placement_bind_preferred(NULL, 4096, -1), EINVAL);
    assert_int_equal(placement_bind_preferred(NULL, 4096, 1024), EINVAL);
    size_t n = 4 * 4096;
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    int rc = placement_bind_preferred(p, n, 0);
    if (rc == ENOSYS || rc == EPERM) {
        munmap(p, n);
        skip(); /* a kernel or container without mbind: the backend goes on unbound */
    }
    assert_int_equal(rc, 0);
    memset(p, 1, n);
    int mode = -1;
    unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {0};
    assert_int_equal(syscall(SYS_get_mempolicy, &mode, mask, 1025UL, p, 2UL /* MPOL_F_ADDR */), 0);
    assert_int_equal(mode, 1); /* MPOL_PREFERRED */
    assert_true(mask[0] & 1);
    int node = -1;
    assert_int_equal(syscall(SYS_get_mempolicy, &node, NULL, 0UL, p, 3UL /* |MPOL_F_NODE */), 0);
    assert_int_equal(node, 0);
    munmap(p, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpulist_parse_accepts_sysfs_forms),
        cmocka_unit_test(test_cpulist_parse_refuses_malformed_and_leaves_none),
        cmocka_unit_test(test_pci_name_as_sysfs_writes_it),
        cmocka_unit_test(test_device_read_from_a_sysfs_tree),
        cmocka_unit_test(test_plan_two_nodes_pins_to_the_device_node),
        cmocka_unit_test(test_plan_one_node_pins_only_when_forced),
        cmocka_unit_test(test_plan_two_cpu_machine),
        cmocka_unit_test(test_plan_explicit_cpus),
        cmocka_unit_test(test_bind_preferred_places_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
