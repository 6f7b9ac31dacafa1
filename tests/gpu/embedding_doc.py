"""What the GPU tests of docs/embedding.md share (py_embedding.py and
py_moe.py; not a py_* module, so run_py.py collects no tests here): the
guide's `python run:NAME` blocks, read out of the file and executed, and
an engine's forward captured once in a CUDA graph. Imported from
tests/gpu/ (run_py.py puts it on sys.path; so does Python for a script
there)."""
import os
import re

import torch

ROOT = os.environ.get("REFIT_SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")
GUIDE = os.path.join(ROOT, "docs", "embedding.md")


class Skip(Exception):
    """What a test cannot check here (run_py.py reports it skipped)."""


def blocks():
    """Every `python run:NAME` block of the guide: {NAME: code}."""
    with open(GUIDE, encoding="utf-8") as f:
        text = f.read()
    return dict(re.findall(r"```python run:(\w+)\n(.*?)```", text, re.S))


def run(code, names, module):
    """A namespace (__name__ module) with the blocks names of code (from
    blocks()) executed in order."""
    ns = {"__name__": module}
    for n in names:
        exec(compile(code[n], "%s:%s" % (GUIDE, n), "exec"), ns)
    return ns


def graphed(model, ids):
    """model's forward captured in a CUDA graph: (replay -> logits)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        model(input_ids=ids, use_cache=False)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = model(input_ids=ids, use_cache=False).logits

    def replay():
        graph.replay()
        torch.cuda.synchronize()
        return out.clone()
    return replay
