/* MX post-load on a CUDA device (plugins/mxfp8/mx_device.c, linked into
 * mxfp8 and mxfp4 with MX's device image): mx_launch (mx_launch.h) of n
 * pieces, of one module or of several (a post_load_many), through the
 * host's GPU service in one launcher call: piece i is tensor names[i] of
 * module mods[i], and one status word names the first bad one at
 * finalize (the module's own word when every piece is one module's, the
 * host's status_word_many otherwise). MXFP8 encodes E4M3 by the hardware
 * conversion where fp8_cvt_host found it exact. Never waits (but for that
 * once-per-device check). Returns REFIT_OK or the failure, its message
 * set through host->error naming the module. */
#ifndef REFIT_PLUGINS_MX_DEVICE_H
#define REFIT_PLUGINS_MX_DEVICE_H

#include <refit/format.h>

/* 1 when this plugin carries MX's device code. */
int mx_device_code(void);

int mx_device_quant(const refit_host_v2 *h, const refit_fmt_module *const *mods, uint32_t n,
                    const refit_view *q, const refit_view *sc, const refit_view *x,
                    const char *const *names, int elem_bits, void *stream);

/* The pieces of one launcher call, across modules: piece i writes q[i]
 * and sc[i] from x[i], and is tensor names[i] of module mods[i]. text:
 * room for the names a format composes (mx_call_name). */
typedef struct mx_call {
    uint32_t n, cap;
    refit_view *q, *sc, *x;
    const char **names;
    const refit_fmt_module **mods;
    char *text;
    size_t text_used, text_cap;
} mx_call;

/* Piece i of c, its name copied into c's text as printf(fmt, name, arg)
 * (fmt takes a string and a long long); NULL when the text is full. */
const char *mx_call_name(mx_call *c, const char *fmt, const char *name, long long arg);

/* How a format's modules take part in mx_post_load_many. */
typedef struct mx_ops {
    int elem_bits; /* 8 MXFP8, 4 MXFP4 */
    /* 1: m's post-load runs on device *dev; 0: the CPU reference (host
     * memory); -1: m has none (not online) */
    int (*where)(const refit_fmt_module *m, refit_device *dev);
    /* m's pieces and the text bytes their names need */
    uint32_t (*count)(const refit_fmt_module *m, size_t *text);
    /* m's pieces appended to c (as many as count said) */
    int (*add)(const refit_host_v2 *h, const refit_fmt_module *m, mx_call *c);
    /* the CPU reference on m (host memory; done on return) */
    int (*host)(const refit_host_v2 *h, const refit_fmt_module *m);
} mx_ops;

/* post_load_many of an MX format: modules in call order; those on a
 * device in one launcher call per device (every piece of theirs, one
 * status word), the rest by the CPU reference one by one (a failure
 * there stops the call: its status and message). The same bytes as each
 * module's post-load in that order. */
int mx_post_load_many(const refit_host_v2 *h, const refit_fmt_module *const *mods, uint32_t n,
                      void *stream, const mx_ops *ops);

#endif
