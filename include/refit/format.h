/*
 * refit format ABI, version 2: how a format turns a module's checkpoint
 * tensors into its runtime tensors, and the services the host gives it.
 *
 * A format never links a core symbol: everything it needs from the host
 * comes through the refit_host_v2 table it is handed. The host names no
 * format: it copies, zeroes, fetches, describes devices, lends device
 * scratch memory, logs, and runs a plugin's own GPU code (its embedded
 * device code through gpu_load/gpu_kernel/gpu_launch, or a plugin's own
 * CUDA runtime through gpu_run). One struct per ABI version: a later ABI
 * adds refit_host_v3/refit_format_v3 and a symbol refit_format_plugin_v3;
 * within a version members are only appended (REFIT_STRUCT_HAS).
 *
 * Packaging: one shared module per format, refit-fmt-<name>.so, exporting
 * exactly one symbol, REFIT_FORMAT_PLUGIN_SYMBOL, a const refit_format_v2:
 *
 *   REFIT_PLUGIN_EXPORT const refit_format_v2 refit_format_plugin_v2 = {
 *       .abi_version = REFIT_FORMAT_ABI_VERSION,
 *       .struct_size = sizeof(refit_format_v2),
 *       .name = "scale2", .plan = scale2_plan, .post_load = scale2_post_load,
 *   };
 *
 * A plugin built against ABI 1 (it exports refit_format_plugin_v1) is
 * refused with a message saying to rebuild it against this header.
 *
 * Beside it lies <name>.yaml, its declaration (schemas/format.schema.yaml):
 * the loader refuses a plugin whose declaration is missing, invalid, or
 * disagrees with the code (docs/plugins.md says exactly when).
 *
 * Life of a module, as the format sees it:
 *   plan(m)        at seal: set a route for every checkpoint tensor and the
 *                  module flags. May refuse (bad dtype, missing param).
 *   post_load(m)   when every checkpoint tensor of a STAGED module has
 *                  arrived in an update: build the runtime tensors from the
 *                  staged checkpoint bytes, writing in place. Must read only
 *                  the staged views, never runtime bytes (rule 4). With
 *                  REFIT_MODULE_STAGED_IN_PLACE a staged view may be the
 *                  caller's source itself; post_load_many builds several
 *                  modules in one go. With REFIT_MODULE_EXPERT_SLICES, m
 *                  may be one expert's slice of the module (planned too).
 *   release(m)     at model destroy, if plan stored anything in m->state.
 *
 * Arrays the host builds (m->ckpt, m->runtime) carry their element size
 * (ckpt_stride, runtime_stride): index them with refit_ckpt(m, i) and
 * refit_runtime(m, i), never m->ckpt[i], so a plugin built against an
 * older header of this ABI reads each element at its right offset.
 */
#ifndef REFIT_FORMAT_H
#define REFIT_FORMAT_H

#include <stddef.h>

#include <refit/refit.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REFIT_FORMAT_ABI_VERSION 2

/* On a variadic taking a printf format: argument fmt_index is the format,
 * the variadic arguments start at first_arg, so -Wformat checks the
 * arguments of every call (empty on compilers without the attribute). */
#if defined(__GNUC__) || defined(__clang__)
#define REFIT_PRINTF_LIKE(fmt_index, first_arg) \
    __attribute__((format(printf, fmt_index, first_arg)))
#else
#define REFIT_PRINTF_LIKE(fmt_index, first_arg)
#endif

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

/* The quantization group of a STAGED checkpoint tensor whose runtime is
 * quantized from it at post-load: which of its elements share a scale. A
 * delta update (docs/core.md "Delta updates") patches refit's master copy
 * of the tensor and rebuilds only the runtime bytes of the groups it
 * touched; a tensor whose format declares nothing (flags 0) is refused. */
typedef struct refit_quant_group {
    int64_t rows;            /* rows of this rank's 2-D slice quantized
                                together: 128 for 128x128 blocks, 1 for a
                                channel or for groups along K */
    int64_t cols;            /* elements along K sharing a scale (128, 32,
                                16, a group size); 0: the whole row */
    uint32_t flags;          /* REFIT_GROUP_* */
} refit_quant_group;
/* plan set the group (the host starts every tensor at 0: undeclared) */
#define REFIT_GROUP_DECLARED 0x1u
/* A scale spans the whole tensor or more (one scale over fused weights,
 * a global scale beside the block scales): any change rebuilds the whole post-load
 * unit (the module, or its expert's slice) from the master. */
#define REFIT_GROUP_WHOLE 0x2u
/* plan and post_load of a module holding only rows [a, b) of this tensor
 * (a a multiple of rows, b too or the tensor's end; shape, staged view and
 * place narrowed to them; every runtime view as it is) write exactly the
 * runtime bytes and scales of those rows, as the whole post-load does.
 * Without it a change rebuilds the whole post-load unit. */
#define REFIT_GROUP_ROW_SLICES 0x4u
/* With ROW_SLICES: dim 0 of every runtime tensor is this tensor's rows
 * (runtime shapes follow the staged slice), so the host narrows the
 * runtime views to rows [a, b) as well. */
#define REFIT_GROUP_RUNTIME_ROWS 0x8u

/* Checkpoint-tensor flags set by plan. */
#define REFIT_CKPT_CAST 0x1u /* DIRECT: dtype differs from the target's; cast */

/* One checkpoint tensor of a module (elements m->ckpt_stride bytes apart).
 * Every member below is in every ABI 2 host's elements; one appended later
 * says so and is read only when REFIT_ELEM_HAS(m->ckpt_stride,
 * refit_fmt_ckpt, member) (docs/plugins.md, "The rules ..."). */
typedef struct refit_fmt_ckpt {
    const char *name;        /* checkpoint name */
    const char *target;      /* runtime tensor name it maps to (its role:
                                the declaration's first runtime role whose
                                match and dtypes fit that name) */
    int32_t target_index;    /* index into the module's runtime tensors */
    refit_dtype dtype;       /* checkpoint dtype */
    int32_t ndim;
    int64_t shape[REFIT_MAX_DIMS]; /* this rank's slice */
    uint32_t route;          /* OUT (plan): refit_route */
    uint32_t flags;          /* OUT (plan): REFIT_CKPT_* */
    refit_view staged;       /* post_load: the staged bytes (STAGED only):
                                this rank's slice, checkpoint dtype, row-major
                                contiguous, 64-byte aligned (maybe the
                                caller's source: STAGED_IN_PLACE) */
    refit_view place;        /* where a DIRECT copy of this rank's rows would
                                land in the target (STAGED, DIRECT; a VIEW's
                                plan writes it): row `expert`, then
                                dst_offset, rank-local, no pad rows, the
                                target's dtype and strides; zeroed (ndim 0)
                                when the dims do not fit the target */
    /* where this rank's slice sits in the whole tensor, and the placement
     * the model declared, for formats that check block alignment or lay a
     * VIEW at an offset themselves */
    int32_t split_dim;       /* dim the slice is cut along; -1: a scalar */
    int64_t slice_lo;        /* this rank's rows [slice_lo, slice_hi) of */
    int64_t slice_hi;        /*   split_dim, in the whole checkpoint tensor:
                                never an offset in the runtime tensor */
    int64_t full_shape[REFIT_MAX_DIMS]; /* the whole (unsharded) tensor */
    int64_t expert;          /* index into a stacked target's dim 0, or -1 */
    int64_t dst_offset[REFIT_MAX_DIMS]; /* offset in the target as this rank
                                holds it, per checkpoint dim (after the
                                expert dim of a stacked target) */
    /* appended in ABI 2: write it only when REFIT_ELEM_HAS(m->ckpt_stride,
     * refit_fmt_ckpt, group); the host zeroes it before plan */
    refit_quant_group group; /* OUT (plan), STAGED online weights: which
                                elements a change requantizes together
                                (a delta update needs it) */
} refit_fmt_ckpt;

/* One runtime tensor (elements m->runtime_stride bytes apart). */
typedef struct refit_fmt_runtime {
    const char *name;
    refit_view view;         /* the whole runtime tensor */
} refit_fmt_runtime;

/* Module flags set by plan. */
#define REFIT_MODULE_WHOLE 0x1u      /* must be delivered whole when touched */
#define REFIT_MODULE_POST_LOAD 0x2u  /* has a post_load step */
/* post_load only reads its staged views, never writes them: the host may
 * then point a staged view at the caller's source bytes instead of a
 * staged copy (a whole contiguous source, of the staged dtype, on the
 * staging's device, delivered in the call that completes the module; the
 * post-load's work runs on the caller's stream within that call, so the
 * source is read before anything the caller queues after it). */
#define REFIT_MODULE_STAGED_IN_PLACE 0x4u
/* post_load of expert e reads only the staged tensors placed at expert e
 * and writes only row e of dim 0 of each runtime tensor (no group, scale
 * or amax crosses experts): the host may then stage and post-load the
 * module one expert at a time. When every checkpoint tensor has an expert
 * and every runtime tensor's dim 0 is the experts, plan is called once
 * more per expert on that slice (its checkpoint tensors, the runtime views
 * narrowed to [e, e+1) of dim 0; it must route them as the whole module's
 * plan did) and post_load gets the slice once its tensors are all here.
 * Otherwise the module is staged whole. */
#define REFIT_MODULE_EXPERT_SLICES 0x8u
/* The module's runtime tensors hold state a snapshot cannot carry (a
 * device pointer or handle written into them, memory laid out for one
 * process): refit_snapshot_write refuses the model, naming the module, so
 * it is never restored wrong (docs/restart.md). */
#define REFIT_MODULE_NO_SNAPSHOT 0x10u

typedef struct refit_fmt_module {
    const char *name;
    uint32_t n_ckpt;
    uint32_t ckpt_stride;    /* bytes from one checkpoint element to the next */
    refit_fmt_ckpt *ckpt;    /* read through refit_ckpt(m, i) */
    uint32_t n_runtime;
    uint32_t runtime_stride; /* bytes from one runtime element to the next */
    refit_fmt_runtime *runtime; /* read through refit_runtime(m, i); one no
                                checkpoint tensor targets is allowed under
                                REFIT_MODULE_POST_LOAD (seal refuses it
                                otherwise) and is saved for rollback before
                                the post-load like the rest */
    uint32_t flags;          /* OUT (plan): REFIT_MODULE_* */
    void *state;             /* the format's, from plan to release */
    const void *params;      /* opaque; read through host->param */
} refit_fmt_module;

/* Element i of m's checkpoint tensors / runtime tensors, at the stride the
 * host built them with (members past the plugin's header are not seen;
 * members past the host's are not there: check the stride covers a member
 * with REFIT_ELEM_HAS before reading one appended later). */
static inline refit_fmt_ckpt *refit_ckpt(const refit_fmt_module *m, uint32_t i)
{
    return (refit_fmt_ckpt *)(void *)((char *)m->ckpt + (size_t)i * m->ckpt_stride);
}
static inline refit_fmt_runtime *refit_runtime(const refit_fmt_module *m, uint32_t i)
{
    return (refit_fmt_runtime *)(void *)((char *)m->runtime + (size_t)i * m->runtime_stride);
}
/* 1 when elements stride bytes long hold member of type. */
#define REFIT_ELEM_HAS(stride, type, member)                                  \
    ((size_t)(stride) >= offsetof(type, member) + sizeof(((type *)0)->member))

/* What the host knows of a device (host->device_info). */
typedef struct refit_device_info {
    uint32_t struct_size;    /* IN: sizeof(refit_device_info) of the caller */
    refit_device device;
    int32_t served;          /* 1 when a backend of this build serves it */
    int32_t host_access;     /* 1 when the CPU may read and write its bytes
                                directly (CPU, pinned): reference kernels
                                may then run on views of it */
    int32_t cc_major, cc_minor; /* compute capability of a CUDA device the
                                backend serves; 0.0 for host memory */
    const char *backend;     /* "host", "cuda" ...; NULL when not served.
                                Static storage. */
    int32_t multiprocessors; /* streaming multiprocessors of a CUDA device
                                (grid sizing); 0 otherwise. Check
                                REFIT_ELEM_HAS(struct_size, ...) first. */
} refit_device_info;

/* A launch of a plugin's own kernel (host->gpu_launch). */
typedef struct refit_gpu_launch {
    uint32_t struct_size;    /* sizeof(refit_gpu_launch) of the caller */
    uint32_t grid[3];        /* blocks; 0 is read as 1 */
    uint32_t block[3];       /* threads per block; 0 is read as 1 */
    uint32_t shared_bytes;   /* dynamic shared memory */
    void **args;             /* one pointer per kernel parameter, as
                                cudaLaunchKernel takes them */
} refit_gpu_launch;

/* The device status word of a module's post-load (host->status_word). */
#define REFIT_STATUS_NONE 0xffffffffu
/* The key of host->status_word_at: a piece index above, an element index
 * (flat, row-major in the piece; past REFIT_STATUS_AT_ELEMENT_MAX it reads
 * as that) below, so atomicMin keeps the first piece and its first bad
 * element. REFIT_STATUS_AT evaluates element twice. */
#define REFIT_STATUS_AT_NONE 0xffffffffffffffffull
#define REFIT_STATUS_AT_ELEMENT_BITS 40
#define REFIT_STATUS_AT_ELEMENT_MAX ((1ull << REFIT_STATUS_AT_ELEMENT_BITS) - 1)
#define REFIT_STATUS_AT(piece, element)                                       \
    (((unsigned long long)(piece) << REFIT_STATUS_AT_ELEMENT_BITS) |          \
     ((unsigned long long)(element) < REFIT_STATUS_AT_ELEMENT_MAX             \
          ? (unsigned long long)(element)                                     \
          : REFIT_STATUS_AT_ELEMENT_MAX))
#define REFIT_STATUS_AT_PIECE(key) ((unsigned long long)(key) >> REFIT_STATUS_AT_ELEMENT_BITS)
#define REFIT_STATUS_AT_ELEMENT(key) ((unsigned long long)(key) & REFIT_STATUS_AT_ELEMENT_MAX)

/* Services the host hands to a format. Every service may be called from
 * plan, post_load and release, on the thread that called into refit. A
 * view handed to copy, zero or fetch during post_load must lie inside the
 * module's own runtime tensors or staged bytes (or the scratch memory it
 * was lent): anything else is refused with REFIT_EINVAL, naming the view. */
typedef struct refit_host_v2 {
    uint32_t abi_version;    /* REFIT_FORMAT_ABI_VERSION */
    uint32_t struct_size;    /* sizeof(refit_host_v2) of the host */
    void *host;              /* opaque, passed back to every service */
    /* valid from ABI 2 */
    /* Record the message of the current call's failure (printf format) and
     * return status unchanged, so `return host->error(...)` reads well.
     * Never blocks; the message is copied. */
    int (*error)(void *host, int status, const char *fmt, ...) REFIT_PRINTF_LIKE(3, 4);
    /* Log a line (level 0 error, 1 warning, 2 info, 3 debug) through the
     * embedder's log_fn (or stderr). Never blocks long; the text is copied. */
    void (*log)(void *host, int level, const char *fmt, ...) REFIT_PRINTF_LIKE(3, 4);
    /* Value of a module parameter, or NULL when absent. Never blocks. The
     * string is owned by the host, valid while the model lives. */
    const char *(*param)(void *host, const refit_fmt_module *m, const char *key);
    /* Host memory from the host's allocator (for m->state); NULL when none
     * is left. Free with mem_free (NULL is ok). Never blocks long. */
    void *(*mem_alloc)(void *host, size_t size);
    void (*mem_free)(void *host, void *p);
    /* Short name of a dtype ("bf16", "f8_e4m3"; "?" when unknown), for
     * messages. Static storage; never blocks. */
    const char *(*dtype_name)(void *host, refit_dtype dt);
    /* Copy src into dst (same shape), casting between float dtypes with
     * round-to-nearest-even, on dst's device, ordered on stream: it may
     * return before the copy is done. Returns REFIT_OK, REFIT_EMISMATCH
     * (shapes), REFIT_EUNSUPPORTED (dtypes, device), REFIT_EINVAL (a view
     * outside the module's memory); the message is set. */
    int (*copy)(void *host, const refit_view *dst, const refit_view *src, void *stream);
    /* Zero every element of dst, on its device, ordered on stream like
     * copy. Returns REFIT_OK, REFIT_EINVAL or REFIT_EUNSUPPORTED. */
    int (*zero)(void *host, const refit_view *dst, void *stream);
    /* Copy `bytes` bytes of src (a contiguous view in host memory or on a
     * device a backend serves) into host memory at dst, after everything
     * queued on stream, and wait for it: for the few values a post-load
     * must check on the host. Returns REFIT_OK, REFIT_EINVAL (bytes past
     * the view, not contiguous, outside the module), REFIT_EUNSUPPORTED (no
     * backend), or the device's failure; the message is set. */
    int (*fetch)(void *host, void *dst, size_t bytes, const refit_view *src, void *stream);
    /* Describe dev into *out (out->struct_size set by the caller; members
     * beyond it are left alone): served, host access, backend, and for a
     * CUDA device its compute capability. Never blocks. Returns REFIT_OK
     * (also for a device no backend serves: out->served says so) or
     * REFIT_EINVAL. */
    int (*device_info)(void *host, refit_device dev, refit_device_info *out);
    /* `bytes` of scratch memory on dev (host memory for CPU and pinned
     * devices), 256-byte aligned, lent for the current update: the host
     * frees it when the update ends, after its last wait, so work a
     * post-load enqueues on it needs no wait of its own. NULL when none is
     * left or dev is not served (the message is set). */
    void *(*scratch)(void *host, refit_device dev, size_t bytes);
    /* The GPU service: a plugin's own device code. gpu_load takes an image
     * the plugin embeds (a fatbin, cubin or PTX, e.g. from nvcc --fatbin)
     * and loads it once per context (the same image pointer again returns
     * the same module; unloaded at refit_close). gpu_kernel finds an
     * extern "C" __global__ function of it by name. gpu_launch makes dev
     * current and launches the kernel on stream after every copy the host
     * queued there, without waiting. Each returns REFIT_OK,
     * REFIT_EUNSUPPORTED (a build or machine without CUDA; an image with no
     * code for this device: the message names its compute capability),
     * REFIT_ENOTFOUND (gpu_kernel: no such kernel), REFIT_EINVAL or
     * REFIT_EINTERNAL; the message is set. */
    int (*gpu_load)(void *host, const void *image, size_t size, void **module);
    int (*gpu_kernel)(void *host, void *module, const char *name, void **kernel);
    int (*gpu_launch)(void *host, refit_device dev, void *kernel, const refit_gpu_launch *l,
                      void *stream);
    /* For a plugin that links its own CUDA runtime: run fn(arg, stream)
     * with dev current, ordered after every copy the host queued on
     * stream, under the host's device lock. fn returns a refit status. */
    int (*gpu_run)(void *host, refit_device dev, void *stream,
                   int (*fn)(void *arg, void *stream), void *arg);
    /* A device status word for module m's post-load on dev, set to
     * REFIT_STATUS_NONE on stream before anything the post-load enqueues
     * after this call; its kernels lower it (atomicMin) to the index of
     * the first bad piece. The post-load then need not wait: the host
     * reads every module's word once, at finalize, and fails the update
     * (rolled back) naming the module and names[word] with `what` ("NaN or
     * infinity in the weight"). names (n strings) and what are copied. One
     * word per module and update; a second call returns the same word.
     * Returns REFIT_OK, REFIT_EUNSUPPORTED (dev is not a CUDA device the
     * host serves), REFIT_ENOMEM; the message is set. */
    int (*status_word)(void *host, const refit_fmt_module *m, refit_device dev, uint32_t n,
                       const char *const *names, const char *what, void *stream,
                       uint32_t **word);
    /* appended in ABI 2 (check REFIT_HOST_HAS first) */
    /* A status word for one post_load_many call on dev: its kernels lower
     * it to the index of the first bad piece, and piece p is tensor
     * names[p] of module mods[p] (n pieces; each module one of the call's).
     * At finalize the host fails the update naming mods[word]'s module and
     * names[word] with `what`, as for status_word. Set on stream before
     * anything enqueued after this call; names and what are copied. A new
     * word at each call. Returns REFIT_OK, REFIT_EINVAL (a module not of
     * the call), REFIT_EUNSUPPORTED or REFIT_ENOMEM; the message is set. */
    int (*status_word_many)(void *host, refit_device dev, uint32_t n,
                            const refit_fmt_module *const *mods, const char *const *names,
                            const char *what, void *stream, uint32_t **word);
    /* appended in ABI 2 (check REFIT_HOST_HAS first) */
    /* status_word with the element: a 64-bit key, REFIT_STATUS_AT_NONE
     * until its kernels lower it (atomicMin) to REFIT_STATUS_AT(piece,
     * element); at finalize the host fails the update naming module m,
     * names[piece] and the element ("module M, tensor T, element E:
     * what"). One per module and update, as status_word's (a module takes
     * one kind: the other then returns REFIT_EINVAL). Returns as
     * status_word. */
    int (*status_word_at)(void *host, const refit_fmt_module *m, refit_device dev, uint32_t n,
                          const char *const *names, const char *what, void *stream,
                          unsigned long long **key);
} refit_host_v2;

/* 1 when struct *s (abi_version/struct_size first) holds member. */
#define REFIT_STRUCT_HAS(s, type, member)                                     \
    ((size_t)(s)->struct_size >= offsetof(type, member) + sizeof(((type *)0)->member))
#define REFIT_HOST_HAS(h, member) REFIT_STRUCT_HAS(h, refit_host_v2, member)
/* The smallest host table and format struct of ABI 2: a struct_size below
 * it is refused. */
#define REFIT_HOST_V2_MIN_SIZE (offsetof(refit_host_v2, status_word) + sizeof(void (*)(void)))
#define REFIT_FORMAT_V2_MIN_SIZE (offsetof(refit_format_v2, release) + sizeof(void (*)(void)))

/* 1 when a backend of the host serves dev (host->device_info says so): a
 * plugin asks before it hands views on dev to a host service. Inline, so
 * plugins still link nothing of the core. */
static inline int refit_host_serves(const refit_host_v2 *h, refit_device dev)
{
    refit_device_info di = {0};
    di.struct_size = sizeof di;
    return h->device_info(h->host, dev, &di) == REFIT_OK && di.served;
}

typedef struct refit_format_v2 {
    uint32_t abi_version;    /* REFIT_FORMAT_ABI_VERSION */
    uint32_t struct_size;    /* sizeof(refit_format_v2) */
    /* valid from ABI 2 */
    const char *name;        /* "unquantized", "scale2" ...; static storage; a
                                plugin's name is its file's <name> */
    /* Plan one module at seal. Must not block (no device work, no I/O).
     * Reads m (checkpoint names, dtypes, shapes; runtime views; params
     * through host->param; devices through host->device_info); writes only
     * each checkpoint element's route, flags and place (VIEW), m->flags
     * and m->state (memory from host->mem_alloc, freed in release). Must
     * set a route for every checkpoint tensor. (A format whose kernels need
     * a newer compute capability says so in min_compute_capability, below:
     * the host then refuses for it.) Returns REFIT_OK, or
     * REFIT_EFORMAT/EMISMATCH/EUNSUPPORTED/ENOMEM with a message from
     * host->error naming module and tensor (without one, the host names
     * the plugin and module); on failure release is still called when
     * m->state is set. The routes are checked against the plugin's
     * declaration afterwards: a tensor's role is the first of its list
     * whose match (fnmatch of the checkpoint or runtime name) and dtypes
     * fit; kernels' reads/writes name checkpoint/runtime roles, unchecked
     * against the plan. */
    int (*plan)(const refit_host_v2 *host, refit_fmt_module *m);
    /* Build the runtime tensors of a complete STAGED module from its staged
     * checkpoint bytes, writing in place into its runtime views. Reads no
     * runtime byte (rule 4), so running it twice on the same checkpoint
     * gives the same bytes. May enqueue work on stream and return before
     * it is done: the host keeps the staged bytes and scratch until the
     * update's last wait, and reads the module's status word (if it took
     * one) at finalize. Returns REFIT_OK or an error set through
     * host->error. REFIT_ECORRUPT (bad data: a NaN, a value out of range;
     * the message names module and tensor) is held like a lowered status
     * word: the load goes on and the update fails at finalize (the first
     * failure in post-load order). Any other error fails the load at once.
     * NULL when the format declares no post-load step. */
    int (*post_load)(const refit_host_v2 *host, const refit_fmt_module *m, void *stream);
    /* Free m->state (at model destroy, or when seal fails). Never fails,
     * never blocks on a device. NULL when plan keeps no state. */
    void (*release)(const refit_host_v2 *host, refit_fmt_module *m);
    /* appended in ABI 2 (read it through REFIT_STRUCT_HAS) */
    /* The least compute capability the plugin's device code runs on, as
     * major * 10 + minor (89: sm_89, 100: sm_100); 0 when any will do.
     * The host refuses a module whose plan asks for a post-load step when
     * one of its runtime tensors is on a device of a lower compute
     * capability (host->device_info), at seal, with REFIT_EUNSUPPORTED and
     * a message naming the format, the module and both capabilities. Host
     * memory (capability 0.0) runs the CPU reference: never refused. */
    uint32_t min_compute_capability;
    /* appended in ABI 2 (read it through REFIT_STRUCT_HAS) */
    /* post_load of n complete STAGED modules of this format at once, on
     * one stream, in the order given: the same bytes as post_load on each
     * in that order, in as few launches as the format can make (one table
     * over every module's pieces). The host calls it for the modules that
     * one loading call (refit_load_many, a source set) completes; views
     * handed to host services may lie in any of the n modules' memory.
     * Errors as post_load's: REFIT_ECORRUPT (the message names module and
     * tensor) is held until finalize; anything else fails the load. One
     * failure a call: where it stops is the format's (refit/sdk/group.h
     * stops at the first), where post_load for each goes on past an
     * ECORRUPT module. NULL: the host calls post_load for each. Needs
     * post_load too. */
    int (*post_load_many)(const refit_host_v2 *host, const refit_fmt_module *const *m,
                          uint32_t n, void *stream);
    /* appended in ABI 2 (read it through REFIT_STRUCT_HAS) */
    /* The plugin's version ("1.2"; static storage), part of a snapshot's
     * plan signature: refit_restore refuses a snapshot taken under another
     * version. Change it whenever the runtime bytes a checkpoint gives may
     * change. NULL: none declared (the plugin file's digest still counts). */
    const char *version;
} refit_format_v2;

/* The one symbol a plugin exports: a const refit_format_v2. The loader
 * looks up the newest ABI it knows first; an older symbol it finds alone
 * (REFIT_FORMAT_PLUGIN_SYMBOL_V1) is refused with a rebuild message. */
#define REFIT_FORMAT_PLUGIN_SYMBOL "refit_format_plugin_v2"
#define REFIT_FORMAT_PLUGIN_SYMBOL_V1 "refit_format_plugin_v1"

/* Put on the exported struct: plugins build with hidden visibility, so
 * this is the only symbol they export. */
#if defined(__GNUC__) || defined(__clang__)
#define REFIT_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define REFIT_PLUGIN_EXPORT
#endif

/* Make a format available to modules of ctx's model (before seal). The
 * struct must outlive ctx. Formats found in plugin directories are
 * registered the same way at refit_open; an in-process registration
 * replaces a plugin of the same name that no module uses yet (the plugin
 * is then reported shadowed). Refuses a bad version or size, or a name
 * already taken (REFIT_EFORMAT, REFIT_EEXIST). */
REFIT_API int refit_format_register(refit_ctx *ctx, const refit_format_v2 *fmt);

#define REFIT_FORMAT_V2_INIT {REFIT_FORMAT_ABI_VERSION, sizeof(refit_format_v2), \
                              NULL, NULL, NULL, NULL, 0, NULL, NULL}

#ifdef __cplusplus
}
#endif
#endif /* REFIT_FORMAT_H */
