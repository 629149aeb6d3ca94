"""vLLM (its CPU build) loads a Llama-shaped model through `--load-format ztserve` and must
generate the same token ids as from a local folder (scripts/vllm-check and bench/engines run it).

    vllm_load.py check WORK
        writes the tiny model into WORK, serves it with ztserve (ZTSERVE_BIN) and has vLLM
        generate from the folder, then through `--load-format ztserve` from the .zt model and
        from the sharded safetensors checkpoint, at TP=1 and TP=2: every run's token ids must
        equal the folder's at the same TP; prints each run's load time and the bytes ztserve sent
    vllm_load.py bench WORK
        the large model (1.13 GB of weights), loaded at TP=1 and TP=2 from the folder, through the
        Hub API (HF_ENDPOINT, a fresh cache), by Run:ai through the S3 endpoint and through
        `--load-format ztserve`; prints a markdown table of load times and bytes sent, checking
        every run's token ids against the folder's

    vllm_load.py write DIR [--size tiny|large]
        a Llama-shaped model with random bf16 weights, grouped-query attention (fewer key/value
        heads than ranks), a vocabulary not a multiple of 64 and a tokenizer of its own:
        DIR/folder (a sharded safetensors checkpoint, config, tokenizer), the same files as
        DIR/models/st/tiny, and DIR/models/zt/tiny with the weights as one model.zt (written by
        `ztserve convert` from DIR/folder)
    vllm_load.py generate MODEL LOAD_FORMAT TP
        one vLLM engine (TP ranks), greedy ids for fixed prompts, printed as JSON with the
        load's wall time; MODEL is a folder or a Hub repository id (HF_ENDPOINT, ZTSERVE_URL)
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

PROMPTS = ["The weights of a model", "Tensor parallel ranks", "a b c d e f g", "ztserve streams"]
SIZES = {
    # hidden, intermediate, layers, heads, kv heads, vocab
    "tiny": (256, 512, 2, 4, 1, 1000),
    # 1.13 GB (1.05 GiB) of bf16 weights
    "large": (2048, 5632, 10, 16, 1, 32000),
}


def write(out, size):
    import torch
    from huggingface_hub import save_torch_state_dict
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    hidden, intermediate, layers, heads, kv_heads, vocab = SIZES[size]
    head_dim = hidden // heads
    folder = os.path.join(out, "folder")
    os.makedirs(folder)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        bos_token_id=1,
        eos_token_id=2,
    )
    config.save_pretrained(folder)
    # A byte-level BPE tokenizer of its own, trained on a little text, padded to the vocabulary.
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=min(vocab, 600), special_tokens=["<unk>", "<s>", "</s>"])
    text = " ".join(PROMPTS * 20) + " the quick brown fox jumps over the lazy dog " * 20
    tokenizer.train_from_iterator([text], trainer)
    from tokenizers import decoders

    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)
    generator = torch.Generator().manual_seed(20261127)

    def randn(*shape, scale=0.02):
        return (torch.randn(*shape, generator=generator) * scale).to(torch.bfloat16)

    state = {"model.embed_tokens.weight": randn(vocab, hidden, scale=1.0), "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    state["lm_head.weight"] = randn(vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}"
        state[f"{p}.input_layernorm.weight"] = (1 + randn(hidden, scale=0.1)).to(torch.bfloat16)
        state[f"{p}.post_attention_layernorm.weight"] = (1 + randn(hidden, scale=0.1)).to(torch.bfloat16)
        state[f"{p}.self_attn.q_proj.weight"] = randn(heads * head_dim, hidden, scale=0.08)
        state[f"{p}.self_attn.k_proj.weight"] = randn(kv_heads * head_dim, hidden, scale=0.08)
        state[f"{p}.self_attn.v_proj.weight"] = randn(kv_heads * head_dim, hidden, scale=0.08)
        state[f"{p}.self_attn.o_proj.weight"] = randn(hidden, heads * head_dim, scale=0.08)
        state[f"{p}.mlp.gate_proj.weight"] = randn(intermediate, hidden, scale=0.08)
        state[f"{p}.mlp.up_proj.weight"] = randn(intermediate, hidden, scale=0.08)
        state[f"{p}.mlp.down_proj.weight"] = randn(hidden, intermediate, scale=0.08)
    total = sum(t.numel() * t.element_size() for t in state.values())
    save_torch_state_dict(state, folder, max_shard_size=max(total // 3, 1 << 20))
    print(json.dumps({"bytes": total, "tensors": len(state)}))


def generate(model, load_format, tp):
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(
        model=model,
        load_format=load_format,
        tensor_parallel_size=tp,
        dtype="bfloat16",
        max_model_len=128,
        enforce_eager=True,
        seed=0,
        gpu_memory_utilization=float(os.environ.get("VLLM_CHECK_MEMORY", "0.15")),
    )
    loaded = time.perf_counter() - started
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    ids = [list(o.outputs[0].token_ids) for o in outputs]
    print("RESULT " + json.dumps({"ids": ids, "engine_start_s": round(loaded, 2)}), flush=True)
    # The engine's processes end with it, not when this one is killed.
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None:
        core.shutdown()


def prepare(work, size):
    """The model as a folder, and as ztserve's sources: st/<size> (the same files) and
    zt/<size> (its weights as one model.zt, zstd with sha256 digests, beside the config)."""
    work = Path(work)
    if not (work / "folder" / "config.json").exists():
        subprocess.run([sys.executable, __file__, "write", str(work), "--size", size], check=True, stdout=sys.stderr)
    st, zt = work / "models" / "st" / size, work / "models" / "zt" / size
    if not st.exists():
        shutil.copytree(work / "folder", st)
    if not zt.exists():
        zt.mkdir(parents=True)
        for name in os.listdir(work / "folder"):
            if name.endswith(".json") and name != "model.safetensors.index.json":
                shutil.copy(work / "folder" / name, zt / name)
        subprocess.run([os.environ["ZTSERVE_BIN"], "convert", str(work / "folder" / "model.safetensors.index.json"),
                        str(zt / "model.zt"), "--compress", "zstd", "--digest", "sha256"], check=True, stdout=subprocess.DEVNULL)
    total = sum(f.stat().st_size for f in (work / "folder").glob("*.safetensors"))
    return work / "folder", total


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(models, log):
    """ztserve on two free loopback ports (HTTP, and the S3 endpoint), stopped with SIGTERM
    and waited for."""
    http, s3 = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZTSERVE_")}
    env["ZTSERVE_S3_ENDPOINT__LISTEN"] = f"127.0.0.1:{s3}"
    with open(log, "wb") as out:
        server = subprocess.Popen([os.environ["ZTSERVE_BIN"], "serve", "--source", str(models), "--listen", f"127.0.0.1:{http}"],
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{http}"
            for _ in range(600):
                try:
                    if urllib.request.urlopen(url + "/readyz", timeout=1).status == 200:
                        break
                except OSError:
                    time.sleep(0.1)
            else:
                raise RuntimeError(f"ztserve did not become ready; see {log}")
            yield url, f"http://127.0.0.1:{s3}"
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)


def sent(url):
    """Every byte ztserve has sent in response bodies, on every route but /metrics."""
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("ztserve_http_response_body_bytes_total") and 'route="/metrics"' not in line)


def engine(model, load_format, tp, env, log):
    """One vLLM engine in a session of its own: its token ids and the slowest rank's load time.
    Every process of the session is killed after it, as vLLM's workers outlive a killed parent."""
    env = {**os.environ, "VLLM_LOAD_TIMING": "1", **env}
    if tp > 1:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(i % os.cpu_count()) for i in range(tp)))
    with open(log, "w+") as out:
        process = subprocess.Popen([sys.executable, __file__, "generate", model, load_format, str(tp)], env=env,
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            process.wait(timeout=int(os.environ.get("VLLM_CHECK_TIMEOUT", "900")))
        finally:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                time.sleep(1)
            process.wait()
        out.seek(0)
        text = out.read()
    results = [json.loads(line[len("RESULT "):]) for line in text.splitlines() if line.startswith("RESULT ")]
    loads = [float(line.split()[1]) for line in text.splitlines() if line.startswith("LOAD_SECONDS ")]
    if process.returncode != 0 or not results:
        raise RuntimeError(f"vLLM ({model}, --load-format {load_format}, TP={tp}) failed (exit {process.returncode}):\n{text[-4000:]}")
    return results[0]["ids"], max(loads) if loads else float("nan")


def run(work, size, ways):
    """Every way at TP=1 and TP=2; returns rows of (tp, way, load seconds, bytes sent, weights
    bytes) and fails if any way's ids differ from the folder's at the same TP."""
    folder, weights = prepare(work, size)
    work = Path(work)
    rows = []
    with serving(work / "models", work / "ztserve.log") as (url, s3):
        for tp in (1, 2):
            reference = None
            for label, model, load_format, env in ways(folder, url, s3, size):
                if "HF_HOME" in env:
                    shutil.rmtree(env["HF_HOME"], ignore_errors=True)
                before = sent(url)
                ids, seconds = engine(model, load_format, tp, env, work / f"engine-{tp}-{label.split()[0]}.log")
                rows.append((tp, label, seconds, sent(url) - before, weights))
                print(f"vllm-check: TP={tp} {label}: loaded in {seconds:.2f} s, ztserve sent {(sent(url) - before) / 1e6:.1f} MB", file=sys.stderr)
                if reference is None:
                    reference = ids
                elif ids != reference:
                    raise SystemExit(f"vllm-check: TP={tp} {label} generated {ids}, the folder {reference}")
    return rows


def check_ways(folder, url, s3, size):
    hub = {"HF_ENDPOINT": url + "/hf", "ZTSERVE_URL": url, "HF_HOME": str(folder.parent / "hf")}
    return [
        ("folder (safetensors)", str(folder), "auto", {"HF_HUB_OFFLINE": "1"}),
        (f"ztserve zt/{size} (.zt, zstd, sha256)", f"zt/{size}", "ztserve", hub),
        (f"ztserve st/{size} (sharded safetensors)", f"st/{size}", "ztserve", hub),
    ]


def bench_ways(folder, url, s3, size):
    hub = {"HF_ENDPOINT": url + "/hf", "HF_HOME": str(folder.parent / "hf")}
    runai = {"AWS_ENDPOINT_URL": s3, "AWS_ACCESS_KEY_ID": "any", "AWS_SECRET_ACCESS_KEY": "any", "AWS_REGION": "us-east-1",
             "AWS_EC2_METADATA_DISABLED": "true", "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0", "HF_HOME": str(folder.parent / "hf")}
    return [
        ("folder: safetensors from local disk", str(folder), "auto", {"HF_HUB_OFFLINE": "1"}),
        ("Hub API: HF_ENDPOINT, download to an empty cache, then load", f"st/{size}", "auto", hub),
        ("Run:ai streamer through the S3 endpoint", f"s3://models/st/{size}", "runai_streamer", runai),
        ("--load-format ztserve", f"st/{size}", "ztserve", {**hub, "ZTSERVE_URL": url}),
    ]


if __name__ == "__main__":
    if sys.argv[1] == "write":
        size = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--size" else "tiny"
        write(sys.argv[2], size)
    elif sys.argv[1] == "generate":
        generate(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "check":
        for tp, label, seconds, bytes_sent, weights in run(sys.argv[2], "tiny", check_ways):
            print(f"TP={tp} {label}: same token ids as the folder; load {seconds:.2f} s; ztserve sent {bytes_sent / weights:.2f}x the weights")
    elif sys.argv[1] == "bench":
        rows = run(sys.argv[2], "large", bench_ways)
        print("| TP | load | load time | ztserve sent | of the weights |")
        print("|---|---|---|---|---|")
        for tp, label, seconds, bytes_sent, weights in rows:
            print(f"| {tp} | {label} | {seconds:.2f} s | {bytes_sent / 1e6:,.1f} MB | {bytes_sent / weights:.2f}x |")
    else:
        sys.exit(__doc__)
