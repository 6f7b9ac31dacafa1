"""refitctl fleet over journals written by real refit updates (TAP): three
workers through the binding on the host backend, two ranks of one group
holding different versions and a worker POISONED by an abort without
rollback; the table, the JSON, the exit status, a DIR searched, and files
that are not journals or cannot be read.

usage: test_fleet.py BINDINGS_DIR   (env: REFIT_LIB, REFIT_BUILD_ROOT)"""
import ctypes
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

sys.path.insert(0, sys.argv[1])
import refit  # noqa: E402
from refit import torch_util  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import harness  # noqa: E402

CTL = os.path.join(os.environ.get("REFIT_BUILD_ROOT", "build"), "tools", "refitctl")
TMP = tempfile.mkdtemp(prefix="refit-fleet-")


class HostTensor:
    """n f32 values in host memory, described as the binding reads them."""

    def __init__(self, n, fill):
        self.shape = (n,)
        self.buf = (ctypes.c_float * n)(*[fill + i for i in range(n)])

    def _refit_desc(self):
        return torch_util.Desc(ctypes.addressof(self.buf), 1, 0, (2, 32), self.shape, (1,), self)


class Worker:
    """One engine worker: a context on a journal, one module of 8 floats."""

    def __init__(self, journal, worker_id, rank):
        self.ctx = refit.Context(worker_id=worker_id, rank=rank, journal_path=journal)
        self.model = self.ctx.create_model()
        self.runtime = HostTensor(8, 0.0)
        self.model.add_module("layer")
        self.model.bind_runtime("layer", "w", self.runtime)
        self.model.expect("layer", "layer.w", "f32", [8])
        self.model.seal()

    def commit(self, version):
        with self.model.update(version=version) as txn:
            txn.load("layer.w", HostTensor(8, 1.0))

    def poison(self, version):
        txn = self.model.begin(version=version, rollback=False)
        txn.load("layer.w", HostTensor(8, 2.0))
        assert txn.abort("the trainer went away") is False
        assert self.ctx.health() == refit.Health.POISONED


def build_fleet():
    """host-a/tp.db: ranks 0 and 1 of one group, rank 0 one version ahead;
    host-b/solo.db: a worker POISONED after v1. Plus files a DIR search must
    pass over: notes, another application's SQLite file."""
    for d in ("fleet/host-a", "fleet/host-b", "fleet/host-b/other"):
        os.makedirs(os.path.join(TMP, d), exist_ok=True)
    tp = os.path.join(TMP, "fleet/host-a/tp.db")
    solo = os.path.join(TMP, "fleet/host-b/solo.db")
    r0, r1, s = Worker(tp, "tp-r0", 0), Worker(tp, "tp-r1", 1), Worker(solo, "solo", 0)
    for w in (r0, r1, s):
        w.commit("v1")
    r0.commit("v2")
    s.poison("v2")
    with open(os.path.join(TMP, "fleet/host-b/notes.txt"), "w") as f:
        f.write("not a journal\n")
    db = sqlite3.connect(os.path.join(TMP, "fleet/host-b/other/app.db"))
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    return [r0, r1, s], tp, solo


WORKERS, TP, SOLO = build_fleet()


# refitctl's own environment: under a sanitizer it carries its runtime
# linked in (not the one preloaded into this python), and its leaks count.
CTL_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
if "ASAN_OPTIONS" in CTL_ENV:
    CTL_ENV["ASAN_OPTIONS"] = "detect_leaks=1"


def without_age(table):
    """The table with each worker row's last column (AGE, seconds since
    its heartbeat, which moves between two runs) cut off."""
    lines = table.splitlines()
    h = next(i for i, l in enumerate(lines) if l.startswith("FLAG"))
    return lines[:h + 1] + [l.rsplit(None, 1)[0] for l in lines[h + 1:-1]] + lines[-1:]


def ctl(*args):
    p = subprocess.run([CTL, "fleet"] + list(args), capture_output=True, text=True, env=CTL_ENV)
    return p.returncode, p.stdout, p.stderr


def test_table_flags_the_mixed_group_first_and_the_poisoned_worker():
    rc, out, err = ctl(SOLO, TP)
    assert rc == 1, (rc, out, err)
    assert err == "", err
    lines = out.splitlines()
    assert lines[0].startswith("MIXED group %s: " % TP), lines[0]
    assert "v2 on 1 worker" in lines[0] and "v1 on 1 worker" in lines[0], lines[0]
    assert lines[1].startswith("POISONED worker solo (rank 0, host "), lines[1]
    assert lines[1].endswith("in %s: update 2 failed" % SOLO), lines[1]
    head = lines[2].split()
    assert head[:7] == ["FLAG", "GROUP", "HOST", "WORKER", "RANK", "VERSION", "HEALTH"], head
    rows = [l.split() for l in lines[3:6]]
    # the mixed group first though named last; by rank within it
    assert [r[0] for r in rows[:2]] == ["MIXED", "MIXED"], rows
    assert [(r[3], r[4], r[5], r[6], r[7], r[8]) for r in rows[:2]] == [
        ("tp-r0", "0", "v2", "ready", "3", "committed"),
        ("tp-r1", "1", "v1", "ready", "2", "committed")], rows
    assert rows[2][2:8] == ["solo", "0", "v1", "POISONED", "2", "failed"], rows[2]
    assert rows[2][0].endswith("solo.db"), rows[2]  # no flag: one column less
    for r in rows:
        assert r[-1].endswith("s") and int(r[-1][:-1]) < 600, r
    assert lines[6] == "3 workers in 2 groups (2 journals): 1 POISONED, 1 group mixed", lines[6]
    assert len(lines) == 7, lines
    assert all(len(l) <= 100 for l in lines[2:6]), lines  # the table; paths are whole


def test_json_for_scripts():
    rc, out, err = ctl("--json", TP, SOLO)
    assert rc == 1, (rc, out, err)
    d = json.loads(out)
    assert d["ok"] is False and d["poisoned"] == 1 and d["mixed_groups"] == 1, d
    assert d["journals"] == 2 and d["errors"] == [] and "error" not in d, d
    assert d["groups"] == [
        {"group": TP, "mixed": True, "workers": 2, "versions": {"v2": 1, "v1": 1}},
        {"group": SOLO, "mixed": False, "workers": 1, "versions": {"v1": 1}}], d["groups"]
    w = {x["worker"]: x for x in d["workers"]}
    assert [x["worker"] for x in d["workers"]] == ["tp-r0", "tp-r1", "solo"], d["workers"]
    assert w["tp-r0"]["version"] == "v2" and w["tp-r1"]["version"] == "v1", w
    assert w["tp-r0"]["mixed"] and w["tp-r1"]["mixed"] and not w["solo"]["mixed"], w
    assert w["solo"]["health"] == "poisoned" and w["solo"]["poisoned"], w["solo"]
    assert not w["tp-r0"]["poisoned"] and w["tp-r0"]["health"] == "ready", w["tp-r0"]
    assert w["tp-r1"]["rank"] == 1 and w["solo"]["journal"] == SOLO, w
    last = w["solo"]["last_update"]
    assert last["id"] == 2 and last["state"] == "failed", last
    assert "the trainer went away" in last["error"], last
    assert last["ended_at"] >= last["started_at"], last
    assert w["tp-r0"]["last_update"]["id"] == 3, w["tp-r0"]
    assert w["tp-r0"]["last_update"]["state"] == "committed", w["tp-r0"]
    assert w["tp-r0"]["last_update"]["error"] is None, w["tp-r0"]
    for x in d["workers"]:
        assert 0 <= x["age_s"] < 600 and x["alive"] and x["pid"] == os.getpid(), x
        assert x["host"] == os.uname().nodename, x


def test_exit_status_is_a_probe():
    # one group with two versions: 1; one poisoned worker: 1
    assert ctl(TP)[0] == 1
    assert ctl(SOLO)[0] == 1
    # the same group once its ranks agree: 0
    healthy = os.path.join(TMP, "healthy.db")
    a, b = Worker(healthy, "h-r0", 0), Worker(healthy, "h-r1", 1)
    a.commit("v7")
    b.commit("v7")
    rc, out, err = ctl(healthy)
    assert rc == 0, (rc, out, err)
    assert "MIXED" not in out and "POISONED w" not in out, out
    assert [l.split()[5] for l in out.splitlines()[1:3]] == ["ready", "ready"], out
    assert out.splitlines()[-1] == "2 workers in 1 group (1 journal): 0 POISONED, 0 groups mixed"
    d = json.loads(ctl("--json", healthy)[1])
    assert d["ok"] is True and d["groups"][0]["versions"] == {"v7": 2}, d
    b.commit("v8")
    assert ctl(healthy)[0] == 1


def test_a_folder_is_searched_for_journals():
    rc, out, err = ctl("--json", os.path.join(TMP, "fleet"))
    assert rc == 1 and err == "", (rc, err)
    d = json.loads(out)
    # notes.txt, other/app.db, the -wal/-shm/-writers files: passed over
    assert d["journals"] == 2 and d["errors"] == [], d
    assert sorted(x["worker"] for x in d["workers"]) == ["solo", "tp-r0", "tp-r1"], d
    assert {x["journal"] for x in d["workers"]} == {TP, SOLO}, d
    # the same table as naming the files; a journal named twice is read once
    # (AGE, each row's last column, may tick between the two runs: compared without it)
    rc2, out2, _ = ctl(TP, os.path.join(TMP, "fleet"), SOLO)
    rc3, out3, _ = ctl(SOLO, TP)
    assert (rc2, without_age(out2)) == (rc3, without_age(out3)), (out2, out3)


def test_group_by_name_joins_one_group_across_hosts():
    a = os.path.join(TMP, "hosts/a/g.db")
    b = os.path.join(TMP, "hosts/b/g.db")
    os.makedirs(os.path.dirname(a))
    os.makedirs(os.path.dirname(b))
    wa, wb = Worker(a, "g-r0", 0), Worker(b, "g-r1", 1)
    wa.commit("v1")
    wb.commit("v1")
    assert ctl(os.path.join(TMP, "hosts"), "--group-by", "name")[0] == 0
    wb.commit("v2")
    # each file alone is one version; by name they are one mixed group
    rc, out, _ = ctl(os.path.join(TMP, "hosts"))
    assert rc == 0, out
    rc, out, _ = ctl(os.path.join(TMP, "hosts"), "--group-by=name")
    assert rc == 1 and out.startswith("MIXED group g.db: "), out
    d = json.loads(ctl("--json", "--group-by", "name", a, b)[1])
    assert d["groups"] == [{"group": "g.db", "mixed": True, "workers": 2,
                            "versions": {"v1": 1, "v2": 1}}], d
    rc, out, err = ctl(a, "--group-by", "host")
    assert rc == 2 and "--group-by is file or name, not 'host'" in err, err


def test_bad_files_are_named_and_the_rest_still_shown():
    garbage = os.path.join(TMP, "garbage.db")
    with open(garbage, "wb") as f:
        f.write(bytes(range(256)) * 4)
    other = os.path.join(TMP, "fleet/host-b/other/app.db")
    missing = os.path.join(TMP, "missing.db")
    empty = os.path.join(TMP, "empty")
    os.makedirs(empty)
    rc, out, err = ctl(TP, garbage, other, missing, empty)
    assert rc == 1, (rc, out, err)
    errs = err.splitlines()
    assert errs[0] == "refitctl fleet: journal %s: reading the schema: file is not a " \
        "database (sqlite 26); the file is not a SQLite database" % garbage, errs
    assert errs[1].startswith("refitctl fleet: journal %s: not a refit journal" % other), errs
    assert errs[2] == "refitctl fleet: %s: No such file or directory" % missing, errs
    assert errs[3] == "refitctl fleet: %s: no refit journal found in this folder " \
        "(nor below it)" % empty, errs
    assert len(errs) == 4, errs
    # the journal that could be read is still shown
    assert "tp-r0" in out and out.splitlines()[-1].startswith("2 workers in 1 group"), out
    rc, out, _ = ctl("--json", garbage, TP)
    d = json.loads(out)
    assert rc == 1 and d["status"] == 1 and d["command"] == "refitctl fleet", d
    assert d["error"].startswith("journal %s: " % garbage), d
    assert [e["path"] for e in d["errors"]] == [garbage], d
    assert len(d["workers"]) == 2, d
    # a journal unchanged by reading it
    before = open(TP, "rb").read()
    ctl(TP)
    assert open(TP, "rb").read() == before


def test_an_unreadable_journal_is_named():
    locked_as = []
    if os.geteuid() == 0:  # root reads anything: read as nobody instead
        if not shutil.which("setpriv"):
            print("# no setpriv: root cannot be refused a file here")
            return
        locked_as = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    locked = os.path.join(TMP, "locked.db")
    shutil.copy(SOLO, locked)
    os.chmod(locked, 0)
    os.chmod(TMP, 0o755)
    p = subprocess.run(locked_as + [CTL, "fleet", locked], capture_output=True, text=True,
                       env=CTL_ENV)
    assert p.returncode == 1, p
    assert p.stderr == "refitctl fleet: journal %s: cannot open: unable to open database " \
        "file (sqlite 14, os: Permission denied)\n" % locked, p.stderr


def test_usage():
    rc, out, err = ctl()
    assert rc == 2 and "give at least one JOURNAL or DIR" in err, err
    rc, out, err = ctl("--help")
    assert rc == 0 and out.startswith("usage: refitctl fleet ") and err == "", (out, err)


try:
    harness.run(globals())
finally:
    shutil.rmtree(TMP, ignore_errors=True)
