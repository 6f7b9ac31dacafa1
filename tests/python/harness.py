"""What the binding's Python tests share (test_binding.py,
test_hardening.py, test_moe.py; imported from their folder, which Python
puts on sys.path for a script, after they put bindings/python there): the
TAP runner, and raises() for a call refit must refuse."""
import sys
import traceback

import refit


def run(namespace, last=None):
    """Run the functions test_* of namespace (a module's globals()) in name
    order (last: that one last) and print TAP: a failing one prints "not
    ok" and its traceback as comments, and the run goes on. Returns 0."""
    tests = [(n, f) for n, f in sorted(namespace.items()) if n.startswith("test_")]
    if last is not None:
        tests.sort(key=lambda t: t[0] == last)
    print("1..%d" % len(tests), flush=True)
    for i, (name, fn) in enumerate(tests, 1):
        try:
            fn()
        except Exception:
            print("not ok %d - %s" % (i, name))
            for line in traceback.format_exc().splitlines():
                print("# " + line)
            sys.stdout.flush()
            continue
        print("ok %d - %s" % (i, name), flush=True)
    return 0


def raises(status, fn, *words):
    """fn() raises refit.RefitError status whose message has every word;
    returns the error."""
    try:
        fn()
    except refit.RefitError as err:
        assert err.name == status, "%s, not %s: %s" % (err.name, status, err)
        for w in words:
            assert w in err.message, "%r not in %r" % (w, err.message)
        return err
    raise AssertionError("no RefitError %s" % status)
