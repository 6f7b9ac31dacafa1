/*
 * A delta update's patches (docs/journal.md "Delta updates"): one row per
 * patched tensor in delta_tensors and their total in
 * updates.delta_elements, written in one transaction of their own before
 * the update's end (never a write per tensor while it loads).
 */
#include <stdio.h>

#include "journal/journal_int.h"

int journal_update_delta(journal *j, int64_t update_id, size_t n,
                         const char *const *names, const uint64_t *elements)
{
    const char *what = "recording the patches of a delta update";
    if (!j || (n && (!names || !elements)))
        return REFIT_EINVAL;
    if (!update_id || j->cur.id != update_id)
        return jr_fail(j, REFIT_ESTATE, "journal %s: %s: update %lld is not open "
                       "on this handle", j->path, what, (long long)update_id);
    int rc = jr_check_writable(j, what);
    if (rc == REFIT_OK)
        rc = jr_tx_begin(j, what);
    if (rc != REFIT_OK)
        return rc;
    sqlite3_stmt *ins = NULL, *tot = NULL;
    uint64_t total = 0;
    int src = sqlite3_prepare_v2(j->db, "INSERT INTO delta_tensors(update_id, name, "
                                 "elements) VALUES (?1, ?2, ?3) ON CONFLICT(update_id, "
                                 "name) DO UPDATE SET elements = ?3", -1, &ins, NULL);
    for (size_t i = 0; i < n && src == SQLITE_OK; i++) {
        sqlite3_reset(ins);
        sqlite3_bind_int64(ins, 1, update_id);
        sqlite3_bind_text(ins, 2, names[i], -1, SQLITE_STATIC);
        sqlite3_bind_int64(ins, 3, (sqlite3_int64)elements[i]);
        src = jr_step(j, ins) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
        total += elements[i];
    }
    if (src == SQLITE_OK)
        src = sqlite3_prepare_v2(j->db, "UPDATE updates SET delta_elements = ?2 "
                                 "WHERE id = ?1", -1, &tot, NULL);
    if (src == SQLITE_OK) {
        sqlite3_bind_int64(tot, 1, update_id);
        sqlite3_bind_int64(tot, 2, (sqlite3_int64)total);
        src = jr_step(j, tot) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
    }
    sqlite3_finalize(ins);
    sqlite3_finalize(tot);
    if (src != SQLITE_OK)
        return jr_fail_sqlite(j, what); /* rolls the transaction back */
    return jr_tx_commit(j, what);
}
