/* tools-public-api-catches: a "tool" that calls a private core function
 * (xstrdup, core/util.c, which librefit.so does not export) and carries
 * the core instead of loading librefit.so; tools_public_api.sh must fail
 * on both counts. Built, never run. */
#include <stdlib.h>

#include "core/util.h"

int main(int argc, char **argv)
{
    char *s = xstrdup(argc > 0 ? argv[0] : "");
    int rc = s ? 0 : 1;
    free(s);
    return rc;
}
