/* REFIT_CUDA_RING_TRACE (ring_trace.h): records in one array, claimed
 * with an atomic counter, printed at exit. The array is allocated once,
 * when the variable is set; records past its end are counted, not kept. */
#include "core/cuda/ring_trace.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define RT_CAP (1u << 20)

typedef struct rt_rec {
    uint64_t t0, t1, a, b, c, cpu;
    int32_t who;
    uint32_t kind;
} rt_rec;

bool ring_trace_on;
static pthread_once_t rt_once = PTHREAD_ONCE_INIT;
static char rt_path[4096];
static rt_rec *rt_recs;
static uint64_t rt_n;
static _Thread_local int rt_who = -1;

static void rt_write(void)
{
    FILE *f = fopen(rt_path, "w");
    if (!f) {
        fprintf(stderr, "refit: REFIT_CUDA_RING_TRACE: cannot write %s\n", rt_path);
        return;
    }
    uint64_t n = __atomic_load_n(&rt_n, __ATOMIC_ACQUIRE);
    fprintf(f, "# refit ring trace: kind who t0_ns t1_ns a b c cpu_ns (kinds: 0 fill, 1 issue, "
               "2 fill_wait, 3 drain_wait, 4 settle, 5 gap, 6 copy); %llu records, %llu dropped\n",
            (unsigned long long)(n < RT_CAP ? n : RT_CAP),
            (unsigned long long)(n > RT_CAP ? n - RT_CAP : 0));
    for (uint64_t i = 0; i < n && i < RT_CAP; i++) {
        const rt_rec *r = &rt_recs[i];
        fprintf(f, "%u %d %llu %llu %llu %llu %llu %llu\n", r->kind, r->who,
                (unsigned long long)r->t0, (unsigned long long)r->t1,
                (unsigned long long)r->a, (unsigned long long)r->b,
                (unsigned long long)r->c, (unsigned long long)r->cpu);
    }
    fclose(f);
}

static void rt_init_once(void)
{
    const char *p = getenv("REFIT_CUDA_RING_TRACE");
    if (!p || !*p)
        return;
    size_t o = 0;
    for (; *p && o + 24 < sizeof rt_path; p++) {
        if (p[0] == '%' && p[1] == 'p') {
            o += (size_t)snprintf(rt_path + o, sizeof rt_path - o, "%ld", (long)getpid());
            p++;
        } else {
            rt_path[o++] = *p;
        }
    }
    rt_path[o] = 0;
    rt_recs = calloc(RT_CAP, sizeof *rt_recs);
    if (!rt_recs)
        return;
    atexit(rt_write);
    ring_trace_on = true;
}

void ring_trace_init(void)
{
    pthread_once(&rt_once, rt_init_once);
}

void ring_trace_worker(int k)
{
    rt_who = k;
}

uint64_t ring_trace_cpu_ns(void)
{
    struct timespec ts;
    if (!ring_trace_on || clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void ring_trace_add(ring_trace_kind kind, uint64_t t0, uint64_t t1, uint64_t a, uint64_t b,
                    uint64_t c, uint64_t cpu)
{
    if (!ring_trace_on)
        return;
    uint64_t i = __atomic_fetch_add(&rt_n, 1, __ATOMIC_ACQ_REL);
    if (i >= RT_CAP)
        return;
    rt_recs[i] = (rt_rec){t0, t1, a, b, c, cpu, rt_who, (uint32_t)kind};
}
