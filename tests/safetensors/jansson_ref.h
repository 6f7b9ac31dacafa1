/* Reference verdicts for test_json_diff: the header and index JSON stages
 * as refit ran them on jansson, before core/json_reader. Layout rules
 * (offsets tiling the data) are not here: the header cases of the test
 * either tile exactly or fail before layout. */
#ifndef REFIT_TESTS_ST_JANSSON_REF_H
#define REFIT_TESTS_ST_JANSSON_REF_H

#include <stddef.h>
#include <stdint.h>

#include "core/safetensors.h"

#define REF_MAX 64

struct ref_tensor {
    char name[256];
    char shard[256];          /* index: the weight_map value */
    st_dtype dtype;
    int64_t shape[ST_MAX_DIMS];
    int ndim;
    uint64_t begin, end;
};

struct ref_result {
    st_rule rule;             /* ST_R_OK when accepted */
    char message[512];
    struct ref_tensor tensors[REF_MAX]; /* in document order */
    size_t ntensors;
    char meta_key[REF_MAX][128]; /* __metadata__, in document order */
    char meta_val[REF_MAX][128];
    size_t nmeta;
    int64_t total_size;       /* index: -1 when absent */
};

/* 0 when the JSON stage accepts; -1 with o->rule and o->message. */
int ref_header(const void *hdr, size_t n, struct ref_result *o);
int ref_index(const void *text, size_t n, struct ref_result *o);

#endif
