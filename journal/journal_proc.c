/* Is the process that wrote an update still running? Used at open to mark
 * updates of dead writers interrupted, and by readers to show them so. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "journal/journal_int.h"

/* State letter and start time (field 22, clock ticks since boot) from
 * /proc/PID/stat. 0 when unreadable (no /proc, not Linux). */
static int proc_stat(int64_t pid, char *state, int64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* comm (field 2) may hold spaces and parentheses: parse after the
     * last ')'. */
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    unsigned long long st = 0;
    char c = 0;
    /* state ppid pgrp session tty tpgid flags minflt cminflt majflt
     * cmajflt utime stime cutime cstime priority nice threads itreal
     * starttime */
    if (sscanf(p + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s"
               " %*s %*s %*s %*s %*s %*s %llu", &c, &st) != 2)
        return 0;
    *state = c;
    *start = (int64_t)st;
    return 1;
}

int64_t jr_proc_start(int64_t pid)
{
    char state;
    int64_t start = 0;
    return proc_stat(pid, &state, &start) ? start : 0;
}

/* Another host: the writer cannot be this machine's process, and SQLite's
 * WAL works only between processes of one host, so a live writer from
 * another host cannot share this file; its update is over. */
int jr_writer_alive(const journal *j, const char *host, int64_t pid,
                    int64_t pid_start)
{
    if (!host || strcmp(host, j->host) != 0 || pid <= 0)
        return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return 0;
    char state = 0;
    int64_t start = 0;
    if (!proc_stat(pid, &state, &start))
        return 1; /* exists (kill said so); nothing more to learn */
    /* A SIGKILLed writer stays a zombie until its parent reaps it. */
    if (state == 'Z' || state == 'X')
        return 0;
    /* The pid was reused by a newer process. */
    if (pid_start > 0 && start != pid_start)
        return 0;
    return 1;
}
