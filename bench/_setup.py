"""What every bench script does first: the source tree's binding on the
path, and with REFIT_LIB set and no REFIT_PLUGIN_PATH, the plugins/ folder
beside that library (a staged build folder). Imported for its effect."""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
_lib = os.environ.get("REFIT_LIB")
if _lib and not os.environ.get("REFIT_PLUGIN_PATH"):
    _plugins = os.path.join(os.path.dirname(os.path.abspath(_lib)), "plugins")
    if os.path.isdir(_plugins):
        os.environ["REFIT_PLUGIN_PATH"] = _plugins
