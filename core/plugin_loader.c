/* The format plugin loader (see plugin_loader.h and docs/plugins.md).
 *
 * A plugin is code refit runs inside an inference worker, so every check
 * that can be made before dlopen (which runs the plugin's constructors) is
 * made first: the file's owner and mode, its directory's mode, its
 * declaration. Then one dlopen (RTLD_NOW | RTLD_LOCAL: unresolved symbols
 * fail here, not mid-update; nothing it defines leaks into other plugins),
 * one dlsym, and the checks of the exported struct against the ABI and
 * against the declaration. Every refusal names the file and the reason. */
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "core/plugin_loader.h"
#include "schemas/plugin_paths.h"

#define PLUGIN_PREFIX "refit-fmt-"
#define PLUGIN_SUFFIX ".so"
#define WHY_SIZE 768

static void ps_log(const plugin_set *ps, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void ps_log(const plugin_set *ps, int level, const char *fmt, ...)
{
    if (!ps->log)
        return;
    char line[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    ps->log(ps->log_user, level, "%s", line);
}

/* ---- the search path ---- */

static int add_dir(plugin_set *ps, const char *path, size_t len, const char *origin)
{
    if (len == 0)
        return REFIT_OK;
    char *given = strndup(path, len);
    if (!given)
        return REFIT_ENOMEM;
    char *real = realpath(given, NULL);
    char *use = real ? real : given;
    for (size_t i = 0; i < ps->n_dirs; i++)
        if (!strcmp(ps->dirs[i].path, use)) { /* named twice: search it once */
            free(given);
            free(real);
            return REFIT_OK;
        }
    plugin_dir *nd = realloc(ps->dirs, (ps->n_dirs + 1) * sizeof *nd);
    if (!nd) {
        free(given);
        free(real);
        return REFIT_ENOMEM;
    }
    ps->dirs = nd;
    ps->dirs[ps->n_dirs++] = (plugin_dir){.path = use, .origin = origin, .missing = !real};
    if (real)
        free(given);
    return REFIT_OK;
}

static int add_dir_list(plugin_set *ps, const char *list, const char *origin)
{
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        int rc = add_dir(ps, p, len, origin);
        if (rc)
            return rc;
        p += len + (end ? 1 : 0);
    }
    return REFIT_OK;
}

/* True when this code (the shared library, or an executable linking the
 * library statically) lies under the build tree it was built in: only then
 * are the build's uninstalled plugins trusted. */
static int running_from_build_tree(void)
{
    Dl_info info;
    if (!dladdr((void *)running_from_build_tree, &info) || !info.dli_fname)
        return 0;
    char *self = realpath(info.dli_fname, NULL);
    char *root = realpath(REFIT_BUILD_ROOT, NULL);
    size_t n = root ? strlen(root) : 0;
    int inside = self && root && !strncmp(self, root, n) && self[n] == '/';
    free(self);
    free(root);
    return inside;
}

static int build_path(plugin_set *ps, const char *named, unsigned flags)
{
    int rc = add_dir_list(ps, named, "plugin_dirs");
    if (rc || (flags & PLUGINS_ONLY_NAMED))
        return rc;
    rc = add_dir_list(ps, getenv("REFIT_PLUGIN_PATH"), "REFIT_PLUGIN_PATH");
    if (!rc)
        rc = add_dir(ps, REFIT_PLUGIN_INSTALL_DIR, strlen(REFIT_PLUGIN_INSTALL_DIR), "install");
    if (!rc && running_from_build_tree())
        rc = add_dir(ps, REFIT_PLUGIN_BUILD_DIR, strlen(REFIT_PLUGIN_BUILD_DIR), "build");
    return rc;
}

/* ---- entries ---- */

static plugin_entry *new_entry(plugin_set *ps, const char *dir, const char *file)
{
    if (ps->n == ps->cap) {
        size_t nc = ps->cap ? ps->cap * 2 : 8;
        plugin_entry *p = realloc(ps->e, nc * sizeof *p);
        if (!p)
            return NULL;
        ps->e = p;
        ps->cap = nc;
    }
    plugin_entry *e = &ps->e[ps->n];
    memset(e, 0, sizeof *e);
    e->fd = -1;
    size_t len = strlen(file) - strlen(PLUGIN_PREFIX) - strlen(PLUGIN_SUFFIX);
    e->name = strndup(file + strlen(PLUGIN_PREFIX), len);
    if (e->name && asprintf(&e->path, "%s/%s", dir, file) < 0)
        e->path = NULL;
    if (!e->name || !e->path) {
        free(e->name);
        return NULL;
    }
    ps->n++;
    return e;
}

static int set_reason(plugin_entry *e, plugin_state st, const char *why)
{
    e->state = st;
    e->reason = strdup(why);
    return e->reason ? REFIT_OK : REFIT_ENOMEM;
}

static void entry_free(plugin_entry *e)
{
    if (e->dl)
        dlclose(e->dl);
    if (e->fd >= 0)
        close(e->fd);
    fdecl_free(e->decl);
    free(e->path);
    free(e->real);
    free(e->name);
    free(e->reason);
    free(e->decl_path);
    memset(e, 0, sizeof *e);
}

/* ---- vetting the files ---- */

/* The rules for anything refit will execute or trust: a regular file owned
 * by this user or root, writable by no one else. Each refusal says the fix
 * (the command on path). */
static int vet_stat(const struct stat *st, const char *what, const char *path, char *why,
                    size_t n)
{
    uid_t me = geteuid();
    if (!S_ISREG(st->st_mode))
        snprintf(why, n, "%s is not a regular file: put the file itself at %s", what, path);
    else if (st->st_uid != me && st->st_uid != 0)
        snprintf(why, n, "%s is owned by uid %u, not by this user (uid %u) or root: chown %u %s "
                 "(or install it as root)", what, (unsigned)st->st_uid, (unsigned)me,
                 (unsigned)me, path);
    else if (st->st_mode & (S_IWGRP | S_IWOTH))
        snprintf(why, n, "%s is writable by %s (mode %04o): chmod go-w %s", what,
                 (st->st_mode & S_IWOTH) ? "others" : "its group",
                 (unsigned)(st->st_mode & 07777), path);
    else
        return REFIT_OK;
    return REFIT_EFORMAT;
}

/* Anyone who can write a directory can swap the file in it. */
static int vet_dir_of(const char *file, char *why, size_t n)
{
    char *dir = strdup(file);
    if (!dir)
        return REFIT_ENOMEM;
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = '\0';
    struct stat st;
    int rc = REFIT_OK;
    if (stat(slash ? dir : ".", &st) != 0) {
        snprintf(why, n, "cannot stat its directory %s: %s", dir, strerror(errno));
        rc = REFIT_EFORMAT;
    } else if (st.st_mode & S_IWOTH) {
        snprintf(why, n, "its directory %s is writable by others (mode %04o): chmod o-w %s",
                 dir, (unsigned)(st.st_mode & 07777), dir);
        rc = REFIT_EFORMAT;
    }
    free(dir);
    return rc;
}

/* Resolve, open and check the shared module; *fd stays open: dlopen loads
 * this descriptor, the file checked, whatever the path names later. */
static int vet_module(plugin_entry *e, int *fd, struct stat *st, char *why, size_t n)
{
    e->real = realpath(e->path, NULL);
    if (!e->real) {
        if (errno == ENOENT)
            snprintf(why, n, "missing file (a dangling symbolic link?)");
        else if (errno == ENOMEM)
            return REFIT_ENOMEM;
        else
            snprintf(why, n, "cannot resolve the path: %s", strerror(errno));
        return REFIT_EFORMAT;
    }
    /* O_NONBLOCK: a FIFO in the module's place is refused (vet_stat), not waited on */
    *fd = open(e->real, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (*fd < 0) {
        snprintf(why, n, errno == ENOENT ? "missing file" : "cannot open: %s", strerror(errno));
        return REFIT_EFORMAT;
    }
    if (fstat(*fd, st) != 0) {
        snprintf(why, n, "cannot stat: %s", strerror(errno));
        return REFIT_EFORMAT;
    }
    int rc = vet_stat(st, "the file", e->real, why, n);
    if (!rc)
        rc = vet_dir_of(e->real, why, n);
    if (!rc && strcmp(e->real, e->path))
        rc = vet_dir_of(e->path, why, n); /* the directory it was found in, too */
    return rc;
}

/* <name>.yaml beside the module (in the directory it was found in). */
static int vet_decl(plugin_entry *e, const char *dir, char *why, size_t n)
{
    if (asprintf(&e->decl_path, "%s/%s.yaml", dir, e->name) < 0) {
        e->decl_path = NULL;
        return REFIT_ENOMEM;
    }
    struct stat st;
    if (stat(e->decl_path, &st) != 0) {
        if (errno == ENOENT)
            snprintf(why, n, "its declaration %s is missing: install the plugin's %s.yaml "
                     "beside it", e->decl_path, e->name);
        else
            snprintf(why, n, "cannot stat its declaration %s: %s", e->decl_path,
                     strerror(errno));
        return REFIT_EFORMAT;
    }
    char what[64];
    snprintf(what, sizeof what, "its declaration %s.yaml", e->name);
    int rc = vet_stat(&st, what, e->decl_path, why, n);
    if (rc)
        return rc;
    sdiags d = {.max = 8};
    rc = fdecl_load_file(&e->decl, e->decl_path, &d);
    if (rc == REFIT_ENOMEM || (rc == REFIT_OK && d.oom)) {
        sdiags_free(&d);
        return REFIT_ENOMEM;
    }
    if (rc) {
        size_t more = sdiags_count(&d) - 1;
        snprintf(why, n, "invalid declaration: %s%s", sdiags_first(&d),
                 more ? " (and more: refitctl validate shows all)" : "");
        rc = REFIT_EFORMAT;
    }
    sdiags_free(&d);
    return rc;
}

/* ---- loading ---- */

/* The file (device, inode) mapped at addr, from /proc/self/maps; 0 when
 * not found. */
static int mapped_file(const void *addr, dev_t *dev, ino_t *ino)
{
    FILE *f = fopen("/proc/self/maps", "re");
    char line[512];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi, inode;
        unsigned maj, mnr;
        if (sscanf(line, "%lx-%lx %*s %*x %x:%x %lu", &lo, &hi, &maj, &mnr, &inode) == 5 &&
            (uintptr_t)addr >= lo && (uintptr_t)addr < hi) {
            *dev = makedev(maj, mnr);
            *ino = (ino_t)inode;
            found = 1;
        }
    }
    if (f)
        fclose(f);
    return found;
}

/* A /proc/self/fd name for fd that no loaded object of another file
 * holds: glibc finds an object by the name it was loaded under (and every
 * name it was found under since) before it looks at any file, and that
 * name's descriptor may since have been closed and its number reused. An
 * object of this very file (another context loaded it) is fine: dlopen
 * returns it. It is recognized by its mapping's device and inode, or, where
 * the kernel shows another (an overlay's backing file), by coming back
 * under two names. Duplicates made on the way go to dups (closed by the
 * caller after dlopen). -1 when none was found in LOAD_NAME_TRIES. */
#define LOAD_NAME_TRIES 16
static int free_fd_name(int fd, const struct stat *st, int *dups, int *n_dups, char *name,
                        size_t len)
{
    void *prev = NULL;
    for (int cur = fd;;) {
        snprintf(name, len, "/proc/self/fd/%d", cur);
        void *old = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        struct link_map *lm = NULL;
        dev_t dev = 0;
        ino_t ino = 0;
        int same = !old || old == prev ||
                   (dlinfo(old, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_ld &&
                    mapped_file(lm->l_ld, &dev, &ino) && dev == st->st_dev && ino == st->st_ino);
        if (old)
            dlclose(old); /* still mapped: found, not loaded, so a pointer to compare */
        prev = old;
        if (same)
            return cur;
        if (*n_dups == LOAD_NAME_TRIES || (cur = fcntl(fd, F_DUPFD_CLOEXEC, cur + 1)) < 0)
            return -1;
        dups[(*n_dups)++] = cur;
    }
}

/* dlopen of the descriptor that was vetted, by a /proc/self/fd name, not
 * of the path: whoever can write the directory can rename another file in
 * between, and dlopen runs constructors before any check after it could
 * refuse. Takes fd: the descriptor the name is of stays open while the
 * plugin is loaded (e->fd; entry_unload closes it after dlclose), the
 * others are closed. */
static int load_module(plugin_entry *e, int fd, const struct stat *st, char *why, size_t n)
{
    char by_fd[64];
    int dups[LOAD_NAME_TRIES], n_dups = 0, rc = REFIT_OK;
    int use = free_fd_name(fd, st, dups, &n_dups, by_fd, sizeof by_fd);
    dlerror();
    if (use < 0) {
        snprintf(why, n, "no /proc/self/fd name free of other loaded objects to load it by");
        rc = REFIT_EFORMAT;
    } else if (!(e->dl = dlopen(by_fd, RTLD_NOW | RTLD_LOCAL))) {
        const char *err = dlerror();
        if (access(by_fd, F_OK) != 0)
            snprintf(why, n, "cannot load the vetted file by %s (is /proc mounted?): %s",
                     by_fd, err ? err : "unknown error");
        else if (err && strstr(err, "cannot open shared object file"))
            snprintf(why, n, "a library it needs is missing: %s (ldd %s names it: install it, "
                     "or put its folder on LD_LIBRARY_PATH or in the plugin's RUNPATH)", err,
                     e->real);
        else
            snprintf(why, n, "dlopen failed: %s", err ? err : "unknown error");
        rc = REFIT_EFORMAT;
    } else {
        e->fd = use;
    }
    for (int i = 0; i < n_dups; i++)
        if (dups[i] != e->fd)
            close(dups[i]);
    if (fd != e->fd)
        close(fd);
    return rc;
}

/* The newest symbol this loader knows, and the ABI checks that must pass
 * before any member beyond abi_version/struct_size is read. A plugin that
 * exports only an older ABI's symbol was built against an older header:
 * say what to rebuild it against. */
static int check_symbol(plugin_entry *e, char *why, size_t n)
{
    dlerror();
    const refit_format_v2 *f = dlsym(e->dl, REFIT_FORMAT_PLUGIN_SYMBOL);
    const char *dl_err = dlerror();
    char err_buf[256];
    const char *err = dl_err ? (snprintf(err_buf, sizeof err_buf, "%s", dl_err), err_buf) : NULL;
    if (!f) { /* (the copy: the next dlsym frees dlerror's string) */
        if (dlsym(e->dl, REFIT_FORMAT_PLUGIN_SYMBOL_V1)) {
            snprintf(why, n, "built against format ABI 1 (it exports %s): rebuild it against "
                     "refit's <refit/format.h>, format ABI %d (refit_format_v2, exported as "
                     "%s; pkg-config refit-format)", REFIT_FORMAT_PLUGIN_SYMBOL_V1,
                     REFIT_FORMAT_ABI_VERSION, REFIT_FORMAT_PLUGIN_SYMBOL);
            return REFIT_EFORMAT;
        }
        snprintf(why, n, "does not export %s%s%s (export it: REFIT_PLUGIN_EXPORT const "
                 "refit_format_v2 %s = {...}; refit/format.h)", REFIT_FORMAT_PLUGIN_SYMBOL,
                 err ? ": " : "", err ? err : "", REFIT_FORMAT_PLUGIN_SYMBOL);
        return REFIT_EFORMAT;
    }
    if (f->abi_version != REFIT_FORMAT_ABI_VERSION) {
        snprintf(why, n, "invalid version %u in %s (this refit knows format ABI %d): set "
                 "abi_version = REFIT_FORMAT_ABI_VERSION and rebuild against this refit's "
                 "refit/format.h", f->abi_version, REFIT_FORMAT_PLUGIN_SYMBOL,
                 REFIT_FORMAT_ABI_VERSION);
        return REFIT_EFORMAT;
    }
    if (f->struct_size < REFIT_FORMAT_V2_MIN_SIZE) {
        snprintf(why, n, "struct_size %u is smaller than ABI %u's %zu bytes: set struct_size "
                 "= sizeof(refit_format_v2) and rebuild against this refit's refit/format.h",
                 f->struct_size, f->abi_version, (size_t)REFIT_FORMAT_V2_MIN_SIZE);
        return REFIT_EFORMAT;
    }
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (dladdr1(f, &info, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_size &&
        sym->st_size < f->struct_size) {
        snprintf(why, n, "struct_size says %u bytes but %s is %zu bytes", f->struct_size,
                 REFIT_FORMAT_PLUGIN_SYMBOL, (size_t)sym->st_size);
        return REFIT_EFORMAT;
    }
    e->fmt = f;
    return REFIT_OK;
}

/* The struct against its file name and its declaration. */
static int check_struct(plugin_entry *e, char *why, size_t n)
{
    const refit_format_v2 *f = e->fmt;
    const fdecl *d = e->decl;
    if (!f->name || !f->plan)
        snprintf(why, n, "the format has no %s", f->name ? "plan function" : "name");
    else if (strcmp(f->name, e->name))
        snprintf(why, n, "exports format '%s' but the file is named for '%s': name the file "
                 "refit-fmt-%s.so", f->name, e->name, f->name);
    else if (strcmp(d->name, f->name))
        snprintf(why, n, "its declaration names format '%s', the plugin '%s': set name: %s in "
                 "%s", d->name, f->name, f->name, e->decl_path);
    else if (d->abi != (int64_t)f->abi_version)
        snprintf(why, n, "its declaration says ABI %lld, the plugin %u: set abi: %u in %s",
                 (long long)d->abi, f->abi_version, f->abi_version, e->decl_path);
    else if (d->n_kernels && !f->post_load)
        snprintf(why, n, "its declaration lists post-load kernels (%s, line %u) but the plugin "
                 "has no post_load function", d->kernels[0].name, d->kernels[0].at.line);
    else if (REFIT_STRUCT_HAS(f, refit_format_v2, post_load_many) && f->post_load_many &&
             !f->post_load)
        snprintf(why, n, "the plugin has post_load_many but no post_load (a module completed "
                 "alone needs it)");
    else if (!d->n_kernels && f->post_load)
        snprintf(why, n, "the plugin has a post_load function but its declaration lists no "
                 "post-load kernel");
    else
        return REFIT_OK;
    return REFIT_EFORMAT;
}

static int consider(plugin_set *ps, const plugin_dir *dir, const char *file)
{
    plugin_entry *e = new_entry(ps, dir->path, file);
    if (!e)
        return REFIT_ENOMEM;
    for (size_t i = 0; i + 1 < ps->n; i++)
        if (ps->e[i].state == PLUGIN_LOADED && !strcmp(ps->e[i].name, e->name)) {
            ps_log(ps, 1, "plugin %s is shadowed by %s (the first found wins)", e->path,
                   ps->e[i].path);
            return set_reason(e, PLUGIN_SHADOWED, ps->e[i].path);
        }
    char why[WHY_SIZE] = "";
    struct stat st;
    int fd = -1;
    int rc = vet_module(e, &fd, &st, why, sizeof why);
    if (!rc)
        rc = vet_decl(e, dir->path, why, sizeof why);
    if (!rc)
        rc = load_module(e, fd, &st, why, sizeof why); /* takes fd */
    else if (fd >= 0)
        close(fd);
    if (!rc)
        rc = check_symbol(e, why, sizeof why);
    if (!rc)
        rc = check_struct(e, why, sizeof why);
    if (rc == REFIT_ENOMEM)
        return rc;
    if (rc) {
        ps_log(ps, 1, "plugin %s refused: %s", e->path, why);
        plugins_refuse(ps, e, why);
        return e->reason ? REFIT_OK : REFIT_ENOMEM;
    }
    ps_log(ps, 2, "format %s loaded from %s (ABI %u, declaration %s)", e->name, e->real,
           e->fmt->abi_version, e->decl_path);
    return REFIT_OK;
}

static void entry_unload(plugin_entry *e, plugin_state st, const char *why)
{
    if (e->dl)
        dlclose(e->dl);
    e->dl = NULL;
    if (e->fd >= 0)
        close(e->fd);
    e->fd = -1;
    e->fmt = NULL;
    fdecl_free(e->decl);
    e->decl = NULL;
    free(e->reason);
    set_reason(e, st, why);
}

void plugins_refuse(plugin_set *ps, plugin_entry *e, const char *why)
{
    (void)ps;
    entry_unload(e, PLUGIN_REFUSED, why);
}

void plugins_set_aside(plugin_set *ps, plugin_entry *e, const char *why)
{
    (void)ps;
    entry_unload(e, PLUGIN_SHADOWED, why);
}

/* A file that looks like a plugin: refit-fmt-<something>.so. */
static int plugin_file(const char *f)
{
    size_t n = strlen(f), p = strlen(PLUGIN_PREFIX), s = strlen(PLUGIN_SUFFIX);
    return n > p + s && !strncmp(f, PLUGIN_PREFIX, p) && !strcmp(f + n - s, PLUGIN_SUFFIX);
}

static int valid_name(const char *f)
{
    size_t n = strlen(f) - strlen(PLUGIN_SUFFIX);
    const char *p = f + strlen(PLUGIN_PREFIX);
    if (*p < 'a' || *p > 'z')
        return 0;
    for (; p < f + n; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'))
            return 0;
    return 1;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Plugin file names of a directory, sorted so the order is the same on
 * every worker. */
static int list_dir(plugin_dir *d, char ***out, size_t *count)
{
    *out = NULL;
    *count = 0;
    DIR *dh = opendir(d->path);
    if (!dh) {
        d->missing = 1;
        return REFIT_OK;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = REFIT_OK;
    for (struct dirent *de; (de = readdir(dh)) != NULL && !rc;) {
        if (!plugin_file(de->d_name))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            char **p = realloc(names, cap * sizeof *p);
            if (!p) {
                rc = REFIT_ENOMEM;
                break;
            }
            names = p;
        }
        if (!(names[n] = strdup(de->d_name)))
            rc = REFIT_ENOMEM;
        else
            n++;
    }
    closedir(dh);
    if (n)
        qsort(names, n, sizeof *names, cmp_str);
    *out = names;
    *count = n;
    return rc;
}

static int scan_dir(plugin_set *ps, plugin_dir *d)
{
    char **files;
    size_t n;
    int rc = list_dir(d, &files, &n);
    for (size_t i = 0; i < n && !rc; i++) {
        if (valid_name(files[i])) {
            rc = consider(ps, d, files[i]);
            continue;
        }
        static const char bad_name[] = "the name between refit-fmt- and .so is not a "
                                       "lowercase identifier ([a-z][a-z0-9_]*): rename the "
                                       "file refit-fmt-<name>.so after the format's name";
        plugin_entry *e = new_entry(ps, d->path, files[i]);
        rc = e ? set_reason(e, PLUGIN_REFUSED, bad_name) : REFIT_ENOMEM;
        if (e)
            ps_log(ps, 1, "plugin %s refused: %s", e->path, bad_name);
    }
    for (size_t i = 0; i < n; i++)
        free(files[i]);
    free(files);
    if (d->missing)
        ps_log(ps, strcmp(d->origin, "plugin_dirs") ? 3 : 1,
               "plugin directory %s (%s) is missing", d->path, d->origin);
    return rc;
}

int plugins_open(plugin_set **out, const char *named, unsigned flags, plugin_log_fn log,
                 void *log_user)
{
    *out = NULL;
    plugin_set *ps = calloc(1, sizeof *ps);
    if (!ps)
        return REFIT_ENOMEM;
    ps->log = log;
    ps->log_user = log_user;
    int rc = build_path(ps, named, flags);
    for (size_t i = 0; i < ps->n_dirs && !rc; i++)
        rc = scan_dir(ps, &ps->dirs[i]);
    if (rc) {
        plugins_close_set(ps);
        return rc;
    }
    *out = ps;
    return REFIT_OK;
}

void plugins_close_set(plugin_set *ps)
{
    if (!ps)
        return;
    for (size_t i = 0; i < ps->n; i++)
        entry_free(&ps->e[i]);
    for (size_t i = 0; i < ps->n_dirs; i++)
        free(ps->dirs[i].path);
    free(ps->e);
    free(ps->dirs);
    free(ps);
}

const plugin_entry *plugins_entry_of(const plugin_set *ps, const refit_format_v2 *fmt)
{
    for (size_t i = 0; ps && fmt && i < ps->n; i++)
        if (ps->e[i].state == PLUGIN_LOADED && ps->e[i].fmt == fmt)
            return &ps->e[i];
    return NULL;
}

size_t plugins_count(const plugin_set *ps, plugin_state st)
{
    size_t n = 0;
    for (size_t i = 0; ps && i < ps->n; i++)
        n += ps->e[i].state == st;
    return n;
}

void plugins_describe_path(const plugin_set *ps, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; ps && i < ps->n_dirs && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s (%s%s)", i ? ", " : "",
                                 ps->dirs[i].path, ps->dirs[i].origin,
                                 ps->dirs[i].missing ? ", missing" : "");
    if (!ps || ps->n_dirs == 0)
        snprintf(buf, n, "no directory");
}

/* ---- the plan against the declaration ---- */

/* Where a plan disagrees with the declaration, in the order a reader
 * would check: each checkpoint tensor's role and route, the post-load
 * step, the delivery rule of non-idempotent kernels, the runtime dtypes. */
static int check_ckpt(const plugin_entry *pe, const refit_fmt_module *fm,
                      const refit_fmt_ckpt *c, char *why, size_t n)
{
    const fdecl *d = pe->decl;
    const fdecl_ckpt_role *role = fdecl_ckpt_role_for(d, c->name, c->dtype);
    char routes[40];
    if (!role) {
        snprintf(why, n, "plugin %s (%s): module %s, tensor %s (%s) matches no checkpoint "
                 "role of its declaration %s", pe->name, pe->real, fm->name, c->name,
                 refit_dtype_name(c->dtype), pe->decl_path);
        return REFIT_EFORMAT;
    }
    if (c->route > REFIT_ROUTE_STAGED || !(role->routes & FDECL_ROUTE_BIT(c->route))) {
        snprintf(why, n, "plugin %s (%s): module %s, tensor %s: plan() chose route %s, but "
                 "its declaration %s:%u lists %s for checkpoint role '%s'", pe->name, pe->real,
                 fm->name, c->name, fdecl_route_name(c->route), pe->decl_path, role->at.line,
                 fdecl_routes_text(role->routes, routes, sizeof routes), role->role);
        return REFIT_EFORMAT;
    }
    return REFIT_OK;
}

static int check_post_load(const plugin_entry *pe, const refit_fmt_module *fm,
                           const char *staged, char *why, size_t n)
{
    const fdecl *d = pe->decl;
    int post = (fm->flags & REFIT_MODULE_POST_LOAD) != 0;
    if (staged && !post)
        snprintf(why, n, "plugin %s (%s): module %s, tensor %s: plan() staged it but asked "
                 "for no post-load step, so its bytes would never reach a runtime tensor",
                 pe->name, pe->real, fm->name, staged);
    else if (post && d->n_kernels == 0)
        snprintf(why, n, "plugin %s (%s): module %s: plan() asks for a post-load step, but "
                 "its declaration %s lists no post-load kernel", pe->name, pe->real, fm->name,
                 pe->decl_path);
    else if (post && d->non_idempotent && !(fm->flags & REFIT_MODULE_WHOLE))
        snprintf(why, n, "plugin %s (%s): module %s: its declaration %s has a non-idempotent "
                 "post-load kernel, but plan() did not require the module to be delivered "
                 "whole (REFIT_MODULE_WHOLE)", pe->name, pe->real, fm->name, pe->decl_path);
    else
        return REFIT_OK;
    return REFIT_EFORMAT;
}

int plugins_check_module(const plugin_entry *pe, const refit_fmt_module *fm, char *why,
                         size_t n)
{
    const char *staged = NULL;
    for (uint32_t i = 0; i < fm->n_ckpt; i++) {
        int rc = check_ckpt(pe, fm, &fm->ckpt[i], why, n);
        if (rc)
            return rc;
        if (fm->ckpt[i].route == REFIT_ROUTE_STAGED && !staged)
            staged = fm->ckpt[i].name;
    }
    int rc = check_post_load(pe, fm, staged, why, n);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < fm->n_runtime; i++) {
        const refit_fmt_runtime *r = &fm->runtime[i];
        if (!fdecl_rt_role_for(pe->decl, r->name, r->view.dtype)) {
            snprintf(why, n, "plugin %s (%s): module %s, runtime tensor %s (%s) matches no "
                     "runtime role of its declaration %s", pe->name, pe->real, fm->name,
                     r->name, refit_dtype_name(r->view.dtype), pe->decl_path);
            return REFIT_EFORMAT;
        }
    }
    return REFIT_OK;
}
