/* Load each plugin given on the command line with RTLD_NOW into a process
 * that links libc (and libdl) alone: a plugin needing any refit symbol
 * fails here, whatever a test process linking the core would resolve.
 * Prints one line per plugin; exits 1 if any did not load or look right. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <refit/format.h>

int main(int argc, char **argv)
{
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            printf("FAIL %s: %s\n", argv[i], dlerror());
            bad = 1;
            continue;
        }
        const refit_format_v2 *f = dlsym(h, REFIT_FORMAT_PLUGIN_SYMBOL);
        const char *base = strrchr(argv[i], '/');
        base = base ? base + 1 : argv[i];
        if (!f || f->abi_version != REFIT_FORMAT_ABI_VERSION ||
            f->struct_size < REFIT_FORMAT_V2_MIN_SIZE || !f->name || !f->plan ||
            strncmp(base, "refit-fmt-", 10) || strncmp(base + 10, f->name, strlen(f->name)) ||
            strcmp(base + 10 + strlen(f->name), ".so")) {
            printf("FAIL %s: no valid %s named after the file\n", argv[i],
                   REFIT_FORMAT_PLUGIN_SYMBOL);
            bad = 1;
        } else {
            printf("ok %s: format %s, ABI %u\n", argv[i], f->name, f->abi_version);
        }
        dlclose(h);
    }
    return bad;
}
