#include <stdlib.h>
#include <string.h>

#include <refit/refit.h>

#include "core/names.h"

/* Names are long and alike ("model.layers.17.mlp.experts.203.w2.weight"):
 * hash 8 bytes a step, each word multiplied in, then a final mix. */
static uint64_t names_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t names_hash(const char *s)
{
    size_t n = strlen(s);
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    for (; n >= 8; n -= 8, s += 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    return names_mix(h ^ w);
}

static names_slot *probe(const names *t, const char *key, uint64_t h)
{
    size_t mask = t->cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        names_slot *s = &t->slots[i];
        if (!s->key || (s->hash == h && !strcmp(s->key, key)))
            return s;
    }
}

static int names_grow(names *t)
{
    size_t cap = t->cap ? t->cap * 2 : 64;
    names_slot *old = t->slots;
    size_t old_cap = t->cap;
    t->slots = calloc(cap, sizeof *t->slots);
    if (!t->slots) {
        t->slots = old;
        return REFIT_ENOMEM;
    }
    t->cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].key)
            *probe(t, old[i].key, old[i].hash) = old[i];
    free(old);
    return REFIT_OK;
}

int names_insert(names *t, const char *key, uint32_t value)
{
    if ((t->count + 1) * 2 > t->cap) {
        int rc = names_grow(t);
        if (rc)
            return rc;
    }
    uint64_t h = names_hash(key);
    names_slot *s = probe(t, key, h);
    if (s->key)
        return REFIT_EEXIST;
    s->key = key;
    s->hash = h;
    s->value = value;
    t->count++;
    return REFIT_OK;
}

uint32_t names_find(const names *t, const char *key)
{
    if (!t->cap)
        return NAMES_NONE;
    names_slot *s = probe(t, key, names_hash(key));
    return s->key ? s->value : NAMES_NONE;
}

void names_free(names *t)
{
    free(t->slots);
    memset(t, 0, sizeof *t);
}
