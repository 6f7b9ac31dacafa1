/* The format plugin loader: find refit-fmt-<name>.so files on the search
 * path, vet them (owner, permissions, ABI, declaration) and dlopen them.
 * Everything it found, loaded, refused or found shadowed is kept for
 * messages and `refitctl formats`. docs/plugins.md is the user's view. */
#ifndef REFIT_CORE_PLUGIN_LOADER_H
#define REFIT_CORE_PLUGIN_LOADER_H

#include <stdarg.h>
#include <stddef.h>

#include <refit/format.h>

#include "schemas/format_decl.h"

typedef enum plugin_state {
    PLUGIN_LOADED = 0,
    PLUGIN_REFUSED = 1,         /* reason says why */
    PLUGIN_SHADOWED = 2,        /* a plugin of the same name was found first */
} plugin_state;

typedef struct plugin_entry {
    char *path;                 /* as found on the search path */
    char *real;                 /* resolved path (what was opened), or NULL */
    char *name;                 /* <name> of refit-fmt-<name>.so */
    plugin_state state;
    char *reason;               /* REFUSED: why; SHADOWED: by which file */
    void *dl;                   /* LOADED: the dlopen handle */
    int fd;                     /* LOADED: the vetted file, loaded by its
                                   /proc/self/fd name; -1 otherwise */
    const refit_format_v2 *fmt; /* LOADED: the exported struct */
    fdecl *decl;                /* LOADED: its declaration */
    char *decl_path;
} plugin_entry;

typedef struct plugin_dir {
    char *path;
    const char *origin;         /* "plugin_dirs", "REFIT_PLUGIN_PATH", "install", "build" */
    int missing;                /* not a readable directory */
} plugin_dir;

/* Log sink: level 0 error, 1 warning, 2 info, 3 debug. */
typedef void (*plugin_log_fn)(void *user, int level, const char *fmt, ...);

typedef struct plugin_set {
    plugin_dir *dirs;
    size_t n_dirs;
    plugin_entry *e;
    size_t n, cap;
    plugin_log_fn log;
    void *log_user;
} plugin_set;

/* Search only the directories named, not $REFIT_PLUGIN_PATH, the install
 * dir or the build dir (tests and `refitctl formats --only`). */
#define PLUGINS_ONLY_NAMED 0x1u

/* Build the search path (named dirs, ':'-separated, may be NULL; then
 * $REFIT_PLUGIN_PATH; the install dir; the build dir when this code runs
 * from the build tree), then find and vet every plugin. Refusals are
 * recorded, not returned: only REFIT_ENOMEM fails. */
int plugins_open(plugin_set **out, const char *named_dirs, unsigned flags, plugin_log_fn log,
                 void *log_user);
/* dlclose every loaded plugin and free the set. NULL is ok. */
void plugins_close_set(plugin_set *ps);

/* The entry whose format struct is fmt, or NULL (not from a plugin). */
const plugin_entry *plugins_entry_of(const plugin_set *ps, const refit_format_v2 *fmt);
/* "dir1 (plugin_dirs), dir2 (install, missing), ..." for messages. */
void plugins_describe_path(const plugin_set *ps, char *buf, size_t n);
/* Count of entries in a state. */
size_t plugins_count(const plugin_set *ps, plugin_state st);
/* Mark a loaded entry refused after the fact (registration failed) and
 * close it. */
void plugins_refuse(plugin_set *ps, plugin_entry *e, const char *why);
/* Mark a loaded entry shadowed (why: by what) and close it. */
void plugins_set_aside(plugin_set *ps, plugin_entry *e, const char *why);

/* Cross-check one module's plan against its plugin's declaration, after
 * plan() ran (docs/plugins.md "disagreement"). Writes the reason into why
 * and returns REFIT_EFORMAT on disagreement. */
int plugins_check_module(const plugin_entry *pe, const refit_fmt_module *fm, char *why,
                         size_t n);

#endif
