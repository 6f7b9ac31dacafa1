"""The binding's many-tensors path on the host backend, without torch (TAP):
txn.load_dict (refit_load_many) and refit.SourceSet over host buffers that
look like torch tensors (data_ptr, shape, stride, dtype, get_device), and
over objects that only describe themselves (_refit_desc).

usage: test_batch.py BINDINGS_DIR   (env: REFIT_LIB)"""
import array
import ctypes
import sys
import traceback
import types

sys.path.insert(0, sys.argv[1])
import refit  # noqa: E402
from refit import _batch, _ffi, torch_util  # noqa: E402


class HostTensor:
    """A row-major f32 host tensor with the torch fields the table reads."""

    def __init__(self, shape, fill=0.0):
        self.shape = tuple(shape)
        n = 1
        for s in shape:
            n *= s
        self.buf = (ctypes.c_float * max(n, 1))()
        self.numel = n
        self.dtype = "f32"
        for i in range(n):
            self.buf[i] = fill + i

    def data_ptr(self):
        return ctypes.addressof(self.buf)

    def stride(self):
        return self.row_major()

    def row_major(self):
        out, acc = [], 1
        for s in reversed(self.shape):
            out.append(acc)
            acc *= s
        return tuple(reversed(out))

    def is_contiguous(self):
        return tuple(self.stride()) == self.row_major()

    def get_device(self):
        return -1

    def is_pinned(self):
        return False

    def _refit_desc(self):
        return torch_util.Desc(self.data_ptr(), 1, 0, (2, 32), self.shape, self.stride(), self)

    def values(self):
        return list(self.buf[:self.numel])

    def fill(self, base):
        for i in range(self.numel):
            self.buf[i] = base + i


class Described:
    """Only _refit_desc: the table takes the one-at-a-time path."""

    def __init__(self, t):
        self.t = t

    def _refit_desc(self):
        return self.t._refit_desc()


SHAPES = {"a.weight": (4, 3), "b.weight": (5,), "c.weight": (2, 2, 2), "d.bias": (7,)}


def world():
    ctx = refit.Context(worker_id="batch-test", journal_path="")
    model = ctx.create_model()
    rt = {}
    for name, shape in SHAPES.items():
        model.add_module(name)
        rt[name] = HostTensor(shape, -1.0)
        model.bind_runtime(name, "w", rt[name])
        model.expect(name, name, "f32", list(shape))
    model.seal()
    return ctx, model, rt


def sources(base):
    return {name: HostTensor(shape, base + 100 * k) for k, (name, shape) in
            enumerate(SHAPES.items())}


def test_load_dict_equals_one_load_per_tensor():
    ctx1, m1, rt1 = world()
    ctx2, m2, rt2 = world()
    src = sources(1.0)
    with m1.update(version="v1") as txn:
        for name, t in src.items():
            txn.load(name, t)
    with m2.update(version="v1") as txn:
        txn.load_dict(src)
        assert txn.stats()["tensors_loaded"] == len(SHAPES)
    for name in SHAPES:
        assert rt1[name].values() == rt2[name].values() == src[name].values(), name
    assert ctx2.health() == refit.Health.READY


def test_described_objects_take_the_same_path():
    ctx, m, rt = world()
    src = sources(3.0)
    with m.update(version="v1") as txn:
        txn.load_dict({k: Described(v) for k, v in src.items()})
    for name in SHAPES:
        assert rt[name].values() == src[name].values(), name


def test_bad_row_refuses_the_call():
    ctx, m, rt = world()
    with m.update(version="v1") as txn:
        txn.load_dict(sources(1.0))
    before = {k: v.values() for k, v in rt.items()}
    bad = sources(2.0)
    bad["c.weight"] = HostTensor((2, 2, 3))
    txn = m.begin(version="v2", rollback=False, keep_going=True)
    try:
        txn.load_dict(bad)
        raise AssertionError("a wrong shape was accepted")
    except refit.RefitError as e:
        assert e.name == "REFIT_EMISMATCH", e
        assert "row 2 (c.weight)" in e.message and "nothing written" in e.message, e.message
    assert {k: v.values() for k, v in rt.items()} == before
    assert txn.stats()["tensors_loaded"] == 0
    good = sources(2.0)
    txn.load_dict(good)          # the txn goes on
    txn.finalize()
    assert rt["c.weight"].values() == good["c.weight"].values()


def test_refused_call_fails_the_update_closed():
    ctx, m, rt = world()
    with m.update(version="v1") as txn:
        txn.load_dict(sources(1.0))
    before = {k: v.values() for k, v in rt.items()}
    bad = sources(2.0)
    bad["c.weight"] = HostTensor((2, 2, 3))
    txn = m.begin(version="v2")
    for tensors, status in ((bad, "REFIT_EMISMATCH"), (sources(2.0), "REFIT_ESTATE")):
        try:
            txn.load_dict(tensors)
            raise AssertionError("loaded after a refusal without keep_going")
        except refit.RefitError as e:
            assert e.name == status, e
    txn.abort()
    assert {k: v.values() for k, v in rt.items()} == before and ctx.version == "v1"


def test_strict_false_skips_unknown_names():
    ctx, m, rt = world()
    src = sources(4.0)
    src["not.expected"] = HostTensor((3,))
    with m.update(version="v1", keep_going=True) as txn:
        try:
            txn.load_dict(src)
            raise AssertionError("an unexpected name was accepted")
        except refit.RefitError as e:
            assert e.name == "REFIT_EUNEXPECTED" and "not.expected" in e.message, e
        txn.load_dict(src, strict=False)
    assert rt["a.weight"].values() == src["a.weight"].values()


def test_source_set_reused_across_updates():
    ctx, m, rt = world()
    src = sources(0.0)
    ss = m.source_set(src)
    assert len(ss) == len(SHAPES) and set(ss.names) == set(SHAPES)
    for step in range(1, 4):
        for k, t in enumerate(src.values()):
            t.fill(1000.0 * step + 10 * k)      # the trainer writes in place
        with m.update(version="step-%d" % step) as txn:
            txn.load_set(ss)
        for name in SHAPES:
            assert rt[name].values() == src[name].values(), (step, name)
    assert ctx.version == "step-3"
    # re-pointed at other buffers
    other = sources(77.0)
    ss.repoint(other)
    with m.update(version="step-4") as txn:
        txn.load_set(ss)
    assert rt["d.bias"].values() == other["d.bias"].values()
    ss.close()


def test_stale_source_set_refused():
    ctx1, m1, rt1 = world()
    ctx2, m2, rt2 = world()
    ss = m1.source_set(sources(5.0))
    txn = m2.begin(version="v1")
    try:
        txn.load_set(ss)
        raise AssertionError("another model's set was accepted")
    except refit.RefitError as e:
        assert e.name == "REFIT_ESTATE" and "another model" in e.message, e
    txn.abort()
    m1.destroy()
    txn = m2.begin(version="v1")
    try:
        txn.load_set(ss)
        raise AssertionError("a stale set was accepted")
    except refit.RefitError as e:
        assert e.name == "REFIT_ESTATE" and "destroyed" in e.message, e
    txn.abort()
    ss.close()


def test_source_set_build_refuses_a_bad_row():
    ctx, m, rt = world()
    src = sources(0.0)
    src["b.weight"] = HostTensor((6,))
    try:
        m.source_set(src)
        raise AssertionError("a wrong shape was accepted")
    except refit.RefitError as e:
        assert e.name == "REFIT_EMISMATCH" and "row 1 (b.weight)" in e.message, e


class Strided(HostTensor):
    """A view with its own strides (a list, as a stand-in may give), maybe
    on a device, maybe pinned."""

    def __init__(self, shape, strides, device=-1, pinned=False):
        super().__init__(shape)
        self._strides, self._device, self._pinned = strides, device, pinned

    def stride(self):
        return self._strides

    def get_device(self):
        return self._device

    def is_pinned(self):
        return self._pinned


def rows_of(table):
    """(data, device type, device id, dtype, shape, strides) of each row
    (strides None: the row has none, contiguous)."""
    out = []
    for i in range(table.n):
        t = _ffi.Tensor.from_address(table.srcs_ptr + i * ctypes.sizeof(_ffi.Tensor))
        out.append((t.data, t.device.device_type, t.device.device_id, (t.dtype.code, t.dtype.bits),
                    tuple(t.shape[:t.ndim]), tuple(t.strides[:t.ndim]) if t.strides else None))
    return out


def test_table_rows_describe_each_tensor():
    # shapes repeated (one entry each in the table) and distinct, a scalar,
    # list strides, host, pinned and device rows, names not all ASCII; a
    # contiguous tensor's row has no strides (its stride() is not read)
    ts = [HostTensor((4, 3)), HostTensor((4, 3)), HostTensor(()), HostTensor((5,)),
          Strided((4, 3), [1, 4]), Strided((4, 3), (1, 4), pinned=True),
          Strided((2, 2, 2), (4, 2, 1), device=1), HostTensor((4, 3))]
    names = ["a", "b", "c", "d.\u00e9", "e", "f", "g", "h"]
    table = _batch.Table(names, ts)
    want = []
    for t in ts:
        dev = t.get_device()
        kind = _ffi.DEVICE_CUDA if dev >= 0 else (_ffi.DEVICE_CUDA_HOST if t.is_pinned()
                                                  else _ffi.DEVICE_CPU)
        want.append((t.data_ptr(), kind, max(dev, 0), (2, 32), tuple(t.shape),
                     None if t.is_contiguous() else tuple(t.stride())))
    assert rows_of(table) == want, rows_of(table)
    assert table.device == (_ffi.DEVICE_CUDA, 1), table.device
    got = [ctypes.string_at(p).decode() for p in array.array("Q", table._name_ptrs)]
    assert got == names, got
    assert _batch.Table([], []).n == 0 and _batch.Table([], []).device is None
    one_dev = _batch.Table(["x", "y"], [Strided((2,), (1,), device=3)] * 2)
    assert [r[1:3] for r in rows_of(one_dev)] == [(_ffi.DEVICE_CUDA, 3)] * 2

    class Contiguous(HostTensor):
        def is_contiguous(self):
            return True

        def stride(self):
            raise AssertionError("stride() read of a contiguous tensor")
    # two dtypes over two shapes: each row's dtype and dims its own (a tail
    # per (shape, dtype) pair, not per shape)
    mixed = [HostTensor((4, 3)), HostTensor((5,)), HostTensor((4, 3)), HostTensor((5,))]
    mixed[1].dtype = mixed[2].dtype = "f16"
    got = rows_of(_batch.Table(["p", "q", "r", "s"], mixed))
    f16 = torch_util.refit_dtype("f16")
    assert [(r[3], r[4]) for r in got] == [((2, 32), (4, 3)), (f16, (5,)), (f16, (4, 3)),
                                           ((2, 32), (5,))], got
    assert [r[0] for r in got] == [t.data_ptr() for t in mixed], got
    same = [HostTensor((4, 3), float(i)) for i in range(3)]     # one key, one tail
    assert rows_of(_batch.Table(["x", "y", "z"], same)) == [
        (t.data_ptr(), _ffi.DEVICE_CPU, 0, (2, 32), (4, 3), None) for t in same]
    t = Contiguous((3, 2), 5.0)
    assert rows_of(_batch.Table(["x"], [t])) == [(t.data_ptr(), _ffi.DEVICE_CPU, 0, (2, 32),
                                                  (3, 2), None)]


def test_torch_methods_only_for_plain_tensors():
    # exactly torch.Tensor or Parameter: the table maps torch.Tensor's own
    # methods; any other type (a subclass may override them) is asked by
    # name, and its override is what the row holds (a stand-in torch here)
    fake = types.ModuleType("torch")

    class Tensor(HostTensor):
        pass

    class Parameter(Tensor):
        pass

    class Moved(Tensor):
        def data_ptr(self):
            return super().data_ptr() + 4

    fake.Tensor = Tensor
    fake.nn = types.SimpleNamespace(Parameter=Parameter)
    saved = sys.modules.get("torch")
    sys.modules["torch"] = fake
    _batch._torch_methods = None
    try:
        plain = [Tensor((2,)), Parameter((3,))]
        assert _batch._getters(plain)[0] is Tensor.data_ptr
        assert [r[0] for r in rows_of(_batch.Table(["a", "b"], plain))] == \
            [t.data_ptr() for t in plain]
        mixed = plain + [Moved((2,))]
        assert _batch._getters(mixed) is _batch._BY_NAME
        got = [r[0] for r in rows_of(_batch.Table(["a", "b", "c"], mixed))]
        assert got[2] == ctypes.addressof(mixed[2].buf) + 4, got
    finally:
        if saved is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved
        _batch._torch_methods = None


def main():
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    print("1..%d" % len(tests))
    failed = 0
    for i, (name, fn) in enumerate(tests, 1):
        try:
            fn()
            print("ok %d - %s" % (i, name))
        except Exception:
            failed += 1
            print("not ok %d - %s" % (i, name))
            for line in traceback.format_exc().splitlines():
                print("# " + line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
