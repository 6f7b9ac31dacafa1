/* Helpers of the plugin, schema and manifest suites: private temporary
 * directories, staging plugins with their declarations into them, and the
 * paths meson passes in the environment. */
#ifndef REFIT_TESTS_PLUGINS_PUTIL_H
#define REFIT_TESTS_PLUGINS_PUTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <sys/types.h>

#include <cmocka.h>

#include <refit/format.h>
#include <refit/refit.h>

/* An environment variable meson sets; fails the test when it is not. */
const char *pt_env(const char *name);
/* A fresh directory (mode 0700) under $TMPDIR or /tmp; free with pt_rmtree. */
char *pt_tmpdir(void);
/* Remove dir and what is in it (one level), then free the string. */
void pt_rmtree(char *dir);
/* Copy a file, then chmod it. */
void pt_copy(const char *src, const char *dst, mode_t mode);
/* Write text to path, then chmod it. */
void pt_write(const char *path, const char *text, mode_t mode);
/* dir/name into a static buffer (one at a time). */
const char *pt_path(const char *dir, const char *name);
/* Copy the test plugin refit-fmt-NAME.so into dir (mode 0755) and write its
 * declaration NAME.yaml there (0644) from yaml, in which every "@NAME@" is
 * replaced by name; yaml NULL writes no declaration. */
void pt_stage_fake(const char *dir, const char *name, const char *yaml);
/* Copy a built format plugin (refit-fmt-NAME.so and NAME.yaml) into dir. */
void pt_stage_built(const char *dir, const char *name);
/* printf into a static buffer (one at a time). */
const char *pt_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Fail with the context's message when rc is not want. */
#define PT_RC(ctx, call, want)                                                 \
    do {                                                                       \
        int pt_rc_ = (call);                                                   \
        if (pt_rc_ != (want))                                                  \
            fail_msg("%s = %s, want %s: %s", #call, refit_status_name(pt_rc_), \
                     refit_status_name(want), refit_errmsg(ctx));              \
    } while (0)
/* Fail unless haystack contains needle. */
#define PT_HAS(haystack, needle)                                                \
    do {                                                                        \
        const char *pt_h_ = (haystack);                                         \
        if (!pt_h_ || !strstr(pt_h_, (needle)))                                 \
            fail_msg("message \"%s\" lacks \"%s\"", pt_h_ ? pt_h_ : "(null)", (needle)); \
    } while (0)

/* A declaration that fits the fake plugins' DIRECT plan. */
extern const char *const PT_DECL_DIRECT;
/* One for their STAGED identity plan (one idempotent kernel). */
extern const char *const PT_DECL_STAGED;

#endif
