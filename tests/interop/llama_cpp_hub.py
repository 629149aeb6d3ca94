"""llama.cpp loading a GGUF model through ztserve's Hub API, as llama-cpp-python users do
(scripts/llama-cpp-check runs it; it is not part of scripts/test, since llama-cpp-python comes
from PyPI only as source and its build takes minutes).

  write DIR             writes DIR/org/tiny-llama/tiny-llama-{Q8_0,Q4_0}.gguf with the `gguf`
                        package: a 2-layer llama with a 257-token byte-level BPE vocabulary,
                        quantized by its own quantizers (run in the `gguf` venv)
  load ENDPOINT DIR     Llama.from_pretrained("org/tiny-llama", "*Q4_0.gguf") with HF_ENDPOINT
                        set, then the same file loaded from DIR: the logits of a prompt and a
                        greedy completion must be identical (run in the llama-cpp venv)
"""

import json
import os
import sys
from pathlib import Path

import numpy as np


def byte_tokens():
    """GPT-2's printable stand-ins for the 256 bytes, as byte-level BPE vocabularies list them."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    mapping = dict(zip(bs, cs))
    return [chr(mapping[b]) for b in range(256)]


def write(root):
    import gguf
    from gguf import GGMLQuantizationType as Q

    out = root / "org/tiny-llama"
    out.mkdir(parents=True, exist_ok=True)
    n_vocab, n_embd, n_ff, n_head, n_layer = 257, 64, 128, 4, 2
    for qtype in (Q.Q8_0, Q.Q4_0):
        w = gguf.GGUFWriter(out / f"tiny-llama-{qtype.name}.gguf", "llama")
        w.add_name("tiny-llama")
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_context_length(64)
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(n_ff)
        w.add_rope_dimension_count(n_embd // n_head)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_vocab_size(n_vocab)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(byte_tokens() + ["ab"])
        w.add_token_types([1] * n_vocab)
        w.add_token_merges(["a b"])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        r = np.random.default_rng(7)

        def tensor(name, shape, quantized=True):
            data = (r.standard_normal(shape) * 0.2).astype(np.float32)
            if quantized:
                w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
            else:
                w.add_tensor(name, data)

        tensor("token_embd.weight", (n_vocab, n_embd))
        tensor("output_norm.weight", (n_embd,), quantized=False)
        tensor("output.weight", (n_vocab, n_embd))
        for i in range(n_layer):
            tensor(f"blk.{i}.attn_norm.weight", (n_embd,), quantized=False)
            tensor(f"blk.{i}.ffn_norm.weight", (n_embd,), quantized=False)
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                tensor(f"blk.{i}.{name}.weight", (n_embd, n_embd))
            tensor(f"blk.{i}.ffn_gate.weight", (n_ff, n_embd))
            tensor(f"blk.{i}.ffn_up.weight", (n_ff, n_embd))
            tensor(f"blk.{i}.ffn_down.weight", (n_embd, n_ff))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def load(endpoint, root):
    os.environ["HF_ENDPOINT"] = endpoint
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    from llama_cpp import Llama

    def run(llm):
        tokens = llm.tokenize(b"hello ab", add_bos=True)
        llm.eval(tokens)
        logits = np.array(llm.scores[: len(tokens)])
        text = llm.create_completion("hello ab", max_tokens=12, temperature=0.0)["choices"][0]["text"]
        return logits, text

    options = dict(n_ctx=32, verbose=False, logits_all=True)
    remote = Llama.from_pretrained("org/tiny-llama", filename="*Q4_0.gguf", **options)
    assert Path(remote.model_path).read_bytes() == (root / "org/tiny-llama/tiny-llama-Q4_0.gguf").read_bytes()
    local = Llama(model_path=str(root / "org/tiny-llama/tiny-llama-Q4_0.gguf"), **options)
    (a, text_a), (b, text_b) = run(remote), run(local)
    assert np.isfinite(a).all() and np.array_equal(a, b), "logits differ"
    assert text_a == text_b, (text_a, text_b)
    print(json.dumps({"logits": list(a.shape), "text": text_a, "downloaded": remote.model_path}))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(Path(sys.argv[2]))
    elif sys.argv[1] == "load":
        load(sys.argv[2], Path(sys.argv[3]))
    else:
        sys.exit(f"unknown mode {sys.argv[1]}")
