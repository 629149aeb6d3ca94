"""vLLM (its CPU build) loads models through `--load-format ztserve` and must generate the same
token ids as from a local folder (scripts/vllm-check and bench/engines run it). Every load
through the load format must fetch exactly the tensor bytes `python -m ztserve_vllm plan` says.

    vllm_load.py check WORK
        writes the tiny model into WORK, serves it with ztserve (ZTSERVE_BIN) and has vLLM
        generate from the folder, then through `--load-format ztserve` from the .zt model and
        from the sharded safetensors checkpoint, at TP=1 and TP=2: every run's token ids must
        equal the folder's at the same TP; prints each run's load time and the bytes ztserve sent
    vllm_load.py check-moe WORK
        the same at TP=2 for a 15 MB Qwen3-MoE (8 experts, top 2), which must cost the server at
        most 1.1x its weights
    vllm_load.py check-quantized WORK [awq|gptq|w8a8 ...]
        the same at TP=2 for a small Llama quantized by each method (default all three), at most
        1.1x its weights
    vllm_load.py check-restart WORK
        the small Llama (97 MB) at TP=2 through the load format, the server killed (SIGKILL) once
        the ranks are fetching and started again on the same ports 3 s later: the load must
        complete with the folder's token ids, part of it served by the restarted server; then
        with two replicas in ZTSERVE_URL, the first killed mid-load and left down: the load
        completes at the second, with the folder's token ids
    vllm_load.py check-refit WORK [SIZE]
        refits (clients/vllm/src/ztserve_vllm/refit.py) on the large model (SIZE, default large):
        versions A, B, C, D written as the lineage policy/step-000001..4 (each the one before with
        2% of the elements of every weight set to new random values of its scale, seeded; a
        READY file each), served with `[refits] lineages = ["policy"]`, A alone published at
        first. An engine at TP=2 loads A through the load format with the ztserve
        weight-transfer backend, then publishes B, C and D in turn as a trainer does (its READY
        file last, then waits until the server lists it and has computed ahead the deltas of the
        regions the last update asked) and moves to each by `update_weights` (each
        rank fetching its regions' deltas); after each its
        token ids must equal vLLM's from that version's folder (each version's must differ from the
        one before's). A
        late joiner loads B and moves to C. Each update must cost the server less than a
        quarter of what a reload of the shares does; prints the bytes per update against that
    vllm_load.py bench WORK
        the large model (1.13 GB of weights), loaded at TP=1 and TP=2 from the folder, through the
        Hub API (HF_ENDPOINT, a fresh cache), by Run:ai through the S3 endpoint and through
        `--load-format ztserve`, then a 0.98 GB Qwen3-MoE at TP=2 from the folder, by Run:ai and
        through the load format, each BENCH_ROUNDS times (2) in alternating order; then the large
        model at TP=2 with the server across a link shaped to BENCH_LINK_RATE (10gbit: a network
        namespace, a veth pair and tbf; root); and, before the engines, one rank's fetch of its
        share without vLLM (vllm_rank_fetch.py). Prints markdown tables (medians), checking
        every run's token ids against the folder's

    vllm_load.py write DIR [--size tiny|small|large|moe|moe-large|small-q-METHOD]
        a model with random bf16 weights (Llama-shaped, or Qwen3-MoE for moe*), grouped-query
        attention, a vocabulary not a multiple of 64 and a tokenizer of its own, its linear
        layers quantized by METHOD for -q-: DIR/folder (a sharded safetensors checkpoint,
        config, tokenizer), the same files as DIR/models/st/SIZE, and DIR/models/zt/SIZE with
        the weights as one model.zt (written by `ztserve convert` from DIR/folder)
    vllm_load.py generate MODEL LOAD_FORMAT TP
        one vLLM engine (TP ranks), greedy ids for fixed prompts, printed as JSON with the
        load's wall time; MODEL is a folder or a Hub repository id (HF_ENDPOINT, ZTSERVE_URL)
"""

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

PROMPTS = ["The weights of a model", "Tensor parallel ranks", "a b c d e f g", "ztserve streams"]
SIZES = {
    # hidden, intermediate, layers, heads, kv heads, vocab
    "tiny": (256, 512, 2, 4, 1, 1000),
    # 97 MB of bf16 weights (52 MB with 4-bit linear layers), two key/value heads
    "small": (1024, 2048, 4, 8, 2, 8000),
    # 1.13 GB (1.05 GiB) of bf16 weights
    "large": (2048, 5632, 10, 16, 1, 32000),
}
MOE_SIZES = {
    # Qwen3-MoE: hidden, each expert's intermediate size, layers, heads, kv heads, vocab, experts, experts per token
    # 15.2 MB of bf16 weights, 83% of them in experts
    "moe": (256, 256, 4, 4, 2, 1000, 8, 2),
    # 0.98 GB, 82% in experts
    "moe-large": (1024, 512, 8, 16, 4, 32000, 32, 4),
}


def write(out, size):
    import torch
    from huggingface_hub import save_torch_state_dict
    from transformers import LlamaConfig, Qwen3MoeConfig

    size, _, quantization = size.partition("-q-")
    folder = os.path.join(out, "folder")
    os.makedirs(folder)
    generator = torch.Generator().manual_seed(20261127)

    def randn(*shape, scale=0.02):
        return (torch.randn(*shape, generator=generator) * scale).to(torch.bfloat16)

    if size in MOE_SIZES:
        hidden, expert_size, layers, heads, kv_heads, vocab, experts, top = MOE_SIZES[size]
        head_dim = hidden // heads
        config = Qwen3MoeConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * expert_size, moe_intermediate_size=expert_size,
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
            num_experts=experts, num_experts_per_tok=top, norm_topk_prob=True, decoder_sparse_step=1, max_position_embeddings=512,
            rms_norm_eps=1e-6, tie_word_embeddings=False, torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2,
            architectures=["Qwen3MoeForCausalLM"],
        )
    else:
        hidden, intermediate, layers, heads, kv_heads, vocab = SIZES[size]
        head_dim = hidden // heads
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
    write_tokenizer(folder, vocab)
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
        if size in MOE_SIZES:
            # Qwen3-MoE: per-head norms of q and k, a router, and each expert's own projections.
            state[f"{p}.self_attn.q_norm.weight"] = (1 + randn(head_dim, scale=0.1)).to(torch.bfloat16)
            state[f"{p}.self_attn.k_norm.weight"] = (1 + randn(head_dim, scale=0.1)).to(torch.bfloat16)
            state[f"{p}.mlp.gate.weight"] = randn(experts, hidden, scale=0.5)
            for e in range(experts):
                state[f"{p}.mlp.experts.{e}.gate_proj.weight"] = randn(expert_size, hidden, scale=0.08)
                state[f"{p}.mlp.experts.{e}.up_proj.weight"] = randn(expert_size, hidden, scale=0.08)
                state[f"{p}.mlp.experts.{e}.down_proj.weight"] = randn(hidden, expert_size, scale=0.08)
        else:
            state[f"{p}.mlp.gate_proj.weight"] = randn(intermediate, hidden, scale=0.08)
            state[f"{p}.mlp.up_proj.weight"] = randn(intermediate, hidden, scale=0.08)
            state[f"{p}.mlp.down_proj.weight"] = randn(hidden, intermediate, scale=0.08)
    if quantization:
        state = quantized(state, quantization)
        config_path = os.path.join(folder, "config.json")
        with open(config_path) as f:
            saved = json.load(f)
        saved["quantization_config"] = QUANTIZATIONS[quantization]
        with open(config_path, "w") as f:
            json.dump(saved, f, indent=2)
    total = sum(t.numel() * t.element_size() for t in state.values())
    save_torch_state_dict(state, folder, max_shard_size=max(total // 3, 1 << 20))
    print(json.dumps({"bytes": total, "tensors": len(state)}))


# The quantized layouts vLLM's CPU build runs, as their quantizers configure them.
GROUP = 128
QUANTIZATIONS = {
    "awq": {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": True, "checkpoint_format": "gptq"},
    "w8a8": {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed", "ignore": ["lm_head"],
             "config_groups": {"group_0": {"targets": ["Linear"],
                                           "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                                                       "dynamic": False},
                                           "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                                                                 "dynamic": True}}}},
}
_LINEAR = (".q_proj.", ".k_proj.", ".v_proj.", ".o_proj.", ".gate_proj.", ".up_proj.", ".down_proj.")


def quantized(state, method):
    """`state` with every linear layer's bf16 weight quantized round-to-nearest into `method`'s
    layout: GPTQ (symmetric) and AWQ 4-bit with a scale and zero point per group of 128 inputs
    (GPTQ packs eight inputs per int32 and stores zero points less one; AWQ packs eight outputs
    in its interleaved order), int8 with a scale per output channel; so the quantized model generates
    about what the bf16 one would."""
    import torch

    out = {}
    for name, tensor in state.items():
        if not (any(part in name for part in _LINEAR) and name.endswith(".weight")):
            out[name] = tensor
            continue
        prefix = name[: -len(".weight")]
        w = tensor.float()  # [N, K]
        n, k = w.shape
        if method == "w8a8":
            scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127
            out[f"{prefix}.weight"] = (w / scale).round().clamp(-127, 127).to(torch.int8)
            out[f"{prefix}.weight_scale"] = scale.to(torch.bfloat16)
            continue
        groups = w.reshape(n, k // GROUP, GROUP)
        if method == "gptq":  # symmetric (`sym`, as vLLM runs GPTQ): the zero point is 8
            scale = (groups.abs().amax(dim=2) / 7).clamp(min=1e-8)  # [N, K/g]
            zero = torch.full_like(scale, 8)
        else:
            low, high = groups.amin(dim=2), groups.amax(dim=2)
            scale = ((high - low) / 15).clamp(min=1e-8)
            zero = (-low / scale).round().clamp(0, 15)
        codes = ((groups / scale[..., None]).round() + zero[..., None]).clamp(0, 15).to(torch.int32).reshape(n, k)
        if method == "gptq":
            out[f"{prefix}.qweight"] = _pack(codes.t(), 0, range(8))  # [K/8, N]
            out[f"{prefix}.qzeros"] = _pack((zero - 1).clamp(0, 15).to(torch.int32).t(), 1, range(8))  # [K/g, N/8]
            out[f"{prefix}.scales"] = scale.t().to(torch.float16).contiguous()
            out[f"{prefix}.g_idx"] = torch.arange(k, dtype=torch.int32) // GROUP
        else:
            order = (0, 2, 4, 6, 1, 3, 5, 7)
            out[f"{prefix}.qweight"] = _pack(codes.t(), 1, order)  # [K, N/8]
            out[f"{prefix}.qzeros"] = _pack(zero.to(torch.int32).t(), 1, order)  # [K/g, N/8]
            out[f"{prefix}.scales"] = scale.t().to(torch.float16).contiguous()
    return out


def _pack(codes, dim, order):
    """4-bit `codes` packed eight to an int32 along `dim`, the i-th nibble holding the
    `order[i]`-th of each eight."""
    import torch

    codes = codes.movedim(dim, -1)
    codes = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 8, 8).to(torch.int64)
    packed = torch.zeros(codes.shape[:-1], dtype=torch.int64)
    for slot, index in enumerate(order):
        packed |= codes[..., index] << (4 * slot)
    packed = torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)
    return packed.movedim(-1, dim).contiguous()


def write_tokenizer(folder, vocab):
    """A byte-level BPE tokenizer of its own, trained on a little text, padded to the vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=min(vocab, 600), special_tokens=["<unk>", "<s>", "</s>"])
    text = " ".join(PROMPTS * 20) + " the quick brown fox jumps over the lazy dog " * 20
    tokenizer.train_from_iterator([text], trainer)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)


def generate(model, load_format, tp):
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(
        model=model,
        load_format=load_format,
        tensor_parallel_size=tp,
        dtype="bfloat16",
        max_model_len=128,
        # Compilation on only where a check measures it (vllm_compile_cache.py): it costs a minute.
        enforce_eager=os.environ.get("VLLM_CHECK_COMPILE") != "1",
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


class Served(NamedTuple):
    """A running ztserve: its HTTP and S3 endpoint URLs and its process id."""

    url: str
    s3: str
    pid: int


@contextmanager
def serving(models, log, settings=None, host="127.0.0.1", prefix=(), ports=None):
    """ztserve on two ports of `host` (HTTP, and the S3 endpoint; free ones unless `ports`),
    with `settings` (its ZTSERVE_* variables), run under `prefix` (a network namespace's `ip
    netns exec NS`), stopped with SIGTERM and waited for."""
    http, s3 = ports or (free_port(), free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZTSERVE_")}
    env["ZTSERVE_S3_ENDPOINT__LISTEN"] = f"{host}:{s3}"
    env.update(settings or {})
    with open(log, "wb") as out:
        server = subprocess.Popen([*prefix, os.environ["ZTSERVE_BIN"], "serve", "--source", str(models), "--listen", f"{host}:{http}"],
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            url = f"http://{host}:{http}"
            for _ in range(600):
                try:
                    if urllib.request.urlopen(url + "/readyz", timeout=1).status == 200:
                        break
                except OSError:
                    time.sleep(0.1)
            else:
                raise RuntimeError(f"ztserve did not become ready; see {log}")
            # Under `ip netns exec` the server is the child's own child only if exec'd: it is.
            yield Served(url, f"http://{host}:{s3}", server.pid)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)


@contextmanager
def link(rate):
    """A network namespace holding one end of a veth pair, each end's egress shaped to `rate`
    (`tc ... tbf`, e.g. `10gbit`): the command prefix that runs a process in it, and its address
    (the other end, here, is 10.213.0.1). Only these two ends carry traffic; both, and the
    namespace, are removed after, whatever happens (as root)."""
    tag = os.getpid() % 100000
    namespace, here, there = f"ztlink{tag}", f"ztl{tag}a", f"ztl{tag}b"
    shaped = ["root", "tbf", "rate", rate, "burst", "4mb", "latency", "50ms"]
    inside = ["ip", "netns", "exec", namespace]
    steps = [
        ["ip", "netns", "add", namespace],
        ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
        ["ip", "link", "set", there, "netns", namespace],
        ["ip", "addr", "add", "10.213.0.1/30", "dev", here],
        ["ip", "link", "set", here, "up"],
        [*inside, "ip", "addr", "add", "10.213.0.2/30", "dev", there],
        [*inside, "ip", "link", "set", there, "up"],
        [*inside, "ip", "link", "set", "lo", "up"],
        ["tc", "qdisc", "add", "dev", here, *shaped],
        [*inside, "tc", "qdisc", "add", "dev", there, *shaped],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, stdout=subprocess.DEVNULL)
        yield inside, "10.213.0.2"
    finally:
        subprocess.run(["ip", "link", "del", here], stderr=subprocess.DEVNULL)  # both ends go
        subprocess.run(["ip", "netns", "del", namespace], stderr=subprocess.DEVNULL)


def sent(url, tensors_only=False):
    """Every byte ztserve has sent in response bodies, on every route but /metrics, or the
    tensors alone: the bodies of its object, component and regions routes, less the 4 bytes of
    CRC32C each region carries."""
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    regions = sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("ztserve_regions_total"))
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("ztserve_http_response_body_bytes_total") and 'route="/metrics"' not in line
               and (not tensors_only or "/objects/" in line or "/regions" in line)) - (4 * regions if tensors_only else 0)


class Run(NamedTuple):
    """One engine's token ids, and its slowest rank's model load and weight load, in seconds."""

    ids: list
    load_s: float
    weights_s: float


def session(args, tp, env, log, timeout):
    """This script run with `args` in a session of its own, its output into `log`: its exit
    status and output. Every process of the session is killed after it (vLLM's workers outlive
    a killed parent); VLLM_CHECK_TIMEOUT overrides `timeout` (seconds)."""
    env = {**os.environ, **env}
    if tp > 1:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(i % os.cpu_count()) for i in range(tp)))
    with open(log, "w+") as out:
        process = subprocess.Popen([sys.executable, __file__, *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            process.wait(timeout=int(os.environ.get("VLLM_CHECK_TIMEOUT", str(timeout))))
        finally:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                time.sleep(1)
            process.wait()
        out.seek(0)
        return process.returncode, out.read()


def engine(model, load_format, tp, env, log):
    """One vLLM engine in a session of its own: a `Run`. The weight load is each load format's
    `load_weights` (the folder's includes listing its files, the Hub's its download, the load
    format's its manifest and plan). Every process of the session is killed after it, as vLLM's
    workers outlive a killed parent."""
    returncode, text = session(["generate", model, load_format, str(tp)], tp, {"VLLM_LOAD_TIMING": "1", **env}, log, 900)
    results = [json.loads(line[len("RESULT "):]) for line in text.splitlines() if line.startswith("RESULT ")]
    loads = [float(line.split()[1]) for line in text.splitlines() if line.startswith("LOAD_SECONDS ")]
    weights = [float(line.split()[1]) for line in text.splitlines() if line.startswith("WEIGHTS_SECONDS ")]
    if returncode != 0 or not results:
        raise RuntimeError(f"vLLM ({model}, --load-format {load_format}, TP={tp}) failed (exit {returncode}):\n{text[-4000:]}")
    return Run(results[0]["ids"], max(loads, default=float("nan")), max(weights, default=float("nan")))


def planned(url, model, tp):
    """What `python -m ztserve_vllm plan` says the ranks fetch of `model` at `tp`, in all, and
    whether any of its objects is stored compressed."""
    from ztserve_client import Client
    from ztserve_vllm import __main__ as command

    with Client(url) as client:
        model_id, manifest = command.model_id(client, model, "local")
        config = json.loads(client.file(model_id, "config.json"))
    compressed = any(c.get("encoding", "raw") != "raw" for o in manifest["objects"] for c in o["components"])
    return sum(c["planned"] for c in command.rank_costs(manifest, config, tp, False)), compressed


class Row(NamedTuple):
    """One way of loading at one TP size: its weight and model loads, one per round, and the
    bytes ztserve sent for it (the last round's) against the weights' bytes."""

    tp: int
    label: str
    weights_s: list
    load_s: list
    sent: float
    weights: int


def warm(*directories):
    """Reads every file below `directories`, so each way starts from the page cache."""
    for directory in directories:
        for path in Path(directory).rglob("*"):
            if path.is_file():
                with open(path, "rb") as f:
                    while f.read(16 << 20):
                        pass


def run(work, size, ways, tps=(1, 2), rounds=1, rate=None, fetched=None):
    """Every way at each TP size, `rounds` times in alternating order; returns a `Row` per way
    and fails if any run's ids differ from the folder's at the same TP, or if a load through
    the ztserve load format fetched other tensor bytes than the plan command says. With `rate`,
    the server runs across a link shaped to it (`link`). `fetched(served)`, when given, runs
    once the server is up (bench/engines measures a rank's fetch there)."""
    folder, weights = prepare(work, size)
    work = Path(work)
    rows = []
    with contextlib.ExitStack() as stack:
        prefix, host = stack.enter_context(link(rate)) if rate else ((), "127.0.0.1")
        served = stack.enter_context(serving(work / "models", work / "ztserve.log", host=host, prefix=prefix))
        if fetched is not None:
            fetched(served)
        for tp in tps:
            reference, results = None, {}
            for _ in range(rounds):
                for label, model, load_format, env in ways(folder, served.url, served.s3, size):
                    if "HF_HOME" in env:
                        shutil.rmtree(env["HF_HOME"], ignore_errors=True)
                    warm(folder, work / "models")
                    before, tensors_before = sent(served.url), sent(served.url, tensors_only=True)
                    result = engine(model, load_format, tp, env, work / f"engine-{tp}-{label.split()[0]}.log")
                    bytes_sent = sent(served.url) - before
                    runs = results.setdefault(label, ([], [], None))
                    runs[0].append(result.weights_s)
                    runs[1].append(result.load_s)
                    results[label] = (runs[0], runs[1], bytes_sent)
                    print(f"vllm-check: TP={tp} {label}: weights loaded in {result.weights_s:.2f} s (model {result.load_s:.2f} s), "
                          f"ztserve sent {bytes_sent / 1e6:.1f} MB", file=sys.stderr)
                    if reference is None:
                        reference = result.ids
                    elif result.ids != reference:
                        raise SystemExit(f"vllm-check: TP={tp} {label} generated {result.ids}, the folder {reference}")
                    if load_format == "ztserve":
                        # A whole zstd object travels compressed, so only an uncompressed model's bytes are exact.
                        expected, compressed = planned(served.url, model, tp)
                        fetched_bytes = sent(served.url, tensors_only=True) - tensors_before
                        if fetched_bytes > expected or fetched_bytes != expected and not compressed:
                            raise SystemExit(f"vllm-check: TP={tp} {label}: the engine fetched {fetched_bytes:.0f} tensor bytes, "
                                             f"the plan command says {expected}")
            rows += [Row(tp, label, w, m, b, weights) for label, (w, m, b) in results.items()]
    return rows


def restart(work):
    """The small Llama at TP=2 from the folder, then through the load format with the server
    killed mid-load and started again on the same ports: the same token ids, and the restarted
    server must have served part of the load (else the kill came too late, and it says so)."""
    import threading

    size = "small"
    folder, _ = prepare(work, size)
    work = Path(work)
    reference = engine(str(folder), "auto", 2, {"HF_HUB_OFFLINE": "1"}, work / "engine-folder.log").ids
    ports = (free_port(), free_port())
    # Small requests, little ahead and one connection a rank: the load lasts long enough to be cut.
    settings = {"ZTSERVE_REQUEST_BYTES": str(64 << 10), "ZTSERVE_PREFETCH_BYTES": str(256 << 10), "ZTSERVE_CONCURRENCY": "1"}
    outcome = {}

    def regions(url):
        text = urllib.request.urlopen(url + "/metrics").read().decode()
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("ztserve_regions_total"))

    def load_and_kill(hub, log, victim):
        """Starts the engine's load in a thread; once `victim` has sent a region, kills it (SIGKILL)."""
        def load():
            try:
                outcome["run"] = engine(f"st/{size}", "ztserve", 2, hub, log)
            except BaseException as e:  # noqa: BLE001 - reported below
                outcome["error"] = e

        loading = threading.Thread(target=load)
        loading.start()
        while regions(victim.url) == 0:
            if not loading.is_alive():
                raise SystemExit(f"vllm-check: the engine ended before it fetched a region: {outcome}")
            time.sleep(0.02)
        os.kill(victim.pid, signal.SIGKILL)
        return loading

    with serving(work / "models", work / "ztserve-killed.log", ports=ports) as served:
        hub = {"HF_ENDPOINT": served.url + "/hf", "ZTSERVE_URL": served.url, "HF_HOME": str(work / "hf"), **settings}
        loading = load_and_kill(hub, work / "engine-restart.log", served)
    time.sleep(3)
    with serving(work / "models", work / "ztserve-restarted.log", ports=ports) as served:
        loading.join()
        served_after = regions(served.url)
    if "error" in outcome:
        raise SystemExit(f"vllm-check: the load did not survive the restart: {outcome['error']}")
    if outcome["run"].ids != reference:
        raise SystemExit(f"vllm-check: after the restart the engine generated {outcome['run'].ids}, the folder {reference}")
    if served_after == 0:
        raise SystemExit("vllm-check: the load ended before the server was killed; nothing was asked of the restarted one")

    # Two replicas over the same folder (one version): the first killed mid-load and left down,
    # the ranks go on at the second, named after it in ZTSERVE_URL.
    outcome.clear()
    with serving(work / "models", work / "ztserve-survivor.log") as survivor:
        with serving(work / "models", work / "ztserve-first.log") as first:
            hub = {"HF_ENDPOINT": survivor.url + "/hf", "ZTSERVE_URL": f"{first.url},{survivor.url}",
                   "HF_HOME": str(work / "hf"), **settings}
            loading = load_and_kill(hub, work / "engine-failover.log", first)
        loading.join()
        served_by_survivor = regions(survivor.url)
    if "error" in outcome:
        raise SystemExit(f"vllm-check: the load did not go on at the second replica: {outcome['error']}")
    if outcome["run"].ids != reference:
        raise SystemExit(f"vllm-check: after the failover the engine generated {outcome['run'].ids}, the folder {reference}")
    if served_by_survivor == 0:
        raise SystemExit("vllm-check: the load ended before the first replica was killed; the second served nothing")
    return served_after, served_by_survivor


LINEAGE = "policy"


def step(n):
    return f"step-{n:06d}"


def write_versions(work, size, count=4, fraction=0.02, seed=20261129):
    """The lineage `work/models/policy/step-000001..count`: the first the model `write` makes,
    each next the one before with `fraction` of the elements of every tensor set to new random
    values at the tensor's scale (its mean plus its standard deviation times a normal draw),
    seeded; each folder a checkpoint with its config and tokenizer and, last, a READY file."""
    import torch
    from huggingface_hub import save_torch_state_dict
    from safetensors.torch import load_file

    work = Path(work)
    root = work / "models" / LINEAGE
    first = root / step(1)
    if not (first / "READY").exists():
        shutil.rmtree(work / "gen", ignore_errors=True)
        subprocess.run([sys.executable, __file__, "write", str(work / "gen"), "--size", size], check=True, stdout=sys.stderr)
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(first, ignore_errors=True)
        shutil.move(str(work / "gen" / "folder"), first)
        (first / "READY").touch()
    for n in range(2, count + 1):
        folder = root / step(n)
        if (folder / "config.json").exists():
            continue
        # Seeded per version, so a version written again (its folder left half-written) is the same.
        generator = torch.Generator().manual_seed(seed + n)
        previous = root / step(n - 1)
        state = {}
        for shard in sorted(previous.glob("*.safetensors")):
            state.update(load_file(shard))
        for name in sorted(state):
            tensor = state[name]
            flat = tensor.reshape(-1).clone()
            values = flat.float()
            scale = float(values.std()) if flat.numel() > 1 else 0.0
            scale = scale or 0.1 * max(abs(float(values.mean())), 0.2)
            picked = torch.randperm(flat.numel(), generator=generator)[: max(1, int(fraction * flat.numel()))]
            flat[picked] = (float(values.mean()) + scale * torch.randn(len(picked), generator=generator)).to(flat.dtype)
            state[name] = flat.reshape(tensor.shape)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        total = sum(t.numel() * t.element_size() for t in state.values())
        save_torch_state_dict(state, str(folder), max_shard_size=max(total // 3, 1 << 20))
        # config.json last: a folder that has it is whole (check-refit takes READY files away).
        for extra in sorted(previous.iterdir(), key=lambda p: (p.name == "config.json", p.name)):
            if extra.suffix != ".safetensors" and extra.name not in ("model.safetensors.index.json", "READY"):
                shutil.copy(extra, folder / extra.name)
        del state
        (folder / "READY").touch()
    return root


def metric(url, name, labels=""):
    """The sum of the series of metric `name` (whose labels contain `labels`) at `url`."""
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.split("{")[0].split(" ")[0] == name and labels in line)


def publish(url, root, version, ahead=0, within=300):
    """Publishes `version` of the lineage at `root` as a trainer does (its READY file, last) and
    waits until the server at `url` lists it (its rescan) and has computed `ahead` deltas to it
    in the background (those of the regions the last update asked, before anyone asks again)."""
    before = metric(url, "ztserve_deltas_ahead_total")
    (Path(root) / version / "READY").touch()
    deadline = time.monotonic() + within
    while True:
        listed = json.load(urllib.request.urlopen(url + "/models"))["models"]
        done = metric(url, "ztserve_deltas_ahead_total") - before
        if any(m["id"] == f"{LINEAGE}/{version}" for m in listed) and done >= ahead:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"vllm-check: refit: {within} s after {LINEAGE}/{version}'s READY file the server had "
                             f"computed {done:.0f} of its {ahead} deltas ahead")
        time.sleep(0.2)


def refit_run(first, tp, targets):
    """One engine through the load format with the ztserve weight-transfer backend: loads
    `first` (a version of the lineage), generates, then for each of `targets` publishes it when
    REFIT_PUBLISH names the lineage's folder, updates to it and generates again; a RESULT line
    per version with its ids, the update's seconds, the bytes the server sent during it and the
    deltas it found kept (its metrics at ZTSERVE_URL)."""
    from vllm import LLM, SamplingParams

    url = os.environ["ZTSERVE_URL"]
    started = time.perf_counter()
    llm = LLM(model=f"{LINEAGE}/{first}", load_format="ztserve", tensor_parallel_size=tp, dtype="bfloat16", max_model_len=128,
              enforce_eager=True, seed=0, gpu_memory_utilization=float(os.environ.get("VLLM_CHECK_MEMORY", "0.15")),
              weight_transfer_config={"backend": "ztserve"})
    loaded = time.perf_counter() - started
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)

    def ids():
        return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]

    print("RESULT " + json.dumps({"version": first, "ids": ids(), "engine_start_s": round(loaded, 2)}), flush=True)
    llm.init_weight_transfer_engine({"init_info": {"url": url, "model": LINEAGE}})
    base = first
    asked = 0  # the distinct deltas the last update asked for: the next version's are computed ahead
    for target in targets:
        computing = metric(url, "ztserve_delta_compute_seconds_count")
        if os.environ.get("REFIT_PUBLISH"):
            publish(url, os.environ["REFIT_PUBLISH"], target, ahead=asked)
        before, kept = sent(url), metric(url, "ztserve_deltas_total", 'outcome="kept"')
        began = time.perf_counter()
        llm.start_weight_update()
        llm.update_weights({"update_info": {"base": base, "target": target}})
        llm.finish_weight_update(weight_version=target)
        took = time.perf_counter() - began
        update_sent = sent(url) - before
        kept = metric(url, "ztserve_deltas_total", 'outcome="kept"') - kept
        # Each distinct delta is computed once: ahead (`publish` waited for them) or on request.
        asked = metric(url, "ztserve_delta_compute_seconds_count") - computing
        print("RESULT " + json.dumps({"version": target, "ids": ids(), "update_s": round(took, 2), "sent": update_sent,
                                      "kept": kept}), flush=True)
        base = target
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None:
        core.shutdown()


def refit_engine(first, targets, tp, env, log):
    """`refit_run` in a session of its own (as `engine`), its RESULT lines and each rank's refit
    log lines (`ztserve: refit ...`)."""
    returncode, text = session(["refit-run", first, str(tp), *targets], tp, env, log, 1800)
    results = [json.loads(line[len("RESULT "):]) for line in text.splitlines() if line.startswith("RESULT ")]
    refits = [line[line.index("refit "):] for line in text.splitlines() if "ztserve: refit " in line]
    if returncode != 0 or len(results) != 1 + len(targets):
        raise RuntimeError(f"vLLM refit engine ({first} -> {targets}) failed (exit {returncode}):\n{text[-6000:]}")
    return results, refits


def check_refit(work, size="large"):
    """check-refit (module docstring): returns the lines it prints."""
    import re

    work = Path(work)
    tp = 2
    root = write_versions(work, size)
    versions = [step(n) for n in range(1, 5)]
    lines = []
    # A rescan a second: a version is listed within about a second of its READY file.
    settings = {"ZTSERVE_REFITS__LINEAGES": LINEAGE, "ZTSERVE_SOURCES__RESCAN_INTERVAL_SECS": "1"}
    reference = {}
    for version in versions:  # vLLM from each version's folder, one engine at a time
        began = time.perf_counter()
        reference[version] = engine(str(root / version), "auto", tp, {"HF_HUB_OFFLINE": "1"}, work / f"engine-{version}.log").ids
        print(f"vllm-check: refit: the folder of {version} at TP={tp} in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    for older, newer in zip(versions, versions[1:]):
        if reference[older] == reference[newer]:
            raise SystemExit(f"vllm-check: refit: {older} and {newer} generate the same token ids, so an update to {newer} "
                             "could not be told from none; change more")
    for version in versions[1:]:  # published one by one, by engine 1, as a trainer would
        (root / version / "READY").unlink(missing_ok=True)
    with serving(work / "models", work / "ztserve.log", settings=settings) as served:
        hub = {"HF_ENDPOINT": served.url + "/hf", "ZTSERVE_URL": served.url, "HF_HOME": str(work / "hf")}
        listed = [m["id"] for m in json.load(urllib.request.urlopen(served.url + "/models"))["models"]]
        if listed != [f"{LINEAGE}/{versions[0]}"]:
            raise SystemExit(f"vllm-check: refit: the server lists {listed}, not the one version published")
        share, _ = planned(served.url, f"{LINEAGE}/{versions[0]}", tp)
        runs = [("engine 1", versions[0], versions[1:], {"REFIT_PUBLISH": str(root)}),
                ("late joiner", versions[1], versions[2:3], {})]
        for label, first, targets, publishing in runs:
            shutil.rmtree(work / "hf", ignore_errors=True)
            began = time.perf_counter()
            results, refits = refit_engine(first, targets, tp, {**hub, **publishing}, work / f"engine-refit-{first}.log")
            print(f"vllm-check: refit: {label} ran in {time.perf_counter() - began:.0f} s", file=sys.stderr)
            for result in results:
                version = result["version"]
                if result["ids"] != reference[version]:
                    raise SystemExit(f"vllm-check: refit: {label} at {version} generated {result['ids']}, its folder "
                                     f"{reference[version]}")
                if "sent" not in result:
                    lines.append(f"TP={tp} {label}: loaded {version} through the load format: same token ids as its folder")
                    continue
                ranks = [r for r in refits if f" -> {LINEAGE}/{version}:" in r]
                received = [int(re.search(r"received (\d+) bytes", r).group(1)) for r in ranks]
                shares = [int(re.search(r"share of (\d+) bytes", r).group(1)) for r in ranks]
                if len(ranks) != tp:
                    raise SystemExit(f"vllm-check: refit: {label}: {len(ranks)} rank(s) logged the update to {version}, not {tp}")
                for got, whole in zip(received, shares):
                    if got * 4 > whole:
                        raise SystemExit(f"vllm-check: refit: {label}: a rank received {got} bytes for its share of {whole}")
                if result["sent"] * 4 > share:
                    raise SystemExit(f"vllm-check: refit: {label}: the update to {version} cost the server {result['sent']:.0f} "
                                     f"bytes, a reload of the shares {share}")
                asked = sum(int(re.search(r"of (\d+) regions by delta", r).group(1)) for r in ranks)
                if label == "engine 1" and version != versions[1] and result["kept"] != asked:
                    raise SystemExit(f"vllm-check: refit: {label}: {result['kept']:.0f} of the {asked} deltas to {version} "
                                     "were kept; the server was to compute them ahead, after it listed the version")
                lines.append(f"TP={tp} {label}: updated to {version} in {result['update_s']:.2f} s ({result['kept']:.0f} of "
                             f"{asked} deltas found kept); same token ids as its folder; "
                             f"server sent {result['sent'] / 1e6:.1f} MB against {share / 1e6:.1f} MB for a reload "
                             f"({share / result['sent']:.1f}x fewer); ranks received "
                             + ", ".join(f"{g / 1e6:.1f} of {w / 1e6:.1f} MB" for g, w in zip(received, shares)))
    return lines


def check_ways(folder, url, s3, size):
    hub = {"HF_ENDPOINT": url + "/hf", "ZTSERVE_URL": url, "HF_HOME": str(folder.parent / "hf")}
    return [
        ("folder (safetensors)", str(folder), "auto", {"HF_HUB_OFFLINE": "1"}),
        (f"ztserve zt/{size} (.zt, zstd, sha256)", f"zt/{size}", "ztserve", hub),
        (f"ztserve st/{size} (sharded safetensors)", f"st/{size}", "ztserve", hub),
    ]


def quantized_ways(folder, url, s3, size):
    hub = {"HF_ENDPOINT": url + "/hf", "ZTSERVE_URL": url, "HF_HOME": str(folder.parent / "hf")}
    return [
        ("folder (safetensors)", str(folder), "auto", {"HF_HUB_OFFLINE": "1"}),
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


def moe_bench_ways(folder, url, s3, size):
    return [way for way in bench_ways(folder, url, s3, size) if not way[0].startswith("Hub API")]


def _median(values):
    return statistics.median(values)


def _engine_rows(model, rows):
    """Markdown rows of `rows` (one model): each way's median weight load against the folder's
    at the same TP (above 1, faster), its model load, and what ztserve sent."""
    out = []
    for row in rows:
        folder = next(r for r in rows if r.tp == row.tp and r.label.startswith("folder"))
        weights = _median(row.weights_s)
        out.append(f"| {model}, {row.weights / 1e9:.2f} GB | {row.tp} | {row.label} | {weights:.2f} s "
                   f"({min(row.weights_s):.2f}–{max(row.weights_s):.2f}) | {_median(folder.weights_s) / weights:.2f}x | "
                   f"{_median(row.load_s):.2f} s | {row.sent / 1e6:,.1f} MB | {row.sent / row.weights:.2f}x |")
    return out


def _link_rows(rows, rate):
    """Markdown rows over the link: each way's median weight load against the bound the issue
    sets the load format (what it sent at the link's rate, plus the folder's load)."""
    bits = float(rate.rstrip("gbit")) * 1e9 if rate.endswith("gbit") else float(rate.rstrip("mbit")) * 1e6
    out = []
    for row in rows:
        folder = _median(next(r for r in rows if r.label.startswith("folder")).weights_s)
        weights = _median(row.weights_s)
        bound = row.sent * 8 / bits + folder
        out.append(f"| {row.tp} | {row.label} | {weights:.2f} s ({min(row.weights_s):.2f}–{max(row.weights_s):.2f}) | "
                   f"{row.sent / 1e6:,.1f} MB | {row.sent * 8 / bits:.2f} s + {folder:.2f} s = {bound:.2f} s | {weights / bound:.2f}x |")
    return out


def bench(work, rounds, rate):
    """The tables bench/engines writes: a rank's fetch (three ways, one server), the engines over
    loopback, and at TP=2 across a link shaped to `rate`."""
    import vllm_rank_fetch

    fetch_rows = []

    def fetches(model, label, tp):
        return lambda served: fetch_rows.extend(vllm_rank_fetch.rows(served.url, served.pid, model, tp, 2 * rounds + 1, label))

    large = run(work / "large", "large", bench_ways, rounds=rounds, fetched=fetches("st/large", "Llama", 2))
    moe = run(work / "moe", "moe-large", moe_bench_ways, tps=(2,), rounds=rounds, fetched=fetches("st/moe-large", "Qwen3-MoE", 2))
    linked = run(work / "link", "large", bench_ways, tps=(2,), rounds=rounds, rate=rate)
    print("### A rank's fetch, without vLLM (one server, loopback)\n")
    print("| share | way | time (median) | rate | of the ceiling | server CPU |")
    print("|---|---|---|---|---|---|")
    print("\n".join(fetch_rows))
    print(f"\n### vLLM's weight load (slowest rank, medians of {rounds} alternating rounds, loopback)\n")
    print("| model | TP | load | weights load (spread) | of the folder's speed | model load | ztserve sent | of the weights |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(_engine_rows("Llama", large) + _engine_rows("Qwen3-MoE", moe)))
    print(f"\n### Across a link shaped to {rate} (the server in a network namespace; Llama, 1.13 GB, medians of {rounds})\n")
    print("| TP | load | weights load (spread) | ztserve sent | bound: sent at the link's rate + the folder's load | of the bound |")
    print("|---|---|---|---|---|---|")
    print("\n".join(_link_rows(linked, rate)))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        size = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--size" else "tiny"
        write(sys.argv[2], size)
    elif sys.argv[1] == "generate":
        generate(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "check":
        for row in run(sys.argv[2], "tiny", check_ways):
            print(f"TP={row.tp} {row.label}: same token ids as the folder; weights {row.weights_s[0]:.2f} s; "
                  f"ztserve sent {row.sent / row.weights:.2f}x the weights")
    elif sys.argv[1] == "check-quantized":
        for method in sys.argv[3:] or list(QUANTIZATIONS):
            for row in run(os.path.join(sys.argv[2], method), f"small-q-{method}", quantized_ways, tps=(2,)):
                print(f"TP={row.tp} {method} {row.label}: same token ids as the folder; weights {row.weights_s[0]:.2f} s; "
                      f"ztserve sent {row.sent / row.weights:.2f}x the weights")
                if "ztserve" in row.label and row.sent > 1.1 * row.weights:
                    raise SystemExit(f"vllm-check: TP={row.tp} {row.label} cost the server {row.sent / row.weights:.2f}x the weights, "
                                     "more than 1.1x")
    elif sys.argv[1] == "check-moe":
        for row in run(sys.argv[2], "moe", check_ways, tps=(2,)):
            print(f"TP={row.tp} {row.label}: same token ids as the folder; weights {row.weights_s[0]:.2f} s; "
                  f"ztserve sent {row.sent / row.weights:.2f}x the weights")
            if "ztserve" in row.label and row.sent > 1.1 * row.weights:
                raise SystemExit(f"vllm-check: TP={row.tp} {row.label} cost the server {row.sent / row.weights:.2f}x the weights, more than 1.1x")
    elif sys.argv[1] == "check-restart":
        after, survivor = restart(sys.argv[2])
        print(f"TP=2 the server killed mid-load and started again: same token ids as the folder; "
              f"{after:.0f} regions served by the restarted server")
        print(f"TP=2 the first of two replicas killed mid-load: same token ids as the folder; "
              f"{survivor:.0f} regions served by the second")
    elif sys.argv[1] == "refit-run":
        refit_run(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    elif sys.argv[1] == "check-refit":
        for line in check_refit(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "large"):
            print(line)
    elif sys.argv[1] == "bench":
        bench(Path(sys.argv[2]), int(os.environ.get("BENCH_ROUNDS", "2")), os.environ.get("BENCH_LINK_RATE", "10gbit"))
    else:
        sys.exit(__doc__)
