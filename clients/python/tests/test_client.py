"""ztserve_client against live servers (conftest.py): listings, manifests, every format and
dtype, equality with what the official ztensor==1.2.3 package reads from the same local file,
multi-range transfers, digest checks, typed errors, tokens, and `ztserve pull` interop."""

import fnmatch
import subprocess
import threading
import time

import numpy as np
import pytest
import scipy.sparse
import ztensor

import ztserve_client
from ztserve_client import Client

from conftest import TOKEN, Server, binary


def official_components(path):
    """Every object of a local file as the official package reads it: name → {role: 1-D
    ndarray of the component's dtype}. Per component, because 1.2.3's `Reader.read` fails on
    its own complex64 objects (it reshapes the f32 blob, twice the elements, to the logical
    shape); `_read_component_raw` is the read beneath it, pinned with the release."""
    reader = ztensor.Reader(str(path))
    out = {}
    for name in reader.keys():
        meta = reader._inner._get_metadata(name)
        out[name] = {}
        for role in meta["components"]:
            buf, dtype = reader._inner._read_component_raw(name, role)
            out[name][role] = ztensor.Reader._buf_to_numpy(buf, dtype, [], False)
    return out


def assert_same_bytes(ours, theirs, what):
    assert np.ascontiguousarray(ours).tobytes() == np.ascontiguousarray(theirs).tobytes(), what


def assert_loaded_equals_official(loaded, manifest, official):
    assert set(loaded) == set(official), "object names differ from ztensor 1.2.3's"
    for obj in manifest["objects"]:
        name, fmt = obj["name"], obj["format"]
        ours, theirs = loaded[name], official[name]
        if fmt == "dense":
            assert ours.shape == tuple(obj["shape"]), name
            assert_same_bytes(ours, theirs["data"], name)
            if obj["components"][0]["type"] is None:
                assert ours.dtype == theirs["data"].dtype, f"{name}: {ours.dtype} against {theirs['data'].dtype}"
        elif fmt == "sparse_csr":
            assert isinstance(ours, scipy.sparse.csr_array) and ours.shape == tuple(obj["shape"])
            assert_same_bytes(ours.data, theirs["values"], name)
            assert_same_bytes(ours.indices.astype(np.uint64), theirs["indices"], name)
            assert_same_bytes(ours.indptr.astype(np.uint64), theirs["indptr"], name)
        elif fmt == "sparse_coo":
            assert isinstance(ours, scipy.sparse.coo_array) and ours.shape == tuple(obj["shape"])
            assert_same_bytes(ours.data, theirs["values"], name)
            assert_same_bytes(np.concatenate(ours.coords).astype(np.uint64), theirs["coords"], name)
        else:
            assert set(ours) == set(theirs), name
            for role in ours:
                assert_same_bytes(ours[role], theirs[role], f"{name}.{role}")


def test_models_and_manifest(server):
    client = Client(server.url)
    ids = {m["id"]: m for m in client.models()}
    assert {"demo/dense", "demo/structured", "official", "large"} <= set(ids)
    assert all(m["status"] == "ok" for m in ids.values())
    manifest = client.manifest("demo/dense")
    assert manifest["id"] == "demo/dense" and len(manifest["objects"]) == 7


def test_a_file_beside_a_model_is_read_by_name_and_bounded(server):
    client = Client(server.url)
    assert client.file("tp/llama", "config.json") == b'{"model_type": "llama", "hidden_size": 16}'
    with pytest.raises(ztserve_client.NotFound):
        client.file("tp/llama", "tokenizer.json")
    with pytest.raises(ztserve_client.ZtserveError, match="more than the 8 bytes asked for"):
        client.file("tp/llama", "config.json", limit=8)


def test_an_official_1_2_3_file_loads_equal_to_what_ztensor_1_2_3_reads_locally(server, models):
    client = Client(server.url)
    loaded = client.load("official")
    assert_loaded_equals_official(loaded, client.manifest("official"), official_components(models["dir"] / "official.zt"))
    # The right dtypes, not just the right bytes.
    assert loaded["bf16"].dtype.name == "bfloat16"
    assert loaded["fp8"].dtype.name == "float8_e4m3fn"
    assert loaded["complex"].dtype == np.complex64 and loaded["complex"].shape == (4,)
    # 1.2.3's write_numpy stores a 0-d array as shape [1]; Writer.write keeps [] (NOTES.md).
    assert loaded["scalar"].shape == (1,) and loaded["scalar.0d"].shape == ()
    assert loaded["empty"].shape == (0, 4)
    assert set(loaded["quant"]) == {"packed_weight", "scales", "zeros"}


def test_many_ranges_per_component_assemble_exactly(server, models):
    expected = official_components(models["dir"] / "large.zt")
    for concurrency, chunk in [(1, 1 << 20), (8, 65_536), (3, 4_099)]:
        client = Client(server.url, concurrency=concurrency, chunk_size=chunk)
        loaded = client.load("large")
        for name, array in loaded.items():
            assert_same_bytes(array, expected[name]["data"], f"{name} at chunk {chunk}")
        assert loaded["big.f32"].shape == (512, 1024) and loaded["big.f32"].dtype == np.float32


def test_names_select_objects_and_an_unknown_name_is_not_found(server):
    client = Client(server.url)
    loaded = client.load("demo/dense", names=["scale", "embed.weight"])
    assert list(loaded) == ["scale", "embed.weight"]
    assert loaded["scale"] == 2.5
    with pytest.raises(ztserve_client.NotFound):
        client.load("demo/dense", names=["no such object"])


def test_structured_formats(server):
    loaded = Client(server.url).load("demo/structured")
    csr = loaded["adjacency"]
    assert isinstance(csr, scipy.sparse.csr_array) and csr.shape == (8, 8)
    assert csr.toarray()[7, 5] == 6.0 and csr.nnz == 6
    coo = loaded["points"]
    assert isinstance(coo, scipy.sparse.coo_array) and coo.shape == (4, 5, 6)
    assert list(coo.data) == [10, 20, 30]
    assert isinstance(loaded["layers.0.q_proj"], dict)
    assert loaded["vendor/lookup table ü %?#"]["table"].tolist() == list(range(256))


def test_torch_tensors_equal_the_numpy_arrays(server):
    torch = pytest.importorskip("torch", reason="torch is installed by scripts/python-env; missing means a broken venv")
    client = Client(server.url)
    as_numpy = client.load("official")
    as_torch = client.load("official", framework="torch")
    for name, array in as_numpy.items():
        tensor = as_torch[name]
        if isinstance(array, np.ndarray):
            assert tuple(tensor.shape) == array.shape, name
            assert tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() == array.tobytes(), name
        elif isinstance(array, dict):
            for role in array:
                assert tensor[role].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() == array[role].tobytes(), f"{name}.{role}"
        else:
            assert np.array_equal(tensor.to_dense().numpy(), array.toarray()), name
    assert as_torch["bf16"].dtype == torch.bfloat16
    assert as_torch["fp8"].dtype == torch.float8_e4m3fn
    assert as_torch["csr"].layout == torch.sparse_csr and as_torch["coo"].layout == torch.sparse_coo


def test_cuda_without_a_cuda_device_is_an_error_not_a_fallback(server):
    torch = pytest.importorskip("torch", reason="torch is installed by scripts/python-env; missing means a broken venv")
    if torch.cuda.is_available():
        loaded = Client(server.url).load("demo/dense", framework="torch", device="cuda")
        assert all(t.is_cuda for t in loaded.values())
        return
    with pytest.raises(ztserve_client.ZtserveError, match="CUDA"):
        Client(server.url).load("demo/dense", framework="torch", device="cuda")
    with pytest.raises(ValueError):
        Client(server.url).load("demo/dense", device="cuda")


def test_bytes_that_miss_their_digest_raise_digest_mismatch(trusting_server, models):
    # One span, and many spans landing out of order: the digest is built in order either way.
    for concurrency, chunk in [(8, 8 << 20), (3, 4_099), (8, 65_536)]:
        client = Client(trusting_server.url, concurrency=concurrency, chunk_size=chunk)
        for name, algorithm in models["corrupted"].items():
            with pytest.raises(ztserve_client.DigestMismatch, match=f"'{name}'.*{algorithm}"):
                client.load("large", names=[name])
    # The other objects of the same file still load.
    assert Client(trusting_server.url).load("large", names=["small"])["small"].tolist() == [0, 1, 2]


def test_a_server_that_checks_digests_answers_a_typed_422(checking_server, models):
    with pytest.raises(ztserve_client.BrokenModel) as caught:
        Client(checking_server.url, retries=0).load("large", names=list(models["corrupted"])[:1])
    assert caught.value.status == 422 and caught.value.code == "invalid_component"


def test_errors_are_typed(server, token_server):
    with pytest.raises(ztserve_client.NotFound) as caught:
        Client(server.url).manifest("no/such/model")
    assert caught.value.status == 404 and caught.value.code == "model_not_found"
    with pytest.raises(ztserve_client.Unauthorized):
        Client(token_server.url, token="").models()
    with pytest.raises(ztserve_client.Unauthorized):
        Client(token_server.url, token="wrong-token-wrong-token").models()
    assert Client(token_server.url, token=TOKEN).load("demo/dense", names=["scale"])["scale"] == 2.5
    # Nothing listens here: retried, then a TransferError.
    with pytest.raises(ztserve_client.TransferError):
        Client("http://127.0.0.1:9", retries=1).models()


def test_a_model_replaced_during_a_load_raises_model_changed(tmp_path):
    def write(value):
        scratch = tmp_path / "next.zt"
        w = ztensor.Writer(str(scratch))
        for name in ("a", "b"):
            w.write_numpy(name, np.full(100_000, value, dtype=np.float32))
        w.finish()
        scratch.replace(tmp_path / "models" / "swap.zt")  # atomically, as operators should

    (tmp_path / "models").mkdir()
    write(1.0)
    server = Server(tmp_path / "models", env={"ZTSERVE_SOURCES__RESCAN_INTERVAL_SECS": "1"})
    try:
        class ReplacedAfterTheManifest(Client):
            def _versioned_manifest(self, model):
                manifest, version = super()._versioned_manifest(model)
                write(2.0)
                deadline = time.monotonic() + 15
                while super()._versioned_manifest(model)[1] == version:
                    assert time.monotonic() < deadline, "the server never picked up the new file"
                    time.sleep(0.1)
                return manifest, version

        with pytest.raises(ztserve_client.ModelChanged, match="changed on the server during the load"):
            ReplacedAfterTheManifest(server.url, chunk_size=65_536).load("swap")
        loaded = Client(server.url).load("swap")
        assert all((array == 2.0).all() for array in loaded.values())
    finally:
        server.stop()


def test_the_token_comes_from_the_environment(token_server, monkeypatch):
    monkeypatch.setenv("ZTSERVE_TOKEN", TOKEN)
    assert {m["id"] for m in Client(token_server.url).models()} >= {"official"}


def test_a_pulled_official_file_reads_identically_through_ztensor_1_2_3(server, models, tmp_path):
    source = models["dir"] / "official.zt"
    for extra, out in [([], tmp_path / "rebuilt.zt"), (["--raw"], tmp_path / "raw.zt")]:
        subprocess.run([str(binary()), "pull", "--progress", "none", *extra, f"{server.url}/models/official", str(out)], check=True)
        theirs, pulled = official_components(source), official_components(out)
        assert set(theirs) == set(pulled)
        for name in theirs:
            assert set(theirs[name]) == set(pulled[name]), name
            for role in theirs[name]:
                assert_same_bytes(pulled[name][role], theirs[name][role], f"{out.name}: {name}.{role}")
            assert ztensor.Reader(str(out)).metadata(name).shape == ztensor.Reader(str(source)).metadata(name).shape
    assert (tmp_path / "raw.zt").read_bytes() == source.read_bytes()


def test_official_v2_files_load_equal_to_what_ztensor_2_1_2_reads(server, models):
    """Every part of a canonical and a seekable v2 file (raw parts by ranges, seekable ones
    decoded by the server frame by frame), its xxh3 digest checked over the decoded bytes."""
    client = Client(server.url, chunk_size=1 << 20)
    for file, objects in models["v2"].items():
        model = "v2/" + file.removesuffix(".zt")
        loaded = client.load(model)
        assert set(loaded) == set(objects), model
        for name, parts in objects.items():
            value = loaded[name]
            if name == "sparse":
                assert value.shape == (3, 4)
                assert_same_bytes(value.data, parts["values"], f"{model}: sparse.values")
                assert_same_bytes(value.indices.astype(np.uint32), parts["indices"], f"{model}: sparse.indices")
            elif name == "quantized":
                assert set(value) == {"data", "scales"}
                for role in value:
                    assert_same_bytes(value[role], parts[role], f"{model}: quantized.{role}")
            elif name == "f4_e2m1":
                # Unpacked one code per byte, low nibble first: repack and compare.
                codes = value.view(np.uint8)
                padded = np.append(codes, np.zeros(len(codes) % 2, np.uint8))
                assert_same_bytes(padded[0::2] | (padded[1::2] << 4), parts["data"], f"{model}: f4_e2m1")
                assert value.dtype.name == "float4_e2m1fn" and value.shape == (7,)
            else:
                assert_same_bytes(value, parts["data"], f"{model}: {name}")
    canonical = client.load("v2/canonical")
    assert canonical["bool"].dtype == np.bool_ and canonical["f8_e8m0"].dtype.name == "float8_e8m0fnu"
    assert canonical["complex64"].dtype == np.complex64 and canonical["bf16"].dtype.name == "bfloat16"
    assert client.load("v2/seekable", names=["big"])["big"].nbytes == len(models["v2"]["seekable.zt"]["big"]["data"])


def test_safetensors_checkpoints_load_equal_to_what_safe_open_reads(server, models):
    """A torch-written file and a huggingface_hub-sharded checkpoint load into numpy and torch
    exactly as `safetensors.safe_open` reads the local files: dtypes (bf16, fp8, bool) and values."""
    import torch
    from safetensors import safe_open

    client = Client(server.url, chunk_size=4096)
    for model, files in models["safetensors"].items():
        expected = {}
        for path in files:
            with safe_open(str(path), framework="pt") as f:
                expected.update({name: f.get_tensor(name) for name in f.keys()})
        as_torch = client.load(model, framework="torch")
        as_numpy = client.load(model)
        assert set(as_torch) == set(expected) == set(as_numpy), model
        for name, tensor in expected.items():
            loaded = as_torch[name]
            assert loaded.dtype == tensor.dtype and loaded.shape == tensor.shape, f"{model}: {name}"
            assert torch.equal(loaded.view(torch.uint8), tensor.view(torch.uint8)), f"{model}: {name}"
            array = as_numpy[name]
            assert array.shape == tuple(tensor.shape), f"{model}: {name}"
            assert array.tobytes() == tensor.contiguous().view(torch.uint8).numpy().tobytes(), f"{model}: {name}"
    weights = client.load("st/weights")
    assert weights["embed"].dtype.name == "bfloat16" and weights["q"].dtype.name == "float8_e4m3fn"
    assert weights["mask"].dtype == np.bool_


def test_v2_bytes_that_miss_their_xxh3_digest_raise_digest_mismatch(trusting_server, models):
    assert set(models["corrupted_v2"].values()) == {"xxh3"}
    client = Client(trusting_server.url)
    for name in list(models["corrupted_v2"])[:3]:
        with pytest.raises(ztserve_client.DigestMismatch, match="xxh3"):
            client.load("v2/canonical", names=[name])


def test_each_tensor_parallel_rank_loads_its_share_cut_by_the_server(server):
    client = Client(server.url)
    whole = client.load("tp/llama")
    for size in (2, 3):
        for rank in range(size):
            share = client.load("tp/llama", tp_rank=rank, tp_size=size)
            assert share.keys() == whole.keys()
            for name, array in whole.items():
                dim = next((d for p, d in ztserve_client.TRANSFORMER_SHARD_DIMS.items() if fnmatch.fnmatchcase(name, p)), None)
                if dim is None:
                    expected = array
                else:
                    each = array.shape[dim] // size
                    stop = array.shape[dim] if rank == size - 1 else (rank + 1) * each
                    expected = np.take(array, range(rank * each, stop), axis=dim)
                assert share[name].dtype == expected.dtype and share[name].shape == expected.shape, (name, rank, size)
                assert share[name].tobytes() == expected.tobytes(), (name, rank, size)
    # o_proj and down_proj are row-parallel: their columns are split.
    share = client.load("tp/llama", tp_rank=2, tp_size=3)
    assert share["model.layers.0.self_attn.o_proj.weight"].shape == (16, 9)
    assert share["model.layers.0.mlp.down_proj.weight"].shape == (16, 15)
    assert share["model.norm.weight"].shape == (16,)


def test_shard_dims_name_the_split_and_bad_ones_are_refused(server):
    client = Client(server.url)
    whole = client.load("tp/llama", names=["lm_head.weight"])["lm_head.weight"]
    share = client.load("tp/llama", names=["lm_head.weight"], tp_rank=1, tp_size=4, shard_dims={"lm_head.*": -1})
    assert share["lm_head.weight"].tobytes() == np.ascontiguousarray(whole[:, 4:8]).tobytes()
    torch_share = client.load("tp/llama", names=["lm_head.weight"], framework="torch", tp_rank=1, tp_size=4, shard_dims={"lm_head.*": 1})
    assert torch_share["lm_head.weight"].shape == (50, 4)
    with pytest.raises(ValueError, match="no dimension 1"):
        client.load("tp/llama", tp_rank=0, tp_size=2, shard_dims={"*": 1})
    with pytest.raises(ValueError, match="both"):
        client.load("tp/llama", tp_rank=0)
    with pytest.raises(ValueError, match="tp_rank"):
        client.load("tp/llama", tp_rank=2, tp_size=2)
    with pytest.raises(ValueError, match="only dense"):
        client.load("demo/structured", names=["adjacency"], tp_rank=0, tp_size=2, shard_dims={"*": 0})


def test_a_snapshot_fetches_whole_objects_and_regions_cut_by_the_server(server):
    client = Client(server.url)
    whole = client.load("tp/llama")
    snapshot = client.snapshot("tp/llama")
    assert snapshot.version and set(snapshot.objects) == set(whole)
    o_proj, embed = "model.layers.0.self_attn.o_proj.weight", "model.embed_tokens.weight"
    requests = [(o_proj, ((0, 16), (3, 11))), (embed, ((10, 20),)), (embed, ((7, 7),)), (o_proj, None)]
    cut, rows, empty, full = snapshot.fetch(requests, framework="numpy")
    assert cut.tobytes() == np.ascontiguousarray(whole[o_proj][:, 3:11]).tobytes() and cut.shape == (16, 8)
    assert rows.tobytes() == whole[embed][10:20].tobytes() and empty.shape == (0, 16)
    assert full.tobytes() == whole[o_proj].tobytes()
    import torch

    tensors = snapshot.fetch([(embed, ((1, 3),))])
    assert tensors[0].shape == (2, 16) and tensors[0].view(torch.uint8).numpy().tobytes() == whole[embed][1:3].tobytes()
    with pytest.raises(ValueError, match="not within dimension 0"):
        snapshot.fetch([(embed, ((40, 60),))])
    with pytest.raises(ztserve_client.NotFound):
        snapshot.fetch([("no such tensor", None)])


def test_bytes_that_miss_the_servers_repr_digest_raise_digest_mismatch():
    """A server that states the SHA-256 of what it sends (`Repr-Digest`) for a tensor whose
    manifest declares no digest: the client checks the bytes against it."""
    import base64
    import hashlib
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    data = bytes(range(64))
    stated = {"digest": hashlib.sha256(data).digest()}
    manifest = {"objects": [{"name": "w", "format": "dense", "shape": [16], "components": [
        {"role": "data", "dtype": "f32", "encoding": "raw", "decoded_length": 64, "stored_length": 64, "digest": None}]}]}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == "/models/m":
                body = json.dumps(manifest).encode()
                self.send_response(200)
            else:
                start, end = map(int, self.headers["Range"].removeprefix("bytes=").split("-"))
                body = data[start:end + 1]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/64")
                self.send_header("Repr-Digest", "sha-256=:" + base64.b64encode(stated["digest"]).decode() + ":")
            self.send_header("X-Zt-Model-Version", '"v1"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    stub = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=stub.serve_forever)
    thread.start()
    try:
        url = f"http://127.0.0.1:{stub.server_address[1]}"
        assert Client(url, chunk_size=16).load("m")["w"].tobytes() == data
        stated["digest"] = hashlib.sha256(b"other bytes").digest()
        with pytest.raises(ztserve_client.DigestMismatch, match="Repr-Digest"):
            Client(url, chunk_size=16).load("m")
    finally:
        stub.shutdown()
        stub.server_close()
        thread.join()
