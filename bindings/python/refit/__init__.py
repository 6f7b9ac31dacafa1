"""refit: reload model weights into a live inference worker as a transaction.

ctypes over librefit.so: the copy inside this package (`pip install .`),
else $REFIT_LIB or a checkout's build folder. The standard library only;
torch and numpy are optional and never imported by refit itself.

    import refit
    ctx = refit.Context(worker_id="rank0")
    model = ctx.create_model()
    refit.register_module(model, llama)          # parameters and buffers by name
                                                 # (MoE stacked experts: refit.moe)
    model.seal()
    with model.update(version="step-1200") as txn:
        txn.load_safetensors("/ckpt/step-1200")  # or txn.load_dict(state_dict)
    ctx.health()                                 # Health.READY

Errors raise refit.RefitError carrying refit's status and message. The
guide for engines: docs/embedding.md."""
from ._version import __version__
from .core import (Context, Health, Model, RefitError, Source, SourceSet, Txn, describe,
                   dtype_name, status_name, strerror)
from .delta_file import write_delta_file
from . import moe
from .moe import ExpertMap, register_experts
from .tensors import Desc, refit_dtype
from .torch_util import register_module
from . import core as _core, keeper as _keeper

# The wiring above core: Model.restore("keeper://SOCKET") is refit.keeper's.
_core._RESTORE_SCHEMES["keeper://"] = _keeper.restore

__all__ = ["Context", "Desc", "ExpertMap", "Health", "Model", "RefitError", "Source", "SourceSet",
           "Txn", "__version__", "describe", "dtype_name", "moe", "refit_dtype",
           "register_experts", "register_module", "status_name", "strerror", "write_delta_file"]
