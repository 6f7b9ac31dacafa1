#!/bin/sh
# The installed headers' variadics carry printf format attributes: a
# plugin passing a wrong argument to host->error, host->log or
# refit_pgpu_fail does not compile under -Werror=format, and the same
# call with the right argument does (so the check can tell them apart);
# every variadic declared in INCLUDE_DIR/refit/ carries REFIT_PRINTF_LIKE
# (on its line or the line above).
# Usage: printf_checked.sh INCLUDE_DIR CC [CFLAGS...]   (TAP)
inc="$1" cc="$2"
shift 2
cflags="$*"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# snippet NAME CALL: a plugin function making CALL on h (a refit_host_v2),
# g (a refit_pgpu) and n (an int64_t count)
snippet() {
    cat > "$tmp/$1.c" <<C
#include <stdint.h>
#include <refit/format.h>
#include <refit/sdk/pgpu.h>
int f(const refit_host_v2 *h, refit_pgpu *g, int64_t n);
int f(const refit_host_v2 *h, refit_pgpu *g, int64_t n)
{
    (void)g;
    (void)n;
    $2;
    return 0;
}
C
}
compiles() {
    # shellcheck disable=SC2086 # cflags: words
    "$cc" $cflags -std=c11 -Wall -Werror=format -I"$inc" -c "$tmp/$name.c" -o "$tmp/$name.o" \
        >"$tmp/$name.log" 2>&1
}
i=0
check() { # check NAME RIGHT_CALL WRONG_CALL
    name=$1
    snippet "$name" "$2"
    i=$((i + 1))
    if compiles; then
        echo "ok $i - $name: the right argument compiles"
    else
        echo "not ok $i - $name: the right argument does not compile: $(head -3 "$tmp/$name.log")"
    fi
    snippet "$name" "$3"
    i=$((i + 1))
    if compiles; then
        echo "not ok $i - $name: a wrong argument compiles (no format attribute?)"
    elif grep -q "format" "$tmp/$name.log"; then
        echo "ok $i - $name: a wrong argument is refused by -Wformat"
    else
        echo "not ok $i - $name: refused, but not by -Wformat: $(head -3 "$tmp/$name.log")"
    fi
}
echo "1..7"
check host-error 'return h->error(h->host, REFIT_EINVAL, "groups of %lld", (long long)n)' \
                 'return h->error(h->host, REFIT_EINVAL, "groups of %d", n)'
check host-log 'h->log(h->host, 2, "%s: %d", "m", 1)' 'h->log(h->host, 2, "%s: %d", 1, "m")'
check pgpu-fail 'return refit_pgpu_fail(g, REFIT_EINVAL, "piece %u", 3u)' \
                'return refit_pgpu_fail(g, REFIT_EINVAL, "piece %s", 3u)'
# code outside comments, line by line (a comment may span lines)
bare=$(find "$inc/refit" -name '*.h' -exec awk '
    FNR == 1 { incomment = 0; prev = "" }
    {
        line = $0; code = ""
        while (line != "") {
            if (incomment) {
                e = index(line, "*/"); if (!e) { line = ""; break }
                line = substr(line, e + 2); incomment = 0
            } else {
                b = index(line, "/*"); if (!b) { code = code line; break }
                code = code substr(line, 1, b - 1); line = substr(line, b + 2); incomment = 1
            }
        }
        if (code ~ /\.\.\.[ \t]*\)/ && code !~ /REFIT_PRINTF_LIKE/ && prev !~ /REFIT_PRINTF_LIKE/)
            print FILENAME ":" FNR ": " $0
        if (code ~ /[^ \t]/) prev = code
    }' {} +)
if [ -z "$bare" ]; then
    echo "ok 7 - every variadic in $inc/refit/ carries REFIT_PRINTF_LIKE"
else
    echo "not ok 7 - variadics without REFIT_PRINTF_LIKE:"
    echo "$bare" | sed 's/^/# /'
fi
