"""What one rank loads, without vLLM: each layer and parameter of the model vLLM built described
for `shares` (by vLLM class name and attributes, duck-typed), the load plan of every checkpoint
tensor, what it costs against the rank's fair share, and the stream of `(name, tensor)` vLLM's
`load_weights` consumes, fetched ahead in bounded batches."""

from ztserve_client import ZtserveError
from ztserve_client._dtypes import numpy_dtype, torch_dtype

from . import shares
from .remote import OverShare, RemoteTensor

# The vLLM layers whose weight loaders `shares` knows, by class name. A subclass may cut
# differently (more parts, another order), so it is not taken for its base unless it cannot
# split (one rank) or derives from a replicated layer.
_KINDS = {
    "QKVParallelLinear": shares.QKV,
    "MergedColumnParallelLinear": shares.MERGED,
    "ColumnParallelLinear": shares.COLUMN,
    "RowParallelLinear": shares.ROW,
    "VocabParallelEmbedding": shares.VOCAB,
    "ParallelLMHead": shares.VOCAB,
    "ReplicatedLinear": shares.REPLICATED,
}
# Linear methods whose weight loaders cut each parameter by its marks (output_dim, input_dim,
# packing, block scales), as `shares` does: vLLM's weight_loader_v2 methods and the unquantized.
_LINEAR_METHODS = {
    "UnquantizedLinearMethod", "UnquantizedEmbeddingMethod", "Fp8LinearMethod", "FBGEMMFp8LinearMethod",
    "CompressedTensorsLinearMethod", "AutoGPTQLinearMethod", "AutoAWQLinearMethod", "AutoAWQMarlinLinearMethod",
}
# Expert methods whose parameters RoutedExperts.weight_loader cuts by `shares`' expert rules.
_EXPERT_METHODS = {
    "UnquantizedFusedMoEMethod", "Fp8MoEMethod", "CompressedTensorsW8A8Fp8MoEMethod", "CompressedTensorsW8A8Int8MoEMethod",
    "CompressedTensorsWNA16MoEMethod", "CompressedTensorsW4A16FlydslMoEMethod", "AutoGPTQMoEMethod", "AutoAWQMoEMethod",
}
# Compressed-tensors methods whose loader transposes a K-first packed expert before cutting it.
_FLIPPING = {"CompressedTensorsWNA16MoEMethod", "CompressedTensorsW4A16FlydslMoEMethod"}
_EXPERT_CLASSES = {"RoutedExperts", "FusedMoE"}


def _bases(module):
    return {c.__name__ for c in type(module).__mro__}


def describe(module, model_loader=shares.ROUTED):
    """The `shares.Layer` of a vLLM module that splits weights among ranks, or None for a
    module every rank holds whole (norms, rotary embeddings). `model_loader` says whose code
    loads the experts (gpt-oss's own `load_weights`, or vLLM's RoutedExperts)."""
    cls, bases = type(module).__name__, _bases(module)
    if bases & _EXPERT_CLASSES:
        return _describe_experts(module, cls, model_loader)
    tp_size = getattr(module, "tp_size", 1) or 1
    kind = _KINDS.get(cls)
    if kind is None:
        if "ReplicatedLinear" in bases or bases & set(_KINDS) and tp_size == 1:
            return shares.Layer(shares.REPLICATED, cls=cls)  # nothing to cut: every rank reads it whole
        if tp_size > 1 or bases & set(_KINDS):
            return shares.Layer(shares.OPAQUE, tp_size=tp_size, cls=cls, reason=f"its layer is a {cls}, whose cut this loader does not know")
        return None
    quant = getattr(module, "quant_method", None)
    if quant is not None and type(quant).__name__ not in _LINEAR_METHODS:
        return shares.Layer(shares.OPAQUE, tp_size=tp_size, cls=cls,
                            reason=f"its layer is quantized by {type(quant).__name__}, whose cut this loader does not know")
    if kind == shares.REPLICATED or tp_size == 1:
        return shares.Layer(shares.REPLICATED, cls=cls)
    rank = getattr(module, "tp_rank", 0)  # a vocabulary layer's rows are in its shard_indices
    block = tuple(module.weight_block_size) if getattr(module, "weight_block_size", None) else None
    if kind == shares.QKV:
        return shares.Layer(
            kind, rank, tp_size, cls=cls, block=block,
            heads=module.num_heads,
            kv_heads=module.num_kv_heads,
            head_size=module.head_size,
            v_head_size=getattr(module, "v_head_size", module.head_size),
            kv_replicas=module.num_kv_head_replicas,
        )
    if kind == shares.MERGED:
        return shares.Layer(kind, rank, tp_size, cls=cls, block=block, sizes=tuple(module.output_sizes))
    if kind == shares.COLUMN:
        return shares.Layer(kind, rank, tp_size, cls=cls, block=block, per_rank=module.output_size_per_partition)
    if kind == shares.ROW:
        return shares.Layer(kind, rank, tp_size, cls=cls, block=block, per_rank=module.input_size_per_partition)
    indices = module.shard_indices
    return shares.Layer(kind, rank, tp_size, cls=cls, start=indices.org_vocab_start_index, stop=indices.org_vocab_end_index)


def _describe_experts(module, cls, model_loader):
    """A mixture of experts (vLLM's RoutedExperts): its ranks, its experts on this rank, its
    checkpoint names and how its quantization method loads them; an experts layer of another
    make (an older vLLM's FusedMoE) is fetched whole, with the reason."""
    try:
        config = module.moe_config
        parallel = config.moe_parallel_config
        ways = parallel.ep_size if parallel.use_ep else parallel.tp_size
        experts = _local_experts(module, config) if parallel.use_ep else None
        common = dict(
            tp_rank=parallel.tp_rank, tp_size=parallel.tp_size, cls=cls, experts=experts,
            ep_size=parallel.ep_size if parallel.use_ep else 1,
            names=(module.ckpt_gate_proj_name, module.ckpt_down_proj_name, module.ckpt_up_proj_name),
            gated=bool(config.is_act_and_mul), fused_transposed=bool(getattr(module, "is_fused_checkpoint_transposed", False)),
            intermediate=config.intermediate_size,
        )
    except AttributeError as e:
        return shares.Layer(shares.EXPERTS, tp_size=getattr(module, "tp_size", 1) or 1, cls=cls,
                            reason=f"its experts are a {cls} this loader does not know ({e})")
    quant = type(getattr(module, "quant_method", None)).__name__
    if model_loader == shares.GPT_OSS:
        if quant != "UnquantizedFusedMoEMethod":
            return shares.Layer(shares.EXPERTS, reason=f"vLLM reshapes gpt-oss's {quant} expert blocks before it cuts them", **common)
        return shares.Layer(shares.EXPERTS, loader=shares.GPT_OSS, **common)
    if quant not in _EXPERT_METHODS:
        return shares.Layer(shares.EXPERTS, reason=f"its experts are quantized by {quant}, whose cut this loader does not know", **common)
    if getattr(config, "tp_shard_with_padding", False):
        return shares.Layer(shares.EXPERTS, reason="vLLM pads these experts' shares to its kernel's blocks", **common)
    if ways > 1 and getattr(module, "_fused_shared_expert_quantizer", None) is not None:
        return shares.Layer(shares.EXPERTS, reason="vLLM quantizes a fused shared expert while loading it", **common)
    refined = getattr(module.quant_method, "weight_scale_refine", None) is not None
    return shares.Layer(shares.EXPERTS, refined=refined, flips=quant in _FLIPPING, **common)


def _local_experts(module, config):
    """The checkpoint (logical) ids of the experts this rank holds under expert parallelism:
    its physical experts, each redundant one (EPLB) naming the logical expert it copies."""
    physical = module.expert_map_manager.get_local_expert_ids()
    logical = config.num_logical_experts
    return tuple(sorted({p if p < logical else (p - logical) % logical for p in physical}))


def describe_param(param):
    """The `shares.Param` of a vLLM parameter, from its marks (vLLM's parameter classes and
    `set_weight_attrs`)."""
    bases = _bases(param)

    def mark(name):
        try:
            return getattr(param, name, None)
        except (AttributeError, ValueError):
            return None

    scale = mark("quant_method")
    return shares.Param(
        output_dim=mark("output_dim"),
        input_dim=mark("input_dim"),
        sharded=bool(mark("is_sharded_weight")),
        shape=tuple(param.shape),
        packed_dim=mark("packed_dim"),
        packed_factor=mark("packed_factor") or 1,
        marlin_tile=mark("marlin_tile_size"),
        block="BlockQuantScaleParameter" in bases,
        scalar="PerTensorScaleParameter" in bases or bool(mark("needs_scalar_to_array")),
        transposed=bool(mark("is_transposed")),
        scale=scale if isinstance(scale, str) else None,
    )


def model_loader(model):
    """Whose code loads the model's experts: gpt-oss's own `load_weights` or RoutedExperts."""
    return shares.GPT_OSS if type(model).__name__.startswith("GptOss") else shares.ROUTED


def layers(model):
    """Every layer of `model` that splits weights (by name) and every parameter's marks (by
    full name). A RoutedExperts module is filed under the layer the checkpoint names (its
    parent `…experts` in vLLM 0.32, whose runner holds it as `routed_experts`)."""
    modules, params = {}, {}
    loader = model_loader(model)
    for name, module in model.named_modules():
        layer = describe(module, loader)
        if layer is None:
            continue
        key = name[: -len(".routed_experts")] if name.endswith(".routed_experts") else name
        modules[key] = layer
        if layer.kind == shares.EXPERTS:
            for pname, p in module.named_parameters(recurse=False):
                params[f"{key}.{pname}"] = describe_param(p)
    for name, p in model.named_parameters():
        params.setdefault(name, describe_param(p))
    return modules, params


def _uncuttable(obj):
    """Why the server cannot cut dense object `obj` into regions, or "" when it can."""
    if obj["components"][0].get("type") == "f4_e2m1":
        return "it packs two f4_e2m1 elements per byte"
    return ""


def check_dense(snapshot):
    """Refuses a model holding objects that are not dense tensors: vLLM's weight loaders take
    tensors of the checkpoint's names and shapes; sparse, grouped-quantized and GGUF block
    layouts have none."""
    for obj in snapshot.objects.values():
        if obj["format"] != "dense" or len(obj["components"]) != 1:
            raise ZtserveError(
                f"{obj['name']!r} of {snapshot.model!r} is a {obj['format']} object, not a dense tensor; the ztserve "
                "load format loads dense tensors, as vLLM reads them from safetensors")


def renamer(model):
    """vLLM's `hf_to_vllm_mapper` of `model` as a function of a checkpoint name to `(name in the
    model, stacked part or None)`, None when the model drops the tensor. As vLLM's
    AutoWeightsLoader does, the quantization config's own mappers follow the model's (vLLM 0.32
    drops every `.g_idx`)."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    quant = next((getattr(m, "quant_config", None) for m in (model, *model.children()) if getattr(m, "quant_config", None)), None)
    for name in ("get_cache_scale_mapper", "get_checkpoint_weight_mapper"):
        extra = getattr(quant, name, None)
        if extra is not None:
            mapper = extra() if mapper is None else mapper | extra()
    split = getattr(mapper, "_map_name_with_shard", None)
    if split is not None:
        return split
    if mapper is not None:
        return lambda name: (lambda mapped: None if mapped is None else (mapped, None))(mapper.map_name(name))  # noqa: E731
    return lambda name: (name, None)  # noqa: E731


def absence(model):
    """Whether a name (in the model's naming) belongs to a layer this rank's model does not
    have: an index past the end of one of its layer lists (DeepSeek's multi-token-prediction
    layer, which the main model skips), or another pipeline stage's layer (PPMissingLayer)."""
    names, lists = {}, set()
    for name, module in model.named_modules():
        names[name] = type(module).__name__
        parent, _, leaf = name.rpartition(".")
        if leaf.isdecimal():
            lists.add(parent)  # a list of layers (model.layers)

    def absent(name):
        parts = name.split(".")
        for i in range(1, len(parts)):
            prefix = ".".join(parts[:i])
            if names.get(prefix) == "PPMissingLayer":
                return True
            if parts[i].isdecimal() and prefix in lists and f"{prefix}.{parts[i]}" not in names:
                return True
        return False

    return absent


def planner(model):
    """A function of checkpoint tensors (name -> (shape, why the server cannot cut it)) to
    their `shares.Plan`s for this rank of `model`, its layers described once, now: it plans
    another version of the checkpoint later without looking at the model again (a refit
    plans while vLLM's layerwise reload holds the layers on the meta device)."""
    modules, params = layers(model)
    packed = getattr(model, "packed_modules_mapping", {}) or {}
    rename, absent = renamer(model), absence(model)
    return lambda tensors: shares.plan(tensors, modules, packed, params, rename, absent, complete=True)


def plan_tensors(model, tensors):
    """The `shares.Plan` of every checkpoint tensor (name -> (shape, why the server cannot cut
    it)) for this rank of `model`."""
    return planner(model)(tensors)


def snapshot_tensors(snapshot):
    """What `planner` takes of every object of `snapshot` (checked dense)."""
    check_dense(snapshot)
    return {name: (obj["shape"], _uncuttable(obj)) for name, obj in snapshot.objects.items()}


def plan_model(model, snapshot, plan=None):
    """The `shares.Plan` of every object of `snapshot` for this rank of `model` (by `plan`, a
    `planner` of it, when given)."""
    return (plan or planner(model))(snapshot_tensors(snapshot))


def wanted(one):
    """The regions `one` fetches: its regions, or [None] for the whole tensor."""
    return [None] if one.regions is None else one.regions


def box(shape, region):
    """`region` (None: the whole tensor; else `(start, stop)` per leading dimension) as one
    `(start, stop)` per dimension of a tensor of `shape`."""
    region = region or ()
    return tuple(tuple(region[d]) if d < len(region) else (0, n) for d, n in enumerate(shape))


def joined(full_box, tiles, dtype):
    """A new contiguous tensor of `full_box` from the `(box, pending or tensor)` tiles that
    cover it: the kept copy of a region, which outlives the stream's reused buffers."""
    import torch

    out = torch.empty([stop - start for start, stop in full_box], dtype=dtype)
    for tile_box, tile in tiles:
        value = tile.result() if hasattr(tile, "result") and not isinstance(tile, torch.Tensor) else tile
        out[tuple(slice(a - start, b - start) for (a, b), (start, _) in zip(tile_box, full_box))] = value
    return out


def kept_tensor(snapshot, one, kept, misses):
    """What vLLM's `load_weights` is handed for `one` from its kept regions (`kept`: a list of
    `(box, tensor)`, one per region of the plan): the tensor itself when whole, else a
    RemoteTensor over them."""
    if one.regions is None and len(kept) == 1:
        return kept[0][1]
    obj = snapshot.objects[one.name]
    meta = obj["components"][0]
    return RemoteTensor(
        one.name, obj["shape"], torch_dtype(meta["dtype"], meta.get("type")), list(kept),
        lambda region, name=one.name: snapshot.fetch([(name, region)], framework="torch")[0], misses)


def stream(snapshot, plans, misses, prefetch_bytes, request_bytes=None, concurrency=None, cpus=None, keep=None):
    """(name, tensor) for every checkpoint tensor, in the manifest's order: a plain tensor for
    one fetched whole in one piece, a RemoteTensor over the pieces fetched for it otherwise
    (none for a tensor this rank does not load). Every planned region is fetched ahead
    (`Snapshot.stream`: many regions per request, each checked against its CRC32C; a region
    larger than a request in several pieces, never copied into one, each copied by vLLM's
    loader as it arrives while the next is still on its way) with at most about
    `prefetch_bytes` fetched and not yet handed to vLLM, on threads confined to `cpus` when
    given; the buffers are reused once vLLM has copied them.

    With `keep` (a dict), each tensor's regions are first copied into tensors of their own,
    kept as `keep[name] = [(box, tensor), ...]` (one per region of its plan, in order), and
    vLLM reads those: a refit (`refit`) applies the next version's deltas to them."""
    requests = [(one.name, region) for one in plans for region in wanted(one)]
    options = {"ahead_bytes": prefetch_bytes, "pieces": True, "cpus": cpus}
    if request_bytes is not None:
        options["request_bytes"] = request_bytes
    if concurrency is not None:
        options["concurrency"] = concurrency
    fetched = snapshot.stream(requests, framework="torch", **options) if requests else iter(())
    try:
        for one in plans:
            if keep is not None:
                obj = snapshot.objects[one.name]
                meta = obj["components"][0]
                dtype = torch_dtype(meta["dtype"], meta.get("type"))
                kept = keep[one.name] = []
                for region in wanted(one):
                    full = box(obj["shape"], region)
                    kept.append((full, joined(full, next(fetched), dtype)))
                yield one.name, kept_tensor(snapshot, one, kept, misses)
                continue
            pieces = [piece for _ in wanted(one) for piece in next(fetched)]
            if one.regions is None and len(pieces) == 1:
                yield one.name, pieces[0][1].result()
                del pieces
                continue
            obj = snapshot.objects[one.name]
            meta = obj["components"][0]
            yield one.name, RemoteTensor(
                one.name,
                obj["shape"],
                torch_dtype(meta["dtype"], meta.get("type")),
                pieces,
                lambda region, name=one.name: snapshot.fetch([(name, region)], framework="torch")[0],
                misses,
            )
            del pieces
    finally:
        close = getattr(fetched, "close", None)
        if close is not None:
            close()


def _itemsize(obj):
    meta = obj["components"][0]
    return numpy_dtype(meta["dtype"], meta.get("type")).itemsize


def object_bytes(obj):
    """The decoded bytes of a whole object."""
    return sum(c["decoded_length"] for c in obj["components"])


def plan_bytes(obj, one):
    """The bytes `one` fetches of `obj`."""
    if one.regions is None:
        return object_bytes(obj)
    return sum(shares.region_bytes(obj["shape"], region, _itemsize(obj)) for region in one.regions)


def costs(objects, plans):
    """What a rank's plan costs: `total` (the model's bytes), `planned` (fetched), `share`
    (what it would fetch were every split weight cut), `cut` and `skipped` counts,
    `replicated` (count, bytes: tensors every rank reads whole), and `whole`: the tensors fetched whole
    though split, by layer class and reason ((class, reason) -> {names, bytes})."""
    out = {"total": sum(object_bytes(o) for o in objects.values()), "planned": 0, "share": 0, "cut": 0, "skipped": 0,
           "replicated": [0, 0], "whole": {}}
    for one in plans:
        obj = objects[one.name]
        planned = plan_bytes(obj, one)
        out["planned"] += planned
        # A tensor fetched whole for a reason counts for its fair share (1/ways) of the share.
        out["share"] += object_bytes(obj) // max(one.ways, 1) if one.regions is None and one.reason else planned
        if one.regions == []:
            out["skipped"] += 1
        elif one.regions is not None:
            out["cut"] += 1
        elif one.reason:
            entry = out["whole"].setdefault((one.cls or "unknown", one.reason), {"names": [], "bytes": 0})
            entry["names"].append(one.name)
            entry["bytes"] += object_bytes(obj)
        else:
            out["replicated"][0] += 1
            out["replicated"][1] += object_bytes(obj)
    return out


def summary(snapshot, plans):
    """The log line of a load plan, the tensors fetched whole though split (as `costs` gives
    them), and the bytes planned and of the rank's share."""
    c = costs(snapshot.objects, plans)
    version = snapshot.version.strip('"')
    whole_count = sum(len(entry["names"]) for entry in c["whole"].values())
    whole_bytes = sum(entry["bytes"] for entry in c["whole"].values())
    parts = [f"{c['cut']} cut to this rank's share"]
    if c["skipped"]:
        parts.append(f"{c['skipped']} not loaded by this rank (other ranks' experts, tensors the model does not load)")
    parts.append(f"{c['replicated'][0]} read whole by every rank ({c['replicated'][1] / 1e6:.1f} MB)")
    parts.append(f"{whole_count} fetched whole though split ({whole_bytes / 1e6:.1f} MB)")
    line = (f"{snapshot.model} version {version}: fetching {c['planned'] / 1e6:.1f} MB of its {c['total'] / 1e6:.1f} MB "
            f"({c['planned'] / c['total'] if c['total'] else 0:.1%}, {c['planned'] / c['share'] if c['share'] else 1:.2f}x this rank's "
            f"share): " + ", ".join(parts))
    return {"line": line, "whole": c["whole"], "planned": c["planned"], "share": c["share"]}


def strict_limit(summary, ratio):
    """The most bytes a rank may fetch under the strict setting (`ratio` times its share);
    raises OverShare, naming what is fetched whole, when its plan already fetches more."""
    limit = ratio * summary["share"]
    if summary["planned"] > limit:
        raise OverShare(
            f"this rank would fetch {summary['planned'] / 1e6:.1f} MB, more than {ratio}x its share "
            f"({summary['share'] / 1e6:.1f} MB), and the strict setting is on: " + "; ".join(warnings(summary["whole"])))
    return limit


def warnings(whole):
    """One warning per layer class for the tensors fetched whole though split: how many, their
    bytes and why, with a few names."""
    by_class = {}
    for (cls, reason), entry in whole.items():
        by_class.setdefault(cls, []).append((reason, entry))
    lines = []
    for cls, entries in sorted(by_class.items()):
        count = sum(len(e["names"]) for _, e in entries)
        size = sum(e["bytes"] for _, e in entries)
        reasons = "; ".join(reason for reason, _ in entries)
        names = [n for _, e in entries for n in e["names"]]
        lines.append(f"{count} tensor(s) of {cls} layers ({size / 1e6:.1f} MB) fetched whole though the layer is split, "
                     f"because {reasons}: {sample(names)}")
    return lines


def sample(names, count=3):
    """A few of `names`, for a log line."""
    return ", ".join(names[:count]) + (f" and {len(names) - count} more" if len(names) > count else "")
