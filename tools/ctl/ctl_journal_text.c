/* refitctl journal: output helpers shared by the commands. */
#include <stdio.h>
#include <string.h>

#include "ctl_journal_int.h"

const char *ctl_fit(const char *s, int width, int left_cut, char *buf)
{
    if (!s)
        return "-";
    size_t n = strlen(s), w = (size_t)width;
    if (n <= w)
        return s;
    if (left_cut)
        snprintf(buf, w + 1, "..%s", s + n - (w - 2));
    else
        snprintf(buf, w + 1, "%.*s..", (int)(w - 2), s);
    return buf;
}

const char *ctl_bytes(uint64_t v, char *buf, size_t len)
{
    static const char units[] = "KMGTPE";
    double d = (double)v;
    int u = -1;
    if (v < 1024) {
        snprintf(buf, len, "%llu", (unsigned long long)v);
        return buf;
    }
    while (d >= 1024.0 && u < 5) {
        d /= 1024.0;
        u++;
    }
    snprintf(buf, len, d < 10.0 ? "%.1f%c" : "%.0f%c", d, units[u]);
    return buf;
}

const char *ctl_time(const char *iso, char *buf, size_t len)
{
    if (!iso)
        return "-";
    /* 2024-05-01T12:00:00.123Z: the date, a space, the seconds. */
    snprintf(buf, len, "%.19s", iso);
    if (strlen(buf) > 10 && buf[10] == 'T')
        buf[10] = ' ';
    return buf;
}

/* Each line reads at most room + 1 bytes ahead (strnlen, then memchr in
 * those), so a text of N bytes costs O(N): a scan to the newline or the
 * end per line made a 4 MB URI take seconds. */
void ctl_wrap(FILE *f, const char *text, int col)
{
    int room = CTL_COLUMNS - col, first = 1;
    const char *p = text ? text : "-";
    if (room < 20)
        room = 20;
    do {
        size_t n = strnlen(p, (size_t)room + 1);
        const char *nl = memchr(p, '\n', n);
        if (nl)
            n = (size_t)(nl - p);
        if (n > (size_t)room) {
            /* Break at the last space that fits, else mid-word. */
            n = (size_t)room;
            for (size_t k = n; k > (size_t)room / 2; k--)
                if (p[k] == ' ') {
                    n = k;
                    break;
                }
        }
        fprintf(f, "%*s%.*s\n", first ? 0 : col, "", (int)n, p);
        first = 0;
        p += n;
        p += strspn(p, " \n");
    } while (*p);
}

json_t *ctl_jstr(const char *s)
{
    return s ? json_string(s) : json_null();
}

int ctl_json_print(json_t *root)
{
    return cli_json_print(root);
}

int ctl_journal_fail(journal *j)
{
    return cli_error(1, "%s", journal_errmsg(j));
}
