"""refit's version: meson.build's project version. The installed package
has this file generated from it (bindings/python/meson.build); a checkout
reads meson.build itself."""
import os
import re


def _from_meson_build() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "..", "meson.build")
    with open(path, encoding="utf-8") as f:
        m = re.search(r"project\([^)]*?version\s*:\s*'([^']+)'", f.read(), re.S)
    if not m:
        raise RuntimeError("refit: no project version in %s" % path)
    return m.group(1)


__version__ = _from_meson_build()
