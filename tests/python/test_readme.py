"""The README's examples, run as written (TAP): the ```python block on the
host backend with numpy, and the ```c block compiled into a main() against
the build's librefit and run (skipped where meson gave no compiler, as under
a sanitizer). Each example ends by checking the bytes it committed.

usage: test_readme.py   (env: REFIT_LIB, the build's librefit.so;
REFIT_SOURCE_ROOT, the checkout; REFIT_README_CC, the C compiler, or unset)"""
import os
import re
import shlex
import subprocess
import sys
import tempfile
import traceback

ROOT = os.environ["REFIT_SOURCE_ROOT"]
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

README = os.path.join(ROOT, "README.md")


def block(lang):
    """The one fenced block of lang in the README."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    found = re.findall(r"^```%s\n(.*?)^```$" % re.escape(lang), text, re.S | re.M)
    assert len(found) == 1, "README.md: %d ```%s blocks, expected 1" % (len(found), lang)
    return found[0]


def test_python_example_runs():
    code = block("python")
    assert "refit.Context" in code and "model.update" in code, "not the example"
    exec(compile(code, "README.md:python", "exec"), {"__name__": "readme"})


C_MAIN = """#include <stdio.h>
#include <refit/refit.h>
int main(void)
{
%s
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            if (w[i][j] != next[i][j]) { fprintf(stderr, "w[%%d][%%d] not loaded\\n", i, j); return 1; }
    return 0;
}
"""


def test_c_example_runs():
    cc = os.environ.get("REFIT_README_CC")
    if not cc:
        return "SKIP no REFIT_README_CC (meson sets it outside sanitizer builds)"
    code = block("c")
    # Every call's status must be REFIT_OK: wrap each statement that calls refit_.
    lines = []
    for ln in code.splitlines():
        stmt = ln.split("/*")[0].rstrip()
        m = re.match(r"^(refit_\w+\(.*\));$", stmt)
        if m and not stmt.startswith("refit_close"):
            fn = m.group(1).split("(")[0]
            lines.append('    if (%s != REFIT_OK) { fprintf(stderr, "%s failed\\n"); return 1; }'
                         % (m.group(1), fn))
        else:
            lines.append("    " + ln)
    src = C_MAIN % "\n".join(lines)
    lib = os.environ["REFIT_LIB"]
    with tempfile.TemporaryDirectory(prefix="refit-readme-") as d:
        c = os.path.join(d, "readme.c")
        exe = os.path.join(d, "readme")
        with open(c, "w") as f:
            f.write(src)
        cmd = shlex.split(cc) + ["-std=c11", "-Wall", "-Werror", "-I", os.path.join(ROOT, "include"),
                                 c, "-o", exe, lib, "-Wl,-rpath," + os.path.dirname(lib)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, "compile failed:\n%s\n%s" % (r.stderr, src)
        r = subprocess.run([exe], capture_output=True, text=True)
        assert r.returncode == 0, "the C example failed (%d): %s" % (r.returncode, r.stderr)


def main():
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    print("1..%d" % len(tests))
    failed = 0
    for i, (name, fn) in enumerate(tests, 1):
        try:
            skip = fn()
            print("ok %d - %s%s" % (i, name, " # " + skip if skip else ""))
        except Exception:
            failed += 1
            print("not ok %d - %s" % (i, name))
            for ln in traceback.format_exc().splitlines():
                print("# " + ln)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
