/* The MX formats' post_load_many on the CPU reference (shared by the
 * formats-mxfp8 and formats-mxfp4 suites; tests/formats/mxfp8/mx_batch.c):
 * MXB_MODULES online modules (BF16 sources in the test's own buffers)
 * loaded by one refit_load_many must
 *   - get one post_load_many of every module at the call's end, no
 *     post_load, each staged view the caller's source itself where it is
 *     64-byte aligned (STAGED_IN_PLACE) and a staged copy where it is not;
 *   - leave the bytes of the CPU reference (kern_quant_mxfp8 / _mxfp4 on
 *     the same input), of the per-call refit_load path and of a cold start,
 *     from aligned and unaligned sources alike;
 *   - with a NaN in module k of the batch: the call accepted, finalize
 *     fails naming module k and its tensor, rolled back (bytes, health and
 *     version kept).
 * The plugin is registered through a wrapper that counts its post_load and
 * post_load_many calls and records the staged views they see. */
#ifndef REFIT_TESTS_FORMATS_MX_BATCH_H
#define REFIT_TESTS_FORMATS_MX_BATCH_H

#include <refit/format.h>

#define MXB_MODULES 5

/* Module i (0 .. MXB_MODULES) is "l<i>.proj". mxfp8 (elem_bits 8):
 * weight E4M3 [rows, k] from l<i>.proj.weight BF16 [rows, k]; module 1
 * fuses two (gate: rows 0 .. rows/2, up: the rest). mxfp4 (elem_bits 4):
 * weight U8 [(E,) rows, ceil(k/2)] from one BF16 [(E,) rows, k]; module 1
 * stacks 3 experts. Both: weight_scale U8 [(E,) rows, ceil(k/32)]. */
typedef struct mxb_case {
    const refit_format_v2 *plugin;
    int elem_bits;
    int64_t rows, k;
} mxb_case;

/* Every check above, for c. */
void mxb_run(const mxb_case *c);

#endif
