/* Built in until the plugin loader lands; then this becomes the plugin's
 * exported refit_format_plugin_v1. */
#ifndef REFIT_PLUGINS_UNQUANTIZED_H
#define REFIT_PLUGINS_UNQUANTIZED_H

#include <refit/format.h>

extern const refit_format_v1 refit_format_unquantized;

#endif
