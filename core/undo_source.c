/* Undo sources: the model's list, the choice at begin, the fingerprint
 * check after a restore (core/undo_source.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/undo_source.h"
#include "core/ctx.h"
#include "core/model.h"
#include "core/util.h"

int undo_source_init(undo_source *s, refit_model *m, const undo_source_ops *ops,
                     const char *uri, const uint64_t *fp)
{
    memset(s, 0, sizeof *s);
    s->ops = ops;
    s->n_modules = m->n_modules;
    s->uri = xstrdup(uri);
    s->fp = malloc((m->n_modules + 1) * sizeof *s->fp);
    if (!s->uri || !s->fp) {
        free(s->uri);
        free(s->fp);
        return ctx_error(m->ctx, REFIT_ENOMEM, "undo source %s: out of memory", uri);
    }
    if (fp) {
        memcpy(s->fp, fp, m->n_modules * sizeof *s->fp);
        return REFIT_OK;
    }
    for (uint32_t i = 0; i < m->n_modules; i++) {
        int rc = module_fingerprint(m, &m->modules[i], &s->fp[i]);
        if (rc) {
            free(s->uri);
            free(s->fp);
            return ctx_error(m->ctx, rc, "undo source %s: fingerprint of module %s failed: %s",
                             uri, m->modules[i].name, refit_strerror(rc));
        }
    }
    return REFIT_OK;
}

static void source_free(undo_source *s)
{
    s->ops->release(s);
    free(s->uri);
    free(s->fp);
    free(s);
}

void undo_sources_drop(refit_model *m, const char *kind)
{
    for (undo_source **pp = &m->undo_sources; *pp;) {
        undo_source *s = *pp;
        if (kind && strcmp(s->ops->kind, kind)) {
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        source_free(s);
    }
}

void undo_source_arm(refit_model *m, undo_source *s)
{
    undo_sources_drop(m, s->ops->kind);
    s->next = m->undo_sources;
    m->undo_sources = s;
}

static undo_source *find_mode(refit_model *m, int mode)
{
    for (undo_source *s = m->undo_sources; s; s = s->next)
        if (s->ops->mode == mode)
            return s;
    return NULL;
}

/* Whether s can serve now; reason says why not. */
static bool can_serve(refit_model *m, undo_source *s, char *reason, size_t n)
{
    if (s->n_modules != m->n_modules) {
        snprintf(reason, n, "it was armed for another module count");
        return false;
    }
    return s->ops->check(s, reason, n) == REFIT_OK;
}

/* Auto's order: the previous update's files first (what a cold start of
 * that version reads), then a snapshot, then any other kind armed (a
 * keeper), in the order armed. */
static int auto_rank(const undo_source *s)
{
    return s->ops->mode == REFIT_UNDO_FILES ? 0 : s->ops->mode == REFIT_UNDO_SNAPSHOT ? 1 : 2;
}

int undo_source_pick(refit_model *m, int mode, undo_source **out, char *why, size_t n)
{
    *out = NULL;
    why[0] = '\0';
    if (mode == REFIT_UNDO_LOG || mode == REFIT_UNDO_OFF)
        return REFIT_OK;
    char reason[512];
    if (mode != REFIT_UNDO_AUTO) {
        undo_source *s = find_mode(m, mode);
        if (s && can_serve(m, s, reason, sizeof reason)) {
            *out = s;
            return REFIT_OK;
        }
        const char *kind = mode == REFIT_UNDO_FILES ? "files"
                         : mode == REFIT_UNDO_SNAPSHOT ? "snapshot"
                         : s ? s->ops->kind : "?";
        return ctx_error(m->ctx, REFIT_EUNSUPPORTED, "begin: undo source %s asked for "
                         "(refit_update_opts.undo_source), but %s%s%s; nothing written", kind,
                         s ? reason : "none holds the committed version", s ? ": " : "",
                         s ? s->uri : "");
    }
    for (int rank = 0; rank < 3; rank++)
        for (undo_source *s = m->undo_sources; s; s = s->next) {
            if (auto_rank(s) != rank)
                continue;
            if (can_serve(m, s, reason, sizeof reason)) {
                *out = s;
                return REFIT_OK;
            }
            if (!why[0]) /* the first passed over, for the journal */
                snprintf(why, n, "%s %s: %s", s->ops->kind, s->uri, reason);
        }
    return REFIT_OK;
}

int undo_source_verify(refit_model *m, const undo_source *s, const uint32_t *modules, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        const module *mod = &m->modules[modules[i]];
        uint64_t fp;
        int rc = module_fingerprint(m, mod, &fp);
        if (rc)
            return ctx_error(m->ctx, rc, "undo source %s: fingerprint of module %s failed: %s",
                             s->uri, mod->name, refit_strerror(rc));
        if (fp != s->fp[modules[i]])
            return ctx_error(m->ctx, REFIT_ECORRUPT, "undo source %s: module %s fingerprints "
                             "to %016llx after the restore, the committed version to %016llx "
                             "(the source's bytes changed since the commit)", s->uri, mod->name,
                             (unsigned long long)fp, (unsigned long long)s->fp[modules[i]]);
    }
    return REFIT_OK;
}

void undo_sources_committed(refit_model *m, refit_source *files)
{
    undo_sources_drop(m, NULL);
    if (files && undo_source_files_arm(m, files))
        ctx_clear_error(m->ctx); /* not armed: the next update keeps an undo log */
}
