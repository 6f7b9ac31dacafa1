/*
 * SHA-256 through libcrypto (OpenSSL 3, EVP): checkpoint digests.
 *
 * The Hugging Face hub publishes the SHA-256 of every LFS file, so the hex
 * of a whole .safetensors file is what the journal records and what an
 * operator compares against the hub. libcrypto's implementation uses the
 * CPU's SHA extensions where there are any (docs/safetensors.md has the
 * figures against `openssl dgst`).
 *
 * Streaming use: init, update any number of times, final. init allocates
 * (libcrypto's context); final and free release it, so every init is
 * followed by exactly one of them. Each returns 0, or -1 when libcrypto
 * failed (out of memory): the caller reports REFIT_ENOMEM.
 */
#ifndef REFIT_CORE_SHA256_H
#define REFIT_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>

#define ST_SHA256_DIGEST 32 /* bytes in a digest */
#define ST_SHA256_HEX 65    /* hex digits plus the terminating NUL */

typedef struct st_sha256_ctx {
    EVP_MD_CTX *md; /* owned; NULL after final/free */
} st_sha256_ctx;

static inline int st_sha256_init(st_sha256_ctx *c)
{
    c->md = EVP_MD_CTX_new();
    if (c->md && EVP_DigestInit_ex(c->md, EVP_sha256(), NULL) == 1)
        return 0;
    EVP_MD_CTX_free(c->md);
    c->md = NULL;
    return -1;
}

static inline int st_sha256_update(st_sha256_ctx *c, const void *data, size_t len)
{
    return c->md && EVP_DigestUpdate(c->md, data, len) == 1 ? 0 : -1;
}

/* Releases c without a digest (an error path). */
static inline void st_sha256_free(st_sha256_ctx *c)
{
    EVP_MD_CTX_free(c->md);
    c->md = NULL;
}

/* Writes the digest to out and releases c. */
static inline int st_sha256_final(st_sha256_ctx *c, uint8_t out[ST_SHA256_DIGEST])
{
    unsigned n = 0;
    int ok = c->md && EVP_DigestFinal_ex(c->md, out, &n) == 1 && n == ST_SHA256_DIGEST;
    st_sha256_free(c);
    return ok ? 0 : -1;
}

/* One-shot digest of a buffer. */
static inline int st_sha256_buf(const void *data, size_t len, uint8_t out[ST_SHA256_DIGEST])
{
    unsigned n = 0;
    return EVP_Digest(data, len, out, &n, EVP_sha256(), NULL) == 1 && n == ST_SHA256_DIGEST
               ? 0
               : -1;
}

/* Lower-case hex of a digest, NUL-terminated (what sha256sum prints). */
static inline void st_sha256_hex(const uint8_t digest[ST_SHA256_DIGEST], char hex[ST_SHA256_HEX])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < ST_SHA256_DIGEST; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 15];
    }
    hex[2 * ST_SHA256_DIGEST] = '\0';
}

#endif
