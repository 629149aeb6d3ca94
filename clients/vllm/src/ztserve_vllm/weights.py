"""What one rank loads, without vLLM: each layer of the model vLLM built described for
`shares` (by its vLLM class name and attributes, duck-typed), the load plan of every
checkpoint tensor, and the stream of `(name, tensor)` vLLM's `load_weights` consumes, fetched
ahead in bounded batches."""

from concurrent.futures import ThreadPoolExecutor

from ztserve_client import ZtserveError
from ztserve_client._dtypes import numpy_dtype, torch_dtype

from . import shares
from .remote import RemoteTensor

# The vLLM layers whose weight loaders `shares` knows, by class name. A subclass may cut
# differently (more parts, another order), so it is not taken for its base.
_KINDS = {
    "QKVParallelLinear": shares.QKV,
    "MergedColumnParallelLinear": shares.MERGED,
    "ColumnParallelLinear": shares.COLUMN,
    "RowParallelLinear": shares.ROW,
    "VocabParallelEmbedding": shares.VOCAB,
    "ParallelLMHead": shares.VOCAB,
    "ReplicatedLinear": shares.REPLICATED,
}
_UNQUANTIZED = {"UnquantizedLinearMethod", "UnquantizedEmbeddingMethod"}


def describe(module):
    """The `shares.Layer` of a vLLM module that splits weights among ranks, or None for a
    module every rank holds whole (norms, rotary embeddings)."""
    cls = type(module).__name__
    tp_size = getattr(module, "tp_size", 1) or 1
    kind = _KINDS.get(cls)
    if kind is None:
        bases = {c.__name__ for c in type(module).__mro__}
        if tp_size > 1 or bases & set(_KINDS):
            return shares.Layer(shares.OPAQUE, tp_size=tp_size, reason=f"its layer is a {cls}, whose cut this loader does not know")
        return None
    quant = getattr(module, "quant_method", None)
    if quant is not None and type(quant).__name__ not in _UNQUANTIZED:
        return shares.Layer(shares.OPAQUE, tp_size=tp_size, reason=f"its layer is quantized ({type(quant).__name__})")
    if kind == shares.REPLICATED or tp_size == 1:
        return shares.Layer(shares.REPLICATED)
    rank = getattr(module, "tp_rank", 0)  # a vocabulary layer's rows are in its shard_indices
    if kind == shares.QKV:
        return shares.Layer(
            kind,
            rank,
            tp_size,
            heads=module.num_heads,
            kv_heads=module.num_kv_heads,
            head_size=module.head_size,
            v_head_size=getattr(module, "v_head_size", module.head_size),
            kv_replicas=module.num_kv_head_replicas,
        )
    if kind == shares.MERGED:
        return shares.Layer(kind, rank, tp_size, sizes=tuple(module.output_sizes))
    if kind == shares.COLUMN:
        return shares.Layer(kind, rank, tp_size, per_rank=module.output_size_per_partition)
    if kind == shares.ROW:
        return shares.Layer(kind, rank, tp_size, per_rank=module.input_size_per_partition)
    indices = module.shard_indices
    return shares.Layer(kind, rank, tp_size, start=indices.org_vocab_start_index, stop=indices.org_vocab_end_index)


def _uncuttable(obj):
    """Why the server cannot cut dense object `obj` into regions, or "" when it can."""
    if obj["components"][0].get("type") == "f4_e2m1":
        return "it packs two f4_e2m1 elements per byte"
    return ""


def stream(snapshot, plans, misses, prefetch_bytes):
    """(name, tensor) for every checkpoint tensor, in the manifest's order: a plain tensor
    for one fetched whole, a RemoteTensor over the regions fetched for it otherwise. Batches
    of up to `prefetch_bytes` are fetched one ahead of the one being loaded."""
    batches, batch, size = [], [], 0
    for one in plans:
        cost = _plan_bytes(snapshot.objects[one.name], one)
        if batch and size + cost > prefetch_bytes:
            batches.append(batch)
            batch, size = [], 0
        batch.append(one)
        size += cost
    if batch:
        batches.append(batch)

    def fetch(batch):
        requests = [(one.name, region) for one in batch for region in (one.regions or [None])]
        tensors = iter(snapshot.fetch(requests, framework="torch"))
        return [(one, [(region, next(tensors)) for region in (one.regions or [None])]) for one in batch]

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ztserve-prefetch") as ahead:
        pending = ahead.submit(fetch, batches[0]) if batches else None
        for i in range(len(batches)):
            fetched = pending.result()
            pending = ahead.submit(fetch, batches[i + 1]) if i + 1 < len(batches) else None
            for one, pieces in fetched:
                if one.regions is None:
                    yield one.name, pieces[0][1]
                    continue
                obj = snapshot.objects[one.name]
                meta = obj["components"][0]
                full = [tuple(region) + tuple((0, n) for n in obj["shape"][len(region):]) for region, _ in pieces]
                yield one.name, RemoteTensor(
                    one.name,
                    obj["shape"],
                    torch_dtype(meta["dtype"], meta.get("type")),
                    [(region, tensor) for region, (_, tensor) in zip(full, pieces)],
                    lambda region, name=one.name: snapshot.fetch([(name, region)], framework="torch")[0],
                    misses,
                )
            del fetched


def plan_model(model, snapshot):
    """The `shares.Plan` of every object of `snapshot` for this rank of `model`."""
    modules = {}
    for name, module in model.named_modules():
        layer = describe(module)
        if layer is not None:
            modules[name] = layer
    params = {
        name: shares.Param(getattr(p, "output_dim", None), getattr(p, "input_dim", None), bool(getattr(p, "is_sharded_weight", False)))
        for name, p in model.named_parameters()
    }
    for obj in snapshot.objects.values():
        if obj["format"] != "dense" or len(obj["components"]) != 1:
            # vLLM reads tensors; sparse, grouped-quantized and GGUF block layouts have no
            # tensor of the name and shape its weight loaders expect.
            raise ZtserveError(
                f"{obj['name']!r} of {snapshot.model!r} is a {obj['format']} object, not a dense tensor; the ztserve "
                "load format loads dense tensors, as vLLM reads them from safetensors")
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    split = getattr(mapper, "_map_name_with_shard", None)
    if split is not None:
        rename = split
    elif mapper is not None:
        rename = lambda name: (lambda mapped: None if mapped is None else (mapped, None))(mapper.map_name(name))  # noqa: E731
    else:
        rename = lambda name: (name, None)  # noqa: E731
    tensors = {name: (obj["shape"], _uncuttable(obj)) for name, obj in snapshot.objects.items()}
    return shares.plan(tensors, modules, getattr(model, "packed_modules_mapping", {}) or {}, params, rename)


def _itemsize(obj):
    meta = obj["components"][0]
    return numpy_dtype(meta["dtype"], meta.get("type")).itemsize


def _plan_bytes(obj, one):
    if one.regions is None:
        return sum(c["decoded_length"] for c in obj["components"])
    return sum(shares.region_bytes(obj["shape"], region, _itemsize(obj)) for region in one.regions)


def summary(snapshot, plans):
    """The log line of a load plan, and the tensors fetched whole though split, by reason."""
    total = sum(sum(c["decoded_length"] for c in obj["components"]) for obj in snapshot.objects.values())
    planned = sum(_plan_bytes(snapshot.objects[one.name], one) for one in plans)
    cut = sum(1 for one in plans if one.regions is not None)
    whole = {}
    for one in plans:
        if one.regions is None and one.reason:
            whole.setdefault(one.reason, []).append(one.name)
    version = snapshot.version.strip('"')
    line = (f"{snapshot.model} version {version}: fetching {planned / 1e6:.1f} MB of its {total / 1e6:.1f} MB "
            f"({planned / total if total else 0:.1%}): {cut} tensor(s) cut to this rank's share, {len(plans) - cut} whole")
    return {"line": line, "whole": whole}


def sample(names, count=3):
    """A few of `names`, for a log line."""
    return ", ".join(names[:count]) + (f" and {len(names) - count} more" if len(names) > count else "")
