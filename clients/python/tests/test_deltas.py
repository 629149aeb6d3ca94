"""`Client.deltas` against the server's `POST /models/{B}/deltas` (ZTSERVE_BIN must have the
route: these tests fail, not skip, without it): two versions of a model as sibling folders
(policy/step-1, policy/step-2, 2% of every tensor changed), each region's delta applied to A's
bytes of it gives exactly B's, for far fewer bytes; a pinned base the server no longer has is
410 VersionGone, a base that is not there 404."""

import numpy as np
import pytest
from conftest import Server
from safetensors.numpy import save_file

import ztserve_client
from ztserve_client import Client, apply_delta


def _versions(seed=5):
    rng = np.random.default_rng(seed)
    a = {
        "w": rng.standard_normal((256, 96)).astype(np.float32),
        "h": (rng.standard_normal((128, 64)) * 0.02).astype(np.float16),
        "b": rng.integers(0, 255, 1000, dtype=np.uint8),
    }
    b = {}
    for name, tensor in a.items():
        flat = tensor.copy().reshape(-1)
        picked = rng.random(flat.size) < 0.02
        flat[picked] = (flat[picked] + 1).astype(flat.dtype)
        b[name] = flat.reshape(tensor.shape)
    return a, b


@pytest.fixture(scope="module")
def lineage(tmp_path_factory):
    models = tmp_path_factory.mktemp("deltas") / "models"
    a, b = _versions()
    for step, state in ((1, a), (2, b)):
        (models / "policy" / f"step-{step}").mkdir(parents=True)
        save_file(state, str(models / "policy" / f"step-{step}" / "model.safetensors"))
    server = Server(models)
    yield server, a, b
    server.stop()


REGIONS = [("w", ((0, 128),)), ("w", ((128, 256), (32, 64))), ("h", ((64, 128),)), ("b", None), ("h", ((0, 64),))]


def _region(state, name, box):
    tensor = state[name]
    if box is None:
        return tensor
    return tensor[tuple(slice(start, stop) for start, stop in box)]


def test_each_delta_applied_to_the_base_region_gives_the_target_region(lineage):
    server, a, b = lineage
    client = Client(server.url)
    stream = client.deltas("policy/step-2", "policy/step-1", REGIONS)
    deltas = list(stream)
    assert len(deltas) == len(REGIONS)
    total = 0
    for (name, box), delta in zip(REGIONS, deltas):
        target = np.ascontiguousarray(_region(a, name, box)).view(np.uint8).reshape(-1).copy()
        apply_delta(delta, target)
        assert target.tobytes() == np.ascontiguousarray(_region(b, name, box)).tobytes(), (name, box)
        total += target.size
    assert stream.version and stream.from_version
    assert stream.received < total / 4, (stream.received, total)


def test_a_snapshot_pins_the_target_and_a_pinned_base_gives_the_same_deltas(lineage):
    server, a, b = lineage
    client = Client(server.url)
    base = client.snapshot("policy/step-1")
    target = client.snapshot("policy/step-2")
    pinned = f"policy/step-1@{base.version.strip(chr(34))}"
    stream = target.deltas(pinned, REGIONS[:2])
    assert [bytes(d) for d in stream] == [bytes(d) for d in client.deltas("policy/step-2", "policy/step-1", REGIONS[:2])]
    assert stream.version == target.version


def test_a_base_pinned_at_a_version_the_server_does_not_have_is_version_gone(lineage):
    server, _, _ = lineage
    with pytest.raises(ztserve_client.VersionGone) as raised:
        list(Client(server.url).deltas("policy/step-2", "policy/step-1@0123456789abcdef", REGIONS[:1]))
    assert raised.value.status == 404 and isinstance(raised.value, ztserve_client.ModelChanged)


def test_a_version_its_lineage_no_longer_keeps_is_version_gone(tmp_path):
    models = tmp_path / "models"
    a, b = _versions()
    for step, state in ((1, a), (2, b)):
        (models / "policy" / f"step-{step}").mkdir(parents=True)
        save_file(state, str(models / "policy" / f"step-{step}" / "model.safetensors"))
        (models / "policy" / f"step-{step}" / "READY").write_bytes(b"")
    server = Server(models, env={"ZTSERVE_REFITS__LINEAGES": "policy", "ZTSERVE_REFITS__KEEP_VERSIONS": "1"})
    try:
        client = Client(server.url)
        assert [m["id"] for m in client.models()] == ["policy/step-2"]
        with pytest.raises(ztserve_client.VersionGone) as raised:
            list(client.deltas("policy/step-2", "policy/step-1", REGIONS[:1]))
        assert raised.value.status == 410 and "keeps step-2" in str(raised.value)
    finally:
        server.stop()


def test_a_base_that_is_not_there_is_not_found(lineage):
    server, _, _ = lineage
    with pytest.raises(ztserve_client.NotFound):
        list(Client(server.url).deltas("policy/step-2", "policy/step-9", REGIONS[:1]))
