/* The checks of the conformance kit, one function each (docs/conformance.md
 * says what each holds a format to). Each fills r: pass, fail or skip,
 * with a message saying what was seen. */
#ifndef REFIT_CONFORMANCE_KIT_CHECKS_H
#define REFIT_CONFORMANCE_KIT_CHECKS_H

#include "conformance/kit.h"

typedef enum kit_verdict { KIT_PASS = 0, KIT_FAIL = 1, KIT_SKIP = 2 } kit_verdict;

typedef struct kit_result {
    kit_verdict verdict;
    char msg[3072];
} kit_result;

typedef struct kit_check {
    const char *id;       /* what --only and the TAP line name */
    const char *title;
    void (*run)(const kit_env *env, kit_result *r);
} kit_check;

/* Every check, in the order they run; n set to their count. */
const kit_check *kit_checks(size_t *n);

#endif
