"""Which part of each checkpoint tensor a tensor-parallel rank's layers read, as vLLM's weight
loaders cut it, computed from plain descriptions of the layers (no vLLM or torch here, so the
rules are tested on their own).

A region is one `(start, stop)` per leading dimension of a tensor, the dimensions after them
whole. A weight gets a list of regions: one for a split, several for a tensor fused on disk
that vLLM cuts piece by piece (a stored `qkv_proj`), or `None` for the whole tensor, with the
reason when the whole tensor is not simply what every rank holds.
"""

from dataclasses import dataclass

# What a layer is, by the vLLM class it is (or derives from), most specific first.
COLUMN, MERGED, QKV, ROW, VOCAB, REPLICATED, OPAQUE = "column", "merged", "qkv", "row", "vocab", "replicated", "opaque"


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
    - replicated: every rank holds the whole weight (ReplicatedLinear);
    - opaque: a layer whose cut this module does not know (`reason` says why): fetched whole.
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


@dataclass(frozen=True)
class Param:
    """A parameter's split dimensions, as vLLM marks them (`output_dim`, `input_dim`), and
    whether its checkpoint tensor is already one rank's (`is_sharded_weight`)."""

    output_dim: int | None = None
    input_dim: int | None = None
    sharded: bool = False


@dataclass
class Plan:
    """What one checkpoint tensor needs: `regions` (None: the whole tensor), and why it is
    whole when it could have been cut (`reason`, empty for weights every rank holds)."""

    name: str
    regions: list | None
    reason: str = ""
    module: str | None = None


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
    dim %= len(shape)
    if not 0 <= start <= stop <= shape[dim]:
        raise ValueError(f"{start}:{stop} is outside dimension {dim} of a tensor of shape {list(shape)}")
    return tuple((start, stop) if d == dim else (0, n) for d, n in enumerate(shape[: dim + 1]))


def regions(layer, param, index, shape):
    """The regions of a checkpoint tensor of `shape` that `layer`'s loader reads for `param`
    (a stacked part `index`, or None), and the reason when it is read whole though the layer
    is split; `(None, "")` for a weight every rank holds whole."""
    if layer.kind in (REPLICATED,) or layer.tp_size == 1:
        return None, ""
    if layer.kind == OPAQUE:
        return None, layer.reason
    if param.sharded:
        return None, "the checkpoint tensor is marked as already one rank's share"
    if not shape:
        return None, ""
    rank = layer.tp_rank
    if layer.kind == ROW:
        if param.input_dim is None:
            return None, ""  # a row-parallel bias: every rank adds it once
        return [_cut(shape, param.input_dim, rank * layer.per_rank, (rank + 1) * layer.per_rank)], ""
    dim = param.output_dim
    if dim is None:
        return None, ""
    if layer.kind == COLUMN:
        return [_cut(shape, dim, rank * layer.per_rank, (rank + 1) * layer.per_rank)], ""
    if layer.kind == VOCAB:
        return [_cut(shape, dim, layer.start, layer.stop)], ""
    if layer.kind == MERGED:
        each = [size // layer.tp_size for size in layer.sizes]
        if index is not None:
            return [_cut(shape, dim, rank * each[index], (rank + 1) * each[index])], ""
        # Fused on disk: each part's share, at that part's place in the stored tensor.
        out, offset = [], 0
        for size, share in zip(layer.sizes, each):
            out.append(_cut(shape, dim, offset + rank * share, offset + (rank + 1) * share))
            offset += size
        return out, ""
    if layer.kind == QKV:
        kv_rank = rank // layer.kv_replicas
        q = layer.heads * layer.head_size
        k = layer.kv_heads * layer.head_size
        v = layer.kv_heads * layer.v_head_size
        parts = [(q, rank), (k, kv_rank), (v, kv_rank)]
        if index is not None:
            size, at = parts[index]
            return [_cut(shape, dim, at * size, (at + 1) * size)], ""
        # Fused on disk: q, k and v of every rank, one after the other.
        out, offset = [], 0
        totals = [q * layer.tp_size, k * layer.tp_size // layer.kv_replicas, v * layer.tp_size // layer.kv_replicas]
        for (size, at), total in zip(parts, totals):
            out.append(_cut(shape, dim, offset + at * size, offset + (at + 1) * size))
            offset += total
        return out, ""
    return None, f"a {layer.kind} layer, whose cut is unknown"


def plan(tensors, modules, packed, params, rename=lambda name: (name, None)):
    """A `Plan` per checkpoint tensor: `tensors` maps each name to its shape and why the
    server cannot cut it (`(shape, reason)`, reason empty when it can); `modules` maps module
    names to `Layer`s and `params` full parameter names to `Param`s; `packed` is the model's
    `packed_modules_mapping`; `rename` maps a checkpoint name to the model's name and the
    stacked part it fills (vLLM's `hf_to_vllm_mapper`: `(name, shard id or None)`), or None
    when the model drops the tensor."""
    out = []
    for name, (shape, uncuttable) in tensors.items():
        renamed = rename(name)
        target = None
        if renamed is not None:
            mapped, shard = renamed
            module, _, param_name = mapped.rpartition(".")
            if module in modules:
                target = (module, param_name, shard_index(shard))
            else:
                target = resolve(mapped, modules, packed)
        if target is None:
            out.append(Plan(name, None, "", None))
            continue
        module, param_name, index = target
        layer = modules[module]
        param = params.get(f"{module}.{param_name}", Param())
        if index is _UNKNOWN_SHARD:
            cut, reason = None, f"it fills a stacked part {renamed[1]!r} of {module} this loader cannot place"
        else:
            cut, reason = regions(layer, param, index, tuple(shape))
        if cut is not None and uncuttable:
            cut, reason = None, uncuttable
        if cut is not None and all(region == tuple((0, n) for n in shape[: len(region)]) for region in cut):
            cut = None  # the share is the whole tensor (one rank, or one key/value head per rank)
        out.append(Plan(name, cut, reason, module))
    return out


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
