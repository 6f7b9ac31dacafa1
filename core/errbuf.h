/* A status with its message written into a caller's buffer: the error
 * style of the leaf units (descriptor checks, the NCCL wire, the IPC
 * channel) that have no context to hold a message. */
#ifndef REFIT_CORE_ERRBUF_H
#define REFIT_CORE_ERRBUF_H

#include <stddef.h>

/* Formats into err (when errlen > 0) and returns status. */
int errbuf_set(char *err, size_t errlen, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
