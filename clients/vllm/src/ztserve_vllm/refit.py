"""Refits: a vLLM engine moves from one version of a model to the next by fetching only what
changed in each rank's share (docs/notes/refits-design.md).

The `ztserve` load format, when vLLM's `weight_transfer_config` names the `ztserve` backend,
keeps each rank's region buffers (its share of the version it loaded, `Kept`). A refit from A
to B fetches the deltas of exactly those regions (`POST /models/{B}@{version}/deltas`, from A at
the version the rank holds), applies each in place to its buffer (`apply_delta`, which checks
the XXH3 of the result), and loads the buffers through the model's own `load_weights` inside
vLLM's layerwise reload, so naming, fusing, TP slicing and processing (the CPU build repacks
linear weights and drops the originals) are those of a load. A region whose delta does not
apply, a base the server no longer holds (410/404), or a tensor whose shape, dtype or plan
changed, is fetched whole from B through `/regions`.

    llm = LLM(model=..., load_format="ztserve", tensor_parallel_size=2,
              weight_transfer_config={"backend": "ztserve"})
    llm.init_weight_transfer_engine({"init_info": {"url": URL, "model": "policy"}})
    llm.start_weight_update()
    llm.update_weights({"update_info": {"base": "step-000001", "target": "step-000002"}})
    llm.finish_weight_update("step-000002")

`base` and `target` are versions of the lineage `model` (`policy/step-000001`), or model ids of
their own when they already begin with `model/` (or `model` is not given)."""

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from ztserve_client import (
    Client,
    ClientError,
    DeltaError,
    ModelChanged,
    NotFound,
    ServerError,
    TransferError,
    Unavailable,
    apply_delta,
)
from ztserve_client._dtypes import torch_dtype

from . import shares, weights
from .remote import Misses

try:  # vLLM's logger when there is one (the engine); plain logging in the unit tests
    from vllm.logger import init_logger

    logger = init_logger(f"vllm.{__name__}")
except ImportError:  # pragma: no cover
    logger = logging.getLogger(__name__)

# What one deltas request asks at most: the client's regions batch, and the region bytes
# (`limits.max_regions_bytes` defaults to 16 GiB; a batch this size keeps each request short).
MAX_REGIONS = 1024
MAX_REQUEST_BYTES = 1 << 30
# Deltas requests a rank has in flight at once (at most the client's concurrency), each of at
# least MIN_REQUEST_BYTES of regions.
REQUESTS_AT_ONCE = 4
MIN_REQUEST_BYTES = 16 << 20
ATTRIBUTE = "_ztserve_refit"


class Kept:
    """What a rank holds of the version it loaded: the model id and version token, `plans`
    (`shares.Plan` per checkpoint tensor), `objects` (the manifest's, by name), `buffers` (name
    -> `[(box, tensor)]`, one per region of its plan), and `plan` (the rank's planner)."""

    def __init__(self, url, token, model_id, version, plans, objects, buffers, plan, settings=None):
        self.url, self.token = url, token
        self.model_id, self.version = model_id, version
        self.plans, self.objects, self.buffers, self.plan = plans, objects, buffers, plan
        self.settings = settings or {}
        self.broken = None  # why the buffers no longer hold one version, after a failed refit

    def nbytes(self):
        return sum(t.numel() * t.element_size() for kept in self.buffers.values() for _, t in kept)


def keep(model, kept):
    """Attaches `kept` to `model` (the engine finds it there)."""
    model.__dict__[ATTRIBUTE] = kept


def kept_of(model):
    kept = model.__dict__.get(ATTRIBUTE)
    if kept is None:
        raise RuntimeError("the ztserve weight-transfer backend needs the model loaded with load_format='ztserve' and "
                           "weight_transfer_config={'backend': 'ztserve'}: this rank kept no regions to apply deltas to")
    return kept


def wants_keeping():
    """Whether the engine being built asks for the ztserve weight-transfer backend (read in the
    load format, within vLLM's current config)."""
    try:
        from vllm.config import get_current_vllm_config

        config = get_current_vllm_config().weight_transfer_config
    except Exception:  # noqa: BLE001 - no config: nothing to keep
        return False
    return config is not None and getattr(config, "backend", None) == "ztserve"


def model_id(lineage, version):
    """The model id of `version` of `lineage` (itself when it already names one)."""
    if not lineage or version.startswith(lineage + "/"):
        return version
    return f"{lineage}/{version}"


def _as_bytes(tensor):
    """A contiguous CPU tensor's bytes as a writable uint8 numpy array (no copy)."""
    return tensor.view(-1).view(torch.uint8).numpy()


def _same(obj_a, obj_b):
    return obj_a is not None and list(obj_a["shape"]) == list(obj_b["shape"]) \
        and obj_a["components"][0]["dtype"] == obj_b["components"][0]["dtype"] \
        and obj_a["components"][0].get("type") == obj_b["components"][0].get("type")


def _overlap(a, b):
    return all(x < w and v < y for (x, y), (v, w) in zip(a or (), b or ()))


def _batches(requests, sizes, limit=MAX_REQUEST_BYTES):
    """`requests` (name, index, region) in order, in batches of at most MAX_REGIONS and about
    `limit` bytes of regions, no two regions of one tensor overlapping (the server refuses a
    request that asks for a byte twice)."""
    batch, total, seen = [], 0, {}
    for request, size in zip(requests, sizes):
        name, _, region = request
        clash = any(_overlap(region, other) for other in seen.get(name, ()))
        if batch and (len(batch) >= MAX_REGIONS or total + size > limit or clash):
            yield batch
            batch, total, seen = [], 0, {}
        batch.append(request)
        seen.setdefault(name, []).append(region)
        total += size
    if batch:
        yield batch


@dataclass
class Stats:
    """One refit of one rank: bytes received (deltas with their CRCs, and regions fetched whole
    with theirs), the rank's share (what a reload would fetch), counts, and seconds."""

    base: str = ""
    target: str = ""
    delta_bytes: int = 0
    whole_bytes: int = 0
    share_bytes: int = 0
    regions: int = 0
    patched: int = 0
    fallback: int = 0
    fallback_reasons: tuple = ()
    fetch_s: float = 0.0
    load_s: float = 0.0

    @property
    def received(self):
        return self.delta_bytes + self.whole_bytes

    def line(self):
        ratio = self.share_bytes / self.received if self.received else float("inf")
        why = f" ({'; '.join(self.fallback_reasons[:3])})" if self.fallback_reasons else ""
        return (f"refit {self.base} -> {self.target}: received {self.received} bytes ({self.delta_bytes} of deltas, "
                f"{self.whole_bytes} whole) for a share of {self.share_bytes} bytes ({ratio:.1f}x fewer); "
                f"{self.patched} of {self.regions} regions by delta, {self.fallback} fetched whole{why}; "
                f"fetched and applied in {self.fetch_s:.2f} s, loaded in {self.load_s:.2f} s")


def refit(client, kept, lineage, base, target, load_weights):
    """Moves `kept` from `base` to `target` (versions of `lineage`) and hands the result to
    `load_weights` (an iterable of `(name, tensor)`, as a load does); returns the `Stats`."""
    started = time.perf_counter()
    base_id, target_id = model_id(lineage, base), model_id(lineage, target)
    if kept.broken:
        raise RuntimeError(f"this rank's kept regions are not one version any more ({kept.broken}); load the model again")
    if base_id != kept.model_id:
        raise ValueError(f"refit from {base_id!r}: this rank holds {kept.model_id!r} (version {kept.version.strip(chr(34))}), "
                         f"not {base_id!r}")
    snapshot = client.snapshot(target_id)
    plans = weights.plan_model(None, snapshot, kept.plan)
    stats = Stats(base=base_id, target=target_id)
    old_plans = {one.name: one for one in kept.plans}
    # What can come as deltas: a tensor of the same shape and dtype in both, planned alike.
    patchable, whole = [], []  # (name, index of region, region)
    for one in plans:
        before = old_plans.get(one.name)
        same = before is not None and _same(kept.objects.get(one.name), snapshot.objects[one.name]) \
            and before.regions == one.regions and one.name in kept.buffers
        for index, region in enumerate(weights.wanted(one)):
            (patchable if same else whole).append((one.name, index, region))
        stats.share_bytes += weights.plan_bytes(snapshot.objects[one.name], one)
    stats.regions = len(patchable) + len(whole)
    reasons = []
    if len(whole):
        reasons.append(f"{len(whole)} region(s) of tensors new, reshaped or planned anew")
    buffers = {name: list(kept.buffers[name]) for name in kept.buffers}
    kept.broken = f"a refit to {target_id} began and did not end"
    base_pinned = f"{kept.model_id}@{kept.version.strip(chr(34))}"
    sizes = [buffers[name][index][1].numel() * buffers[name][index][1].element_size() for name, index, _ in patchable]
    # Several requests at once, so a server computing deltas (each region's on its blocking
    # pool, one after another within a request) works on as many regions at once.
    ways = max(1, min(REQUESTS_AT_ONCE, client.concurrency))
    per_request = min(MAX_REQUEST_BYTES, max(MIN_REQUEST_BYTES, -(-sum(sizes) // ways)))
    batches = list(_batches(patchable, sizes, per_request))

    def patch(batch):
        """The batch's deltas applied: (patched, failed, reasons, bytes received)."""
        stream = snapshot.deltas(base_pinned, [(name, region) for name, _, region in batch])
        at, patched, failed, reasons = 0, 0, [], []
        try:
            for delta in stream:
                name, index, _ = batch[at]
                at += 1
                try:
                    apply_delta(delta, _as_bytes(buffers[name][index][1]))
                    patched += 1
                except DeltaError as e:
                    failed.append(batch[at - 1])
                    reasons.append(f"{name}: {e.code}")
        except (ModelChanged, NotFound) as e:
            # The base is gone (410) or not there (404): what is not yet patched comes whole.
            reasons.append(f"base {base_pinned} not served: {getattr(e, 'code', type(e).__name__)}")
            failed.extend(batch[at:])
        except (TransferError, DeltaError) as e:
            reasons.append(f"deltas cut short or malformed: {e}")
            failed.extend(batch[at:])
        except (ServerError, Unavailable) as e:
            # The server could not diff them (a version's bytes failing their digest, a store
            # unreachable): they come whole, where the same failure, if lasting, is raised.
            reasons.append(f"deltas not served: {getattr(e, 'code', None) or e}")
            failed.extend(batch[at:])
        except ClientError as e:
            if e.status != 413:
                raise
            # A region too large for the server to diff (`refits.delta_memory_bytes`): refused
            # before any byte, so the batch comes whole.
            reasons.append(f"deltas refused: {e.code}")
            failed.extend(batch[at:])
        return patched, failed, reasons, stream.received

    failed = []
    if batches:
        with ThreadPoolExecutor(max_workers=min(ways, len(batches)), thread_name_prefix="ztserve-refit") as pool:
            for patched, batch_failed, batch_reasons, received in pool.map(patch, batches):
                stats.patched += patched
                stats.delta_bytes += received
                failed += batch_failed
                reasons += [r for r in batch_reasons if r not in reasons]
    whole += failed
    if whole:
        stats.whole_bytes = _fetch_whole(snapshot, plans, whole, buffers)
    stats.fallback = len(whole)
    stats.fallback_reasons = tuple(reasons)
    stats.fetch_s = time.perf_counter() - started
    # The kept buffers now hold the target's share: hand them to the model's loaders.
    # A tensor new in the target that this rank does not load has no regions, so none kept.
    kept.buffers = {one.name: buffers.get(one.name, []) for one in plans}
    kept.plans, kept.objects = plans, snapshot.objects
    kept.model_id, kept.version = target_id, snapshot.version
    loading = time.perf_counter()
    misses = Misses(lambda name, region: logger.warning("ztserve: refit: %s: the weight loader read %s, off the plan; "
                                                        "fetched on demand", name, list(region)))
    load_weights((one.name, weights.kept_tensor(snapshot, one, kept.buffers[one.name], misses)) for one in plans)
    kept.broken = None
    stats.load_s = time.perf_counter() - loading
    return stats


def _fetch_whole(snapshot, plans, wanted, buffers):
    """Fetches `wanted` regions (name, index, region) of B whole through `/regions` into
    `buffers` (a tensor of B's plan not kept yet gets its list made); the bytes received."""
    by_name = {one.name: one for one in plans}
    for name in {name for name, _, _ in wanted}:
        one = by_name[name]
        size = len(weights.wanted(one))
        if name not in buffers or len(buffers[name]) != size:
            buffers[name] = [None] * size
    received = 0
    requests = [(name, region) for name, _, region in wanted]
    for (name, index, region), value in zip(wanted, snapshot.stream(requests, framework="torch")):
        obj = snapshot.objects[name]
        meta = obj["components"][0]
        full = weights.box(obj["shape"], region)
        # The stream reuses its buffers: the kept copy is a tensor of its own.
        tensor = value.to(torch_dtype(meta["dtype"], meta.get("type"))).reshape([b - a for a, b in full]).clone()
        buffers[name][index] = (full, tensor)
        received += tensor.numel() * tensor.element_size() + 4
    return received


try:
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )
except ImportError:  # pragma: no cover - the unit tests of `refit` run without vLLM
    WeightTransferEngine = None

if WeightTransferEngine is not None:

    @dataclass
    class ZtserveInitInfo(WeightTransferInitInfo):
        url: str
        model: str | None = None  # the lineage (`policy`) whose versions base and target name
        token: str | None = None

    @dataclass
    class ZtserveUpdateInfo(WeightTransferUpdateInfo):
        base: str  # the version the ranks hold now (A)
        target: str  # the version to move to (B)

    class ZtserveWeightTransferEngine(WeightTransferEngine[ZtserveInitInfo, ZtserveUpdateInfo]):
        """vLLM's weight-transfer backend `ztserve`: each rank pulls the deltas of its share
        from the server (module docstring). `stats` is the last update's `Stats` on this rank;
        `history` every one."""

        init_info_cls = ZtserveInitInfo
        update_info_cls = ZtserveUpdateInfo
        supports_draft_weight_update = False

        def __init__(self, config, vllm_config, device, model):
            super().__init__(config, vllm_config, device, model)
            self.client = None
            self.lineage = None
            self.stats = None
            self.history = []

        def init_transfer_engine(self, init_info):
            kept = kept_of(self.model)
            if self.client is not None:
                self.client.close()
            url = init_info.url or kept.url
            token = init_info.token if init_info.token is not None else kept.token
            options = {k: kept.settings[k] for k in ("concurrency", "chunk_size", "outage_secs") if k in kept.settings}
            self.client = Client(url, token, **options)
            self.lineage = init_info.model

        def start_weight_update(self):
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)

        def finish_weight_update(self):
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(self.model, self.model_config)

        def update_weights(self, update_info):
            """As the base's, but the accelerator is synchronized only when there is one (the
            CPU build has none, and `torch.accelerator.synchronize()` raises there)."""
            self.receive_weights(self.parse_update_info(update_info))
            if torch.accelerator.is_available():
                torch.accelerator.synchronize()

        def receive_weights(self, update_info):
            if self.client is None:
                raise RuntimeError("init_weight_transfer_engine({'init_info': {'url': ..., 'model': ...}}) comes first")
            kept = kept_of(self.model)
            stats = refit(self.client, kept, self.lineage, update_info.base, update_info.target, self.model.load_weights)
            self.stats = stats
            self.history.append(stats)
            logger.info("ztserve: %s", stats.line())

        def shutdown(self):
            if self.client is not None:
                self.client.close()
                self.client = None
