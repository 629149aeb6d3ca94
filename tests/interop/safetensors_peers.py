"""Drive the safetensors peers for the interop tests.

    safetensors_peers.py write DIR    (the client venv: safetensors, torch, huggingface_hub)
        write checkpoints into DIR as their users' tools do: `safetensors.numpy.save_file`,
        `safetensors.torch.save_file` (bf16, fp8, bool, complex…), and a sharded checkpoint
        saved by `huggingface_hub.save_torch_state_dict` with a small `max_shard_size`, the
        way `transformers`' `save_pretrained` shards. Each tensor is read back with
        `safetensors.safe_open` and its bytes written to a .bin file; DIR/expect.json lists,
        for each model id, its files and, for each tensor, the .bin, dtype and shape.
    safetensors_peers.py ztensor DIR  (the ztensor==2.1.2 venv)
        open each model of DIR/expect.json with `ztensor.open` (a checkpoint's shards as a
        list) and check that every tensor's bytes are the .bin `safe_open` gave.

The Rust interop test serves DIR (from a local directory and from S3) and compares every
object ztserve sends with the same .bin files.
"""

import json
import os
import sys


def tensor_bytes(tensor):
    import torch

    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def write(out):
    import numpy as np
    import torch
    from huggingface_hub import save_torch_state_dict
    from safetensors import safe_open
    from safetensors.numpy import save_file as save_numpy
    from safetensors.torch import save_file as save_torch

    rng = np.random.default_rng(20261123)
    os.makedirs(os.path.join(out, "np"), exist_ok=True)
    arrays = {
        "f16": rng.standard_normal((3, 5)).astype(np.float16),
        "f32": rng.standard_normal((4, 4)).astype(np.float32),
        "f64": rng.standard_normal((2, 3, 2)).astype(np.float64),
        "i8": rng.integers(-128, 127, (7,), dtype=np.int8),
        "i16": rng.integers(-30000, 30000, (3, 3), dtype=np.int16),
        "i32": rng.integers(-(2**31), 2**31 - 1, (5,), dtype=np.int32),
        "i64": rng.integers(-(2**62), 2**62, (2, 2), dtype=np.int64),
        "u8": rng.integers(0, 255, (9,), dtype=np.uint8),
        "u16": rng.integers(0, 65535, (4,), dtype=np.uint16),
        "u32": rng.integers(0, 2**32 - 1, (4,), dtype=np.uint32),
        "u64": rng.integers(0, 2**63, (3,), dtype=np.uint64),
        "mask": rng.integers(0, 2, (2, 5)).astype(np.bool_),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    save_numpy(arrays, os.path.join(out, "np/arrays.safetensors"), metadata={"made_by": "safetensors.numpy"})
    # ztensor 2.1.2 has no projection for C64: its file stands apart, and the refusal is checked.
    complex_values = {"c64": (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex64)}
    save_numpy(complex_values, os.path.join(out, "np/complex.safetensors"))

    os.makedirs(os.path.join(out, "pt"), exist_ok=True)
    weights = {
        "embed.weight": torch.randn(16, 8, dtype=torch.bfloat16),
        "attn.q.weight": torch.randn(8, 8).to(torch.float8_e4m3fn),
        "attn.k.weight": torch.randn(8, 8).to(torch.float8_e5m2),
        "attn.scale": torch.randn(8).to(torch.float8_e8m0fnu),
        "norm.weight": torch.randn(8, dtype=torch.float16),
        "head.bias": torch.randn(8, dtype=torch.float32),
        "valid": torch.tensor([True, False, True]),
        "step": torch.tensor(7, dtype=torch.int64),
    }
    save_torch(weights, os.path.join(out, "pt/weights.safetensors"), metadata={"format": "pt"})

    # A small llama-like state dict, sharded at 24 KB as save_pretrained would shard a large one.
    state = {}
    for layer in range(3):
        for name, shape in [("self_attn.q_proj", (32, 32)), ("self_attn.o_proj", (32, 32)), ("mlp.up_proj", (64, 32)),
                            ("mlp.down_proj", (32, 64))]:
            state[f"model.layers.{layer}.{name}.weight"] = torch.randn(*shape, dtype=torch.bfloat16)
        state[f"model.layers.{layer}.input_layernorm.weight"] = torch.ones(32, dtype=torch.float32)
    state["model.embed_tokens.weight"] = torch.randn(256, 32, dtype=torch.bfloat16)
    state["lm_head.weight"] = torch.randn(256, 32, dtype=torch.bfloat16)
    hf = os.path.join(out, "hf/llama")
    os.makedirs(hf, exist_ok=True)
    save_torch_state_dict(state, hf, max_shard_size="24KB")

    models = {
        "np/arrays": ["np/arrays.safetensors"],
        "np/complex": ["np/complex.safetensors"],
        "pt/weights": ["pt/weights.safetensors"],
    }
    with open(os.path.join(hf, "model.safetensors.index.json")) as f:
        index = json.load(f)
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3, f"expected several shards, got {shards}"
    models["hf/llama"] = ["hf/llama/model.safetensors.index.json"] + [f"hf/llama/{s}" for s in shards]

    expect = {}
    count = 0
    for model, files in models.items():
        tensors = {}
        for file in files:
            if not file.endswith(".safetensors"):
                continue
            with safe_open(os.path.join(out, file), framework="pt") as f:
                for name in f.keys():
                    tensor = f.get_tensor(name)
                    path = f"{count}.bin"
                    count += 1
                    with open(os.path.join(out, path), "wb") as bin_file:
                        bin_file.write(tensor_bytes(tensor))
                    tensors[name] = {"bin": path, "dtype": str(tensor.dtype), "shape": list(tensor.shape)}
        if model == "hf/llama":
            assert sorted(tensors) == sorted(index["weight_map"]), "every indexed tensor is in a shard"
        expect[model] = {"files": files, "tensors": tensors, "ztensor_refuses": "C64" if model == "np/complex" else None}
    with open(os.path.join(out, "expect.json"), "w") as f:
        json.dump(expect, f, indent=1)


def check_with_ztensor(out):
    import ztensor

    with open(os.path.join(out, "expect.json")) as f:
        expect = json.load(f)
    checked = 0
    for model, entry in expect.items():
        shards = [os.path.join(out, file) for file in entry["files"] if file.endswith(".safetensors")]
        if entry["ztensor_refuses"]:
            try:
                ztensor.open(shards[0])
            except ValueError as e:
                assert entry["ztensor_refuses"] in str(e), e
                continue
            raise AssertionError(f"{model}: this ztensor now reads it: compare its bytes")
        source = ztensor.open(shards if len(shards) > 1 else shards[0])
        assert sorted(source.keys()) == sorted(entry["tensors"]), (model, sorted(source.keys()))
        for name, tensor in entry["tensors"].items():
            with open(os.path.join(out, tensor["bin"]), "rb") as f:
                expected = f.read()
            assert source[name].tobytes() == expected, f"{model}: {name}: ztensor.open reads other bytes than safe_open"
            checked += 1
        source.close()
    print(json.dumps({"checked": checked}))


if __name__ == "__main__":
    {"write": write, "ztensor": check_with_ztensor}[sys.argv[1]](sys.argv[2])
