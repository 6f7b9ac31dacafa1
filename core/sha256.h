/*
 * SHA-256 (FIPS 180-4), written for refit from the standard.
 *
 * Used for checkpoint digests: the Hugging Face hub publishes the SHA-256 of
 * every LFS file, so the hex of a whole .safetensors file is what the journal
 * records and what an operator compares against the hub.
 *
 * Streaming use: init, update any number of times, final. The context holds
 * no pointer, so it may be copied or kept on the stack.
 */
#ifndef REFIT_CORE_SHA256_H
#define REFIT_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define ST_SHA256_DIGEST 32 /* bytes in a digest */
#define ST_SHA256_HEX 65    /* hex digits plus the terminating NUL */

typedef struct st_sha256_ctx {
    uint32_t h[8];      /* intermediate hash value H(i) */
    uint64_t total;     /* message bytes seen so far */
    uint8_t block[64];  /* partial block awaiting 64 bytes */
    size_t fill;        /* bytes used in block */
} st_sha256_ctx;

void st_sha256_init(st_sha256_ctx *c);
void st_sha256_update(st_sha256_ctx *c, const void *data, size_t len);
/* Pads, writes the digest to out and leaves c unusable until re-init. */
void st_sha256_final(st_sha256_ctx *c, uint8_t out[ST_SHA256_DIGEST]);

/* One-shot digest of a buffer. */
void st_sha256_buf(const void *data, size_t len, uint8_t out[ST_SHA256_DIGEST]);
/* Lower-case hex of a digest, NUL-terminated (what sha256sum prints). */
void st_sha256_hex(const uint8_t digest[ST_SHA256_DIGEST], char hex[ST_SHA256_HEX]);

#endif
