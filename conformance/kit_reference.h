/* The author's reference (--reference CMD, docs/conformance.md "The
 * reference"): the checkpoint tensors of a world's modules of the format
 * go to the author's program, which answers with the runtime bytes it
 * expects; they must equal what the plugin wrote, byte for byte. */
#ifndef REFIT_CONFORMANCE_KIT_REFERENCE_H
#define REFIT_CONFORMANCE_KIT_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "conformance/kit.h"

/* w holds a cold start of `version` at w->rank (layout KIT_SHARDED). In a
 * fresh directory: checkpoint.safetensors (w->rank's slice of each
 * checkpoint tensor of the format's modules) and request.json (format,
 * rank, version, each module's params, checkpoint and runtime tensors);
 * then `CMD DIR/request.json` through /bin/sh (its stdout to stderr); then
 * DIR/runtime.safetensors, one tensor "MODULE/NAME" per runtime tensor of
 * those modules, compared with w's. REFIT_OK when every byte is equal;
 * REFIT_EUNSUPPORTED when the case has a tensor the exchange cannot carry;
 * else a status, why naming the tensor and the first differing byte. The
 * directory is removed. */
int kit_reference_run(const kit_world *w, uint64_t version, char *why, size_t n);

#endif
