"""Live ztserve servers for the client tests: the binary from ZTSERVE_BIN (scripts/test builds
it), on 127.0.0.1 ports of their own, over a models directory made here: the repository's
demo models, a file written by the official ztensor==1.2.3 package (this venv's ztensor),
v2 files written by the official ztensor==2.1.2 (in its own venv, `.venv/ztensor-2.1.2`),
safetensors checkpoints (one file by `safetensors.torch`, one sharded by `huggingface_hub`), a
larger model for multi-range transfers, and copies of it and of a v2 file with one byte flipped
in each raw blob that has a digest (sha256, crc32c and xxh3)."""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
TOKEN = "client-tests-token-0123456789"


def binary():
    path = Path(os.environ.get("ZTSERVE_BIN", REPO / "target" / "debug" / "ztserve"))
    if not path.exists():
        raise RuntimeError(f"{path} does not exist: build it (cargo build) or set ZTSERVE_BIN")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keypair(directory, name, curve="P-256"):
    """An ECDSA key pair written as PEM files DIRECTORY/NAME.pem and NAME.pub (`curve` P-256 or
    P-384), for signing artifact bundles; their paths, as strings."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key({"P-256": ec.SECP256R1(), "P-384": ec.SECP384R1()}[curve])
    private, public = directory / f"{name}.pem", directory / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                    serialization.PublicFormat.SubjectPublicKeyInfo))
    return str(private), str(public)


class Server:
    def __init__(self, models, env=None, port=None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(models.parent / f"server-{self.port}.log", "w+b")
        self.process = subprocess.Popen(
            [str(binary()), "serve", "--source", str(models), "--listen", f"127.0.0.1:{self.port}"],
            # Only the settings given here: ZTSERVE_* from the caller (ZTSERVE_VENVS, say) are not server keys.
            env={**{k: v for k, v in os.environ.items() if not k.startswith("ZTSERVE_")}, **(env or {})},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                self.log.seek(0)
                raise RuntimeError(f"ztserve did not become ready:\n{self.log.read().decode(errors='replace')}")
            time.sleep(0.05)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=15)
        self.log.close()

    def kill(self):
        """Ends the server as a crash would (SIGKILL), mid-response if it is in one."""
        self.process.kill()
        self.process.wait(timeout=15)
        self.log.close()


def tensor_bytes_sent(url):
    """The tensor bytes a server has sent: the bodies of its object, component and regions
    routes, less the 4 bytes of CRC32C each region carries (its `ztserve_regions_total`)."""
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    bodies = sum(float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("ztserve_http_response_body_bytes_total") and ("/objects/" in line or "/regions" in line))
    regions = sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("ztserve_regions_total"))
    return bodies - 4 * regions


def write_official(directory):
    """official.zt from tests/interop/official.py under this venv's ztensor (1.2.3)."""
    scratch = directory.parent / "official-write"
    scratch.mkdir()
    subprocess.run([sys.executable, str(REPO / "tests" / "interop" / "official.py"), "write", str(scratch)], check=True)
    shutil.copy(scratch / "official.zt", directory / "official.zt")


def write_v2(directory):
    """v2/canonical.zt and v2/seekable.zt from tests/interop/official_v2.py under ztensor==2.1.2,
    and the bytes `ztensor.open` returns for each of their parts: {file: {object: {part: uint8 array}}}."""
    import json

    venvs = Path(os.environ.get("ZTSERVE_VENVS", REPO / ".venv"))
    python = venvs / "ztensor-2.1.2" / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"{python} is missing: run scripts/python-env (scripts/test does)")
    scratch = directory.parent / "official-v2-write"
    scratch.mkdir()
    subprocess.run([str(python), str(REPO / "tests" / "interop" / "official_v2.py"), "write", str(scratch)], check=True)
    (directory / "v2").mkdir()
    expect = json.loads((scratch / "expect.json").read_text())["files"]
    parts = {}
    for file in ("canonical.zt", "seekable.zt"):
        shutil.copy(scratch / file, directory / "v2" / file)
        parts[file] = {
            name: {part: np.fromfile(scratch / bin_path, dtype=np.uint8) for part, bin_path in objects.items()}
            for name, objects in expect[file].items()
        }
    return parts


def write_safetensors(directory):
    """st/weights.safetensors by `safetensors.torch.save_file` (bf16, fp8, bool, f16, i64) and
    hf/tiny, sharded at 10 KB by `huggingface_hub.save_torch_state_dict` as save_pretrained
    shards; returns their model ids and local files."""
    import torch
    from huggingface_hub import save_torch_state_dict
    from safetensors.torch import save_file

    torch.manual_seed(19)
    (directory / "st").mkdir()
    save_file(
        {
            "embed": torch.randn(32, 16, dtype=torch.bfloat16),
            "q": torch.randn(16, 16).to(torch.float8_e4m3fn),
            "k": torch.randn(16, 16).to(torch.float8_e5m2),
            "mask": torch.rand(5) > 0.5,
            "norm": torch.randn(16, dtype=torch.float16),
            "step": torch.tensor([3, 4], dtype=torch.int64),
        },
        directory / "st" / "weights.safetensors",
        metadata={"format": "pt"},
    )
    state = {f"layers.{i}.{n}": torch.randn(64, 32, dtype=torch.bfloat16) for i in range(3) for n in ("up", "down")}
    state["norm"] = torch.ones(32)
    (directory / "hf" / "tiny").mkdir(parents=True)
    save_torch_state_dict(state, directory / "hf" / "tiny", max_shard_size="10KB")
    shards = sorted((directory / "hf" / "tiny").glob("*.safetensors"))
    if len(shards) < 3:
        raise RuntimeError(f"expected a checkpoint of several shards, got {shards}")
    return {"st/weights": [directory / "st" / "weights.safetensors"], "hf/tiny": shards}


def write_tp_model(directory):
    """tp/llama.safetensors: one Llama layer with sizes 3 does not divide (so the last rank
    takes a remainder), as `safetensors.torch.save_file` writes it."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(21)
    hidden, heads, ffn, vocab = 16, 25, 41, 50
    layer = "model.layers.0"
    state = {
        "model.embed_tokens.weight": torch.randn(vocab, hidden, dtype=torch.bfloat16),
        f"{layer}.self_attn.q_proj.weight": torch.randn(heads, hidden, dtype=torch.bfloat16),
        f"{layer}.self_attn.k_proj.weight": torch.randn(heads, hidden).to(torch.float8_e4m3fn),
        f"{layer}.self_attn.v_proj.weight": torch.randn(heads, hidden, dtype=torch.float16),
        f"{layer}.self_attn.q_proj.bias": torch.randn(heads),
        f"{layer}.self_attn.o_proj.weight": torch.randn(hidden, heads, dtype=torch.bfloat16),
        f"{layer}.mlp.gate_proj.weight": torch.randn(ffn, hidden),
        f"{layer}.mlp.up_proj.weight": torch.randn(ffn, hidden, dtype=torch.float64),
        f"{layer}.mlp.down_proj.weight": torch.randn(hidden, ffn, dtype=torch.bfloat16),
        f"{layer}.input_layernorm.weight": torch.randn(hidden),
        "model.norm.weight": torch.randn(hidden),
        "lm_head.weight": torch.randn(vocab, hidden, dtype=torch.bfloat16),
        "rotary.inv_freq": torch.randn(8),
    }
    (directory / "tp").mkdir()
    save_file(state, directory / "tp" / "llama.safetensors", metadata={"format": "pt"})
    (directory / "tp" / "config.json").write_text('{"model_type": "llama", "hidden_size": 16}')


def write_large(path):
    """Several megabytes across dtypes, written by the official package with both digests."""
    import ztensor

    rng = np.random.default_rng(8)
    w = ztensor.Writer(str(path))
    w.write_numpy("big.f32", rng.standard_normal((512, 1024)).astype(np.float32), checksum="sha256")
    w.write_numpy("big.i16", rng.integers(-999, 999, size=(300_001,), dtype=np.int16), checksum="crc32c")
    w.write_numpy("big.zstd", np.repeat(np.arange(4096, dtype=np.float64), 64), compress=True, checksum="sha256")
    w.write_numpy("small", np.arange(3, dtype=np.uint8))
    w.finish()


def corrupt(source, target):
    """A copy of `source` with one byte flipped in the middle of every raw blob that has a
    digest; returns {object name: digest algorithm}."""
    corrupted = flip_digested_blobs(source, target)
    if set(corrupted.values()) != {"sha256", "crc32c"}:
        raise RuntimeError(f"expected raw blobs under both digests, corrupted {corrupted}")
    return corrupted


def flip_digested_blobs(source, target):
    """Writes `source` to `target` with one byte flipped in every raw blob that has a digest."""
    import json

    out = subprocess.run([str(binary()), "inspect", "--json", str(source)], check=True, capture_output=True).stdout
    data = bytearray(source.read_bytes())
    corrupted = {}
    for obj in json.loads(out)["objects"]:
        for c in obj["components"]:
            if c["encoding"] == "raw" and c["digest"] and c["stored_length"] > 0:
                data[c["offset"] + c["stored_length"] // 2] ^= 0xFF
                corrupted[obj["name"]] = c["digest"].partition(":")[0]
    target.write_bytes(bytes(data))
    return corrupted


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("client")
    directory = root / "models"
    (directory / "demo").mkdir(parents=True)
    for name in ("dense.zt", "structured.zt"):
        shutil.copy(REPO / "models" / "demo" / name, directory / "demo" / name)
    write_official(directory)
    write_large(directory / "large.zt")
    bad = root / "bad"
    bad.mkdir()
    corrupted = corrupt(directory / "large.zt", bad / "large.zt")
    v2 = write_v2(directory)
    (bad / "v2").mkdir()
    corrupted_v2 = flip_digested_blobs(directory / "v2" / "canonical.zt", bad / "v2" / "canonical.zt")
    safetensors = write_safetensors(directory)
    write_tp_model(directory)
    return {"dir": directory, "bad_dir": bad, "corrupted": corrupted, "v2": v2, "corrupted_v2": corrupted_v2,
            "safetensors": safetensors}


@pytest.fixture(scope="session")
def server(models):
    s = Server(models["dir"])
    yield s
    s.stop()


@pytest.fixture(scope="session")
def token_server(models):
    s = Server(models["dir"], env={"ZTSERVE_AUTH__TOKENS": TOKEN})
    yield s
    s.stop()


@pytest.fixture(scope="session")
def trusting_server(models):
    """Serves the corrupted copy without checking digests itself, so only the client can."""
    s = Server(models["bad_dir"], env={"ZTSERVE_SERVING__VERIFY": "never"})
    yield s
    s.stop()


@pytest.fixture(scope="session")
def checking_server(models):
    s = Server(models["bad_dir"], env={"ZTSERVE_SERVING__VERIFY": "always"})
    yield s
    s.stop()
