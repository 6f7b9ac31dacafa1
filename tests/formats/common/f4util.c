/* See f4util.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/common/pyref.h"
#include "tests/formats/common/f4util.h"

st_set *f4_ref(const char *cmd, const char *args)
{
    return pyref_run("tests/formats/common/ref4.py", cmd, args);
}

const st_tensor *f4_get(const st_set *s, const char *name)
{
    return pyref_get(s, name);
}

const char *f4_suffix(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

void f4_assert_block_eq(const float *want, int64_t cols, int64_t lo, int64_t hi, int64_t c0,
                        int64_t c1, const float *got)
{
    for (int64_t i = lo; i < hi; i++)
        for (int64_t j = c0; j < c1; j++) {
            float a = want[i * cols + j], b = got[(i - lo) * (c1 - c0) + (j - c0)];
            if (memcmp(&a, &b, sizeof a))
                fail_msg("element (%lld, %lld): want %.9g, got %.9g", (long long)i,
                         (long long)j, a, b);
        }
}
