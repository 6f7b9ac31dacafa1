/* refit format SDK: the loop of a post_load_many that gathers a call's
 * modules into groups (one launcher call a group). Modules go in call
 * order; each not yet done is skipped, post-loaded by itself, or leads a
 * group that takes it and the later modules of its kind, marking them in
 * done[]. The first failure stops the call. Header-only. */
#ifndef REFIT_SDK_GROUP_H
#define REFIT_SDK_GROUP_H

#include <stdint.h>
#include <string.h>

#include <refit/format.h>

/* What ops->where says of a module no group has taken. */
enum {
    REFIT_SDK_GROUP_SKIP = -1, /* no post-load */
    REFIT_SDK_GROUP_ONE = 0,   /* ops->one */
    REFIT_SDK_GROUP_LEAD = 1,  /* ops->group, the module its lead */
};

typedef struct refit_sdk_group_ops {
    int (*where)(const refit_fmt_module *m, void *arg);
    /* mods[lead] and the later modules of mods[0 .. n) of its group,
     * done[k] nonzero for each one taken (done[lead] too) */
    int (*group)(const refit_host_v2 *h, const refit_fmt_module *const *mods, uint32_t n,
                 uint32_t lead, unsigned char *done, void *stream, void *arg);
    /* m by itself */
    int (*one)(const refit_host_v2 *h, const refit_fmt_module *m, void *stream, void *arg);
} refit_sdk_group_ops;

/* post_load_many through ops, arg passed on (done[]: host->mem_alloc
 * when n > 1). Returns REFIT_OK or the first failure, its message set. */
static inline int refit_sdk_post_load_groups(const refit_host_v2 *h,
                                             const refit_fmt_module *const *mods, uint32_t n,
                                             void *stream, const refit_sdk_group_ops *ops,
                                             void *arg)
{
    unsigned char one = 0, *done = n > 1 ? (unsigned char *)h->mem_alloc(h->host, n) : &one;
    if (!done)
        return h->error(h->host, REFIT_ENOMEM, "module %s: out of memory", mods[0]->name);
    memset(done, 0, n > 1 ? n : 1);
    int rc = REFIT_OK;
    for (uint32_t k = 0; k < n && !rc; k++) {
        int w = done[k] ? REFIT_SDK_GROUP_SKIP : ops->where(mods[k], arg);
        if (w == REFIT_SDK_GROUP_LEAD)
            rc = ops->group(h, mods, n, k, done, stream, arg);
        else if (w == REFIT_SDK_GROUP_ONE)
            rc = ops->one(h, mods[k], stream, arg);
        done[k] = 1;
    }
    if (done != &one)
        h->mem_free(h->host, done);
    return rc;
}

#endif
