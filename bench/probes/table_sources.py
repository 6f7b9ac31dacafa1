"""What a row of txn.load_dict is made of, for bench/probes/table_rows.py
and tests/python/test_table_rows.py alike: a producer seen only through
DLPack, and the host model whose update takes n such rows.

Neither imports refit itself: the caller puts the bindings it times or
tests on sys.path first."""
import numpy as np


class DLPackOnly:
    """Only the DLPack protocol, over a numpy array or a torch tensor (as a
    CuPy or JAX array reaches refit): each call handed on as it came."""

    def __init__(self, a):
        self.a = a

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)


class RecordingDLPack(DLPackOnly):
    """DLPackOnly that appends each call to calls: "device" for
    __dlpack_device__, ("dlpack", its keywords sorted) for __dlpack__."""

    def __init__(self, a, calls=None):
        super().__init__(a)
        self.calls = calls if calls is not None else []

    def __dlpack_device__(self):
        self.calls.append("device")
        return super().__dlpack_device__()

    def __dlpack__(self, **kw):
        self.calls.append(("dlpack", tuple(sorted(kw.items()))))
        return super().__dlpack__(**kw)


def row_model(refit, n, width):
    """(context, sealed model, runtime array): one module "m" whose runtime
    tensor is an [n, width] f32 array, and n checkpoint tensors "t<i>" of
    [1, width], tensor i placed at row i; journal off."""
    ctx = refit.Context(worker_id="table-rows", journal_path="")
    m = ctx.create_model()
    w = np.zeros((n, width), np.float32)
    m.add_module("m")
    m.bind_runtime("m", "w", w)
    for i in range(n):
        m.expect("m", "t%d" % i, "f32", [1, width], dst_offset=[i, 0])
    m.seal()
    return ctx, m, w
