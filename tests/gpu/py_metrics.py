"""Metrics on the GPU (docs/operators.md "Metrics"): py_binding's Tiny
model (TP rank 1 of 2, fused qkv, padded vocabulary, tied head, a cast
norm) updated from CUDA tensors: the route bytes and the source bytes
equal the bytes the update loaded, the undo log's placement follows
undo_device_budget (device memory within it, pinned host without), a
commit and a rolled-back abort move the counters and the phases. Parsed
here without prometheus_client (the GPU venv may lack it)."""
import re

import torch

import refit

import py_binding as pb

_SERIES = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def series(text):
    """{(name, ((label, value), ...) without worker and rank): value}."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _SERIES.match(line)
        assert m, line
        labels = dict(_LABEL.findall(m.group(2)))
        assert labels.pop("worker") == "py-metrics" and labels.pop("rank") == str(pb.TP_RANK)
        out[(m.group(1), tuple(sorted(labels.items())))] = float(m.group(3))
    return out


def _build(budget):
    m = pb.Tiny()
    ctx = refit.Context(worker_id="py-metrics", rank=pb.TP_RANK, journal_path="",
                        undo_device_budget=budget)
    model = ctx.create_model()
    refit.register_module(
        model, m, fused={"qkv": [("q", 16), ("k", 4), ("v", 4)]},
        shard_dims={"embed": 0, "qkv": 0, "o": 1}, tp_rank=pb.TP_RANK, tp_size=pb.TP,
        padded={"embed": 30}, ckpt_dtype={"norm": torch.bfloat16},
        rename={"embed": "model.embed", "head": "lm_head"})
    model.seal()
    return m, ctx, model


def _on_device(ck):
    return {k: v.to(pb.DEV) for k, v in ck.items() if v is not None}


def test_metrics_of_device_updates():
    for budget, placement in ((1 << 20, "device"), (0, "host")):
        m, ctx, model = _build(budget)
        with model.update(version="v1") as txn:
            txn.load_dict(_on_device(pb.checkpoint(1)))
            loaded = txn.stats()["bytes_loaded"]
        torch.cuda.synchronize()
        pb.check(m, pb.checkpoint(1))
        s = series(ctx.metrics())
        routed = sum(v for (n, _), v in s.items() if n == "refit_route_bytes_total")
        assert loaded > 0 and routed == loaded, (routed, loaded)
        assert s[("refit_source_bytes_total", (("source", "memory"),))] == loaded
        assert s[("refit_updates_committed_total", ())] == 1
        assert s[("refit_version_info", (("version", "v1"),))] == 1
        # a second update, rolled back: the undo log in the placement asked for
        txn = model.begin(version="v2")
        txn.load_dict(_on_device(pb.checkpoint(2)))
        txn.abort()
        torch.cuda.synchronize()
        pb.check(m, pb.checkpoint(1))
        s = series(ctx.metrics())
        other = "host" if placement == "device" else "device"
        assert s[("refit_undo_bytes", (("placement", placement),))] > 0, (placement, s)
        assert s[("refit_undo_bytes", (("placement", other),))] == 0, (placement, s)
        assert s[("refit_rollbacks_total", ())] == 1
        assert s[("refit_updates_aborted_total", (("reason", "caller"),))] == 1
        assert s[("refit_updates_started_total", ())] == 2
        for phase in ("begin", "load", "post_load", "finalize", "journal"):
            assert s[("refit_update_phase_seconds_count", (("phase", phase),))] == 2, phase
        assert s[("refit_update_duration_seconds_count", (("outcome", "aborted"),))] == 1
        assert s[("refit_health", (("state", "ready"),))] == 1
        ctx.close()
