/* A string -> index table (open addressing, linear probing). Keys are
 * borrowed: the caller keeps them alive as long as the table. */
#ifndef REFIT_CORE_NAMES_H
#define REFIT_CORE_NAMES_H

#include <stddef.h>
#include <stdint.h>

typedef struct names_slot {
    const char *key;            /* NULL: empty */
    uint64_t hash;
    uint32_t value;
} names_slot;

typedef struct names {
    names_slot *slots;
    size_t cap;                 /* power of two, or 0 */
    size_t count;
} names;

#define NAMES_NONE UINT32_MAX

uint64_t names_hash(const char *s);
/* Insert key -> value. REFIT_EEXIST when key is present (value unchanged). */
int names_insert(names *t, const char *key, uint32_t value);
/* Value of key, or NAMES_NONE. */
uint32_t names_find(const names *t, const char *key);
void names_free(names *t);

#endif
