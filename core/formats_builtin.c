/* Formats compiled into the library, registered on every context. */
#include "core/internal.h"
#include "plugins/unquantized/unquantized.h"

int formats_register_builtin(refit_ctx *ctx)
{
    return refit_format_register(ctx, &refit_format_unquantized);
}
