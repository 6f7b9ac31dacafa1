"""The installed Python package works with no environment variable (TAP).

Installs what `pip install .` installs (the tag python-runtime, exactly what
pyproject.toml hands meson-python) into a scratch DESTDIR, then imports it
from there in a process with an empty environment (python -I, PATH only)
and runs an update through the librefit.so and the format plugins inside
the package.

usage: check_install.py MESON BUILD_ROOT PROJECT_VERSION"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

meson, build, version = sys.argv[1:4]
dest = tempfile.mkdtemp(prefix="refit-install-")
CHILD = r"""
import json, sys
sys.path.insert(0, SITE)
import refit, refit._ffi as ffi
out = {"version": refit.__version__, "file": refit.__file__, "lib": ffi.lib()._name,
       "plugins": ffi.bundled_plugin_dir()}
import array
w = array.array("f", [0.0] * 4)
src = array.array("f", [1.0, 2.0, 3.0, 4.0])
class Buf:  # a host tensor without numpy or torch: a Desc over an array's buffer
    def __init__(self, a): self.a = a
    def _refit_desc(self):
        return refit.Desc(self.a.buffer_info()[0], ffi.DEVICE_CPU, 0, (2, 32), [4], [1], self.a)
ctx = refit.Context(journal_path="")
m = ctx.create_model()
for fmt in ("unquantized", "fp8", "int4", "nvfp4", "mxfp8", "mxfp4", "int8"):
    # each format's required parameters (its declaration's), so that the
    # module is accepted: the check is that the plugin loads and answers
    need = {"unquantized": {"cast": "true"}, "int4": {"group_size": "128"}}
    m.add_module("m-" + fmt, fmt, need.get(fmt))
    if fmt == "unquantized":
        m.bind_runtime("m-" + fmt, "w", Buf(w))
        m.expect("m-" + fmt, "w", "f32", [4])
out["formats"] = True
m2 = refit.Context(journal_path="").create_model()
m2.add_module("w")
m2.bind_runtime("w", "w", Buf(w))
m2.expect("w", "w", "f32", [4])
m2.seal()
with m2.update(version="1") as txn:
    txn.load("w", Buf(src))
out["bytes"] = list(w)
out["health"] = m2.ctx.health().name
print(json.dumps(out))
"""


def tap(checks):
    print("1..%d" % len(checks))
    for i, (ok, what) in enumerate(checks, 1):
        print("%s %d - %s" % ("ok" if ok else "not ok", i, what))


try:
    r = subprocess.run([meson, "install", "-C", build, "--no-rebuild", "--quiet",
                        "--tags", "python-runtime", "--destdir", dest],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        print("1..1\nnot ok 1 - meson install --tags python-runtime\n# " +
              r.stdout.replace("\n", "\n# "))
        sys.exit(0)
    inits = glob.glob(os.path.join(dest, "**", "refit", "__init__.py"), recursive=True)
    pkg = os.path.dirname(inits[0]) if len(inits) == 1 else None
    checks = [(pkg is not None, "one refit package installed (%s)" % inits)]
    if pkg:
        plugins_src = os.path.join(os.environ["REFIT_SOURCE_ROOT"], "plugins")
        fmts = sorted(d for d in os.listdir(plugins_src)
                      if os.path.isfile(os.path.join(plugins_src, d, "meson.build")))
        have = set(os.listdir(os.path.join(pkg, "plugins")))
        files = set(os.listdir(pkg))
        checks += [({"librefit.so", "py.typed", "_version.py", "tensors.py", "core.py"} <= files,
                    "librefit.so, py.typed, _version.py and the modules: %s" % sorted(files)),
                   (all("refit-fmt-%s.so" % f in have and f + ".yaml" in have for f in fmts),
                    "every plugin and its declaration in plugins/: %s" % sorted(have))]
        env = {"PATH": "/usr/bin:/bin"}
        for k in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS"):
            if os.environ.get("REFIT_CHILD_" + k):
                env[k] = os.environ["REFIT_CHILD_" + k]
        c = subprocess.run([sys.executable, "-I", "-c", "SITE = %r\n" % os.path.dirname(pkg)
                            + CHILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, cwd=dest)
        try:
            got = json.loads(c.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            got = {}
        checks += [(c.returncode == 0 and got, "imported and ran with an empty environment" +
                    ("" if c.returncode == 0 else ": " + c.stderr.replace("\n", "\n# ")))]
        if got:
            checks += [(got["version"] == version, "__version__ %s is meson's %s" %
                        (got["version"], version)),
                       (got["file"].startswith(pkg) and got["lib"] == os.path.join(pkg, "librefit.so")
                        and got["plugins"] == os.path.join(pkg, "plugins"),
                        "the package's own librefit.so and plugins: %s, %s" % (got["lib"],
                                                                                got["plugins"])),
                       (got["formats"], "every plugin's format is registered"),
                       (got["bytes"] == [1.0, 2.0, 3.0, 4.0] and got["health"] == "READY",
                        "an update wrote the runtime tensor: %s %s" % (got["bytes"],
                                                                        got["health"]))]
    tap(checks)
finally:
    shutil.rmtree(dest, ignore_errors=True)
