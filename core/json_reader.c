/*
 * Strict JSON pull reader; see core/json_reader.h.
 *
 * Error precedence follows jansson's, so that a header refused today is
 * refused under the same rule: bytes are validated as UTF-8 when the scan
 * reaches them (a number or a literal looks one byte past its end, as
 * jansson's lexer does), a string is scanned whole (UTF-8, control
 * characters, escape syntax) before it is decoded (surrogates, \u0000),
 * and a key is checked for duplicates as soon as it is read.
 */
#include "core/json_reader.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct jr_key {
    const char *s;
    uint32_t len;
    uint64_t hash;               /* once its object is hashed */
};

struct jr_frame {
    size_t base;                 /* the object's first key */
    uint32_t *slots;             /* NULL while searched linearly */
    size_t mask;
};

/* ---- errors ------------------------------------------------------------ */

static int jr_error(jr_reader *r, jr_status st, size_t pos, const char *fmt, ...)
{
    if (r->status != JR_OK)
        return -1;
    r->status = st;
    r->err_pos = pos;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err_text, sizeof r->err_text, fmt, ap);
    va_end(ap);
    return -1;
}

/* Length of the valid UTF-8 sequence at p, 0 when invalid (overlong,
 * surrogate, above U+10FFFF, cut short). */
static size_t jr_utf8_len(const uint8_t *p, const uint8_t *end)
{
    uint8_t c = p[0];
    size_t n;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, cp = c & 0x07;
    else
        return 0;
    if ((size_t)(end - p) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

/* A syntax error at pos, unless the byte there is not valid UTF-8: jansson
 * reads it before judging the token, and that error comes first. */
static int jr_bad(jr_reader *r, size_t pos, const char *what)
{
    if (pos < r->len && r->buf[pos] >= 0x80 && !jr_utf8_len(r->buf + pos, r->buf + r->len))
        return jr_error(r, JR_UTF8, pos, "invalid UTF-8 byte 0x%02x", r->buf[pos]);
    if (pos >= r->len)
        return jr_error(r, JR_SYNTAX, pos, "%s at end of input", what);
    return jr_error(r, JR_SYNTAX, pos, "%s", what);
}

const char *jr_kind_name(jr_kind k)
{
    switch (k) {
    case JR_OBJECT: return "object";
    case JR_ARRAY: return "array";
    case JR_STRING: return "string";
    case JR_INTEGER: return "integer";
    case JR_REAL: return "real number";
    case JR_TRUE:
    case JR_FALSE: return "boolean";
    case JR_NULL: return "null";
    default: return "nothing";
    }
}

/* ---- setup ------------------------------------------------------------- */

int jr_init(jr_reader *r, const void *buf, size_t len)
{
    memset(r, 0, sizeof *r);
    r->buf = buf;
    r->len = len;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    r->seed = (uint64_t)(uintptr_t)r ^ ((uint64_t)ts.tv_nsec << 17) ^ (uint64_t)ts.tv_sec;
    /* a decoded string is never longer than its quoted source: one arena
     * of len + 1 bytes never moves */
    if (!(r->arena = malloc(len + 1))) {
        r->status = JR_NOMEM;
        return -1;
    }
    return 0;
}

void jr_free(jr_reader *r)
{
    free(r->arena);
    for (size_t i = 0; i < r->nframes; i++)
        free(r->frames[i].slots);
    free(r->frames);
    free(r->keys);
    memset(r, 0, sizeof *r);
}

/* ---- bytes ------------------------------------------------------------- */

static bool jr_is_ws(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void jr_ws(jr_reader *r)
{
    while (r->pos < r->len) {
        uint8_t c = r->buf[r->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            return;
        r->pos++;
    }
}

static int jr_byte(const jr_reader *r)
{
    return r->pos < r->len ? r->buf[r->pos] : -1;
}

static jr_kind jr_kind_of(int c)
{
    switch (c) {
    case '{': return JR_OBJECT;
    case '[': return JR_ARRAY;
    case '"': return JR_STRING;
    case 't': return JR_TRUE;
    case 'f': return JR_FALSE;
    case 'n': return JR_NULL;
    default:
        if (c == '-' || (c >= '0' && c <= '9'))
            return JR_INTEGER; /* or JR_REAL: jr_number says */
        /* any other word fails when read, as jansson's lexer reads it */
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ? JR_NULL : JR_NONE;
    }
}

jr_kind jr_peek(jr_reader *r)
{
    if (r->status != JR_OK)
        return JR_NONE;
    jr_ws(r);
    jr_kind k = jr_kind_of(jr_byte(r));
    if (k == JR_NONE)
        jr_bad(r, r->pos, "a value was expected");
    return k;
}

/* A scalar at depth + 1, or a container about to open, must fit. */
static int jr_depth_ok(jr_reader *r, size_t pos)
{
    if (r->depth + 1 > JR_MAX_DEPTH)
        return jr_error(r, JR_SYNTAX, pos, "nesting deeper than %d levels", JR_MAX_DEPTH);
    return 0;
}

/* ---- strings ----------------------------------------------------------- */

static int jr_hex4(const uint8_t *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = p[i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v << 4 | d;
    }
    return v;
}

static bool jr_xdigit(int c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* First pass: from the opening quote to the closing one, checking UTF-8,
 * control characters and escape syntax; *close: the closing quote. */
static int jr_scan_string(jr_reader *r, size_t *close)
{
    const uint8_t *b = r->buf;
    size_t i = r->pos + 1;
    for (;;) {
        if (i >= r->len)
            return jr_error(r, JR_SYNTAX, i, "string not closed at end of input");
        uint8_t c = b[i];
        if (c == '"')
            break;
        if (c < 0x20)
            return jr_error(r, JR_SYNTAX, i, "control character 0x%02x in a string", c);
        if (c >= 0x80) {
            size_t n = jr_utf8_len(b + i, b + r->len);
            if (!n)
                return jr_error(r, JR_UTF8, i, "invalid UTF-8 byte 0x%02x", c);
            i += n;
            continue;
        }
        if (c != '\\') {
            i++;
            continue;
        }
        if (++i >= r->len)
            return jr_error(r, JR_SYNTAX, i, "string not closed at end of input");
        c = b[i];
        if (c == 'u') {
            for (int k = 1; k <= 4; k++) {
                if (i + k >= r->len)
                    return jr_error(r, JR_SYNTAX, i + k, "string not closed at end of input");
                if (!jr_xdigit(b[i + k]))
                    return jr_bad(r, i + k, "invalid escape in a string");
            }
            i += 5;
        } else if (c && strchr("\"\\/bfnrt", c)) {
            i++;
        } else {
            return jr_bad(r, i, "invalid escape in a string");
        }
    }
    *close = i;
    return 0;
}

static bool jr_digit(int c) { return c >= '0' && c <= '9'; }

/* jansson's lexer reads a word as a run of letters (not digits). */
static bool jr_alpha(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* A syntax error where a token was not expected: jansson's lexer reads the
 * whole token at pos first (a string to its end, a word or a number to the
 * first byte that does not fit), and invalid UTF-8 met on the way is the
 * error it reports. */
static int jr_bad_token(jr_reader *r, size_t pos, const char *what)
{
    const uint8_t *b = r->buf;
    size_t i = pos, close;
    if (i < r->len && b[i] == '"') {
        size_t save = r->pos;
        r->pos = i;
        int rc = jr_scan_string(r, &close);
        r->pos = save;
        if (rc)
            return -1;
    } else if (i < r->len && jr_alpha(b[i])) {
        while (i < r->len && jr_alpha(b[i]))
            i++;
    } else if (i < r->len && (b[i] == '-' || jr_digit(b[i]))) {
        i += b[i] == '-';
        if (i < r->len && b[i] == '0')
            i++;
        else
            while (i < r->len && jr_digit(b[i]))
                i++;
        if (i < r->len && b[i] == '.')
            for (i++; i < r->len && jr_digit(b[i]);)
                i++;
        if (i < r->len && (b[i] == 'e' || b[i] == 'E')) {
            i++;
            if (i < r->len && (b[i] == '+' || b[i] == '-'))
                i++;
            while (i < r->len && jr_digit(b[i]))
                i++;
        }
    }
    if (i != pos && i < r->len && b[i] >= 0x80 && !jr_utf8_len(b + i, b + r->len))
        return jr_error(r, JR_UTF8, i, "invalid UTF-8 byte 0x%02x", b[i]);
    return jr_bad(r, pos, what);
}

static char *jr_put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        *o++ = (char)cp;
    } else if (cp < 0x800) {
        *o++ = (char)(0xc0 | cp >> 6);
        *o++ = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        *o++ = (char)(0xe0 | cp >> 12);
        *o++ = (char)(0x80 | (cp >> 6 & 0x3f));
        *o++ = (char)(0x80 | (cp & 0x3f));
    } else {
        *o++ = (char)(0xf0 | cp >> 18);
        *o++ = (char)(0x80 | (cp >> 12 & 0x3f));
        *o++ = (char)(0x80 | (cp >> 6 & 0x3f));
        *o++ = (char)(0x80 | (cp & 0x3f));
    }
    return o;
}

/* Second pass: decodes [pos + 1, close) into the arena. */
static int jr_decode(jr_reader *r, size_t close, const char **s, size_t *len)
{
    const uint8_t *b = r->buf;
    char *start = r->arena + r->used, *o = start;
    size_t i = r->pos + 1;
    if (!memchr(b + i, '\\', close - i)) { /* no escapes: the bytes as they are */
        memcpy(o, b + i, close - i);
        o += close - i;
        i = close;
    }
    while (i < close) {
        uint8_t c = b[i];
        if (c != '\\') {
            *o++ = (char)c;
            i++;
            continue;
        }
        c = b[i + 1];
        if (c != 'u') {
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            *o++ = to[strchr(from, c) - from];
            i += 2;
            continue;
        }
        uint32_t cp = (uint32_t)jr_hex4(b + i + 2);
        size_t at = i;
        i += 6;
        if (cp >= 0xdc00 && cp <= 0xdfff)
            return jr_error(r, JR_SYNTAX, at, "lone low surrogate \\u%04X in a string", cp);
        if (cp >= 0xd800 && cp <= 0xdbff) {
            int lo = i + 6 <= close && b[i] == '\\' && b[i + 1] == 'u' ? jr_hex4(b + i + 2) : -1;
            if (lo < 0xdc00 || lo > 0xdfff)
                return jr_error(r, JR_SYNTAX, at, "high surrogate \\u%04X not followed by a "
                                "low one in a string", cp);
            cp = 0x10000 + ((cp - 0xd800) << 10) + ((uint32_t)lo - 0xdc00);
            i += 6;
        }
        if (cp == 0)
            return jr_error(r, JR_SYNTAX, at, "\\u0000 (NUL) in a string");
        o = jr_put_utf8(o, cp);
    }
    *o = '\0';
    *s = start;
    *len = (size_t)(o - start);
    r->used += *len + 1;
    r->pos = close + 1;
    return 0;
}

static int jr_string_at(jr_reader *r, const char **s, size_t *len)
{
    size_t close;
    if (jr_scan_string(r, &close))
        return -1;
    return jr_decode(r, close, s, len);
}

int jr_string(jr_reader *r, const char **s, size_t *len)
{
    if (jr_peek(r) != JR_STRING)
        return r->status ? -1 : jr_bad_token(r, r->pos, "a string was expected");
    size_t at = r->pos;
    if (jr_string_at(r, s, len))
        return -1;
    return jr_depth_ok(r, at);
}

/* ---- numbers and literals ---------------------------------------------- */

/* 2^1024 - 2^970: the least decimal that rounds to infinity (DBL_MAX's
 * significand is odd, so the tie rounds up), 309 digits. */
static const char jr_dbl_inf[] =
    "17976931348623158079372897140530341507993413271003782693617377898044496829"
    "27647509466490179775872070963302864166928879109465555478519404026306574886"
    "71505820681908902000708383676273854845817711531764475730270069855571366959"
    "62284291481986083493647529271907416844436551070434271155969950809304288017"
    "7904174497792";

/* Whether the real [from, to) (valid JSON) overflows a double, which is
 * what jansson's strtod refuses: exactly, in any locale, with no copy.
 * value = 0.DDD x 10^e where DDD are the significant digits. */
static bool jr_real_overflows(const uint8_t *b, size_t from, size_t to)
{
    size_t i = from + (b[from] == '-'), first = 0, mant_end = i;
    int64_t e = 0, exp = 0;
    bool seen = false, frac = false;
    for (; i < to && b[i] != 'e' && b[i] != 'E'; i++) {
        if (b[i] == '.') {
            frac = true;
            continue;
        }
        if (!seen && b[i] != '0') {
            seen = true;
            first = i;
        }
        if (seen && !frac)
            e++;     /* integer digits from the first significant one */
        else if (!seen && frac)
            e--;     /* zeros after the point before it */
    }
    mant_end = i;
    if (!seen)
        return false; /* zero */
    if (i < to) {
        bool neg = b[++i] == '-';
        if (b[i] == '-' || b[i] == '+')
            i++;
        for (; i < to; i++)
            if (exp < 1000000000)
                exp = exp * 10 + (b[i] - '0');
        e += neg ? -exp : exp;
    }
    if (e != (int64_t)sizeof jr_dbl_inf - 1)
        return e > (int64_t)sizeof jr_dbl_inf - 1;
    size_t k = 0;
    for (i = first; k < sizeof jr_dbl_inf - 1; k++, i++) {
        while (i < mant_end && b[i] == '.')
            i++;
        int d = i < mant_end ? b[i] : '0';
        if (d != jr_dbl_inf[k])
            return d > jr_dbl_inf[k];
    }
    return true; /* equal to the threshold in its 309 digits: at or above */
}

int jr_number(jr_reader *r, jr_kind *kind, int64_t *value)
{
    if (jr_peek(r) != JR_INTEGER)
        return r->status ? -1 : jr_bad_token(r, r->pos, "a number was expected");
    const uint8_t *b = r->buf;
    size_t at = r->pos, i = at;
    bool neg = i < r->len && b[i] == '-', real = false;
    if (neg)
        i++;
    if (i >= r->len || !jr_digit(b[i]))
        return jr_bad(r, i, "invalid number");
    if (b[i] == '0') {
        i++;
        if (i < r->len && jr_digit(b[i]))
            return jr_bad(r, at, "invalid number (leading zero)");
    } else {
        while (i < r->len && jr_digit(b[i]))
            i++;
    }
    size_t int_end = i;
    if (i < r->len && b[i] == '.') {
        real = true;
        if (++i >= r->len || !jr_digit(b[i]))
            return jr_bad(r, i, "invalid number");
        while (i < r->len && jr_digit(b[i]))
            i++;
    }
    if (i < r->len && (b[i] == 'e' || b[i] == 'E')) {
        real = true;
        if (++i < r->len && (b[i] == '+' || b[i] == '-'))
            i++;
        if (i >= r->len || !jr_digit(b[i]))
            return jr_bad(r, i, "invalid number");
        while (i < r->len && jr_digit(b[i]))
            i++;
    }
    /* the byte after the token is read before the token is judged */
    if (i < r->len && b[i] >= 0x80 && !jr_utf8_len(b + i, b + r->len))
        return jr_error(r, JR_UTF8, i, "invalid UTF-8 byte 0x%02x", b[i]);
    if (real) {
        if (jr_real_overflows(b, at, i))
            return jr_error(r, JR_SYNTAX, at, "real number overflows a double");
        *kind = JR_REAL;
        *value = 0;
    } else {
        uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        for (size_t k = at + neg; k < int_end; k++) {
            unsigned d = (unsigned)(b[k] - '0');
            if (v > (lim - d) / 10)
                return jr_error(r, JR_SYNTAX, at, neg ? "too big negative integer"
                                                      : "too big integer");
            v = v * 10 + d;
        }
        *kind = JR_INTEGER;
        *value = neg ? (int64_t)(0 - v) : (int64_t)v;
    }
    r->pos = i;
    return jr_depth_ok(r, at);
}

/* true, false, null: the whole run of letters must be the word. */
static int jr_literal(jr_reader *r, jr_kind *kind)
{
    size_t at = r->pos, i = at;
    while (i < r->len && jr_alpha(r->buf[i]))
        i++;
    if (i < r->len && r->buf[i] >= 0x80 && !jr_utf8_len(r->buf + i, r->buf + r->len))
        return jr_error(r, JR_UTF8, i, "invalid UTF-8 byte 0x%02x", r->buf[i]);
    size_t n = i - at;
    const char *w = (const char *)r->buf + at;
    if (n == 4 && !memcmp(w, "true", 4))
        *kind = JR_TRUE;
    else if (n == 5 && !memcmp(w, "false", 5))
        *kind = JR_FALSE;
    else if (n == 4 && !memcmp(w, "null", 4))
        *kind = JR_NULL;
    else
        return jr_bad(r, at, "invalid literal");
    r->pos = i;
    return jr_depth_ok(r, at);
}

/* ---- containers -------------------------------------------------------- */

static uint64_t jr_mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

/* FNV-1a from a per-reader seed, mixed. */
static uint64_t jr_hash(uint64_t seed, const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return jr_mix(h);
}

/* An open object's keys are keys[base, nkeys): keys form a stack, a
 * nested object's popped when it closes. A small object is searched
 * linearly; one past JR_LINEAR keys gets its own hash table. */
#define JR_LINEAR 16

static int jr_rehash(jr_reader *r, struct jr_frame *f, size_t n)
{
    uint32_t *s = calloc(n, sizeof *s);
    if (!s)
        return -1;
    for (size_t k = f->base; k < r->nkeys; k++) {
        size_t i = r->keys[k].hash & (n - 1);
        while (s[i])
            i = (i + 1) & (n - 1);
        s[i] = (uint32_t)(k + 1);
    }
    free(f->slots);
    f->slots = s;
    f->mask = n - 1;
    return 0;
}

/* Records key in the innermost object; -1 when it is there already or
 * memory ran out. */
static int jr_add_key(jr_reader *r, const char *key, size_t n, size_t at)
{
    struct jr_frame *f = &r->frames[r->nframes - 1];
    if (n > UINT32_MAX || r->nkeys >= UINT32_MAX - 1)
        return jr_error(r, JR_NOMEM, at, "out of memory");
    if (r->nkeys == r->cap_keys) {
        size_t cap = r->cap_keys ? r->cap_keys * 2 : 64;
        struct jr_key *k = realloc(r->keys, cap * sizeof *k);
        if (!k)
            return jr_error(r, JR_NOMEM, at, "out of memory");
        r->keys = k;
        r->cap_keys = cap;
    }
    size_t count = r->nkeys - f->base;
    uint64_t h = 0;
    if (!f->slots && count < JR_LINEAR) {
        for (size_t k = f->base; k < r->nkeys; k++)
            if (r->keys[k].len == n && !memcmp(r->keys[k].s, key, n))
                return jr_error(r, JR_DUPLICATE, at, "%s", key);
    } else {
        if (!f->slots)
            for (size_t k = f->base; k < r->nkeys; k++)
                r->keys[k].hash = jr_hash(r->seed, r->keys[k].s, r->keys[k].len);
        if ((count + 1) * 2 > (f->slots ? f->mask + 1 : 0) &&
            jr_rehash(r, f, f->slots ? (f->mask + 1) * 2 : 4 * JR_LINEAR))
            return jr_error(r, JR_NOMEM, at, "out of memory");
        h = jr_hash(r->seed, key, n);
        size_t i = h & f->mask;
        for (; f->slots[i]; i = (i + 1) & f->mask) {
            const struct jr_key *o = &r->keys[f->slots[i] - 1];
            if (o->hash == h && o->len == n && !memcmp(o->s, key, n))
                return jr_error(r, JR_DUPLICATE, at, "%s", key);
        }
        f->slots[i] = (uint32_t)(r->nkeys + 1);
    }
    r->keys[r->nkeys++] = (struct jr_key){key, (uint32_t)n, h};
    return 0;
}

int jr_object_begin(jr_reader *r, uint32_t *id)
{
    if (jr_peek(r) != JR_OBJECT)
        return r->status ? -1 : jr_bad_token(r, r->pos, "an object was expected");
    if (jr_depth_ok(r, r->pos))
        return -1;
    if (r->nframes == r->cap_frames) {
        size_t cap = r->cap_frames ? r->cap_frames * 2 : 16;
        struct jr_frame *f = realloc(r->frames, cap * sizeof *f);
        if (!f)
            return jr_error(r, JR_NOMEM, r->pos, "out of memory");
        r->frames = f;
        r->cap_frames = cap;
    }
    r->frames[r->nframes++] = (struct jr_frame){r->nkeys, NULL, 0};
    r->pos++;
    r->depth++;
    *id = (uint32_t)r->nframes;
    return 0;
}

int jr_object_next(jr_reader *r, uint32_t id, const char **key, size_t *klen)
{
    if (r->status || id != r->nframes)
        return r->status ? -1 : jr_error(r, JR_SYNTAX, r->pos, "object read out of turn");
    /* after '{' (and whitespace) a key or '}'; after a member ',' or '}' */
    size_t back = r->pos;
    while (back > 0 && jr_is_ws(r->buf[back - 1]))
        back--;
    bool first = back > 0 && r->buf[back - 1] == '{';
    jr_ws(r);
    int c = jr_byte(r);
    if (c == '}') {
        struct jr_frame *f = &r->frames[--r->nframes];
        free(f->slots);
        r->nkeys = f->base;
        r->pos++;
        r->depth--;
        return 0;
    }
    if (!first) {
        if (c != ',')
            return jr_bad_token(r, r->pos, "',' or '}' was expected");
        r->pos++;
        jr_ws(r);
        c = jr_byte(r);
    }
    if (c != '"')
        return jr_bad_token(r, r->pos, first ? "a string key or '}' was expected"
                                       : "a string key was expected");
    size_t at = r->pos;
    if (jr_string_at(r, key, klen) || jr_add_key(r, *key, *klen, at))
        return -1;
    jr_ws(r);
    if (jr_byte(r) != ':')
        return jr_bad_token(r, r->pos, "':' was expected");
    r->pos++;
    return 1;
}

int jr_array_begin(jr_reader *r)
{
    if (jr_peek(r) != JR_ARRAY)
        return r->status ? -1 : jr_bad_token(r, r->pos, "an array was expected");
    if (jr_depth_ok(r, r->pos))
        return -1;
    r->pos++;
    r->depth++;
    return 0;
}

int jr_array_next(jr_reader *r)
{
    if (r->status)
        return -1;
    size_t back = r->pos;
    jr_ws(r);
    while (back > 0 && jr_is_ws(r->buf[back - 1]))
        back--;
    bool first = back > 0 && r->buf[back - 1] == '[';
    int c = jr_byte(r);
    if (c == ']') {
        r->pos++;
        r->depth--;
        return 0;
    }
    if (first)
        return 1;
    if (c != ',')
        return jr_bad_token(r, r->pos, "',' or ']' was expected");
    r->pos++;
    return 1;
}

int jr_skip(jr_reader *r, jr_kind *kind)
{
    jr_kind k = jr_peek(r), dummy;
    if (!kind)
        kind = &dummy;
    *kind = k;
    int64_t v;
    const char *s;
    size_t n;
    int more;
    switch (k) {
    case JR_NONE:
        return -1;
    case JR_STRING:
        return jr_string(r, &s, &n);
    case JR_INTEGER:
        return jr_number(r, kind, &v);
    case JR_TRUE:
    case JR_FALSE:
    case JR_NULL:
        return jr_literal(r, kind);
    case JR_ARRAY:
        if (jr_array_begin(r))
            return -1;
        while ((more = jr_array_next(r)) == 1)
            if (jr_skip(r, NULL))
                return -1;
        return more;
    default: {
        uint32_t id;
        if (jr_object_begin(r, &id))
            return -1;
        while ((more = jr_object_next(r, id, &s, &n)) == 1)
            if (jr_skip(r, NULL))
                return -1;
        return more;
    }
    }
}

int jr_top(jr_reader *r, jr_kind *kind)
{
    *kind = jr_peek(r);
    if (*kind == JR_OBJECT || *kind == JR_ARRAY || *kind == JR_NONE)
        return *kind == JR_NONE ? -1 : 0;
    size_t at = r->pos;
    if (jr_skip(r, kind)) /* the token is read whole before it is judged */
        return -1;
    return jr_error(r, JR_SYNTAX, at, "'[' or '{' was expected");
}

int jr_finish(jr_reader *r)
{
    if (r->status)
        return -1;
    jr_ws(r);
    return r->pos < r->len ? jr_bad_token(r, r->pos, "end of input was expected") : 0;
}
