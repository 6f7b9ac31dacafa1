#!/usr/bin/env python3
"""The NCCL transport on two GPUs through the Python binding (docs/nccl.md),
two processes per scenario, TAP on stdout.

A. trainer_to_worker: a trainer on GPU 0 broadcasts to a worker on GPU 1
   holding a transformers LlamaForCausalLM (small config, random init,
   BF16) with a CUDA graph of a forward captured once. After each reload the
   replayed logits equal, bit for bit, a fresh model's built from the same
   weights; 1 MiB, 64 MiB and 1 GiB buckets give identical bytes; a trainer
   that cancels (a tensor it cannot pack) and an update the worker refuses
   (a tensor it does not expect) both roll back to the previous logits
   exactly; no parameter's data_ptr moves.
B. group_vote: two worker ranks (GPU 0, GPU 1) each load their own tensors;
   rank 1 fails its finalize on purpose (a partly delivered module, then a
   local status), refit_group_finalize aborts BOTH with rollback, journaled
   on both, READY, bytes and logits as before; then both pass and both
   commit.

Where torch, two CUDA devices or librefit are missing it prints a skipped
plan ("1..0 # SKIP ..."); without transformers, scenario A's checks are
skipped one by one.

Usage: python3 tests/nccl/py_nccl2.py [A|B ...]
Env: REFIT_LIB (librefit.so), REFIT_PLUGIN_PATH (the unquantized plugin),
NCCL2_OUT (a folder for the journals; default a temporary one),
NCCL2_TIMEOUT (seconds per scenario, default 300).
"""
import os
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("REFIT_SOURCE_ROOT") or os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

MIB = 1 << 20
# each refit wait (communicator creation, an update, the vote)
WAIT = float(os.environ.get("NCCL2_WAIT", "60"))


class Skip(Exception):
    pass


# ---- the model (as tests/gpu/py_llama.py builds it) ----

def config():
    try:
        from transformers import LlamaConfig
    except ImportError as e:
        raise Skip("transformers not installed: %s" % e)
    return LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=704,
                       num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4,
                       max_position_embeddings=128, tie_word_embeddings=False,
                       attn_implementation="sdpa")


def fresh(cfg, seed, dev):
    """Random init on the CPU from seed (the same bytes in every process),
    then BF16 on dev."""
    import torch
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(device=dev, dtype=torch.bfloat16).eval()


def weights(cfg, seed, dev):
    return {k: v.detach().contiguous() for k, v in fresh(cfg, seed, dev).state_dict().items()}


def logits_eager(model, ids):
    import torch
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.clone()


class Graphed:
    """A CUDA graph of model(ids).logits, captured once."""

    def __init__(self, model, ids):
        import torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(2):
                model(input_ids=ids, use_cache=False)
        torch.cuda.current_stream().wait_stream(s)
        self.g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.g), torch.no_grad():
            self.out = model(input_ids=ids, use_cache=False).logits

    def __call__(self):
        import torch
        self.g.replay()
        torch.cuda.synchronize()
        return self.out.clone()


def same_logits(out, ref_model, ids):
    """Bit-equal to a fresh model's logits (eager, else its own graph: the
    two paths may pick different kernels; the weights are what is checked)."""
    import torch
    if torch.equal(out, logits_eager(ref_model, ids)):
        return True
    return torch.equal(out, Graphed(ref_model, ids)())


def param_bytes(model):
    import torch
    return torch.cat([p.detach().reshape(-1).view(torch.uint8) for p in model.parameters()])


def journal_rows(path):
    """(state, version) of the newest update and its events' "[kind] msg"
    lines; None when Python has no sqlite3."""
    try:
        import sqlite3
    except ImportError:
        return None
    db = sqlite3.connect("file:%s?mode=ro" % path, uri=True, timeout=10)
    try:
        uid, state, version = db.execute(
            "SELECT id, state, version FROM updates ORDER BY id DESC LIMIT 1").fetchone()
        ev = ["[%s] %s" % r for r in db.execute(
            "SELECT kind, message FROM events WHERE update_id = ? ORDER BY id", (uid,))]
    finally:
        db.close()
    return state, version, ev


# ---- per-process plumbing: checks go back to the parent ----

class Report:
    def __init__(self, q, rank):
        self.q, self.rank = q, rank

    def check(self, name, ok, detail=""):
        self.q.put(("check", self.rank, name, bool(ok), str(detail)[:2000]))

    def skip(self, name, why):
        self.q.put(("skip", self.rank, name, True, why))


def expect_error(fn, name):
    """Runs fn; returns the RefitError's status name ('' when it succeeded)."""
    import refit
    try:
        fn()
    except refit.RefitError as e:
        return e.name, str(e)
    return "", "succeeded"


def open_rank(rank, ids_q, worker_id, journal):
    """Context, device, and the NCCL transport (rank 0 makes the unique id)."""
    import torch
    import refit
    from refit import transport as T
    torch.cuda.set_device(rank)
    ctx = refit.Context(worker_id=worker_id, rank=rank, journal_path=journal)
    if rank == 0:
        uid = T.nccl_unique_id(ctx)
        ids_q.put(uid)
    else:
        uid = ids_q.get(timeout=WAIT)
    x = T.Transport.nccl(ctx, device=rank, unique_id=uid, nranks=2, rank=rank, timeout=WAIT)
    return ctx, x


def served_model(ctx, cfg, dev):
    """The engine's model (seed 0), registered, cold-started with its own
    weights."""
    import refit
    model = fresh(cfg, 0, dev)
    rm = ctx.create_model()
    refit.register_module(rm, model)
    rm.seal()
    with rm.update(version="init") as txn:
        txn.load_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
    return model, rm


# ---- A: trainer (GPU 0) to worker (GPU 1) ----

# (label, seed, bucket bytes, what happens): seeds 1 and 0 alternate so
# every reload changes bytes; the same seed 1 goes over three bucket sizes
A_STEPS = [("w1-1m", 1, MIB, "ok"), ("w0-a", 0, 64 * MIB, "ok"),
           ("w1-64m", 1, 64 * MIB, "ok"), ("w0-b", 0, 0, "ok"),
           ("w1-direct", 1, 64 * MIB, "ok"), ("w0-direct", 0, 1 << 30, "ok"),
           ("w1-1g", 1, 1 << 30, "ok"), ("cancel", 2, MIB, "cancel"),
           ("refuse", 2, MIB, "refuse")]
# the "-direct" steps send tensors of 256 KiB and more from themselves
# (Sender(direct_min_bytes=...)), in buckets of their own: the embedding,
# the head and the MLP weights of config()'s model; q/k/v/o stay packed
DIRECT_MIN = 256 << 10


def a_trainer(rep, ids_q, out_dir):
    import torch
    from refit import transport as T
    from refit.torch_util import describe
    cfg = config()
    ctx, x = open_rank(0, ids_q, "trainer", "")
    buckets = {}
    for label, seed, bucket, what in A_STEPS:
        sd = weights(cfg, seed, "cuda:0")
        direct = label.endswith("-direct")
        s = T.Sender(x, label=label, bucket_bytes=bucket, timeout=WAIT,
                     direct_min_bytes=DIRECT_MIN if direct else 0)
        try:
            for k, v in sd.items():
                s.add(k, v)
            if what == "cancel":
                # last in the order, so earlier buckets are already loaded
                # on the worker when packing this one fails
                d = describe(torch.ones(4096, dtype=torch.bfloat16, device="cuda:0"))
                d.t.device.device_type = 99  # no backend reads it
                s.add_descriptor("model.norm.weight.unreadable", d)
            if what == "refuse":
                s.add("model.extra.weight", torch.ones(4096, dtype=torch.bfloat16,
                                                       device="cuda:0"))
            if what == "ok":
                res = s.send()
                rep.check("A trainer: %s committed on every rank" % label,
                          res["decision"] == 0, res)
                buckets[label] = res["buckets"]
                if label == "w1-direct":  # the big tensors took buckets of their own
                    rep.check("A trainer: w1-direct sent more buckets than w1-64m",
                              res["buckets"] > buckets.get("w1-64m", res["buckets"]),
                              (res["buckets"], buckets.get("w1-64m")))
            else:
                want = "REFIT_EUNSUPPORTED" if what == "cancel" else "REFIT_EUNEXPECTED"
                got, msg = expect_error(s.send, label)
                rep.check("A trainer: %s aborted with %s" % (label, want), got == want, msg)
        finally:
            s.close()
    x.close()
    ctx.close()


def a_worker(rep, ids_q, out_dir):
    import torch
    import refit
    from refit import transport as T
    cfg = config()
    journal = os.path.join(out_dir, "a-worker1.db")
    ctx, x = open_rank(1, ids_q, "worker1", journal)
    dev = "cuda:1"
    model, rm = served_model(ctx, cfg, dev)
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    ids = torch.randint(0, cfg.vocab_size, (2, 48), device=dev,
                        generator=torch.Generator(device=dev).manual_seed(5))
    graph = Graphed(model, ids)
    before = graph()
    r = T.Receiver(rm, x, timeout=WAIT, start_timeout=WAIT)
    ref = {s: fresh(cfg, s, dev) for s in (0, 1)}
    good, good_logits, good_label = None, None, None
    for label, seed, bucket, what in A_STEPS:
        if what == "ok":
            res = r.receive_update(rollback=True)
            out = graph()
            rep.check("A worker: %s committed (label from the sender)" % label,
                      res["decision"] == 0 and ctx.version == label, (res, ctx.version))
            rep.check("A worker: %s graph logits == fresh model's, bit for bit" % label,
                      same_logits(out, ref[seed], ids))
            rep.check("A worker: %s parameters == fresh model's" % label,
                      torch.equal(param_bytes(model), param_bytes(ref[seed])))
            if seed == 0:
                rep.check("A worker: %s logits == the cold start's" % label,
                          torch.equal(out, before))
            if seed == 1 and good is None:
                good, good_logits = param_bytes(model).clone(), out
            elif seed == 1:
                rep.check("A worker: %s bucket size gives identical bytes to 1 MiB's" % label,
                          torch.equal(param_bytes(model), good)
                          and torch.equal(out, good_logits))
            good_label = label
            continue
        want = "REFIT_EUNSUPPORTED" if what == "cancel" else "REFIT_EUNEXPECTED"
        got, msg = expect_error(lambda: r.receive_update(rollback=True), label)
        rep.check("A worker: %s aborted with %s" % (label, want), got == want, msg)
        rep.check("A worker: %s rolled back: READY at %s" % (label, good_label),
                  ctx.health() == refit.Health.READY and ctx.version == good_label,
                  (ctx.health(), ctx.version))
        rep.check("A worker: %s rolled back: previous logits exactly" % label,
                  torch.equal(graph(), good_logits))
        rep.check("A worker: %s rolled back: previous bytes" % label,
                  torch.equal(param_bytes(model), good))
        j = journal_rows(journal)
        if j is None:
            rep.skip("A worker: %s journaled rolled_back" % label, "python has no sqlite3")
        else:
            rep.check("A worker: %s journaled rolled_back" % label, j[0] == "rolled_back", j)
    rep.check("A worker: no parameter's data_ptr moved",
              ptrs == {n: p.data_ptr() for n, p in model.named_parameters()})
    r.close()
    x.close()
    rm.destroy()
    ctx.close()


# ---- B: two worker ranks, one vote ----

def b_rank(rank, rep, ids_q, out_dir):
    import torch
    import refit
    from refit import transport as T
    cfg = config()
    dev = "cuda:%d" % rank
    journal = os.path.join(out_dir, "b-worker%d.db" % rank)
    ctx, x = open_rank(rank, ids_q, "worker%d" % rank, journal)
    model, rm = served_model(ctx, cfg, dev)
    ids = torch.randint(0, cfg.vocab_size, (2, 32), device=dev,
                        generator=torch.Generator(device=dev).manual_seed(7))
    graph = Graphed(model, ids)
    before, before_bytes = graph(), param_bytes(model).clone()
    new = weights(cfg, 1, dev)
    items = list(new.items())
    who = "B rank %d:" % rank

    def failing(case):
        txn = rm.begin(version="b-" + case, rollback=True)
        local = 0
        if rank == 0 or case == "local":
            txn.load_dict(new)
        else:  # half the tensors and the first rows of one more: incomplete
            for k, v in items[0::2]:
                txn.load(k, v)
            k, v = items[1]
            txn.load_part(k, 0, v[: v.shape[0] // 2])
        if rank == 1 and case == "local":
            local = -17  # REFIT_ECORRUPT: the engine's own verdict on what it got
        want = "REFIT_EINCOMPLETE" if case == "prepare" else "REFIT_ECORRUPT"
        got, msg = expect_error(lambda: T.group_finalize(x, txn, local), case)
        rep.check("%s rank 1 fails (%s): this rank aborts with %s" % (who, case, want),
                  got == want, msg)
        rep.check("%s %s: READY at init" % (who, case),
                  ctx.health() == refit.Health.READY and ctx.version == "init",
                  (ctx.health(), ctx.version))
        rep.check("%s %s: bytes and graph logits as before" % (who, case),
                  torch.equal(param_bytes(model), before_bytes) and torch.equal(graph(), before))
        j = journal_rows(journal)
        if j is None:
            rep.skip("%s %s: journaled" % (who, case), "python has no sqlite3")
        else:
            voted = "rank 1 of 2 voted %s" % want
            rep.check("%s %s: journaled rolled_back with the vote" % (who, case),
                      j[0] == "rolled_back" and any(voted in e for e in j[2]), j)

    failing("prepare")
    failing("local")
    txn = rm.begin(version="b-ok", rollback=True)
    txn.load_dict(new)
    res = T.group_finalize(x, txn)
    rep.check("%s every rank passes: committed" % who,
              res["decision"] == 0 and res["vote_taken"] == 1 and ctx.version == "b-ok",
              (res, ctx.version))
    ref = fresh(cfg, 1, dev)
    rep.check("%s every rank passes: bytes and graph logits of the new weights" % who,
              torch.equal(param_bytes(model), param_bytes(ref)) and same_logits(graph(), ref, ids))
    j = journal_rows(journal)
    if j is None:
        rep.skip("%s every rank passes: journaled committed" % who, "python has no sqlite3")
    else:
        rep.check("%s every rank passes: journaled committed" % who, j[0] == "committed", j)
    x.close()
    rm.destroy()
    ctx.close()


def b_rank0(rep, ids_q, out_dir):
    b_rank(0, rep, ids_q, out_dir)


def b_rank1(rep, ids_q, out_dir):
    b_rank(1, rep, ids_q, out_dir)


SCENARIOS = {"A": (a_trainer, a_worker), "B": (b_rank0, b_rank1)}


def rank_entry(fn, rank, q, ids_q, out_dir):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    rep = Report(q, rank)
    try:
        fn(rep, ids_q, out_dir)
    except Skip as e:
        q.put(("skip-all", rank, "", True, str(e)))
    except Exception:
        q.put(("crash", rank, "", False, traceback.format_exc()))
    q.put(("done", rank, "", True, ""))


def run_scenario(mp, key, out_dir, limit):
    """Both ranks of a scenario in their own processes; their reports."""
    ctx = mp.get_context("spawn")
    q, ids_q = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=rank_entry, args=(fn, r, q, ids_q, out_dir))
             for r, fn in enumerate(SCENARIOS[key])]
    for p in procs:
        p.start()
    reports, done, end = [], 0, time.time() + limit
    while done < 2 and time.time() < end:
        try:
            m = q.get(timeout=1.0)
        except Exception:
            if not any(p.is_alive() for p in procs):
                break
            continue
        if m[0] == "done":
            done += 1
        else:
            reports.append(m)
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
            reports.append(("crash", -1, "", False, "%s: a rank did not finish in %d s" %
                            (key, limit)))
        elif p.exitcode:
            reports.append(("crash", -1, "", False, "%s: a rank exited with %s" %
                            (key, p.exitcode)))
    return reports


def why_skip():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return "%d CUDA device(s); two are needed" % (
            torch.cuda.device_count() if torch.cuda.is_available() else 0)
    try:
        import refit
        from refit import transport as T
        c = refit.Context()
        T.nccl_probe(c)
        c.close()
    except Exception as e:
        return "librefit or NCCL unusable: %s" % e
    return None


def main():
    reason = why_skip()
    if reason:
        print("1..0 # SKIP %s" % reason)
        return 0
    import torch.multiprocessing as mp
    keys = [a for a in sys.argv[1:] if a in SCENARIOS] or sorted(SCENARIOS)
    out_dir = os.environ.get("NCCL2_OUT") or tempfile.mkdtemp(prefix="nccl2-")
    os.makedirs(out_dir, exist_ok=True)
    limit = float(os.environ.get("NCCL2_TIMEOUT", "300"))
    lines = []
    for key in keys:
        t0 = time.time()
        for kind, rank, name, ok, detail in run_scenario(mp, key, out_dir, limit):
            if kind == "check":
                lines.append((ok, name, None if ok else detail))
            elif kind == "skip":
                lines.append((True, name + " # SKIP " + detail, None))
            elif kind == "skip-all":
                lines.append((True, "%s rank %d # SKIP %s" % (key, rank, detail), None))
            else:
                lines.append((False, "%s rank %d crashed" % (key, rank), detail))
        lines.append((True, "%s finished in %.1f s" % (key, time.time() - t0), None))
    print("1..%d" % len(lines))
    for i, (ok, name, detail) in enumerate(lines, 1):
        print("%s %d - %s" % ("ok" if ok else "not ok", i, name))
        for ln in (detail or "").splitlines():
            print("# " + ln)
    print("# journals in %s" % out_dir)
    return 0 if all(ok for ok, _, _ in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
