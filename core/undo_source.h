/* Undo sources: what puts the committed version back when an update
 * aborts, in place of an undo log of every byte it overwrites
 * (docs/core.md "Undo sources").
 *
 * An update with rollback keeps the undo log (core/undo.c) or names one
 * undo source, chosen at refit_begin (undo_source_pick) and kept to its
 * end. Such an update saves nothing; its abort hands the modules it wrote
 * to the source's restore, which writes them back through the txn (its
 * RESTORING state: loads and txn_restore_module are accepted, nothing is
 * saved, post-loads run as in any load), then each restored module's
 * fingerprint must equal the committed one the source recorded; anything
 * else poisons the worker, named.
 *
 * The model keeps at most one source of each kind. A source is armed by
 * what makes it equal to the committed state (the commit of an update
 * loaded wholly from durable files, a snapshot written or restored), and
 * every other commit drops it: undo_sources_committed. Adding a kind (the
 * keeper): an undo_source_ops, a constructor that fills undo_source
 * (undo_source_init) and calls undo_source_arm, a REFIT_UNDO_* mode
 * (refit.h; txn_open checks the range). Auto takes it after the files and
 * a snapshot. */
#ifndef REFIT_CORE_UNDO_SOURCE_H
#define REFIT_CORE_UNDO_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include <refit/refit.h>

struct refit_model;
typedef struct undo_source undo_source;

typedef struct undo_source_ops {
    const char *kind;           /* "files", "snapshot", "keeper": the journal's word */
    int mode;                   /* the REFIT_UNDO_* that asks for it */
    /* Whether s still holds the committed version, at begin: REFIT_OK, or
     * an error with why (the file that changed and how). Cheap: stat calls,
     * no byte read. */
    int (*check)(undo_source *s, char *why, size_t n);
    /* Write modules[0, n) back through t (RESTORING) on the default
     * stream: refit_load or txn_restore_module. An error leaves the ctx's
     * message naming the file and module. Blocks on its own reads only
     * (the caller waits for the streams and checks fingerprints). */
    int (*restore)(undo_source *s, refit_txn *t, const uint32_t *modules, uint32_t n);
    /* Free what s holds (not s itself). */
    void (*release)(undo_source *s);
} undo_source_ops;

struct undo_source {
    const undo_source_ops *ops;
    char *uri;                  /* what it restores from, for the journal */
    uint64_t *fp;               /* per module: the committed fingerprint */
    uint32_t n_modules;
    undo_source *next;          /* the model's list */
};

/* Fill the common part: ops, a copy of uri, each module's fingerprint
 * now (the committed bytes; reads every runtime byte), or fp when given
 * (copied; n_modules entries). REFIT_OK or an error (ctx message set). */
int undo_source_init(undo_source *s, struct refit_model *m, const undo_source_ops *ops,
                     const char *uri, const uint64_t *fp);
/* Give s (malloc'ed) to the model, replacing its source of the same kind. */
void undo_source_arm(struct refit_model *m, undo_source *s);
/* Drop the model's sources: kind NULL, all of them. */
void undo_sources_drop(struct refit_model *m, const char *kind);

/* The source for an update that begins with rollback and mode (REFIT_UNDO_*):
 * *out NULL keeps the undo log. A source asked for by name that cannot serve
 * is REFIT_EUNSUPPORTED (ctx message says why); under AUTO, *why gets why
 * the first candidate was passed over ("" when none was armed). */
int undo_source_pick(struct refit_model *m, int mode, undo_source **out, char *why, size_t n);

/* After a restore: each of modules[0, n) fingerprints as s recorded.
 * REFIT_ECORRUPT naming the first that does not. */
int undo_source_verify(struct refit_model *m, const undo_source *s, const uint32_t *modules,
                       uint32_t n);

/* A commit ended: every source is dropped (the committed bytes changed),
 * then files, when not NULL (the update delivered every module wholly
 * from it), is armed as the "previous update's files". */
void undo_sources_committed(struct refit_model *m, refit_source *files);

/* The kinds (undo_source_files.c, undo_source_snapshot.c). */
int undo_source_files_arm(struct refit_model *m, refit_source *src);
/* A snapshot of the committed state at path (just written or restored). */
int undo_source_snapshot_arm(struct refit_model *m, const char *path);

#endif
