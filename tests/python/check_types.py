"""The binding's type hints (the package ships py.typed), checked by mypy
(pinned in scripts/requirements.txt): one TAP point, not ok with every
error mypy reports.

usage: check_types.py PACKAGE_DIR CACHE_DIR"""
import sys

from mypy import api


def main():
    pkg, cache = sys.argv[1], sys.argv[2]
    out, err, status = api.run(["--ignore-missing-imports", "--cache-dir", cache, pkg])
    print("1..1")
    if status == 0:
        print("ok 1 - mypy finds no error in %s" % pkg)
        return 0
    print("not ok 1 - mypy: %s" % (out.strip().splitlines() or [err.strip()])[-1])
    for line in (out + err).splitlines():
        print("# " + line)
    return 1


if __name__ == "__main__":
    sys.exit(main())
