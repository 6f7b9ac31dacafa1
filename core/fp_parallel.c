#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/fp_parallel.h"
#include "kernels/fingerprint.h"

#define FP_PIECE ((size_t)32 << 20) /* a multiple of 8: pieces end on words */
#define FP_MAX_THREADS 64

typedef struct piece {
    const unsigned char *at;
    size_t off, len;            /* within its range */
    kern_fp st;                 /* its sum, from word off / 8 on */
} piece;

typedef struct job {
    piece *p;
    size_t n;
    atomic_size_t next;
} job;

static void *work(void *arg)
{
    job *j = arg;
    for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) {
        piece *p = &j->p[i];
        kern_fp_init(&p->st);
        p->st.nbytes = p->off; /* the word index this piece starts at */
        kern_fp_update(&p->st, p->at + p->off, p->len);
    }
    return NULL;
}

int fp_ranges(const void *const *data, const size_t *bytes, size_t n, uint64_t *out,
              int threads)
{
    size_t np = 0;
    for (size_t i = 0; i < n; i++)
        np += bytes[i] ? (bytes[i] + FP_PIECE - 1) / FP_PIECE : 1;
    piece *p = malloc((np ? np : 1) * sizeof *p);
    if (!p)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t off = 0;
        do {
            size_t len = bytes[i] - off < FP_PIECE ? bytes[i] - off : FP_PIECE;
            p[k++] = (piece){.at = data[i], .off = off, .len = len};
            off += len;
        } while (off < bytes[i]);
    }
    job j = {p, np, 0};
    if (threads > FP_MAX_THREADS)
        threads = FP_MAX_THREADS;
    if ((size_t)threads > np)
        threads = (int)np;
    pthread_t th[FP_MAX_THREADS];
    int started = 0;
    while (started + 1 < threads && pthread_create(&th[started], NULL, work, &j) == 0)
        started++;
    work(&j); /* the caller takes pieces too */
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    k = 0;
    for (size_t i = 0; i < n; i++) { /* a range's sums add up; its last piece has the tail */
        uint64_t acc = 0;
        size_t last;
        do {
            acc += p[k].st.acc;
            last = k++;
        } while (k < np && p[k].off != 0);
        p[last].st.acc = acc;
        out[i] = kern_fp_final(&p[last].st);
    }
    free(p);
    return 0;
}
