/*
 * libFuzzer target for the safetensors header parser and the index reader.
 *
 * The first byte picks the parser (even: a whole .safetensors file through
 * st_open_memory, odd: model.safetensors.index.json through st_index_parse),
 * the rest is the input. Beyond "no crash, no sanitizer report", an input
 * that opens must satisfy the reader's promises, checked here with abort():
 * tensors tile the data section in order, each lies inside the buffer, and
 * every name is found again by st_find.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"

static volatile uint8_t sink;

static void check_set(const st_set *s, const uint8_t *buf, size_t len)
{
    uint64_t pos = 0, start = 0;
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *t = st_tensor_at(s, i);
        const uint8_t *p = t->data;
        if (i == 0)
            start = t->offset;
        if (t->offset != start + pos || p != buf + t->offset || t->offset + t->nbytes > len)
            abort();
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS || st_find(s, t->name) != t)
            abort();
        if (t->nbytes) /* touch both ends: ASan flags anything outside buf */
            sink ^= p[0] ^ p[t->nbytes - 1];
        pos += t->nbytes;
    }
    if (st_count(s) && start + pos != len)
        abort();
}

static void fuzz_file(const uint8_t *data, size_t size)
{
    st_set *s = NULL;
    st_error err;
    if (st_open_memory(&s, data, size, "fuzz", &err) == REFIT_OK) {
        check_set(s, data, size);
        char hex[65];
        if (size < 4096 && st_file_sha256(s, 0, hex, &err))
            abort();
        st_close(s);
    } else if (s || err.rule == ST_R_OK || !err.message[0]) {
        abort(); /* a failure must say why and leave nothing behind */
    }
}

static void fuzz_index(const uint8_t *data, size_t size)
{
    st_index *ix = NULL;
    st_error err;
    if (st_index_parse(&ix, data, size, "fuzz-index", &err) == REFIT_OK) {
        for (size_t i = 0; i < st_index_shard_count(ix); i++)
            if (!st_index_shard(ix, i) || strchr(st_index_shard(ix, i), '/'))
                abort();
        (void)st_index_shard_of(ix, "model.embed_tokens.weight");
        (void)st_index_total_size(ix);
        st_index_free(ix);
    } else if (ix || err.rule == ST_R_OK) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    /* A private copy, so that reads past the input's end are caught at
     * the exact byte whatever libFuzzer's own buffer looks like. */
    uint8_t *copy = malloc(size - 1 ? size - 1 : 1);
    if (!copy)
        return 0;
    memcpy(copy, data + 1, size - 1);
    if (data[0] & 1)
        fuzz_index(copy, size - 1);
    else
        fuzz_file(copy, size - 1);
    free(copy);
    return 0;
}
