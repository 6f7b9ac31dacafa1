"""Mixture-of-experts parameters that stack their experts ([E, ...]), filled
from checkpoints that name each expert separately or hold the stack whole.

One refit module per stacked parameter, all of this rank's experts in it;
each checkpoint tensor lands at its expert's slot (refit_ckpt_spec.expert)
and its row offset (dst_offset), as the C API places it. Two layouts:

  transformers 5 (Qwen2/3-MoE, DeepSeek-V2/V3, GLM-4-MoE, OLMoE, Mixtral, ...):
    experts.gate_up_proj [E, 2I, H] = per expert cat([gate_proj, up_proj], 0)
    experts.down_proj    [E, H, I]  = per expert down_proj
    (transformers' conversion_mapping.py: MergeModulelist(dim=0) then
    Concatenate(dim=1); the forward chunks gate first.) Mixtral-style
    checkpoints name the block `block_sparse_moe` and the projections
    w1 (gate), w3 (up), w2 (down).
  vLLM FusedMoE:
    experts.w13_weight [E_local, 2I/tp, H]: this rank's gate rows, then its
    up rows; experts.w2_weight [E_local, H, I/tp]: its columns of down_proj.
    Block FP8 adds w13_weight_scale_inv [E_local, 2*I/tp/128, H/128] and
    w2_weight_scale_inv [E_local, H/128, I/tp/128] (checkpoint
    `...weight_scale_inv`); per-channel FP8 w13_weight_scale [E_local, 2I/tp, 1]
    and w2_weight_scale [E_local, H, 1] (checkpoint `...weight_scale`; w2's
    is not split). Expert parallelism: slot s of this rank holds global
    expert ids[s] (vLLM's expert_map: global id -> slot, -1 elsewhere).

Experts outside this rank's map: their checkpoint names are recorded in
Model.foreign, and every load drops them, strict or not, as a TP rank drops
the rows of a tensor that are not its own (vLLM's weight_loader skips them
the same way). A name neither expected nor foreign is still refused under
strict=True. This rank's own experts must all arrive: finalize refuses an
incomplete module naming the first missing checkpoint tensor, whose name
carries the layer and the expert."""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .tensors import DTypeLike, refit_dtype

Parts = Sequence[Tuple[Optional[str], Optional[int]]]
PerRuntime = Union[Any, Mapping[str, Any]]


class ExpertMap:
    """Which global experts this rank holds, in slot order: ids[s] is the
    global id of stacked slot s; num_experts is the global count."""

    __slots__ = ("num_experts", "ids", "_slot")

    def __init__(self, num_experts: int, ids: Iterable[int]) -> None:
        self.num_experts = int(num_experts)
        self.ids = [int(g) for g in ids]
        self._slot = {g: s for s, g in enumerate(self.ids)}
        if len(self._slot) != len(self.ids):
            raise ValueError("refit.moe: expert map holds an expert twice: %s" % self.ids)
        bad = [g for g in self.ids if not 0 <= g < self.num_experts]
        if bad:
            raise ValueError("refit.moe: expert ids %s are outside [0, %d)" % (bad, num_experts))

    @classmethod
    def linear(cls, num_experts: int, ep_rank: int, ep_size: int) -> "ExpertMap":
        """vLLM's default placement (determine_expert_map): contiguous runs,
        the lower ranks one more when num_experts % ep_size != 0."""
        base, extra = divmod(num_experts, ep_size)
        start = ep_rank * base + min(ep_rank, extra)
        return cls(num_experts, range(start, start + base + (1 if ep_rank < extra else 0)))

    @classmethod
    def from_map(cls, expert_map: Any) -> "ExpertMap":
        """From vLLM's expert_map: a sequence (list, numpy array, torch
        tensor) of global length, slot of each global id or -1."""
        vals = expert_map.tolist() if hasattr(expert_map, "tolist") else list(expert_map)
        held = sorted((int(s), g) for g, s in enumerate(vals) if int(s) >= 0)
        if [s for s, _ in held] != list(range(len(held))):
            raise ValueError("refit.moe: an expert_map's slots must be 0..n-1, each once")
        return cls(len(vals), [g for _, g in held])

    def slot(self, g: int) -> int:
        """The slot of global expert g, -1 when another rank holds it."""
        return self._slot.get(g, -1)

    @property
    def foreign(self) -> List[int]:
        """The global ids this rank does not hold."""
        return [g for g in range(self.num_experts) if g not in self._slot]

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return "ExpertMap(%d, %s)" % (self.num_experts, self.ids)


def as_expert_map(experts: Any, num_local: int) -> ExpertMap:
    """None (every expert, slot = id), an ExpertMap, or a vLLM expert_map."""
    if experts is None:
        return ExpertMap(num_local, range(num_local))
    if isinstance(experts, ExpertMap):
        return experts
    return ExpertMap.from_map(experts)


def _local_rows(n: int, rank: int, size: int) -> int:
    return n // size + (1 if rank < n % size else 0)


def _split(n: int, rank: int, size: int) -> Tuple[int, int]:
    base, extra = divmod(n, size)
    a = rank * base + min(rank, extra)
    return a, a + base + (1 if rank < extra else 0)


def _per(value: Any, name: str, default: Any = None) -> Any:
    """value itself, or value[name] when it is a per-runtime mapping."""
    if isinstance(value, Mapping):
        return value.get(name, default)
    return default if value is None else value


def register_experts(model: Any, module: str, runtime: PerRuntime,
                     parts: Union[None, Parts, Mapping[str, Parts]] = None, *,
                     experts: Any = None, dim: PerRuntime = 0,
                     shard_dim: PerRuntime = None, tp_rank: int = 0, tp_size: int = 1,
                     ckpt_dtype: Union[None, DTypeLike, Mapping[str, DTypeLike]] = None,
                     format: str = "unquantized",
                     params: Union[None, str, Mapping[str, Any]] = None,
                     stacked: Union[None, str, Mapping[str, str]] = None) -> Dict[str, str]:
    """Register one module whose runtime tensor(s) stack this rank's experts.

    runtime: the stacked tensor [E_local, ...] (bound as "w"), or
        {runtime name: stacked tensor} for a format with several (fp8:
        "weight" and "weight_scale"). numpy arrays, torch tensors, __dlpack__.
    parts: what fills one expert, in order along `dim`:
        [(template, rows), ...], or {runtime name: [...]} (a runtime name
        with no parts is filled by the format, e.g. an online scale). A
        template names the checkpoint tensor of global expert {e}
        ("model.layers.3.mlp.experts.{e}.gate_proj.weight"); rows is its
        full (unsharded) extent along dim, None for "the whole runtime".
    experts: this rank's experts: None (all; slot = id), an ExpertMap, or
        vLLM's expert_map (global id -> slot, -1 elsewhere).
    dim: the dim (of one expert, not of the stack) the parts fuse along.
    shard_dim: TP: this rank (tp_rank of tp_size) keeps its slice of this
        dim of every part; when it is the fused dim, the parts' slices are
        packed [gate_r, up_r] (vLLM's w13). None: not split.
    dim, shard_dim and ckpt_dtype may be {runtime name: value}.
    ckpt_dtype: the checkpoint's dtype where it is not the runtime's (an
        "unquantized" module then casts).
    stacked: the checkpoint holds the stack whole under this name (or
        {runtime name: name}): one [num_experts, ...] tensor; this rank's
        experts are its rows (a contiguous run of an even split, as refit
        splits rows), parts only give the fused row counts. TP of fused
        parts cannot come from one stacked tensor (two slices per rank).

    Returns {checkpoint name: module}; the names of experts this rank does
    not hold go to model.foreign (every load skips them)."""
    rts: Dict[str, Any] = dict(runtime) if isinstance(runtime, Mapping) else {"w": runtime}
    single = not isinstance(runtime, Mapping)
    if not rts or any(len(t.shape) < 1 for t in rts.values()):
        raise ValueError("refit.moe: %s: no stacked runtime tensor" % module)
    num_local = int(next(iter(rts.values())).shape[0])
    for rn, t in rts.items():
        if int(t.shape[0]) != num_local:
            raise ValueError("refit.moe: %s: runtime tensors stack %d and %d experts"
                             % (module, num_local, int(t.shape[0])))
    emap = as_expert_map(experts, num_local)
    if len(emap) != num_local:
        raise ValueError("refit.moe: %s stacks %d experts; the expert map gives this rank %d "
                         "(%s)" % (module, num_local, len(emap), emap.ids))
    if isinstance(parts, Mapping):
        part_of: Dict[str, Parts] = {rn: list(p) for rn, p in parts.items()}
    elif parts is None:
        part_of = {rn: [(None, None)] for rn in rts}
    else:
        if not single:
            raise ValueError("refit.moe: %s: several runtime tensors need parts per name" % module)
        part_of = {"w": list(parts)}
    unknown = set(part_of) - set(rts)
    if unknown:
        raise ValueError("refit.moe: %s: parts for %s, which is not a runtime tensor"
                         % (module, sorted(unknown)))
    plans = []  # (runtime name, [(ckpt name, shape, shard, slot, dst)])
    out: Dict[str, str] = {}
    foreign: List[str] = []
    for rn, t in rts.items():
        if rn not in part_of:
            continue
        d = int(_per(dim, rn, 0))
        sd = _per(shard_dim, rn)
        shard = (int(sd), tp_rank, tp_size) if sd is not None and tp_size > 1 else None
        inner = [int(x) for x in t.shape[1:]]
        if not 0 <= d < max(len(inner), 1):
            raise ValueError("refit.moe: %s/%s: dim %d of an expert of %d dims"
                             % (module, rn, d, len(inner)))
        ps = part_of[rn]
        rows_full = []
        for tmpl, rows in ps:
            if rows is None:
                if len(ps) != 1:
                    raise ValueError("refit.moe: %s/%s: rows may be left out only for a "
                                     "single part" % (module, rn))
                rows = inner[d] * (tp_size if shard and shard[0] == d else 1)
            rows_full.append(int(rows))
        local = [(_local_rows(r, tp_rank, tp_size) if shard and shard[0] == d else r)
                 for r in rows_full]
        if sum(local) != inner[d]:
            raise ValueError("refit.moe: %s/%s: its parts give %s rows on this rank along dim "
                             "%d of an expert; the runtime has %d" % (module, rn, local, d,
                                                                     inner[d]))
        dt = _per(ckpt_dtype, rn)
        dt = t.dtype if dt is None else dt
        rows_here: List[Tuple[str, List[int], Any, int, List[int]]] = []
        if stacked is not None:
            name = _per(stacked, rn)
            if name is None:
                raise ValueError("refit.moe: %s: no stacked checkpoint name for %s" % (module, rn))
            shape = [emap.num_experts] + inner
            if shard:
                if len(ps) > 1 and shard[0] == d:
                    raise ValueError(
                        "refit.moe: %s/%s: a stacked checkpoint cannot fill TP shards of fused "
                        "parts (each rank's rows are one slice of each part); register per "
                        "expert, or send per-expert views" % (module, rn))
                shape[1 + shard[0]] = rows_full[0] if shard[0] == d else inner[shard[0]] * tp_size
            st = _stack_shard(emap, module, rn)
            if st is not None and shard is not None:
                raise ValueError("refit.moe: %s/%s: a stacked checkpoint cannot be split by "
                                 "both experts and TP" % (module, rn))
            if st is not None:
                shard = st
            else:
                shard = (shard[0] + 1, shard[1], shard[2]) if shard else None
            rows_here.append((name, shape, shard, -1, [0] * len(shape)))
        else:
            for s, g in enumerate(emap.ids):
                off = 0
                for (tmpl, _), rows, lr in zip(ps, rows_full, local):
                    if tmpl is None:
                        raise ValueError("refit.moe: %s/%s: a part without a checkpoint name"
                                         % (module, rn))
                    shape = list(inner)
                    shape[d] = rows
                    if shard and shard[0] != d:
                        shape[shard[0]] = inner[shard[0]] * tp_size
                    dst = [0] * len(shape)
                    dst[d] = off
                    off += lr
                    rows_here.append((tmpl.format(e=g), shape, shard, s, dst))
            for g in emap.foreign:
                foreign.extend(tmpl.format(e=g) for tmpl, _ in ps if tmpl is not None)
        plans.append((rn, dt, rows_here))
    casts = any(refit_dtype(dt) != refit_dtype(rts[rn].dtype) for rn, dt, _ in plans)
    if params is None and casts and format == "unquantized":
        params = "cast: true"
    model.add_module(module, format, params)
    for rn, t in rts.items():
        model.bind_runtime(module, rn, t)
    for rn, dt, rows_here in plans:
        for name, shape, shard, slot, dst in rows_here:
            model.expect(module, name, dt, shape, target=None if single else rn, shard=shard,
                         expert=slot, dst_offset=dst)
            out[name] = module
    model.foreign.update(foreign)
    return out


def _stack_shard(emap: ExpertMap, module: str, rn: str) -> Optional[Tuple[int, int, int]]:
    """The dim-0 shard of a stacked checkpoint that gives this rank its
    experts: None for all of them; else (0, rank, count) of refit's split."""
    E, ids = emap.num_experts, emap.ids
    if ids == list(range(E)):
        return None
    if ids and ids == list(range(ids[0], ids[0] + len(ids))):
        for count in range(2, E + 1):
            if not E // count <= len(ids) <= E // count + 1:
                continue
            for rank in range(count):
                if _split(E, rank, count) == (ids[0], ids[-1] + 1):
                    return (0, rank, count)
    raise ValueError("refit.moe: %s/%s: experts %s are not one rank's rows of an even split "
                     "of %d, which is all a stacked checkpoint can give; register per expert"
                     % (module, rn, ids, E))


# ---- torch modules: finding stacked experts ---------------------------------

# Checkpoint names by transformers model_type, read from transformers 5's
# conversion_mapping.py (what save_pretrained writes back): (renames of the
# live name to the checkpoint's, (gate, up, down) projection names).
_QWEN2_STYLE = ((), ("gate_proj", "up_proj", "down_proj"))
_MIXTRAL_STYLE = (((".mlp.", ".block_sparse_moe."),), ("w1", "w3", "w2"))
HF_FAMILIES: Dict[str, Tuple[Tuple[Tuple[str, str], ...], Tuple[str, str, str]]] = {
    "mixtral": _MIXTRAL_STYLE, "minimax": _MIXTRAL_STYLE, "minimax_m2": _MIXTRAL_STYLE,
    "phimoe": (((".mlp.", ".block_sparse_moe."), (".router.weight", ".gate.weight")),
               ("w1", "w3", "w2")),
}
for _t in ("qwen2_moe", "qwen3_moe", "afmoe", "deepseek_v2", "deepseek_v3", "deepseek_v32",
           "dots1", "ernie4_5_moe", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "glm4v_moe",
           "longcat_flash", "solar_open", "mellum", "qwen3_omni_moe", "qwen3_omni_moe_thinker",
           "qwen3_next", "hunyuan_v1_moe", "flex_olmo", "olmoe", "exaone_moe", "cohere2_moe"):
    HF_FAMILIES[_t] = _QWEN2_STYLE

# vLLM FusedMoE scale parameters: suffix of the parameter -> (fp8 scheme,
# checkpoint suffix of the weight's scale)
_VLLM_SCALES = {"_weight_scale_inv": ("block128", "weight_scale_inv"),
                "_weight_scale": ("per_channel", "weight_scale")}


def family(module: Any) -> Tuple[Tuple[Tuple[str, str], ...], Tuple[str, str, str]]:
    """(renames, (gate, up, down)) of a transformers model's checkpoints."""
    mt = getattr(getattr(module, "config", None), "model_type", None)
    return HF_FAMILIES.get(mt, _QWEN2_STYLE) if mt else _QWEN2_STYLE


def family_rename(renames: Sequence[Tuple[str, str]], name: str) -> str:
    for a, b in renames:
        name = name.replace(a, b)
    return name


class Stacked:
    """A stacked expert parameter found in a torch module: kind "hf"
    (gate_up_proj / down_proj) or "vllm" (w13_weight / w2_weight); which
    is "gate_up" or "down"; scale: its vLLM scale parameter's name, or None."""

    __slots__ = ("name", "prefix", "kind", "which", "scale", "scheme")

    def __init__(self, name: str, prefix: str, kind: str, which: str,
                 scale: Optional[str] = None, scheme: Optional[str] = None) -> None:
        self.name, self.prefix, self.kind, self.which = name, prefix, kind, which
        self.scale, self.scheme = scale, scheme


def find_stacked(params: Mapping[str, Any], check: bool = True) -> Dict[str, Stacked]:
    """The stacked expert parameters among params (qualified name ->
    tensor), with the scale parameters they own: {name: Stacked}; a scale
    parameter maps to the Stacked of its weight. check: refuse (ValueError)
    transformers-named stacks whose shapes are not [E, 2I, H] / [E, H, I]."""
    out: Dict[str, Stacked] = {}
    for name, t in params.items():
        prefix, _, leaf = name.rpartition(".")
        if len(t.shape) != 3:
            continue
        if leaf in ("gate_up_proj", "down_proj") and prefix.rpartition(".")[2] == "experts":
            other = prefix + (".down_proj" if leaf == "gate_up_proj" else ".gate_up_proj")
            if other in params and len(params[other].shape) == 3:
                out[name] = Stacked(name, prefix, "hf", "gate_up" if leaf == "gate_up_proj"
                                    else "down")
        elif leaf in ("w13_weight", "w2_weight"):
            st = Stacked(name, prefix, "vllm", "gate_up" if leaf == "w13_weight" else "down")
            for suffix, (scheme, _) in _VLLM_SCALES.items():
                sname = "%s.%s%s" % (prefix, leaf[:-len("_weight")], suffix)
                if sname in params:
                    if len(params[sname].shape) != 3:
                        raise ValueError(
                            "refit.moe: %s has %d dims; only block (scale_inv) and per-channel "
                            "expert scales [E, rows, cols] are placed per expert"
                            % (sname, len(params[sname].shape)))
                    st.scale, st.scheme = sname, scheme
                    out[sname] = st
                    break
            out[name] = st
    for name, st in list(out.items()):
        if check and st.kind == "hf" and st.which == "gate_up":
            gu, dn = params[name], params[st.prefix + ".down_proj"]
            if not (gu.shape[0] == dn.shape[0] and gu.shape[2] == dn.shape[1]
                    and gu.shape[1] == 2 * dn.shape[2]):
                raise ValueError(
                    "refit.moe: %s %s and %s.down_proj %s are not transformers' [E, 2I, H] and "
                    "[E, H, I]; register with expert_ckpt='stacked' (the checkpoint holds them "
                    "under these names) or with refit.moe.register_experts"
                    % (name, tuple(gu.shape), st.prefix, tuple(dn.shape)))
    return out


def register_stacked(model: Any, st: Stacked, params: Mapping[str, Any], ckpt_prefix: str,
                     names: Tuple[str, str, str], *, experts: Any = None,
                     tp: Tuple[int, int] = (0, 1), ckpt_dtype: Any = None,
                     fp8_params: Optional[Mapping[str, Any]] = None) -> Dict[str, str]:
    """register_experts for one Stacked found by find_stacked, checkpoint
    tensors named ckpt_prefix.{e}.<gate|up|down>.weight (and the scale's
    suffix); its module is named after the parameter."""
    t = params[st.name]
    tp_rank, tp_size = tp
    gate, up, down = names
    base = ckpt_prefix + ".{e}."
    if st.which == "gate_up":
        inter = int(t.shape[1]) // 2 * tp_size
        wparts: Parts = [(base + gate + ".weight", inter), (base + up + ".weight", inter)]
        wshard = 0
    else:
        wparts = [(base + down + ".weight", int(t.shape[1]))]
        wshard = 1
    if st.scale is None:
        return register_experts(model, st.name, t, wparts, experts=experts, dim=0,
                                shard_dim=wshard, tp_rank=tp_rank, tp_size=tp_size,
                                ckpt_dtype=ckpt_dtype)
    s = params[st.scale]
    wdt = t.dtype if ckpt_dtype is None else ckpt_dtype
    online = refit_dtype(wdt) != refit_dtype(t.dtype)
    suffix = _VLLM_SCALES["_weight_scale_inv" if st.scheme == "block128" else "_weight_scale"][1]
    # (a ragged block-128 extent needs in_features/out_features: fp8_params)
    p: Dict[str, Any] = {"scheme": st.scheme, "online": online}
    p.update(fp8_params or {})
    parts: Dict[str, Parts] = {"weight": wparts}
    sshard: Optional[int] = wshard
    if not online:
        if st.which == "gate_up":
            srows = int(s.shape[1]) // 2 * tp_size
            parts["weight_scale"] = [(base + gate + "." + suffix, srows),
                                     (base + up + "." + suffix, srows)]
        else:
            parts["weight_scale"] = [(base + down + "." + suffix, int(s.shape[1]))]
            if st.scheme == "per_channel":
                sshard = None   # [H, 1]: the rows of down_proj, whole on every rank
    return register_experts(model, st.name, {"weight": t, "weight_scale": s}, parts,
                            experts=experts, dim=0,
                            shard_dim={"weight": wshard, "weight_scale": sshard},
                            tp_rank=tp_rank, tp_size=tp_size,
                            ckpt_dtype={"weight": wdt, "weight_scale": s.dtype},
                            format="fp8", params=p)


def per_expert(tensors: Mapping[str, Any],
               names: Union[None, Tuple[str, str, str], Callable[[str], str]] = None,
               family_module: Any = None) -> Dict[str, Any]:
    """A name -> tensor mapping with transformers 5's stacked experts
    (`...experts.gate_up_proj` [E, 2I, H], `...experts.down_proj` [E, H, I])
    replaced by per-expert views under the checkpoint's names
    (`...experts.{e}.gate_proj.weight` = gate_up_proj[e, :I], ...): what a
    trainer running transformers 5 sends to an engine registered per
    expert (TP shards or an expert map need per-expert tensors). Views, no
    copy. names: (gate, up, down), or family_module: the model whose
    family gives them and its renames (Mixtral: block_sparse_moe, w1/w3/w2)."""
    renames: Sequence[Tuple[str, str]] = ()
    if names is None:
        renames, names = family(family_module) if family_module is not None else _QWEN2_STYLE
    gate, up, down = names  # type: ignore[misc]
    out: Dict[str, Any] = {}
    for name, t in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf in ("gate_up_proj", "down_proj") and prefix.endswith("experts") and \
                len(t.shape) == 3:
            c = family_rename(renames, prefix) + "."
            if leaf == "gate_up_proj":
                i = int(t.shape[1]) // 2
                for e in range(int(t.shape[0])):
                    out["%s%d.%s.weight" % (c, e, gate)] = t[e, :i]
                    out["%s%d.%s.weight" % (c, e, up)] = t[e, i:]
            else:
                for e in range(int(t.shape[0])):
                    out["%s%d.%s.weight" % (c, e, down)] = t[e]
        else:
            out[family_rename(renames, name)] = t
    return out
