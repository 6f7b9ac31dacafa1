"""refit: reload model weights into a live inference worker as a transaction.

ctypes over librefit.so (found through $REFIT_LIB, beside this package, or
the system's library path); the standard library only, PyTorch optional.

    import refit
    ctx = refit.Context(worker_id="rank0")
    model = ctx.create_model()
    refit.register_module(model, llama)          # parameters and buffers by name
    model.seal()
    with model.update(version="step-1200") as txn:
        txn.load_safetensors("/ckpt/step-1200")  # or txn.load_dict(state_dict)
    ctx.health()                                 # Health.READY

Errors raise refit.RefitError carrying refit's status and message.
"""
from .core import Context, Health, Model, RefitError, Source, SourceSet, Txn, describe, status_name
from .torch_util import refit_dtype, register_module

__all__ = ["Context", "Health", "Model", "RefitError", "Source", "SourceSet", "Txn", "describe",
           "status_name", "refit_dtype", "register_module"]
__version__ = "0.1.0"
