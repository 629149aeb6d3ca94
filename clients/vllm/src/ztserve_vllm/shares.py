"""Which part of each checkpoint tensor a rank's layers read, as vLLM's weight loaders cut it,
computed from plain descriptions of the layers and their parameters (no vLLM or torch here, so
the rules are tested on their own).

A region is one `(start, stop)` per leading dimension of a tensor, the dimensions after them
whole. A weight gets a list of regions: one for a split, several for a tensor fused on disk
that vLLM cuts piece by piece (a stored `qkv_proj`, experts stacked in one tensor), none for a
tensor this rank does not load at all (another rank's experts), or `None` for the whole tensor,
with the reason when the whole tensor is not simply what every rank holds.

The cuts follow vLLM 0.32: `linear.py`'s weight loaders and `parameter.py`'s vLLM parameters
(a share is the parameter's own size on this rank, at the rank's offset; packed, block-scaled
and per-part scalar parameters adjust it as those loaders do), and `RoutedExperts.weight_loader`
for experts (a share is the checkpoint tensor's size over the ranks, along the intermediate
dimension; K-first quantized layouts flip it).
"""

from dataclasses import dataclass

# What a layer is, by the vLLM class it is (or derives from).
COLUMN, MERGED, QKV, ROW, VOCAB, REPLICATED, OPAQUE, EXPERTS = (
    "column", "merged", "qkv", "row", "vocab", "replicated", "opaque", "experts")
# How a mixture of experts is loaded: by `RoutedExperts.weight_loader`, or by gpt-oss's own
# `load_weights` (experts fused on disk as `gate_up_proj` [E, H, 2I] and `down_proj` [E, I, H]).
ROUTED, GPT_OSS = "routed", "gpt-oss"


@dataclass(frozen=True)
class Layer:
    """A layer of one rank, as its weight loaders see it.

    - column: `per_rank` output rows on every rank (ColumnParallelLinear);
    - merged: `sizes`, the full output size of each stacked part (gate, up), split evenly
      (MergedColumnParallelLinear);
    - qkv: `heads` and `kv_heads` per rank, `head_size`, `v_head_size`, and `kv_replicas`
      (ranks sharing one key/value head when there are fewer of them than ranks)
      (QKVParallelLinear);
    - row: `per_rank` input columns (RowParallelLinear);
    - vocab: the rank's rows of the vocabulary, `start` to `stop`, padding removed
      (VocabParallelEmbedding, ParallelLMHead);
    - experts: a mixture of experts (vLLM's RoutedExperts): `tp_rank` of `tp_size` cuts every
      expert's intermediate dimension; `experts` is the ids of the experts this rank holds under
      expert parallelism (None: all of them); `names` the checkpoint's names of gate, down and
      up (`w1`, `w2`, `w3`); `gated` whether gate and up are stacked; `loader` which loader
      places them (ROUTED or GPT_OSS), with `intermediate` and `heads` for gpt-oss's cut;
      `refined` when vLLM upsamples the block scales to a finer grid before cutting them
      (it then reads them whole); `flips` when it transposes a K-first packed tensor before
      cutting it; `fused_transposed` when experts fused on disk are stored [E, H, 2I];
    - replicated: every rank holds the whole weight (ReplicatedLinear, router gates);
    - opaque: a layer whose cut this module does not know (`reason` says why): fetched whole.

    `block` is the layer's FP8 `weight_block_size`, `cls` its vLLM class (for the log).
    """

    kind: str
    tp_rank: int = 0
    tp_size: int = 1
    per_rank: int = 0
    sizes: tuple = ()
    heads: int = 0
    kv_heads: int = 0
    head_size: int = 0
    v_head_size: int = 0
    kv_replicas: int = 1
    start: int = 0
    stop: int = 0
    reason: str = ""
    cls: str = ""
    block: tuple | None = None
    experts: tuple | None = None
    ep_size: int = 1
    names: tuple = ("gate_proj", "down_proj", "up_proj")
    gated: bool = True
    loader: str = ROUTED
    intermediate: int = 0
    refined: bool = False
    flips: bool = False
    fused_transposed: bool = False


@dataclass(frozen=True)
class Param:
    """A parameter as vLLM marks it: its split dimensions (`output_dim`, `input_dim`), whether
    its checkpoint tensor is already one rank's (`sharded`), its `shape` on this rank, how it
    is packed (`packed_dim`, `packed_factor`, `marlin_tile`), whether it holds FP8 block scales
    (`block`) or one scalar per stacked part (`scalar`), and for experts whether its layout is
    K-first (`transposed`) and how its scales are grouped (`scale`: tensor, channel, group,
    block)."""

    output_dim: int | None = None
    input_dim: int | None = None
    sharded: bool = False
    shape: tuple | None = None
    packed_dim: int | None = None
    packed_factor: int = 1
    marlin_tile: int | None = None
    block: bool = False
    scalar: bool = False
    transposed: bool = False
    scale: str | None = None


@dataclass
class Plan:
    """What one checkpoint tensor needs: `regions` (None: the whole tensor; empty: nothing,
    another rank's), and why it is whole when it could have been cut (`reason`, empty for
    weights every rank holds). `module` and `cls` name the layer it loads into; `ways` is how
    many ranks share a tensor fetched whole for a reason (its fair share is 1/ways of it)."""

    name: str
    regions: list | None
    reason: str = ""
    module: str | None = None
    cls: str = ""
    ways: int = 1


def resolve(name, modules, packed):
    """The module a checkpoint tensor `name` (already in the model's naming) loads into, its
    parameter name, and its index among the parts stacked in that module (None when it is
    not stacked): `model.layers.0.self_attn.k_proj.weight` is (`…self_attn.qkv_proj`,
    `weight`, 1) where `packed` maps `qkv_proj` to `[q_proj, k_proj, v_proj]`. None when no
    module of the model takes it."""
    module, _, param = name.rpartition(".")
    if module in modules:
        return module, param, None
    parent, _, leaf = module.rpartition(".")
    for fused, parts in packed.items():
        if leaf in parts:
            target = f"{parent}.{fused}" if parent else fused
            if target in modules:
                return target, param, list(parts).index(leaf)
    return None


def _cut(shape, dim, start, stop):
    """The region of `shape` that is `start:stop` of dimension `dim`, the others whole."""
    return _box(shape, {dim % len(shape): (start, stop)})


def _ceil(a, b):
    return -(-a // b)


def _adjusted(layer, param, size, offset=0):
    """A stacked part's `size` and `offset` along the output dimension in `param`'s units, as
    vLLM adjusts them: FP8 block scales count blocks, packed parameters packed elements."""
    if param.block and layer.block:
        size, offset = _ceil(size, layer.block[0]), _ceil(offset, layer.block[0])
    if param.packed_dim is not None and param.packed_dim == param.output_dim:
        size, offset = size // param.packed_factor, offset // param.packed_factor
        if param.marlin_tile:
            size, offset = size * param.marlin_tile, offset * param.marlin_tile
    return size, offset


def _local(param, dim, fallback):
    """This rank's size of `param` along `dim`: its shape there when known, else `fallback`."""
    if param.shape is not None and dim < len(param.shape):
        return param.shape[dim]
    return fallback


def regions(layer, param, index, shape):
    """The regions of a checkpoint tensor of `shape` that `layer`'s loader reads for `param`
    (a stacked part `index`, or None), and the reason when it is read whole though the layer
    is split; `(None, "")` for a weight every rank holds whole."""
    if layer.kind == REPLICATED or layer.tp_size == 1:
        return None, ""
    if layer.kind == OPAQUE:
        return None, layer.reason
    if param.sharded:
        return None, "the checkpoint tensor is marked as already one rank's share"
    if not shape or param.scalar:
        return None, ""
    rank = layer.tp_rank
    if layer.kind == ROW:
        if param.input_dim is None:
            return None, ""  # a row-parallel bias or per-channel scale: every rank reads it whole
        size = _local(param, param.input_dim, layer.per_rank)
        return [_cut(shape, param.input_dim, rank * size, (rank + 1) * size)], ""
    dim = param.output_dim
    if dim is None:
        return None, ""
    if layer.kind == COLUMN:
        size = _local(param, dim, layer.per_rank)
        return [_cut(shape, dim, rank * size, (rank + 1) * size)], ""
    if layer.kind == VOCAB:
        return [_cut(shape, dim, layer.start, layer.stop)], ""
    if layer.kind == MERGED:
        parts = [(size, rank) for size in layer.sizes]
        return _stacked(layer, param, index, shape, parts, list(layer.sizes)), ""
    if layer.kind == QKV:
        kv_rank = rank // layer.kv_replicas
        parts = [(layer.heads * layer.head_size, rank), (layer.kv_heads * layer.head_size, kv_rank),
                 (layer.kv_heads * layer.v_head_size, kv_rank)]
        kv_total = layer.tp_size // layer.kv_replicas
        totals = [parts[0][0] * layer.tp_size, parts[1][0] * kv_total, parts[2][0] * kv_total]
        return _stacked(layer, param, index, shape, parts, totals, per_rank=True), ""
    return None, f"a {layer.kind} layer, whose cut is unknown"


def _stacked(layer, param, index, shape, parts, totals, per_rank=False):
    """Regions of a stacked part (`index`), or of every part of a tensor fused on disk (index
    None): `parts` are each part's `(size, rank it reads)`, sizes per rank when `per_rank`
    (qkv) else in total (merged, split evenly); `totals` each part's full size."""
    dim = param.output_dim

    def share(i):
        size, at = parts[i]
        size = size if per_rank else size // layer.tp_size
        size, _ = _adjusted(layer, param, size)
        return size, at

    if index is not None:
        size, at = share(index)
        return [_cut(shape, dim, at * size, (at + 1) * size)]
    out, offset = [], 0
    for i, total in enumerate(totals):
        size, at = share(i)
        out.append(_cut(shape, dim, offset + at * size, offset + (at + 1) * size))
        offset += _adjusted(layer, param, total)[0]
    return out


# The stacked parts of a mixture of experts: gate (w1) and up (w3) into w13, down (w2).
W1, W2, W3 = "w1", "w2", "w3"
_SHARD_DIM = {W1: 0, W2: 1, W3: 0}


def expert_kind(suffix):
    """What a checkpoint tensor of an expert is, by its parameter suffix, as vLLM's expert
    weight loader tells them apart: `weight`, `bias`, `input_scale`, `weight_shape`, `scale`
    (scales, zero points, offsets), or `other` (which it does not load)."""
    if "bias" in suffix:
        return "bias"
    if "input_scale" in suffix:
        return "input_scale"
    if "scale" in suffix or "zero" in suffix or "offset" in suffix:
        return "scale"
    if "weight_shape" in suffix:
        return "weight_shape"
    if "weight" in suffix:
        return "weight"
    return "other"


def _expert_dim(layer, part, param):
    """The dimension of one expert's stored 2-D tensor that `part` is cut along."""
    dim = _SHARD_DIM[part]
    # GPTQ and AWQ store experts K-first; compressed-tensors' packed experts are stored N-first
    # and transposed by its loader before the flipped cut, which lands on the stored N again.
    if param.transposed and not layer.flips:
        dim = 1 - dim
    return dim


def _expert_cut(layer, part, param, kind, shape):
    """The cut of one expert's stored tensor of `shape` for `part` (w1, w2, w3): `(dim, start,
    stop)`, None for the whole tensor, or "skip" when vLLM loads nothing from it on this rank;
    with the reason when whole though split."""
    if layer.tp_size == 1 or kind in ("input_scale", "weight_shape") or not shape:
        return None, ""
    if kind == "bias":
        if part == W2:
            return None, ""  # every rank adds the down projection's bias
        dim = 0
    else:
        dim = _expert_dim(layer, part, param)
        if kind == "scale":
            if param.scale == "tensor" or param.scale == "channel" and part == W2:
                return None, ""
            if param.scale == "block" and layer.refined:
                return None, "vLLM upsamples these block scales to a finer grid before cutting them, reading them whole"
            if param.scale not in ("channel", "group", "block"):
                return None, f"its experts' scales are of an unknown kind ({param.scale})"
    if dim >= len(shape):
        return None, ""
    per = shape[dim] // layer.tp_size
    start = per * layer.tp_rank
    stop = min(start + per, shape[dim])
    if stop <= start:
        return "skip", ""
    return (dim, start, stop), ""


def _own_experts(layer, shape):
    """Of a tensor holding every expert (dimension 0), this rank's experts under expert
    parallelism, whole: one region per run of consecutive ids, or None for all of it."""
    runs = []
    for i in sorted(layer.experts):
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return None if runs == [(0, shape[0])] else [(run,) for run in runs]


def _box(shape, cuts):
    """The region of `shape` cut to `cuts` (`{dim: (start, stop)}`), the other dimensions whole."""
    last = max(cuts)
    for dim, (start, stop) in cuts.items():
        if not 0 <= start <= stop <= shape[dim]:
            raise ValueError(f"{start}:{stop} is outside dimension {dim} of a tensor of shape {list(shape)}")
    return tuple(cuts.get(d, (0, n)) for d, n in enumerate(shape[: last + 1]))


def _halves(layer, part, param, kind, one, gated):
    """The cuts of the stacked halves of one expert's gate and up, `one` being its
    [2I, K] shape as the loader orients it (or [I, K] alone when not `gated`): `{dim:
    (start, stop)}` per half it loads, None for whole, with the reason."""
    if not one:
        return None, ""  # a scalar (a per-tensor scale): read whole
    subs = [(W1, 0), (W3, one[0] // 2)] if gated else [(W1, 0)]
    half = one[0] // 2 if gated else one[0]
    out = []
    for sub, offset in subs if part == "w13" else [(part, 0)]:
        size = (half,) + tuple(one[1:]) if part == "w13" else tuple(one)
        cut, reason = _expert_cut(layer, sub, param, kind, size)
        if cut == "skip":
            continue
        if cut is None:
            return None, reason
        dim, start, stop = cut
        cuts = {0: (offset + start, offset + stop)} if dim == 0 else {dim: (start, stop)}
        if dim != 0 and part == "w13":
            cuts[0] = (offset, offset + half)
        out.append(cuts)
    return out, ""


def expert_regions(layer, part, param, suffix, shape, expert=None):
    """The regions of an expert's checkpoint tensor of `shape` this rank loads, and the reason
    when whole though split. `part` is w1, w2 or w3 for one expert's tensor (`expert` its id),
    `w13` for gate and up stacked per expert (`experts.N.gate_up_proj`, [2I, H]), or with
    `expert` None a tensor holding every expert (dimension 0): `w13` ([E, 2I, H], or
    [E, H, 2I] when `fused_transposed`) or `w2` ([E, H, I])."""
    if layer.loader == GPT_OSS:
        return _gpt_oss_regions(layer, part, suffix, shape)
    kind = expert_kind(suffix)
    if kind == "other":
        return [], ""  # vLLM's expert loader loads nothing it cannot tell apart
    if expert is not None:
        if layer.experts is not None and expert not in layer.experts:
            return [], ""
        cuts, reason = _halves(layer, part, param, kind, tuple(shape), part == "w13")
        if cuts is None:
            return None, reason
        return [_box(shape, one) for one in cuts], ""
    if layer.experts is not None:
        return _own_experts(layer, shape), ""
    if layer.tp_size == 1 or len(shape) != 3:
        return None, ""
    # vLLM orients the tensor [E, N, K] first (transposing one stored [E, K, N] that uses the
    # weight's layout), then takes gate and up as halves of N, then cuts each expert.
    transposed = layer.fused_transposed and ("scale" not in suffix or param.scale == "block")
    one = (shape[2], shape[1]) if transposed else tuple(shape[1:])
    cuts, reason = _halves(layer, part, param, kind, one, layer.gated)
    if cuts is None:
        return None, reason
    out = []
    for one_cut in cuts:
        stored = {(2 - d if transposed else d + 1): span for d, span in one_cut.items()}
        out.append(_box(shape, stored))
    return out, ""


def _gpt_oss_regions(layer, part, suffix, shape):
    """gpt-oss's experts as its `load_weights` cuts them (unquantized checkpoints): every
    expert in one tensor, the rank's experts under expert parallelism, else its
    `ceil(I / ranks)` of the intermediate dimension (twice that, interleaved gate and up, in
    `w13`)."""
    if layer.experts is not None:
        return _own_experts(layer, shape), ""
    if layer.tp_size == 1:
        return None, ""
    if "bias" in suffix and part == W2:
        return None, ""  # loaded on every rank (zeroed off rank 0)
    per = _ceil(layer.intermediate, layer.tp_size)
    start = layer.tp_rank * per
    stop = min(start + per, layer.intermediate)
    if part == "w13":
        return [_cut(shape, len(shape) - 1, 2 * start, 2 * stop)], ""
    return [_cut(shape, 1, start, stop)], ""


def plan(tensors, modules, packed, params, rename=lambda name: (name, None), absent=lambda name: False, complete=False):
    """A `Plan` per checkpoint tensor: `tensors` maps each name to its shape and why the
    server cannot cut it (`(shape, reason)`, reason empty when it can); `modules` maps module
    names to `Layer`s and `params` full parameter names to `Param`s; `packed` is the model's
    `packed_modules_mapping`; `rename` maps a checkpoint name to the model's name and the
    stacked part it fills (vLLM's `hf_to_vllm_mapper`: `(name, shard id or None)`), or None
    when the model drops the tensor; `absent` tells a (renamed) tensor of a layer this rank's
    model does not have (a multi-token-prediction layer, another pipeline stage's). Neither
    is fetched, nor, when `params` is `complete` (every parameter of the layers in `modules`),
    a tensor of a layer that has no parameter of its name (vLLM 0.32's GPTQ keeps no `g_idx`)."""
    experts = sorted((name for name, layer in modules.items() if layer.kind == EXPERTS), key=len, reverse=True)
    out = []
    for name, (shape, uncuttable) in tensors.items():
        renamed = rename(name)
        if renamed is None or absent(renamed[0]):
            out.append(Plan(name, []))
            continue
        mapped, shard = renamed
        owner = next((m for m in experts if mapped.startswith(m + ".")), None)
        if owner is not None:
            one = _expert_plan(name, mapped[len(owner) + 1:], owner, modules[owner], params, tuple(shape))
        else:
            one = _linear_plan(name, mapped, shard, modules, packed, params, tuple(shape), complete)
        if one.regions and uncuttable:
            one.regions, one.reason = None, uncuttable
        if one.regions and all(region == tuple((0, n) for n in shape[: len(region)]) for region in one.regions):
            one.regions = None  # the share is the whole tensor (one rank, or one key/value head per rank)
        out.append(one)
    return out


def _linear_plan(name, mapped, shard, modules, packed, params, shape, complete):
    module, _, param_name = mapped.rpartition(".")
    if module in modules:
        target = (module, param_name, shard_index(shard))
    else:
        target = resolve(mapped, modules, packed)
    if target is None:
        return Plan(name, None)
    module, param_name, index = target
    layer = modules[module]
    param = params.get(f"{module}.{param_name}")
    if param is None:
        if complete and layer.kind != OPAQUE:
            return Plan(name, [], "", module, layer.cls)  # the layer has no such parameter: vLLM skips the tensor
        param = Param()
    if index is _UNKNOWN_SHARD:
        return Plan(name, None, f"it fills a stacked part {shard!r} of {module} this loader cannot place", module, layer.cls, layer.tp_size)
    cut, reason = regions(layer, param, index, shape)
    return Plan(name, cut, reason, module, layer.cls, layer.tp_size)


def _expert_plan(name, rest, module, layer, params, shape):
    """The plan of checkpoint tensor `name`, `rest` of it below experts layer `module`:
    `N.<gate>.<suffix>` (one expert), `N.gate_up_proj.<suffix>`, or a tensor of every expert
    (`gate_up_proj`, `down_proj`, `w13_weight`…)."""
    ways = layer.ep_size * layer.tp_size
    if layer.kind == OPAQUE or layer.reason:
        return Plan(name, None, layer.reason, module, layer.cls, ways)
    gate, down, up = layer.names
    fused_gate_up = "gate_up_proj" if (gate, up) == ("gate_proj", "up_proj") else "w13" if (gate, up) == ("w1", "w3") else None
    head, _, tail = rest.partition(".")
    expert = int(head) if head.isdecimal() else None
    if expert is not None:
        leaf, _, suffix = tail.partition(".")
        part = {gate: W1, down: W2, up: W3, fused_gate_up: "w13"}.get(leaf)
        if part is None:
            return Plan(name, None, f"it is an expert tensor ({leaf}) this loader cannot place", module, layer.cls, ways)
    else:
        leaf, _, suffix = rest.partition(".")
        if leaf.startswith("w13_") or leaf.startswith("w2_"):  # already in vLLM's naming (gpt-oss)
            part, suffix = ("w13" if leaf.startswith("w13_") else W2), leaf.split("_", 1)[1] + (f".{suffix}" if suffix else "")
        else:
            part = {fused_gate_up: "w13", gate: "w13" if not layer.gated else None, down: W2}.get(leaf)
            suffix = suffix or "weight"
        if part is None:
            return Plan(name, None, f"it is an expert tensor ({leaf}) this loader cannot place", module, layer.cls, ways)
    stem = "w13" if part in (W1, W3, "w13") else "w2"
    param = params.get(f"{module}.{stem}_{suffix}", Param())
    cut, reason = expert_regions(layer, part, param, suffix, shape, expert)
    return Plan(name, cut, reason, module, layer.cls, ways)


_UNKNOWN_SHARD = object()


def shard_index(shard):
    """The index of the stacked part a vLLM shard id names: `q`, `k`, `v` are 0, 1, 2 and an
    integer is itself; None for no part; a marker for ids naming several parts at once."""
    if shard is None:
        return None
    if isinstance(shard, str) and shard in ("q", "k", "v"):
        return "qkv".index(shard)
    if isinstance(shard, int) and not isinstance(shard, bool):
        return shard
    return _UNKNOWN_SHARD


def region_bytes(shape, region, itemsize):
    """How many bytes `region` of a tensor of `shape` holds."""
    count = itemsize
    for d, n in enumerate(shape):
        count *= (region[d][1] - region[d][0]) if d < len(region) else n
    return count
