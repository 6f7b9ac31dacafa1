/* See errbuf.h. */
#include <stdarg.h>
#include <stdio.h>

#include "core/errbuf.h"

int errbuf_set(char *err, size_t errlen, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (errlen)
        vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return status;
}
