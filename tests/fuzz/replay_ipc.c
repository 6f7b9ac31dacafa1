/*
 * Replays a seed corpus through fuzz_ipc.c's LLVMFuzzerTestOneInput with
 * any compiler, no libFuzzer: every file of each folder named runs once
 * (the harness aborts on a broken invariant). Prints how many ran; no file
 * at all is a failure.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return -1;
    uint8_t *buf = malloc(1 << 16);
    size_t n = buf ? fread(buf, 1, 1 << 16, fp) : 0;
    int bad = !buf || ferror(fp);
    fclose(fp);
    if (!bad)
        LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return bad ? -1 : 0;
}

int main(int argc, char **argv)
{
    int ran = 0;
    for (int i = 1; i < argc; i++) {
        DIR *d = opendir(argv[i]);
        if (!d) {
            fprintf(stderr, "replay_ipc: cannot open the folder %s\n", argv[i]);
            return 1;
        }
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (replay(path)) {
                fprintf(stderr, "replay_ipc: cannot read %s\n", path);
                closedir(d);
                return 1;
            }
            ran++;
        }
        closedir(d);
    }
    printf("replay_ipc: %d inputs, all clean\n", ran);
    return ran ? 0 : 1;
}
