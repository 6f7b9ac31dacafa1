"""PyTorch glue: the caller's stream, and registering a torch.nn.Module's
parameters and buffers by name with a structural mapping (unquantized,
fused targets, TP shards, tied names, padded rows). Imports torch only when
a torch object is handed in. Descriptors live in refit.tensors."""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from . import moe
from .tensors import Desc, DTypeLike, describe, refit_dtype  # noqa: F401  (their old home)


_raw_stream: Optional[Callable[[int], int]] = None  # device index -> its current stream


def default_stream(model_device: Optional[Tuple[int, int]], desc: Any = None
                   ) -> Optional[ctypes.c_void_p]:
    """The caller's current torch stream on the model's device (NULL when
    the model has no device tensor or torch is not loaded)."""
    global _raw_stream
    if model_device is None:
        return None
    get = _raw_stream
    if get is None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return None
        s = torch.cuda.current_stream(model_device[1]).cuda_stream  # initializes CUDA
        # from now on torch's own look-up, without a torch.cuda.Stream made
        _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda i: torch.cuda.current_stream(i).cuda_stream)
    else:
        s = get(model_device[1])
    return ctypes.c_void_p(s) if s else None


def _local_rows(n: int, rank: int, size: int) -> int:
    """This rank's rows of n split over size ranks (lower ranks first), as
    refit splits them."""
    return n // size + (1 if rank < n % size else 0)


FusedSpec = Union[List[Tuple[str, int]], Dict[str, Any]]


def register_module(model: Any, module: Any, *, prefix: str = "",
                    rename: Union[None, Mapping[str, str], Callable[[str], str]] = None,
                    fused: Optional[Mapping[str, FusedSpec]] = None,
                    shard_dims: Optional[Mapping[str, int]] = None,
                    tp_rank: int = 0, tp_size: int = 1,
                    padded: Optional[Mapping[str, int]] = None,
                    ckpt_dtype: Union[None, DTypeLike, Mapping[str, DTypeLike]] = None,
                    format: str = "unquantized", side_buffers: bool = True,
                    skip: Optional[Callable[[str], bool]] = None,
                    experts: Any = None, expert_tp: Optional[Tuple[int, int]] = None,
                    expert_ckpt: str = "per_expert",
                    expert_names: Optional[Tuple[str, str, str]] = None) -> Dict[str, str]:
    """Register every parameter and persistent buffer of a torch.nn.Module.

    Each runtime tensor becomes a module named by its qualified name, with
    one runtime tensor "w" and the checkpoint tensors that fill it:

      rename(name) or rename[name]: its checkpoint name (default: the name).
      fused[name] = [(ckpt_name, rows), ...] or {"dim": d, "parts": [...]}:
          the runtime is the concatenation of these checkpoint tensors along
          dim d (0 by default), e.g. qkv or gate_up; rows are full,
          unsharded extents.
      shard_dims[name] = d: tensor parallel; this rank (tp_rank of tp_size)
          holds its slice of dim d of the checkpoint tensor(s).
      padded[name] = real: the checkpoint has `real` rows along the shard
          dim (dim 0 when not sharded); the runtime's extra rows are padding,
          zeroed at every load.
      ckpt_dtype: a dtype (or name -> dtype) of the checkpoint when it
          differs from the runtime's; the module then casts ("cast: true").
      Names under which one Parameter appears again (tied weights) become
          tie_of names of the first: one storage, written once.
      Non-persistent buffers are registered as side tensors (their addresses
          are verified, their bytes never written) when side_buffers is set.
      skip(name) -> True leaves a tensor out.

    Stacked experts (refit.moe): transformers 5's experts.gate_up_proj
    [E, 2I, H] / experts.down_proj [E, H, I] and vLLM FusedMoE's w13_weight /
    w2_weight (with w13_weight_scale_inv etc. for FP8) become one module per
    stacked parameter, filled from checkpoints that name each expert
    (expert_ckpt="per_expert", the hub layout save_pretrained writes):
    PREFIX.{e}.gate_proj.weight, ... where PREFIX is the experts module's
    path through rename (a transformers model's family renames it as
    save_pretrained does: Mixtral's block_sparse_moe, w1/w3/w2);
    expert_names=(gate, up, down) overrides the projection names.
    expert_ckpt="stacked": the checkpoint holds the stacks whole under the
    live names (transformers' save_original_format=False, a trainer's
    state_dict; vLLM's w13_weight/w2_weight from PREFIX.gate_up_proj /
    PREFIX.down_proj). experts: this rank's experts (refit.moe.ExpertMap,
    vLLM's expert_map, or a callable(experts module path) giving one);
    the others' names go to model.foreign and every load skips them.
    expert_tp=(rank, size): the experts' split of the intermediate dim
    (default tp_rank, tp_size; vLLM with expert parallelism: (0, 1)).

    Returns {checkpoint name: module name}."""
    rename = rename or {}
    fused = fused or {}
    shard_dims = shard_dims or {}
    padded = padded or {}
    state_keys = set(module.state_dict(keep_vars=True).keys())
    seen: Dict[int, str] = {}      # id(tensor) -> primary checkpoint name
    out: Dict[str, str] = {}
    named = list(module.named_parameters(prefix=prefix, remove_duplicate=False))
    if expert_ckpt not in ("per_expert", "stacked"):
        raise ValueError("refit: expert_ckpt is 'per_expert' or 'stacked', not %r" % expert_ckpt)
    pmap = dict(named)
    stacked = moe.find_stacked(pmap, check=expert_ckpt == "per_expert")
    renames, names = moe.family(module)
    if expert_ckpt == "stacked":
        renames = ()
    names = expert_names or names
    named += [(n, b) for n, b in module.named_buffers(prefix=prefix, remove_duplicate=False)]
    for name, t in named:
        if skip and skip(name):
            continue
        st = stacked.get(name)
        if st is not None and (expert_ckpt == "per_expert" or st.kind == "vllm"):
            if st.name == name:
                out.update(_register_stacked(model, st, pmap, rename, renames, names,
                                             experts, expert_tp or (tp_rank, tp_size),
                                             expert_ckpt, ckpt_dtype))
            continue
        key = name[len(prefix) + 1:] if prefix and name.startswith(prefix + ".") else name
        if key not in state_keys and not isinstance(t, _param_type()):
            if side_buffers:
                model.add_side(name, t.detach())
            continue
        if callable(rename):
            ck = rename(name)
        else:
            ck = rename.get(name) or moe.family_rename(renames, name)
        if id(t) in seen:
            primary = seen[id(t)]
            model.expect(out[primary], ck, _ck_dtype(ckpt_dtype, name, t), _ck_shape(t),
                         tie_of=primary)
            out[ck] = out[primary]
            continue
        seen[id(t)] = ck
        dt = _ck_dtype(ckpt_dtype, name, t)
        params = "cast: true" if refit_dtype(dt) != refit_dtype(t.dtype) else None
        model.add_module(name, format, params)
        model.bind_runtime(name, "w", t.detach())
        sd = shard_dims.get(name)
        shard = (sd, tp_rank, tp_size) if sd is not None and tp_size > 1 else None
        sdim = sd if sd is not None else 0     # the split dim, where shard
        spec = fused.get(name)
        if spec is None:
            shape = list(t.shape)
            d = sdim if shard else 0
            if shard:
                shape[d] = t.shape[d] * tp_size
            pad_to = 0
            if name in padded:
                pad_to = shape[d]
                shape[d] = padded[name]
            model.expect(name, ck, dt, shape, shard=shard, pad_to=pad_to)
            out[ck] = name
            continue
        parts = spec["parts"] if isinstance(spec, dict) else spec
        fdim = spec.get("dim", 0) if isinstance(spec, dict) else 0
        off = 0
        for part_name, rows in parts:
            shape = list(t.shape)
            shape[fdim] = rows
            if shard:
                shape[sdim] = rows if sdim == fdim else t.shape[sdim] * tp_size
            dst = [0] * len(shape)
            dst[fdim] = off
            off += _local_rows(rows, tp_rank, tp_size) if shard and sdim == fdim else rows
            model.expect(name, part_name, dt, shape, shard=shard, dst_offset=dst)
            out[part_name] = name
    return out


def _register_stacked(model: Any, st: "moe.Stacked", params: Dict[str, Any], rename: Any,
                      renames: Any, names: Tuple[str, str, str], experts: Any,
                      tp: Tuple[int, int], expert_ckpt: str, ckpt_dtype: Any) -> Dict[str, str]:
    """One stacked expert parameter (and its scale) of register_module."""
    if callable(rename):
        ck = rename(st.prefix)
    else:
        ck = rename.get(st.prefix) or moe.family_rename(renames, st.prefix)
    emap = experts(st.prefix) if callable(experts) else experts
    t = params[st.name].detach()
    dt = ckpt_dtype.get(st.name) if isinstance(ckpt_dtype, dict) else ckpt_dtype
    if expert_ckpt == "stacked":   # vLLM's names from transformers' stacked ones
        if st.scale is not None:
            raise ValueError("refit: %s: FP8 experts from a stacked checkpoint are not "
                             "placed; register per expert" % st.name)
        gate_up = st.which == "gate_up"
        return moe.register_experts(
            model, st.name, t, [(None, int(t.shape[1]) // 2 * tp[1])] * 2 if gate_up else None,
            experts=emap, dim=0, shard_dim=0 if gate_up else 1, tp_rank=tp[0], tp_size=tp[1],
            ckpt_dtype=dt, stacked="%s.%s" % (ck, "gate_up_proj" if gate_up else "down_proj"))
    ps = {n: params[n].detach() for n in (st.name, st.scale) if n}
    return moe.register_stacked(model, st, ps, ck, names, experts=emap, tp=tp, ckpt_dtype=dt)


def _param_type() -> type:
    import torch
    return torch.nn.Parameter


def _ck_dtype(ckpt_dtype: Any, name: str, t: Any) -> Any:
    if ckpt_dtype is None:
        return t.dtype
    if isinstance(ckpt_dtype, dict):
        return ckpt_dtype.get(name, t.dtype)
    return ckpt_dtype


def _ck_shape(t: Any) -> List[int]:
    return list(t.shape)
