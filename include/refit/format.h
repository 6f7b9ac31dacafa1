/*
 * refit format ABI, version 1: how a format turns a module's checkpoint
 * tensors into its runtime tensors.
 *
 * A format never links a core symbol: everything it needs from the host
 * comes through the refit_host_v1 table it is handed. Structs here are
 * versioned: abi_version/struct_size first, members only appended, each
 * group under a "valid from ABI N" comment.
 *
 * Life of a module, as the format sees it:
 *   plan(m)        at seal: set a route for every checkpoint tensor and the
 *                  module flags. May refuse (bad dtype, missing param).
 *   post_load(m)   when every checkpoint tensor of a STAGED module has
 *                  arrived in an update: build the runtime tensors from the
 *                  staged checkpoint bytes, writing in place. Must read only
 *                  m->ckpt[i].staged, never runtime bytes (rule 4).
 *   release(m)     at model destroy, if plan stored anything in m->state.
 */
#ifndef REFIT_FORMAT_H
#define REFIT_FORMAT_H

#include <refit/refit.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REFIT_FORMAT_ABI_VERSION 1

/* Routes of a checkpoint tensor. */
typedef enum refit_route {
    REFIT_ROUTE_NONE = 0,
    REFIT_ROUTE_DIRECT = 1, /* straight into its place in the target */
    REFIT_ROUTE_VIEW = 2,   /* into a checkpoint-layout view of runtime storage */
    REFIT_ROUTE_STAGED = 3, /* into staging; post_load builds the runtime */
} refit_route;

/* A strided view of memory the format may read or write. */
typedef struct refit_view {
    void *data;             /* first element */
    refit_device device;
    refit_dtype dtype;
    int32_t ndim;
    int64_t shape[REFIT_MAX_DIMS];
    int64_t strides[REFIT_MAX_DIMS]; /* in elements */
} refit_view;

/* Checkpoint-tensor flags set by plan. */
#define REFIT_CKPT_CAST 0x1u /* DIRECT: dtype differs from the target's; cast */

/* One checkpoint tensor of a module. */
typedef struct refit_fmt_ckpt {
    const char *name;        /* checkpoint name */
    const char *target;      /* runtime tensor name it maps to */
    int32_t target_index;    /* index into the module's runtime[] */
    refit_dtype dtype;       /* checkpoint dtype */
    int32_t ndim;
    int64_t shape[REFIT_MAX_DIMS]; /* this rank's slice */
    uint32_t route;          /* OUT (plan): refit_route */
    uint32_t flags;          /* OUT (plan): REFIT_CKPT_* */
    refit_view staged;       /* post_load: the staged bytes (STAGED only) */
    refit_view place;        /* where a DIRECT copy would land in the target */
} refit_fmt_ckpt;

typedef struct refit_fmt_runtime {
    const char *name;
    refit_view view;         /* the whole runtime tensor */
} refit_fmt_runtime;

/* Module flags set by plan. */
#define REFIT_MODULE_WHOLE 0x1u      /* must be delivered whole when touched */
#define REFIT_MODULE_POST_LOAD 0x2u  /* has a post_load step */

typedef struct refit_fmt_module {
    const char *name;
    uint32_t n_ckpt;
    refit_fmt_ckpt *ckpt;
    uint32_t n_runtime;
    refit_fmt_runtime *runtime;
    uint32_t flags;          /* OUT (plan): REFIT_MODULE_* */
    void *state;             /* the format's, from plan to release */
    const void *params;      /* opaque; read through host->param */
} refit_fmt_module;

/* Services the host hands to a format. */
typedef struct refit_host_v1 {
    uint32_t abi_version;
    uint32_t struct_size;
    void *host;              /* opaque, passed back to every service */
    /* valid from ABI 1 */
    /* Record an error message for the current call; returns status. */
    int (*error)(void *host, int status, const char *fmt, ...);
    /* Log a line (level 0 error .. 3 debug). Never blocks long. */
    void (*log)(void *host, int level, const char *fmt, ...);
    /* Value of a module parameter, or NULL when absent. Owned by the host,
     * valid while the model lives. */
    const char *(*param)(void *host, const refit_fmt_module *m, const char *key);
    /* Memory from the host's allocator (for m->state); free with mem_free. */
    void *(*mem_alloc)(void *host, size_t size);
    void (*mem_free)(void *host, void *p);
    /* Copy src into dst (same shape), casting between float dtypes with
     * round-to-nearest-even, on the module's device, ordered on stream. */
    int (*copy)(void *host, const refit_view *dst, const refit_view *src,
                void *stream);
} refit_host_v1;

typedef struct refit_format_v1 {
    uint32_t abi_version;    /* REFIT_FORMAT_ABI_VERSION */
    uint32_t struct_size;    /* sizeof(refit_format_v1) */
    /* valid from ABI 1 */
    const char *name;        /* "unquantized", "fp8" ... */
    /* Plan one module at seal. May not block; returns REFIT_OK or an error
     * set through host->error (naming the tensor). Must set route for every
     * checkpoint tensor. */
    int (*plan)(const refit_host_v1 *host, refit_fmt_module *m);
    /* Build the runtime tensors of a complete STAGED module from staged
     * bytes. Ordered on stream; NULL for formats without STAGED routes. */
    int (*post_load)(const refit_host_v1 *host, const refit_fmt_module *m,
                     void *stream);
    /* Free m->state; NULL when plan keeps none. */
    void (*release)(const refit_host_v1 *host, refit_fmt_module *m);
} refit_format_v1;

/* Make a format available to modules of ctx's model (before seal). The
 * struct must outlive ctx. Formats found in plugin directories are
 * registered the same way. Refuses a bad version or size, or a name
 * already taken. */
int refit_format_register(refit_ctx *ctx, const refit_format_v1 *fmt);

#define REFIT_FORMAT_V1_INIT {REFIT_FORMAT_ABI_VERSION, sizeof(refit_format_v1), \
                              NULL, NULL, NULL, NULL}

#ifdef __cplusplus
}
#endif
#endif /* REFIT_FORMAT_H */
