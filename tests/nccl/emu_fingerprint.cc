/* kernels/fingerprint.cu on the CPU through the emulator (tests/gpu/emu):
 * kern_fingerprint_to_cuda (the transport's device checksum) and
 * kern_fingerprint_view_cuda against the host's kern_fingerprint_view, on
 * byte counts that are not multiples of 8, unaligned starts, strided and
 * sub-byte views; the destination word is written and its neighbours are
 * not; a misaligned destination is refused. Run by emu_fingerprint.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/format.h>

extern "C" {
#include "kernels/fingerprint.h"
int kern_fingerprint_view_cuda(const refit_view *v, uint64_t *out, void *stream);
int kern_fingerprint_to_cuda(const refit_view *v, uint64_t *dst, void *stream);
}

/* what the CUDA backend's error slot would hold */
static char last_err[256];
extern "C" const char *kern_cuda_last_error(void) { return last_err; }
extern "C" void kern_cuda_set_error(const char *m) { snprintf(last_err, sizeof last_err, "%s", m); }

/* bytes of the test buffer: the strided view below spans (76 * 607 + 601) * 2 */
enum { BUF = 100000 };

static int failures, checks;

static refit_view bytes_view(uint8_t *p, int64_t n, refit_dtype dt)
{
    refit_view v;
    memset(&v, 0, sizeof v);
    v.data = p;
    v.device = refit_device{REFIT_DEVICE_CUDA, 0};
    v.dtype = dt;
    v.ndim = 1;
    v.shape[0] = dt.bits == 4 ? n * 2 : n / (dt.bits / 8);
    v.strides[0] = 1;
    return v;
}

static void check(const refit_view *v, const char *what, int64_t n, int64_t off)
{
    uint64_t want = kern_fingerprint_view(v), got = 0;
    uint64_t words[3] = {0x1111, 0x2222, 0x3333};
    checks++;
    if (kern_fingerprint_to_cuda(v, &words[1], NULL) || words[1] != want ||
        words[0] != 0x1111 || words[2] != 0x3333) {
        fprintf(stderr, "fingerprint_to %s, %lld bytes at +%lld: %016llx, host %016llx (%s)\n",
                what, (long long)n, (long long)off, (unsigned long long)words[1],
                (unsigned long long)want, kern_cuda_last_error());
        failures++;
    }
    if (kern_fingerprint_view_cuda(v, &got, NULL) || got != want) {
        fprintf(stderr, "fingerprint_view %s, %lld bytes: %016llx, host %016llx\n", what,
                (long long)n, (unsigned long long)got, (unsigned long long)want);
        failures++;
    }
}

int main(void)
{
    const refit_dtype u8 = {REFIT_DTYPE_UINT, 8, 1}, u4 = {REFIT_DTYPE_UINT, 4, 1};
    const refit_dtype bf16 = {REFIT_DTYPE_BFLOAT, 16, 1};
    static const int64_t sizes[] = {0, 1, 7, 8, 9, 13, 255, 2048, 2051, 20483, 65541};
    static const int64_t offs[] = {0, 1, 2, 16};
    uint8_t *buf = (uint8_t *)malloc(BUF);
    for (int i = 0; i < BUF; i++)
        buf[i] = (uint8_t)(i * 131 + (i >> 7) * 7 + 3);
    /* starts 0 and 16: the 16-byte path; 1 and 2: the general walk */
    for (int64_t n : sizes)
        for (int64_t off : offs) {
            refit_view v = bytes_view(buf + off, n, u8);
            check(&v, "u8", n, off);
            if (off == 0) {
                v = bytes_view(buf, n, u4);
                check(&v, "u4", n, off);
            }
        }
    /* a strided BF16 view: every other element of 77 rows of 301 */
    refit_view s;
    memset(&s, 0, sizeof s);
    s.data = buf + 2;
    s.device = refit_device{REFIT_DEVICE_CUDA, 0};
    s.dtype = bf16;
    s.ndim = 2;
    s.shape[0] = 77;
    s.shape[1] = 301;
    s.strides[0] = 2 * 301 + 5;
    s.strides[1] = 2;
    check(&s, "bf16 strided", 77 * 301 * 2, 2);
    /* the word is the destination: 8-byte aligned only */
    uint64_t w[2];
    refit_view v = bytes_view(buf, 64, u8);
    checks++;
    if (kern_fingerprint_to_cuda(&v, (uint64_t *)((char *)w + 4), NULL) != REFIT_EINVAL) {
        fprintf(stderr, "a misaligned destination was accepted\n");
        failures++;
    }
    free(buf);
    printf("%d checks, %d failures\n", checks, failures);
    return failures != 0;
}
