#!/usr/bin/env python3
"""Writes checkpoints of the size fleets run as sparse files, so they fit any disk.

  generate.py checkpoint DIR [--layers 61] [--experts 256] [--shards 163] [--scale 1.0]
      A DeepSeek-V3-shaped safetensors checkpoint in DIR: `model-0000N-of-0000M.safetensors`
      shards, `model.safetensors.index.json` and DeepSeek-V3's `config.json`. Weights are
      F8_E4M3 with F32 block scales (`weight_scale_inv`, one per 128x128 block), norms and the
      embedding BF16, router biases F32, as the official checkpoint has them. The defaults give
      its shape: 163 shards, 91,991 tensors, 688.6 GB, multi-token-prediction layer
      included. `--scale` divides every matrix dimension (and
      the scale blocks with them), for a smaller checkpoint of the same tensor count. Each
      shard's header is written and the file extended to its length: its tensors read as
      zeros and take no disk.
  generate.py checkpoint DIR --shape qwen3-235b [--layers 94] [--experts 128] [--shards 118]
      The same for Qwen3-235B-A22B: BF16 weights, 128 experts of 1536 in each of 94 layers,
      four key/value heads, its `config.json`: 36,945 tensors, 470.2 GB.
  generate.py catalog DIR [--models 2000]
      A catalog of small models: `orgK/model-N/model.safetensors` (two BF16 tensors) with a
      `config.json` each, every file different.

Only the standard library: the test suite and bench/scale both run it with any python3.
"""

import argparse
import json
import os
import struct

DTYPE_BYTES = {"F8_E4M3": 1, "BF16": 2, "F32": 4}


def deepseek_tensors(layers, experts, scale):
    """(name, dtype, shape) of every tensor, in the order the official shards hold them."""
    d = lambda n: max(1, n // scale)  # noqa: E731
    hidden, vocab, moe, dense = d(7168), d(129280), d(2048), d(18432)
    q_lora, kv_lora, rope, heads, head_dim, v_dim = d(1536), d(512), 64, 128, d(128), d(128)

    def quantized(name, rows, cols):
        yield name + ".weight", "F8_E4M3", [rows, cols]
        blocks = max(1, 128 // scale)
        yield name + ".weight_scale_inv", "F32", [-(-rows // blocks), -(-cols // blocks)]

    def layer(i):
        p = f"model.layers.{i}"
        yield p + ".input_layernorm.weight", "BF16", [hidden]
        yield from quantized(p + ".self_attn.q_a_proj", q_lora, hidden)
        yield p + ".self_attn.q_a_layernorm.weight", "BF16", [q_lora]
        yield from quantized(p + ".self_attn.q_b_proj", heads * (head_dim + rope), q_lora)
        yield from quantized(p + ".self_attn.kv_a_proj_with_mqa", kv_lora + rope, hidden)
        yield p + ".self_attn.kv_a_layernorm.weight", "BF16", [kv_lora]
        yield from quantized(p + ".self_attn.kv_b_proj", heads * (head_dim + v_dim), kv_lora)
        yield from quantized(p + ".self_attn.o_proj", hidden, heads * v_dim)
        yield p + ".post_attention_layernorm.weight", "BF16", [hidden]
        if i < 3:
            for proj, rows, cols in (("gate_proj", dense, hidden), ("up_proj", dense, hidden), ("down_proj", hidden, dense)):
                yield from quantized(f"{p}.mlp.{proj}", rows, cols)
            return
        yield p + ".mlp.gate.weight", "BF16", [experts, hidden]
        yield p + ".mlp.gate.e_score_correction_bias", "F32", [experts]
        for e in range(experts):
            for proj, rows, cols in (("gate_proj", moe, hidden), ("up_proj", moe, hidden), ("down_proj", hidden, moe)):
                yield from quantized(f"{p}.mlp.experts.{e}.{proj}", rows, cols)
        for proj, rows, cols in (("gate_proj", moe, hidden), ("up_proj", moe, hidden), ("down_proj", hidden, moe)):
            yield from quantized(f"{p}.mlp.shared_experts.{proj}", rows, cols)

    yield "model.embed_tokens.weight", "BF16", [vocab, hidden]
    for i in range(layers):
        yield from layer(i)
    yield "model.norm.weight", "BF16", [hidden]
    yield "lm_head.weight", "BF16", [vocab, hidden]
    # The multi-token-prediction module: one more MoE layer with its own projections.
    p = f"model.layers.{layers}"
    yield from layer(layers)
    yield p + ".embed_tokens.weight", "BF16", [vocab, hidden]
    yield p + ".enorm.weight", "BF16", [hidden]
    yield p + ".hnorm.weight", "BF16", [hidden]
    yield p + ".eh_proj.weight", "BF16", [hidden, 2 * hidden]
    yield p + ".shared_head.norm.weight", "BF16", [hidden]
    yield p + ".shared_head.head.weight", "BF16", [vocab, hidden]


def qwen3_moe_tensors(layers, experts, scale):
    """(name, dtype, shape) of every tensor of a Qwen3-235B-A22B-shaped checkpoint."""
    d = lambda n: max(1, n // scale)  # noqa: E731
    hidden, vocab, moe, heads, kv_heads, head_dim = d(4096), d(151936), d(1536), 64, 4, d(128)
    yield "model.embed_tokens.weight", "BF16", [vocab, hidden]
    for i in range(layers):
        p = f"model.layers.{i}"
        yield p + ".input_layernorm.weight", "BF16", [hidden]
        yield p + ".self_attn.q_proj.weight", "BF16", [heads * head_dim, hidden]
        yield p + ".self_attn.k_proj.weight", "BF16", [kv_heads * head_dim, hidden]
        yield p + ".self_attn.v_proj.weight", "BF16", [kv_heads * head_dim, hidden]
        yield p + ".self_attn.o_proj.weight", "BF16", [hidden, heads * head_dim]
        yield p + ".self_attn.q_norm.weight", "BF16", [head_dim]
        yield p + ".self_attn.k_norm.weight", "BF16", [head_dim]
        yield p + ".post_attention_layernorm.weight", "BF16", [hidden]
        yield p + ".mlp.gate.weight", "BF16", [experts, hidden]
        for e in range(experts):
            for proj, rows, cols in (("gate_proj", moe, hidden), ("up_proj", moe, hidden), ("down_proj", hidden, moe)):
                yield f"{p}.mlp.experts.{e}.{proj}.weight", "BF16", [rows, cols]
    yield "model.norm.weight", "BF16", [hidden]
    yield "lm_head.weight", "BF16", [vocab, hidden]


def deepseek_config(layers, experts, scale):
    d = lambda n: max(1, n // scale)  # noqa: E731
    blocks = max(1, 128 // scale)
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
        "hidden_size": d(7168), "intermediate_size": d(18432), "moe_intermediate_size": d(2048), "num_hidden_layers": layers,
        "num_nextn_predict_layers": 1, "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
        "n_routed_experts": experts, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 3, "kv_lora_rank": d(512), "q_lora_rank": d(1536), "qk_rope_head_dim": 64,
        "qk_nope_head_dim": d(128), "v_head_dim": d(128), "vocab_size": d(129280), "rms_norm_eps": 1e-6,
        "max_position_embeddings": 163840, "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [blocks, blocks]},
    }


def qwen3_moe_config(layers, experts, scale):
    d = lambda n: max(1, n // scale)  # noqa: E731
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "torch_dtype": "bfloat16", "hidden_size": d(4096),
        "intermediate_size": d(12288), "moe_intermediate_size": d(1536), "num_hidden_layers": layers, "num_attention_heads": 64,
        "num_key_value_heads": 4, "head_dim": d(128), "num_experts": experts, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "norm_topk_prob": True, "vocab_size": d(151936), "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960, "tie_word_embeddings": False,
    }


SHAPES = {"deepseek-v3": (deepseek_tensors, deepseek_config), "qwen3-235b": (qwen3_moe_tensors, qwen3_moe_config)}


def nbytes(dtype, shape):
    n = DTYPE_BYTES[dtype]
    for dim in shape:
        n *= dim
    return n


def write_sparse_safetensors(path, tensors, metadata=None):
    """A safetensors file of `tensors` [(name, dtype, shape)] whose data is a hole; its length."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        size = nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
    return 8 + len(text) + offset


def checkpoint(out, layers, experts, shards, scale, shape="deepseek-v3"):
    tensors_of, config_of = SHAPES[shape]
    tensors = list(tensors_of(layers, experts, scale))
    total = sum(nbytes(dt, shape) for _, dt, shape in tensors)
    per_shard = -(-total // shards)
    groups, current, size = [], [], 0
    for tensor in tensors:
        if current and size + nbytes(tensor[1], tensor[2]) > per_shard and len(groups) < shards - 1:
            groups.append(current)
            current, size = [], 0
        current.append(tensor)
        size += nbytes(tensor[1], tensor[2])
    groups.append(current)
    os.makedirs(out, exist_ok=True)
    weight_map, file_bytes = {}, 0
    for i, group in enumerate(groups, 1):
        name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        file_bytes += write_sparse_safetensors(os.path.join(out, name), group, {"format": "pt"})
        weight_map.update({t[0]: name for t in group})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
    config = config_of(layers, experts, scale)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(json.dumps({"shards": len(groups), "tensors": len(tensors), "bytes": file_bytes}))


def catalog(out, models):
    for n in range(models):
        model = os.path.join(out, f"org{n % 50}", f"model-{n}")
        os.makedirs(model, exist_ok=True)
        tensors = [("weight", "BF16", [16, 16 + n % 7]), ("bias", "BF16", [16])]
        write_sparse_safetensors(os.path.join(model, "model.safetensors"), tensors, {"model": str(n)})
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump({"model_type": "tiny", "id": n}, f)
    print(json.dumps({"models": models}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("checkpoint")
    c.add_argument("dir")
    c.add_argument("--shape", choices=sorted(SHAPES), default="deepseek-v3")
    c.add_argument("--layers", type=int)
    c.add_argument("--experts", type=int)
    c.add_argument("--shards", type=int)
    c.add_argument("--scale", type=int, default=1)
    k = sub.add_parser("catalog")
    k.add_argument("dir")
    k.add_argument("--models", type=int, default=2000)
    args = parser.parse_args()
    if args.what == "checkpoint":
        layers, experts, shards = {"deepseek-v3": (61, 256, 163), "qwen3-235b": (94, 128, 118)}[args.shape]
        checkpoint(args.dir, args.layers or layers, args.experts or experts, args.shards or shards, args.scale, args.shape)
    else:
        catalog(args.dir, args.models)


if __name__ == "__main__":
    main()
