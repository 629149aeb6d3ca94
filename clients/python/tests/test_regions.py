"""`Snapshot.stream` and the regions route: many regions per request, each checked against its
CRC32C, fetched ahead into buffers reused once nothing refers to them; against a live server
(every region as `safe_open` and `load` read it, whole, sliced and cut into pieces) and against
a stub that breaks connections, corrupts bytes and moves to another version."""

import gc
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import crc32c
import numpy as np
import pytest

import ztserve_client
from ztserve_client import Client, _regions


def test_a_stream_yields_every_region_as_the_files_hold_it_in_order(server, models):
    import torch
    from safetensors import safe_open

    client = Client(server.url)
    snapshot = client.snapshot("tp/llama")
    with safe_open(str(models["dir"] / "tp" / "llama.safetensors"), "pt") as f:
        local = {name: f.get_tensor(name) for name in f.keys()}
    requests = []
    for name, tensor in local.items():
        rows = tensor.shape[0]
        requests += [(name, None), (name, ((0, rows // 2),)), (name, ((rows // 2, rows),))]
        if tensor.dim() == 2:
            requests.append((name, ((1, rows), (2, tensor.shape[1] - 1))))
    for request_bytes in (1 << 20, 300, 1):
        got = list(snapshot.stream(requests, request_bytes=request_bytes, ahead_bytes=4096, concurrency=3))
        assert len(got) == len(requests)
        for (name, region), tensor in zip(requests, got):
            expected = local[name] if region is None else local[name][tuple(slice(a, b) for a, b in region)]
            assert tensor.dtype == expected.dtype and torch.equal(tensor.view(torch.uint8), expected.contiguous().view(torch.uint8)), \
                (name, region, request_bytes)
    numpy_rows = list(snapshot.stream([("model.embed_tokens.weight", ((3, 9),))], framework="numpy", request_bytes=64))
    assert numpy_rows[0].tobytes() == local["model.embed_tokens.weight"][3:9].contiguous().view(torch.uint8).numpy().tobytes()


def test_zstd_frames_and_v2_parts_stream_as_load_reads_them(server):
    client = Client(server.url)
    for model in ("large", "v2/seekable", "v2/canonical", "official"):
        whole = client.load(model)
        snapshot = client.snapshot(model)
        dense = [name for name, obj in snapshot.objects.items()
                 if obj["format"] == "dense" and len(obj["components"]) == 1 and obj["components"][0].get("type") != "f4_e2m1"]
        got = list(snapshot.stream([(name, None) for name in dense], framework="numpy", request_bytes=1 << 16))
        for name, array in zip(dense, got):
            assert array.tobytes() == np.ascontiguousarray(whole[name]).tobytes(), (model, name)


def test_pieces_tile_a_region_larger_than_a_request_and_come_before_the_last_has_arrived(server, models):
    from safetensors import safe_open

    client = Client(server.url)
    snapshot = client.snapshot("tp/llama")
    name = "model.layers.0.mlp.up_proj.weight"  # float64 [41, 16]: 128 bytes a row
    with safe_open(str(models["dir"] / "tp" / "llama.safetensors"), "np") as f:
        local = f.get_tensor(name)
    (pieces,) = list(snapshot.stream([(name, ((3, 40),))], framework="numpy", request_bytes=1000, pieces=True))
    boxes = [box for box, _ in pieces]
    assert boxes[0] == ((3, 10), (0, 16)) and boxes[-1][0][1] == 40 and len(boxes) == 6
    assert all(a[0][1] == b[0][0] for a, b in zip(boxes, boxes[1:])), "pieces tile the rows in order"
    for box, pending in pieces:
        assert pending.result().tobytes() == local[box[0][0]:box[0][1]].tobytes()


def test_buffers_are_reused_only_once_nothing_refers_to_them():
    import torch

    def address(buffer):
        return buffer.__array_interface__["data"][0]

    slabs = _regions._Slabs(pinned=False, keep=1 << 20)
    first = slabs.take(4096)
    first_address = address(first)
    held = torch.from_numpy(first[:8])  # what a reader keeps of it
    slabs.give(first)
    del first
    second = slabs.take(4096)
    assert address(second) != first_address, "a buffer a tensor still refers to is not handed out again"
    slabs.give(second)
    del second
    del held
    gc.collect()
    assert address(slabs.take(4096)) == first_address or len(slabs.free) == 1, "released buffers are reused"


def test_a_stream_touches_about_its_ahead_bytes_and_its_largest_region_however_long_the_model(server, monkeypatch):
    allocated = []
    original = _regions._allocate
    monkeypatch.setattr(_regions, "_allocate", lambda size, pinned: allocated.append(size) or original(size, pinned))
    client = Client(server.url)
    snapshot = client.snapshot("large")
    name = "big.f32"  # [512, 1024] f32, 2 MiB: asked for as 32 regions of 64 KiB, three times over
    requests = [(name, ((row, row + 16),)) for row in range(0, 512, 16)] * 3
    for value in snapshot.stream(requests, framework="numpy", request_bytes=64 << 10, ahead_bytes=256 << 10, concurrency=2):
        del value
    assert sum(allocated) <= (256 << 10) + 2 * (64 << 10), f"{sum(allocated)} bytes of buffers for 6 MiB"
    allocated.clear()
    # A region larger than the budget is held whole while read, and the one before it until
    # the reader has it; their buffers serve the regions after.
    for value in snapshot.stream([(name, None)] * 4, framework="numpy", request_bytes=64 << 10, ahead_bytes=256 << 10):
        del value
    assert sum(allocated) <= 2 * (2 << 20) + (256 << 10) + 2 * (64 << 10), f"{sum(allocated)} bytes of buffers for 8 MiB"


class _Stub:
    """A ztserve stand-in for one model of one dense f32 tensor `w` [64, 16] at version "v1":
    its manifest, and regions bodies that `mode` may cut short once, corrupt, or refuse as gone."""

    def __init__(self):
        self.data = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
        self.mode = "ok"
        self.asked = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                manifest = {"objects": [{"name": "w", "format": "dense", "shape": [64, 16], "components": [
                    {"role": "data", "dtype": "f32", "encoding": "raw", "decoded_length": 4096, "stored_length": 4096,
                     "digest": None}]}]}
                self._send(200, json.dumps(manifest).encode())

            def do_POST(self):
                asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["regions"]
                stub.asked.append([r.get("slice") for r in asked])
                if stub.mode == "gone":
                    error = {"error": {"code": "version_gone", "message": "model \"m\" is no longer at version v1"}}
                    return self._send(404, json.dumps(error).encode(), content_type="application/json")
                body = bytearray()
                for region in asked:
                    rows = [int(x) for x in region["slice"].split(",")[0].split(":")] if "slice" in region else [0, 64]
                    part = self.server_data()[rows[0]:rows[1]].tobytes()
                    body += part + crc32c.crc32c(part).to_bytes(4, "big")
                if stub.mode == "corrupt":
                    body[1] ^= 0xFF
                if stub.mode == "cut once":
                    stub.mode = "ok"
                    self.send_response(200)
                    self.send_header("X-Zt-Model-Version", '"v1"')
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(bytes(body[:len(body) // 2]))
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self._send(200, bytes(body))

            def server_data(self):
                return stub.data

            def _send(self, status, body, content_type="application/octet-stream"):
                self.send_response(status)
                self.send_header("X-Zt-Model-Version", '"v1"')
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def stub():
    s = _Stub()
    yield s
    s.close()


def _rows(n):
    return [("w", ((i, i + 1),)) for i in range(n)]


def test_a_broken_connection_resumes_at_the_first_region_not_yet_checked(stub):
    stub.mode = "cut once"
    snapshot = Client(stub.url, retries=2).snapshot("m")
    got = list(snapshot.stream(_rows(8), framework="numpy", concurrency=1))
    assert [g.tobytes() for g in got] == [stub.data[i:i + 1].tobytes() for i in range(8)]
    first, again = stub.asked
    assert first == [f"{i}:{i + 1},0:16" for i in range(8)]
    assert again == first[len(first) - len(again):] and len(again) < len(first), "only the regions not yet checked"


def test_bytes_corrupted_on_the_way_raise_digest_mismatch(stub):
    stub.mode = "corrupt"
    snapshot = Client(stub.url, retries=1).snapshot("m")
    with pytest.raises(ztserve_client.DigestMismatch, match="crc32c"):
        list(snapshot.stream(_rows(2), framework="numpy"))
    assert len(stub.asked) == 2, "asked once more before giving up"


def test_a_version_the_server_no_longer_has_raises_model_changed(stub):
    snapshot = Client(stub.url).snapshot("m")
    stub.mode = "gone"
    with pytest.raises(ztserve_client.ModelChanged, match="no longer at version"):
        list(snapshot.stream(_rows(2), framework="numpy"))


def test_stream_refuses_what_is_not_a_dense_tensor(server):
    snapshot = Client(server.url).snapshot("demo/structured")
    sparse = next(name for name, obj in snapshot.objects.items() if len(obj["components"]) > 1)
    with pytest.raises(ValueError, match="stream\\(\\) fetches dense tensors"):
        snapshot.stream([(sparse, None)])


def _many_tensors(directory, seed):
    """A model of 48 tensors of 128 KiB each, different for each seed."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors = {f"layer.{i}.weight": rng.integers(0, 255, (256, 512), dtype=np.uint8) for i in range(48)}
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"))
    return tensors


def _stream_across_a_restart(tmp_path, restart, outage_secs=60.0):
    """Streams every tensor of a model, one region a request and little ahead, killing the server
    (SIGKILL) once the first tensor is in and calling `restart(port)` in a thread: the tensors
    the stream yields, or the error it raised."""
    from conftest import Server

    models = tmp_path / "models"
    tensors = _many_tensors(models / "many", seed=1)
    server = Server(models)
    client = Client(server.url, outage_secs=outage_secs)
    snapshot = client.snapshot("many")
    names = list(tensors)
    stream = iter(snapshot.stream([(name, None) for name in names], framework="numpy", request_bytes=128 << 10,
                                  ahead_bytes=256 << 10, concurrency=1))
    got = [next(stream)]
    server.kill()
    restarted = []
    thread = threading.Thread(target=lambda: restarted.append(restart(models, server.port)))
    thread.start()
    try:
        got += list(stream)
        return names, tensors, got, None
    except ztserve_client.ZtserveError as e:
        return names, tensors, got, e
    finally:
        thread.join()
        client.close()
        for again in restarted:
            if again is not None:
                again.stop()


def test_a_stream_goes_on_across_a_server_killed_and_started_again(tmp_path):
    import time

    from conftest import Server

    def restart(models, port):
        time.sleep(2)  # the client keeps trying meanwhile: refused connections
        return Server(models, port=port)

    names, tensors, got, error = _stream_across_a_restart(tmp_path, restart)
    assert error is None, error
    assert [array.tobytes() for array in got] == [tensors[name].tobytes() for name in names]


def test_a_server_back_with_another_version_fails_the_stream_and_one_gone_too_long_times_it_out(tmp_path):
    from conftest import Server

    def replaced(models, port):
        _many_tensors(models / "many", seed=2)
        return Server(models, port=port)

    _, _, got, error = _stream_across_a_restart(tmp_path / "replaced", replaced)
    assert isinstance(error, ztserve_client.ModelChanged), error
    _, _, got, error = _stream_across_a_restart(tmp_path / "gone", lambda models, port: None, outage_secs=1.0)
    assert isinstance(error, ztserve_client.TransferError) and "attempts in" in str(error), error


def test_a_load_moves_to_another_replica_of_its_version_and_refuses_one_of_another(tmp_path):
    import shutil

    from conftest import Server, tensor_bytes_sent

    models, copy = tmp_path / "models", tmp_path / "copy"
    tensors = _many_tensors(models / "many", seed=1)
    names = list(tensors)
    # The same bytes in another file: another version of the model.
    shutil.copytree(models, copy)
    same, other = Server(models), Server(copy)

    def load_killing_the_first(first, second):
        client = Client([first.url, second.url])
        try:
            stream = iter(client.snapshot("many").stream([(name, None) for name in names], framework="numpy",
                                                         request_bytes=128 << 10, ahead_bytes=256 << 10, concurrency=1))
            got = [next(stream)]
            first.kill()
            try:
                return client, got + list(stream), None
            except ztserve_client.ZtserveError as e:
                return client, got, e
        finally:
            client.close()

    try:
        client, got, error = load_killing_the_first(Server(models), same)
        assert error is None, error
        assert [array.tobytes() for array in got] == [tensors[name].tobytes() for name in names]
        assert client.url == same.url and tensor_bytes_sent(same.url) > 0
        # A single request (a GET of one tensor) goes to the replica in use.
        array = client.snapshot("many").fetch([(names[0], None)], framework="numpy")[0]
        assert array.tobytes() == tensors[names[0]].tobytes()

        _, got, error = load_killing_the_first(Server(models), other)
        assert isinstance(error, ztserve_client.ModelChanged), error
        assert [array.tobytes() for array in got] == [tensors[names[0]].tobytes()]
    finally:
        same.stop()
        other.stop()


def test_replica_urls_are_one_scheme_and_name_a_server():
    assert ztserve_client._client.replica_urls("http://a:1/, http://b:2") == ["http://a:1", "http://b:2"]
    assert ztserve_client._client.replica_urls(["https://a"]) == ["https://a"]
    for bad in ("", "http://a,", "http://a,https://b", []):
        with pytest.raises(ValueError):
            Client(bad)


def test_closing_a_stream_ends_its_wait_for_a_server_gone(tmp_path):
    import time

    from conftest import Server

    models = tmp_path / "models"
    tensors = _many_tensors(models / "many", seed=1)
    server = Server(models)
    client = Client(server.url, outage_secs=600.0)
    stream = client.snapshot("many").stream([(name, None) for name in tensors], framework="numpy",
                                            request_bytes=128 << 10, ahead_bytes=256 << 10, concurrency=2)
    next(stream)
    server.kill()
    # The workers are waiting for the server (up to 600 s); closing ends that at once.
    time.sleep(0.5)
    began = time.monotonic()
    stream.close()
    assert time.monotonic() - began < 60, "close() waited out the outage"
    assert not [t for t in threading.enumerate() if t.name.startswith("ztserve-regions-")]
    client.close()


def test_a_kept_alive_connection_closed_while_idle_is_tried_again_at_the_same_replica(tmp_path):
    import shutil
    import time

    from conftest import Server

    models, copy = tmp_path / "models", tmp_path / "copy"
    tensors = _many_tensors(models / "many", seed=1)
    shutil.copytree(models, copy)
    # The first closes a connection idle for 1 s; the second serves another version.
    first, other = Server(models, env={"ZTSERVE_LIMITS__HEADER_TIMEOUT_SECS": "1"}), Server(copy)
    client = Client([first.url, other.url], concurrency=1)
    try:
        snapshot = client.snapshot("many")
        name = next(iter(tensors))
        for _ in range(2):
            assert snapshot.fetch([(name, None)], framework="numpy")[0].tobytes() == tensors[name].tobytes()
            time.sleep(3)  # the first has closed the kept-alive connections by now
            assert client.snapshot("many").version == snapshot.version
        assert client.url == first.url, "an idle connection closed by the server is no outage"
    finally:
        client.close()
        first.stop()
        other.stop()


def test_a_stream_closed_after_its_last_item_lets_the_pieces_still_arriving_land(server):
    snapshot = Client(server.url).snapshot("tp/llama")
    names = [name for name, obj in snapshot.objects.items() if ztserve_client._client._is_dense(obj)]
    stream = snapshot.stream([(name, None) for name in names], framework="numpy", pieces=True,
                             request_bytes=4096, ahead_bytes=1 << 30)
    held = [pieces for pieces in (next(stream) for _ in names)]
    stream.close()  # what a loader does once it has every item, before it reads the last pieces
    for name, pieces in zip(names, held):
        for box, pending in pieces:
            assert pending.result().size > 0, name
