/* pgpu.h: the launch table's message. */
#include <stdarg.h>
#include <stdio.h>

#include "plugins/common/pgpu.h"

int pgpu_fail(pgpu *g, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->msg, sizeof g->msg, fmt, ap);
    va_end(ap);
    return rc;
}
