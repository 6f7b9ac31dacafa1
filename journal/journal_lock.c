/*
 * Who writes: one open-file-description lock (fcntl F_OFD_SETLK) per live
 * worker id and per open update, on byte ranges of PATH-writers beside the
 * journal. The kernel drops them when the writer's descriptor closes, in
 * whatever way the process ends, and they hold across PID namespaces (two
 * containers sharing one journal file share the locks on it), where a pid
 * and /proc say nothing. A lock held means alive; a lock not held leaves
 * the pid test (journal_proc.c) to answer, for writers of older versions.
 *
 * The file holds no data: the locks are on offsets past its end.
 *   [JR_LOCK_WORKER, +2^39)  a worker id, at 39 bits of its FNV-1a hash
 *   [JR_LOCK_UPDATE, ...)    an update, at its id
 * It is created with the journal's mode (as SQLite's -wal and -shm are),
 * so every user who may write the journal may take its locks.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "journal/journal_int.h"

#define JR_LOCK_WORKER ((int64_t)1 << 40)
#define JR_LOCK_UPDATE ((int64_t)1 << 41)

static int64_t worker_offset(const char *id)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return JR_LOCK_WORKER + (int64_t)(h & (((uint64_t)1 << 39) - 1));
}

static int lock_op(int fd, int cmd, short type, int64_t at, struct flock *out)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = (off_t)at,
                       .l_len = 1, .l_pid = 0};
    int rc = fcntl(fd, cmd, &fl);
    if (out)
        *out = fl;
    return rc;
}

int jr_lock_open(journal *j)
{
    char *p = malloc(strlen(j->path) + sizeof "-writers");
    if (!p)
        return jr_fail(j, REFIT_ENOMEM, "journal %s: out of memory", j->path);
    sprintf(p, "%s-writers", j->path);
    /* the journal's own mode, as SQLite gives its -wal and -shm: every
     * user who may write the journal may lock here */
    struct stat db;
    mode_t mode = stat(j->path, &db) == 0 ? (db.st_mode & 0666) : 0644;
    j->lock_fd = j->readonly ? open(p, O_RDONLY | O_CLOEXEC)
                             : open(p, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (j->lock_fd >= 0 && !j->readonly)
        fchmod(j->lock_fd, mode); /* past the umask */
    else if (!j->readonly && errno == EEXIST)
        j->lock_fd = open(p, O_RDWR | O_CLOEXEC);
    int err = errno;
    int rc = REFIT_OK;
    /* a reader without the file (an older writer, none yet) tests pids */
    if (j->lock_fd < 0 && !j->readonly)
        rc = jr_fail(j, REFIT_EJOURNAL, "journal %s: cannot open the writers' lock file "
                     "%s: %s", j->path, p, strerror(err));
    free(p);
    return rc;
}

void jr_lock_close(journal *j)
{
    if (j->lock_fd >= 0)
        close(j->lock_fd); /* releases every lock of this handle */
    j->lock_fd = -1;
}

/* 1: another open file description holds it; 0: none; -1: unknown. */
static int held(const journal *j, int64_t at)
{
    struct flock fl;
    if (j->lock_fd < 0 || lock_op(j->lock_fd, F_OFD_GETLK, F_WRLCK, at, &fl) != 0)
        return -1;
    return fl.l_type != F_UNLCK;
}

int jr_worker_live(const journal *j, const char *worker_id, const char *host,
                   int64_t pid, int64_t pid_start)
{
    return (worker_id && held(j, worker_offset(worker_id)) == 1) ||
           jr_writer_alive(j, host, pid, pid_start);
}

int jr_update_live(const journal *j, int64_t update_id, const char *host,
                   int64_t pid, int64_t pid_start)
{
    return held(j, JR_LOCK_UPDATE + update_id) == 1 ||
           jr_writer_alive(j, host, pid, pid_start);
}

int jr_lock_worker(journal *j, const char *worker_id)
{
    if (lock_op(j->lock_fd, F_OFD_SETLK, F_WRLCK, worker_offset(worker_id), NULL) == 0)
        return REFIT_OK;
    if (errno != EAGAIN && errno != EACCES)
        return jr_fail(j, REFIT_EJOURNAL, "journal %s: registering worker '%s': cannot lock "
                       "the writers' lock file: %s", j->path, worker_id, strerror(errno));
    /* who: the row the live holder wrote when it registered */
    char who[JOURNAL_HOST_MAX + 96] = "pid and host not recorded";
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(j->db, "SELECT pid, host, heartbeat FROM workers WHERE id = ?1",
                           -1, &s, NULL) == SQLITE_OK) {
        sqlite3_bind_text(s, 1, worker_id, -1, SQLITE_STATIC);
        if (sqlite3_step(s) == SQLITE_ROW)
            snprintf(who, sizeof who, "pid %lld on host %s, registered %s",
                     (long long)sqlite3_column_int64(s, 0),
                     (const char *)sqlite3_column_text(s, 1),
                     (const char *)sqlite3_column_text(s, 2));
    }
    sqlite3_finalize(s);
    return jr_fail(j, REFIT_EEXIST, "journal %s: worker '%s' is registered by a live process "
                   "(%s); two workers may not share one worker id", j->path, worker_id, who);
}

int jr_lock_update(journal *j, int64_t update_id)
{
    if (lock_op(j->lock_fd, F_OFD_SETLK, F_WRLCK, JR_LOCK_UPDATE + update_id, NULL) == 0)
        return REFIT_OK;
    return jr_fail(j, REFIT_EJOURNAL, "journal %s: update %lld: cannot lock it in the "
                   "writers' lock file: %s", j->path, (long long)update_id, strerror(errno));
}

void jr_unlock_update(journal *j, int64_t update_id)
{
    if (update_id > 0 && j->lock_fd >= 0)
        lock_op(j->lock_fd, F_OFD_SETLK, F_UNLCK, JR_LOCK_UPDATE + update_id, NULL);
}
