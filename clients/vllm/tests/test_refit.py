"""Refits (`ztserve_vllm.refit`) against the stand-in Llama of test_weights: a rank loads
version A keeping its regions, then moves to B through deltas and must hold exactly what loading
B gives, having received far less than its share. The deltas route is stood in here (each
region's delta encoded from the two versions' regions as the server cuts them, by the format's
spec), so the plugin's logic is tested whatever the server's state; the real route is in the
end-to-end check (tests/interop/vllm_load.py check-refit)."""

import numpy as np
import pytest
import torch
import xxhash
import zstandard
from safetensors.torch import save_file
from conftest import live
from test_weights import Llama, checkpoint

import ztserve_client
from ztserve_client import Client, Snapshot
from ztserve_client._delta import HEADER_LEN  # noqa: F401 - the format's header, as the encoder below writes it
from ztserve_vllm import refit, weights
from ztserve_vllm.remote import Misses

# The tests of the engine class itself need vLLM: scripts/vllm-check runs them in its venv.
NEEDS_VLLM = "vLLM is not installed here; scripts/vllm-check runs this test in the vLLM venv"


def changed(state, seed, fraction=0.05):
    """`state` with `fraction` of every tensor's elements set to new values (seeded)."""
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in state.items():
        flat = tensor.clone().reshape(-1)
        picked = torch.rand(flat.numel(), generator=generator) < fraction
        flat[picked] = (torch.randn(int(picked.sum()), generator=generator) * 3).to(flat.dtype)
        out[name] = flat.reshape(tensor.shape)
    return out


def _header(kind, width, elements, count, payload_len, digest):
    import struct

    return struct.pack("<8sBB6sQQQQ", b"ZTDELTA1", kind, width, bytes(6), elements, count, payload_len, digest)


def _varints(values):
    out = bytearray()
    for value in values:
        value = int(value)
        while True:
            byte = value & 0x7F
            value >>= 7
            out.append(byte | (0x80 if value else 0))
            if not value:
                break
    return bytes(out)


def encode(old, new, width):
    """One region's delta, by the spec (`format/src/delta.rs`): a patch when at most half the
    elements changed, else the new bytes whole."""
    elements = len(new) // width
    digest = xxhash.xxh3_64_intdigest(new)
    if len(old) != len(new):
        return _header(1, width, elements, elements, len(new), digest) + new
    element = np.dtype(f"<u{width}")
    moved = np.flatnonzero(np.frombuffer(old, element) != np.frombuffer(new, element))
    if len(moved) > elements // 2:
        return _header(1, width, elements, elements, len(new), digest) + new
    if len(moved) == 0:
        return _header(0, width, elements, 0, 0, digest)
    gaps = np.diff(moved, prepend=-1) - 1
    rows = np.frombuffer(new, np.uint8).reshape(-1, width)[moved]
    frame = zstandard.ZstdCompressor().compress(_varints(gaps) + np.ascontiguousarray(rows.T).tobytes())
    return _header(0, width, elements, len(moved), len(frame), digest) + frame


class StandIn:
    """`Snapshot.deltas` stood in: each region's delta from the base's bytes of it (fetched
    through /regions at the pinned base) to the snapshot's. `mode`: "ok", "gone" (410 for the
    base), or "corrupt NAME" (that tensor's deltas have a flipped payload byte)."""

    def __init__(self, monkeypatch):
        self.mode = "ok"
        self.asked = []
        stand_in = self

        def deltas(snapshot, base, regions):
            stand_in.asked.append((base, list(regions)))
            return _Deltas(stand_in, snapshot, base, list(regions))

        monkeypatch.setattr(Snapshot, "deltas", deltas)


class _Deltas:
    def __init__(self, stand_in, snapshot, base, regions):
        self.stand_in, self.snapshot, self.base, self.regions = stand_in, snapshot, base, regions
        self.received = 0

    def __iter__(self):
        if self.stand_in.mode == "gone":
            raise ztserve_client.VersionGone(410, "version_gone", f"{self.base} is no longer kept", "stand-in")
        base_id, _, version = self.base.partition("@")
        base = self.snapshot.client.snapshot(base_id)
        assert base.version.strip('"') == version, "the base pinned at the version the rank holds"
        for name, region in self.regions:
            old = base.fetch([(name, region)], framework="numpy")[0]
            new = self.snapshot.fetch([(name, region)], framework="numpy")[0]
            delta = bytearray(encode(old.tobytes(), new.tobytes(), new.dtype.itemsize))
            if self.stand_in.mode == f"corrupt {name}" and len(delta) > HEADER_LEN:
                delta[-1] ^= 0xFF
            self.received += len(delta) + 4
            yield delta


@pytest.fixture
def versions(tmp_path):
    """Versions A and B (5% of every tensor changed) and C (B with q_proj widened: a new
    shape), as sibling models policy/step-1..3 of one server."""
    a = checkpoint()
    b = changed(a, 1)
    c = dict(changed(b, 2))
    c["model.layers.0.mlp.up_proj.weight"] = torch.randn(c["model.layers.0.mlp.up_proj.weight"].shape, dtype=torch.bfloat16)
    models = tmp_path / "models"
    for step, state in enumerate((a, b, c), 1):
        (models / "policy" / f"step-{step}").mkdir(parents=True)
        save_file(state, models / "policy" / f"step-{step}" / "model.safetensors", metadata={"format": "pt"})
    server = live.Server(models)
    yield server, (a, b, c)
    server.stop()


def load_kept(url, model_id, rank, size):
    """A rank of the stand-in Llama loaded from `model_id` keeping its regions, as the load
    format does under the ztserve backend."""
    model = Llama(rank, size)
    client = Client(url)
    snapshot = client.snapshot(model_id)
    plan = weights.planner(model)
    plans = weights.plan_model(model, snapshot, plan)
    kept = {}
    model.load_weights(weights.stream(snapshot, plans, Misses(), 1 << 20, keep=kept))
    held = refit.Kept(url, None, model_id, snapshot.version, plans, snapshot.objects, kept, plan)
    refit.keep(model, held)
    return model, client, held


def expected(state, rank, size):
    model = Llama(rank, size)
    model.load_weights(state.items())
    return model


def assert_holds(model, state, rank, size):
    for (name, got), (_, want) in zip(model.named_parameters(), expected(state, rank, size).named_parameters()):
        assert torch.equal(got, want), (name, rank, size)


@pytest.mark.parametrize("size", [1, 2])
def test_a_refit_holds_exactly_what_loading_the_target_gives_for_far_fewer_bytes(versions, monkeypatch, size):
    server, (a, b, _) = versions
    stand_in = StandIn(monkeypatch)
    for rank in range(size):
        model, client, held = load_kept(server.url, "policy/step-1", rank, size)
        assert_holds(model, a, rank, size)
        stats = refit.refit(client, held, "policy", "step-1", "step-2", model.load_weights)
        assert_holds(model, b, rank, size)
        assert stats.patched == stats.regions and stats.fallback == 0 and stats.whole_bytes == 0
        assert 0 < stats.delta_bytes < stats.share_bytes / 2, stats.line()
        assert held.model_id == "policy/step-2"
        # Kept regions now hold B: another refit from B starts from them.
        assert stand_in.asked[-1][0].startswith("policy/step-1@")


def test_a_base_no_longer_served_is_fetched_whole_from_the_target(versions, monkeypatch):
    server, (_, b, _) = versions
    stand_in = StandIn(monkeypatch)
    stand_in.mode = "gone"
    model, client, held = load_kept(server.url, "policy/step-1", 1, 2)
    stats = refit.refit(client, held, "policy", "step-1", "policy/step-2", model.load_weights)
    assert_holds(model, b, 1, 2)
    assert stats.patched == 0 and stats.fallback == stats.regions and stats.whole_bytes >= stats.share_bytes
    assert "not served" in stats.fallback_reasons[0]


def test_a_delta_that_does_not_apply_fetches_that_region_whole(versions, monkeypatch):
    server, (_, b, _) = versions
    stand_in = StandIn(monkeypatch)
    stand_in.mode = "corrupt lm_head.weight"
    model, client, held = load_kept(server.url, "policy/step-1", 0, 2)
    stats = refit.refit(client, held, "policy", "step-1", "step-2", model.load_weights)
    assert_holds(model, b, 0, 2)
    assert stats.fallback == 1 and stats.patched == stats.regions - 1
    assert any(reason.startswith("lm_head.weight: delta_") for reason in stats.fallback_reasons)


def test_a_changed_tensor_comes_whole_and_the_rest_as_deltas_across_two_refits(versions, monkeypatch):
    server, (_, b, c) = versions
    StandIn(monkeypatch)
    model, client, held = load_kept(server.url, "policy/step-1", 1, 2)
    refit.refit(client, held, "policy", "step-1", "step-2", model.load_weights)
    stats = refit.refit(client, held, "policy", "step-2", "step-3", model.load_weights)
    assert_holds(model, c, 1, 2)
    # up_proj was rewritten whole: its delta is the whole region (more than half changed).
    assert stats.fallback == 0 and stats.patched == stats.regions


def test_a_refit_from_a_version_the_rank_does_not_hold_is_refused(versions, monkeypatch):
    server, _ = versions
    StandIn(monkeypatch)
    model, client, held = load_kept(server.url, "policy/step-1", 0, 2)
    with pytest.raises(ValueError, match="this rank holds 'policy/step-1'"):
        refit.refit(client, held, "policy", "step-2", "step-3", model.load_weights)


def test_a_reshaped_tensor_is_fetched_whole(tmp_path, monkeypatch):
    a = checkpoint()
    b = changed(a, 3)
    b["model.norm.weight"] = torch.randn(a["model.norm.weight"].numel(), dtype=torch.float32)  # another dtype
    models = tmp_path / "models"
    for step, state in enumerate((a, b), 1):
        (models / "policy" / f"step-{step}").mkdir(parents=True)
        save_file(state, models / "policy" / f"step-{step}" / "model.safetensors", metadata={"format": "pt"})
    server = live.Server(models)
    try:
        StandIn(monkeypatch)
        model, client, held = load_kept(server.url, "policy/step-1", 0, 2)
        stats = refit.refit(client, held, "policy", "step-1", "step-2", model.load_weights)
        assert_holds(model, b, 0, 2)
        assert stats.fallback == 1 and "new, reshaped or planned anew" in stats.fallback_reasons[0]
    finally:
        server.stop()


def test_model_ids_of_a_lineage():
    assert refit.model_id("policy", "step-2") == "policy/step-2"
    assert refit.model_id("policy", "policy/step-2") == "policy/step-2"
    assert refit.model_id(None, "org/m") == "org/m"


def test_a_batch_refused_as_too_large_to_diff_comes_whole(versions, monkeypatch):
    server, (_, b, _) = versions
    stand_in = StandIn(monkeypatch)
    original = _Deltas.__iter__

    def refuse(self):
        if stand_in.mode == "too large":
            raise ztserve_client.ClientError(413, "delta_region_too_large", "both versions of a region need too much", "x")
        return original(self)

    monkeypatch.setattr(_Deltas, "__iter__", refuse)
    stand_in.mode = "too large"
    model, client, held = load_kept(server.url, "policy/step-1", 1, 2)
    stats = refit.refit(client, held, "policy", "step-1", "step-2", model.load_weights)
    assert_holds(model, b, 1, 2)
    assert stats.patched == 0 and stats.fallback == stats.regions
    assert stats.fallback_reasons == ("deltas refused: delta_region_too_large",)


def test_a_batch_the_server_cannot_diff_comes_whole(versions, monkeypatch):
    server, (_, b, _) = versions
    StandIn(monkeypatch)

    def fail(self):
        raise ztserve_client.ServerError(500, "internal", "the base's bytes failed their digest", "x")

    monkeypatch.setattr(_Deltas, "__iter__", fail)
    model, client, held = load_kept(server.url, "policy/step-1", 1, 2)
    stats = refit.refit(client, held, "policy", "step-1", "step-2", model.load_weights)
    assert_holds(model, b, 1, 2)
    assert stats.patched == 0 and stats.fallback == stats.regions
    assert stats.fallback_reasons == ("deltas not served: internal",)


def test_the_engine_registers_once_and_updates_without_an_accelerator(versions, monkeypatch):
    from types import SimpleNamespace

    pytest.importorskip("vllm", reason=NEEDS_VLLM)

    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    import ztserve_vllm

    ztserve_vllm._register_weight_transfer()
    ztserve_vllm._register_weight_transfer()  # a second call in one process is a no-op
    engine_cls = WeightTransferEngineFactory._registry["ztserve"]()
    assert engine_cls is refit.ZtserveWeightTransferEngine
    server, (_, b, _) = versions
    StandIn(monkeypatch)
    model, _, _ = load_kept(server.url, "policy/step-1", 0, 2)
    config = SimpleNamespace(parallel_config=None, model_config=None)
    engine = engine_cls(SimpleNamespace(backend="ztserve"), config, torch.device("cpu"), model)
    engine.init_transfer_engine(engine.parse_init_info({"url": server.url, "model": "policy"}))
    # The base's update_weights would call torch.accelerator.synchronize(), which raises with no GPU.
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda: (_ for _ in ()).throw(RuntimeError("no accelerator")))
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    engine.update_weights({"base": "step-1", "target": "step-2"})
    assert_holds(model, b, 0, 2)
    assert engine.stats.target == "policy/step-2" and engine.history == [engine.stats]
    with pytest.raises(ValueError, match="Invalid update_info"):
        engine.update_weights({"from": "step-2"})
    engine.shutdown()


@pytest.mark.parametrize("mode", ["ok", "gone", "corrupt lm_head.weight"])
def test_deltas_asked_in_several_requests_at_once_give_the_same(versions, monkeypatch, mode):
    server, (_, b, _) = versions
    monkeypatch.setattr(refit, "MIN_REQUEST_BYTES", 1)
    stand_in = StandIn(monkeypatch)
    stand_in.mode = mode
    model, client, held = load_kept(server.url, "policy/step-1", 1, 2)
    stats = refit.refit(client, held, "policy", "step-1", "step-2", model.load_weights)
    assert_holds(model, b, 1, 2)
    assert len(stand_in.asked) >= refit.REQUESTS_AT_ONCE, "the regions split among several requests"
    assert stats.patched + stats.fallback == stats.regions
    assert stats.fallback == {"ok": 0, "gone": stats.regions, "corrupt lm_head.weight": 1}[mode]
    if mode == "gone":
        assert len(stats.fallback_reasons) == 1, "one reason, however many requests met it"


def test_the_load_format_keeps_regions_only_for_the_ztserve_backend():
    pytest.importorskip("vllm", reason=NEEDS_VLLM)
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.config.weight_transfer import WeightTransferConfig

    assert not refit.wants_keeping()
    with set_current_vllm_config(VllmConfig()):
        assert not refit.wants_keeping()
    for backend, keeps in (("ztserve", True), ("nccl", False)):
        with set_current_vllm_config(VllmConfig(weight_transfer_config=WeightTransferConfig(backend=backend))):
            assert refit.wants_keeping() is keeps


def test_a_model_loaded_without_keeping_is_refused_with_a_clear_error():
    with pytest.raises(RuntimeError, match="load_format='ztserve'"):
        refit.kept_of(Llama(0, 1))
