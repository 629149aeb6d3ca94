"""Refits measured (bench/refits runs it): one tensor-parallel rank's update from version A to
version B of a Llama-shaped bf16 model through `POST /models/{B}/deltas` (fetch, check each
CRC32C, `apply_delta` into the rank's kept share of A), against fetching B's share through
`POST /models/{B}/regions`, on one server; the bytes each sends, the time, the server's CPU
seconds, and what the server's delta store keeps.

    refits.py generate DIR                  the versions, under DIR/policy/
    refits.py measure DIR URL PID TP STORE  one server's rows (JSON lines on stdout)
    refits.py encode                        the format's bytes per changed element, bf16 and FP8
    refits.py sizes                         DeepSeek-V3 and Kimi-K2 ranks at TP=8, by dtype
    refits.py table DIR RESULTS...          the markdown table
    refits.py arithmetic ENCODE SIZES       the arithmetic of the two above, markdown

The plan of a rank is `ztserve_vllm.config_plan`'s (the load format's): q/k/v and gate/up
split by rows (k/v whole when there are fewer key/value heads than ranks, as vLLM replicates
them), o/down by columns, the embedding and lm_head by rows of the vocabulary, norms whole."""

import http.client
import json
import os
import struct
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import crc32c
import numpy as np
import xxhash
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "clients" / "vllm" / "src"))
from ztserve_client import apply_delta  # noqa: E402
from ztserve_vllm import config_plan  # noqa: E402

# hidden, intermediate, layers, heads, kv heads, vocab: tests/interop/vllm_load.py's "large".
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, VOCAB = 2048, 5632, 10, 16, 1, 32000
A = "policy/step-000100"
VERSIONS = {0.02: "policy/step-000101", 0.005: "policy/step-000102"}  # each B: A with p changed
HEADER = struct.Struct("<8sBB6sQQQQ")


# --- the model ------------------------------------------------------------------------------

def llama_tensors():
    """(name, shape, scale) of every weight: values are normal of `scale`, norms 1 + that."""
    head_dim = HIDDEN // HEADS
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN), 1.0)]
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        out += [
            (f"{p}.input_layernorm.weight", (HIDDEN,), -0.1),
            (f"{p}.self_attn.q_proj.weight", (HEADS * head_dim, HIDDEN), 0.08),
            (f"{p}.self_attn.k_proj.weight", (KV_HEADS * head_dim, HIDDEN), 0.08),
            (f"{p}.self_attn.v_proj.weight", (KV_HEADS * head_dim, HIDDEN), 0.08),
            (f"{p}.self_attn.o_proj.weight", (HIDDEN, HEADS * head_dim), 0.08),
            (f"{p}.post_attention_layernorm.weight", (HIDDEN,), -0.1),
            (f"{p}.mlp.gate_proj.weight", (INTERMEDIATE, HIDDEN), 0.08),
            (f"{p}.mlp.up_proj.weight", (INTERMEDIATE, HIDDEN), 0.08),
            (f"{p}.mlp.down_proj.weight", (HIDDEN, INTERMEDIATE), 0.08),
        ]
    out += [("model.norm.weight", (HIDDEN,), -0.1), ("lm_head.weight", (VOCAB, HIDDEN), 0.05)]
    return out


def config():
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HIDDEN // HEADS,
        "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "tie_word_embeddings": False,
    }


def bf16(values):
    """float32 -> bf16 bits (round to nearest even), as uint16."""
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def normal(rng, n, scale):
    """bf16 bits of n values: normal of `scale`, or 1 + normal of -scale for a norm's weight."""
    x = rng.standard_normal(n, dtype=np.float32) * abs(scale)
    return bf16(x + 1 if scale < 0 else x)


def changed_positions(rng, n, p):
    """round(p * n) distinct positions of n, random."""
    return rng.choice(n, int(round(p * n)), replace=False, shuffle=False)


def safetensors_header(tensors):
    header, offset = {}, 0
    for name, shape, _ in tensors:
        size = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def generate(root):
    """A and each B under root/policy/, seeded: B is A with p of every weight's elements set to
    new values of that weight's scale (random positions). Writes root/truth.json: elements, and
    the elements that really differ per B (a new value may equal the old)."""
    tensors = llama_tensors()
    names = [A, *VERSIONS.values()]
    outs = {}
    for name in names:
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config(), indent=1))
        outs[name] = open(folder / "model.safetensors", "wb")
        outs[name].write(safetensors_header(tensors))
    truth = {"elements": 0, "differ": {str(p): 0 for p in VERSIONS}}
    for i, (tensor, shape, scale) in enumerate(tensors):
        n = int(np.prod(shape))
        a = normal(np.random.default_rng([70, i]), n, scale)
        outs[A].write(a.tobytes())
        truth["elements"] += n
        for j, (p, name) in enumerate(VERSIONS.items()):
            rng = np.random.default_rng([70, i, j + 1])
            b = a.copy()
            at = changed_positions(rng, n, p)
            b[at] = normal(rng, len(at), scale)
            truth["differ"][str(p)] += int(np.count_nonzero(a != b))
            outs[name].write(b.tobytes())
    for name in names:
        outs[name].close()
        (root / name / "READY").write_text("")
    (root / "truth.json").write_text(json.dumps(truth))
    print(f"generated {len(names)} versions of {truth['elements'] * 2 / 1e9:.2f} GB", file=sys.stderr)


# --- a rank's share -------------------------------------------------------------------------

def share(rank, tp):
    """The rank's regions as the load format plans them: [(name, region or None, shape)]."""
    shapes = {name: shape for name, shape, _ in llama_tensors()}
    plans = config_plan.plan(config(), shapes, rank, tp, False)
    return [(p.name, region, shapes[p.name]) for p in plans for region in ([None] if p.regions is None else p.regions)]


def request(regions):
    return [{"object": name, **({"slice": ",".join(f"{a}:{b}" for a, b in region)} if region else {})}
            for name, region, _ in regions]


def box(region, shape):
    return tuple(slice(*region[d]) if region and d < len(region) else slice(0, n) for d, n in enumerate(shape))


class Checkpoint:
    """One version's safetensors file, mapped: a region's bytes straight from the file."""

    def __init__(self, path):
        with open(path, "rb") as f:
            head = struct.unpack("<Q", f.read(8))[0]
            self.header = json.loads(f.read(head))
        self.map = np.memmap(path, dtype=np.uint8, mode="r")
        self.base = 8 + head

    def region(self, name, region):
        meta = self.header[name]
        start, stop = meta["data_offsets"]
        tensor = self.map[self.base + start:self.base + stop].view(np.uint16).reshape(meta["shape"])
        return np.ascontiguousarray(tensor[box(region, meta["shape"])]).view(np.uint8).reshape(-1)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def du(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def segment(model):
    return urllib.parse.quote(model, safe="")


def post(conn, path, body):
    conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"POST {path}: {response.status} {response.read(2000).decode(errors='replace')}")
    return response


def read_into(response, view):
    got = 0
    while got < len(view):
        n = response.readinto(view[got:])
        if not n:
            raise RuntimeError(f"the body ended {len(view) - got} bytes early")
        got += n


def check_crc(response, *parts):
    crc = 0
    for part in parts:
        crc = crc32c.crc32c(part, crc)
    tail = bytearray(4)
    read_into(response, memoryview(tail))
    if int.from_bytes(tail, "big") != crc:
        raise RuntimeError("a region's CRC32C does not match")


def fetch_share(conn, model, regions, buffers):
    """B's share through /regions, each region into its buffer, CRC-checked: the bytes sent."""
    response = post(conn, f"/models/{segment(model)}/regions", {"regions": request(regions)})
    for buffer in buffers:
        read_into(response, memoryview(buffer))
        check_crc(response, buffer)
    response.read()
    return sum(len(b) + 4 for b in buffers)


def deltas(conn, base, target, regions):
    """Each region's delta from `POST /models/{target}/deltas`, CRC-checked, in order; then
    checks the body ends there."""
    response = post(conn, f"/models/{segment(target)}/deltas", {"from": base, "regions": request(regions)})
    for _ in regions:
        head = bytearray(HEADER.size)
        read_into(response, memoryview(head))
        payload_len = HEADER.unpack(head)[6]
        delta = bytearray(HEADER.size + payload_len)
        delta[:HEADER.size] = head
        read_into(response, memoryview(delta)[HEADER.size:])
        check_crc(response, delta)
        yield delta
    rest = response.read()
    if rest:
        raise RuntimeError(f"{len(rest)} bytes after the last delta")


def update(conn, base, target, regions, kept):
    """The rank's update: each region's delta applied to its kept buffer as it arrives. The
    bytes sent (with each CRC32C) and the changed elements the deltas declare."""
    sent = changed = 0
    for delta, buffer in zip(deltas(conn, base, target, regions), kept):
        changed += apply_delta(delta, buffer).changed
        sent += len(delta) + 4
    return sent, changed


def touched(n):
    buffer = np.empty(n, dtype=np.uint8)
    buffer[:] = 0
    return buffer


def measure(root, url, pid, tp, store, rounds=2):
    """JSON lines: per B, rank 0 of `tp`'s update (cold once, warm `rounds` times) against its
    share through /regions (`rounds` times), alternating; then what the store keeps."""
    parsed = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=600)
    regions = share(0, tp)
    a = Checkpoint(root / A / "model.safetensors")
    old = [a.region(name, region) for name, region, _ in regions]
    share_bytes = sum(len(o) for o in old)
    fresh = [touched(len(o)) for o in old]
    kept = [touched(len(o)) for o in old]
    # Both versions read once first (page cache, first-read checks), untimed.
    for model in [A, *VERSIONS.values()]:
        fetch_share(conn, model, regions, fresh)
    for p, b in VERSIONS.items():
        expected = Checkpoint(root / b / "model.safetensors")
        row = {"tp": tp, "p": p, "regions": len(regions), "share_bytes": share_bytes, "link": os.environ.get("BENCH_LINK", "")}
        times = {"regions": [], "warm": []}
        cpu = {"regions": [], "warm": []}

        def timed(kind, fn):
            for k, o in zip(kept, old):
                k[:] = o
            before, started = cpu_seconds(pid), time.perf_counter()
            out = fn()
            elapsed, used = time.perf_counter() - started, cpu_seconds(pid) - before
            return out, elapsed, used

        for r in range(rounds):
            sent, t, c = timed("regions", lambda: fetch_share(conn, b, regions, fresh))
            times["regions"].append(t)
            cpu["regions"].append(c)
            row["regions_sent"] = sent
            if r == 0:
                stored = du(store)
                (sent, changed), t, c = timed("cold", lambda: update(conn, A, b, regions, kept))
                row.update(cold_s=t, cold_cpu=c, deltas_sent=sent, changed=changed, store_rank=du(store) - stored)
                for (name, region, _), k in zip(regions, kept):
                    if not np.array_equal(k, expected.region(name, region)):
                        raise RuntimeError(f"{name} {region}: the applied share differs from {b}'s")
            (sent, _), t, c = timed("warm", lambda: update(conn, A, b, regions, kept))
            times["warm"].append(t)
            cpu["warm"].append(c)
        for (name, region, _), k in zip(regions, kept):
            if not np.array_equal(k, expected.region(name, region)):
                raise RuntimeError(f"{name} {region}: the share applied warm differs from {b}'s")
        # This script's encoder (`encode`, for the FP8 figures) gives the server's bytes.
        size = lambda r: np.prod([s.stop - s.start for s in box(r[1], r[2])])  # noqa: E731
        cut = [r for r in regions if r[1] and len(r[1]) > 1 and r[1][1][1] < r[2][1]]  # by columns
        sample = list({(r[0], str(r[1])): r for r in [max(regions, key=size), *cut[:1], regions[-1]]}.values())
        got = list(zip(deltas(conn, A, b, sample), sample))  # the whole body read, the connection reusable
        row["encoder_matches"] = all(encode(a.region(name, region), expected.region(name, region), 2) == delta
                                     for delta, (name, region, _) in got)
        row.update(regions_s=float(np.median(times["regions"])), regions_cpu=float(np.median(cpu["regions"])),
                   warm_s=float(np.median(times["warm"])), warm_cpu=float(np.median(cpu["warm"])), rounds=rounds)
        # The other ranks' updates, untimed: what the store keeps for the whole version.
        if not os.environ.get("BENCH_LINK"):
            for rank in range(1, tp):
                others = share(rank, tp)
                buffers = [a.region(name, region).copy() for name, region, _ in others]
                update(conn, A, b, others, buffers)
            row["store_version"] = du(store) - stored
        print(json.dumps(row), flush=True)
    conn.close()


# --- the format's bytes per changed element -------------------------------------------------

def varints(values):
    """LEB128 of each uint64 of `values`, concatenated."""
    values = values.astype(np.uint64)
    lengths = np.maximum(1, -(-np.floor(np.log2(np.maximum(values, 1).astype(np.float64)) + 1).astype(np.int64) // 7))
    lengths[values == 0] = 1
    out = np.zeros(int(lengths.sum()), dtype=np.uint8)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    for k in range(int(lengths.max())):
        has = lengths > k
        byte = ((values[has] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        byte |= np.where(lengths[has] > k + 1, 0x80, 0).astype(np.uint8)
        out[starts[has] + k] = byte
    return out


def encode(old, new, width, level=3):
    """`format::delta::encode` in numpy (the same bytes for the same zstd build and level)."""
    dtype = np.dtype(f"<u{width}")
    o, n = old.view(dtype), new.view(dtype)
    elements = len(n)
    at = np.flatnonzero(o != n)
    head = lambda kind, changed, length: HEADER.pack(b"ZTDELTA1", kind, width, bytes(6), elements, changed, length,  # noqa: E731
                                                     xxhash.xxh3_64_intdigest(new))
    whole = head(1, elements, len(new)) + new.tobytes()
    if len(at) > elements // 2:
        return whole
    if len(at) == 0:
        return head(0, 0, 0)
    gaps = np.diff(at, prepend=-1) - 1
    planes = n[at].view(np.uint8).reshape(len(at), width).T.reshape(-1)
    body = varints(gaps).tobytes() + planes.tobytes()
    frame = zstandard.ZstdCompressor(level=level, write_content_size=True).compress(body)
    if HEADER.size + len(frame) >= len(new) // 2:
        return whole
    return head(0, len(at), len(frame)) + frame


E4M3 = None


def fp8_e4m3(x):
    """float32 -> FP8 E4M3 (finite, saturating) bytes, nearest."""
    global E4M3
    if E4M3 is None:
        codes = np.arange(128, dtype=np.uint32)
        exp, man = codes >> 3, codes & 7
        values = np.where(exp == 0, man / 8 * 2.0 ** -6, (1 + man / 8) * 2.0 ** (exp.astype(np.float64) - 7))
        keep = codes != 127  # 0x7f is NaN
        E4M3 = (values[keep], codes[keep].astype(np.uint8))
    values, codes = E4M3
    mag = np.minimum(np.abs(x), 448.0)
    i = np.clip(np.searchsorted(values, mag), 1, len(values) - 1)
    nearest = np.where(mag - values[i - 1] <= values[i] - mag, i - 1, i)
    return codes[nearest] | np.where(x < 0, 0x80, 0).astype(np.uint8)


def fp8_blocks(rng, rows, cols, std, scales=None):
    """A 128x128-block-quantized FP8 weight: normal of `std` over each block's amax / 448."""
    x = rng.standard_normal((rows, cols), dtype=np.float32) * std
    if scales is None:
        blocks = x.reshape(rows // 128, 128, cols // 128, 128)
        scales = np.abs(blocks).max(axis=(1, 3)) / 448.0
    per = np.repeat(np.repeat(scales, 128, axis=0), 128, axis=1)
    return fp8_e4m3(x / per).reshape(-1), scales


def encode_stats(level=3):
    """Bytes per changed element of the format (header included) for a bf16 and an FP8 weight
    at each p, each delta checked by apply_delta; and of the XOR of the two versions, zstd."""
    rng = np.random.default_rng(7070)
    rows, cols = 7168, 2048  # an expert's gate_proj of DeepSeek-V3 (transposed), 14.7 M elements
    out = {}
    a16 = normal(rng, rows * cols, 0.02)
    a8, scales = fp8_blocks(rng, rows, cols, 0.02)
    for p in VERSIONS:
        for kind, a in (("bf16", a16), ("fp8", a8)):
            b = a.copy()
            at = changed_positions(rng, len(a), p)
            if kind == "bf16":
                b[at] = normal(rng, len(at), 0.02)
            else:
                fresh, _ = fp8_blocks(rng, rows, cols, 0.02, scales)
                b[at] = fresh[at]
            old, new = a.view(np.uint8), b.view(np.uint8)
            delta = encode(old, new, a.itemsize, level)
            target = old.copy()
            header = apply_delta(delta, target)
            assert np.array_equal(target, new)
            # ModelExpress's layout for comparison: the XOR of the two, zstd at the same level.
            xor = zstandard.ZstdCompressor(level=level).compress((old ^ new).tobytes())
            out[f"{kind} {p}"] = {"changed": header.changed, "bytes": len(delta), "region": len(new),
                                  "per_changed": len(delta) / header.changed, "xor_zstd_per_changed": len(xor) / header.changed}
    return out


# --- DeepSeek-V3 and Kimi-K2 at TP=8 --------------------------------------------------------

def mla_tensors(layers, experts, heads, dense_layers, vocab, mtp):
    """(name, dtype, shape) of a DeepSeek-V3-architecture FP8 checkpoint (bench/scale/generate.py's
    layout): 128x128-block FP8 linears with F32 scales, BF16 norms, router, embedding, head."""
    hidden, moe, dense, q_lora, kv_lora, rope, nope, v_dim = 7168, 2048, 18432, 1536, 512, 64, 128, 128

    def quantized(name, rows, cols):
        yield name + ".weight", "F8_E4M3", [rows, cols]
        yield name + ".weight_scale_inv", "F32", [-(-rows // 128), -(-cols // 128)]

    def layer(i):
        p = f"model.layers.{i}"
        yield p + ".input_layernorm.weight", "BF16", [hidden]
        yield from quantized(p + ".self_attn.q_a_proj", q_lora, hidden)
        yield p + ".self_attn.q_a_layernorm.weight", "BF16", [q_lora]
        yield from quantized(p + ".self_attn.q_b_proj", heads * (nope + rope), q_lora)
        yield from quantized(p + ".self_attn.kv_a_proj_with_mqa", kv_lora + rope, hidden)
        yield p + ".self_attn.kv_a_layernorm.weight", "BF16", [kv_lora]
        yield from quantized(p + ".self_attn.kv_b_proj", heads * (nope + v_dim), kv_lora)
        yield from quantized(p + ".self_attn.o_proj", hidden, heads * v_dim)
        yield p + ".post_attention_layernorm.weight", "BF16", [hidden]
        if i < dense_layers:
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
    if mtp:  # the multi-token-prediction layer: in the checkpoint, not loaded by the main model
        yield from layer(layers)


def mla_config(experts, heads, dense_layers, vocab, mtp):
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
        "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_nextn_predict_layers": int(mtp), "num_attention_heads": heads, "num_key_value_heads": heads,
        "n_shared_experts": 1, "n_routed_experts": experts, "num_experts_per_tok": 8, "first_k_dense_replace": dense_layers,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
        "vocab_size": vocab, "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    }


# DeepSeek-V3: 256 experts, 128 heads, 3 dense layers, 129,280 tokens, an MTP layer; Kimi-K2
# (its config.json): 384 experts, 64 heads, 1 dense layer, 163,840 tokens, no MTP layer.
BIG = {"DeepSeek-V3": (256, 128, 3, 129280, True), "Kimi-K2": (384, 64, 1, 163840, False)}
DTYPE_BYTES = {"F8_E4M3": 1, "BF16": 2, "F32": 4}


def big_sizes():
    """Rank 0 of 8's bytes by dtype and its region count, as the load format plans them."""
    out = {}
    for label, shape in BIG.items():
        tensors = list(mla_tensors(61, *shape))
        dtypes = {name: dtype for name, dtype, _ in tensors}
        shapes = {name: tuple(s) for name, _, s in tensors}
        by_dtype, regions = {}, 0
        for p in config_plan.plan(mla_config(*shape), shapes, 0, 8, False):
            for region in ([None] if p.regions is None else p.regions):
                s = shapes[p.name]
                n = int(np.prod([b - a for a, b in region] + list(s[len(region):]))) if region else int(np.prod(s))
                by_dtype[dtypes[p.name]] = by_dtype.get(dtypes[p.name], 0) + n * DTYPE_BYTES[dtypes[p.name]]
                regions += 1
        out[label] = {
            "rank_bytes": by_dtype, "regions": regions,
            "checkpoint_bytes": sum(int(np.prod(s)) * DTYPE_BYTES[dtypes[n]] for n, s in shapes.items()),
            "params": sum(int(np.prod(s)) for n, s in shapes.items() if not n.endswith("_scale_inv")),
        }
    return out


# --- the table ------------------------------------------------------------------------------

def gb(n):
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def cpu(seconds):
    """CPU seconds from /proc's clock ticks (10 ms): below one tick reads as such."""
    return f"{seconds:.2f}" if seconds >= 0.01 else "< 0.01"


def table(root, paths):
    truth = json.loads((root / "truth.json").read_text())
    rows = [json.loads(line) for path in paths for line in Path(path).read_text().splitlines() if line.strip()]
    out = ["| rank 0 of | changed | share (/regions) | deltas sent | fewer bytes | target | "
           "update cold | warm | /regions | cold vs /regions | warm vs /regions | server CPU cold / warm / /regions | store: rank / version |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["regions_sent"] / r["deltas_sent"]
        target = 20 if r["p"] == 0.02 else 50
        differ = truth["differ"][str(r["p"])] / truth["elements"]
        link = f" over {r['link']}" if r["link"] else ""
        store = f"{gb(r['store_rank'])} / {gb(r['store_version'])}" if "store_version" in r else f"{gb(r['store_rank'])} / –"
        out.append(
            f"| TP={r['tp']}{link} | {r['p'] * 100:g}% ({differ * 100:.2f}% differ) | {gb(r['regions_sent'])} | "
            f"{gb(r['deltas_sent'])} | {ratio:.1f}x | ≥ {target}x {'PASS' if ratio >= target else 'MISS'} | "
            f"{r['cold_s']:.3f} s | {r['warm_s']:.3f} s | {r['regions_s']:.3f} s | "
            f"{r['regions_s'] / r['cold_s']:.2f}x | {r['regions_s'] / r['warm_s']:.2f}x | "
            f"{cpu(r['cold_cpu'])} / {cpu(r['warm_cpu'])} / {cpu(r['regions_cpu'])} s | {store} |")
    matches = [r["encoder_matches"] for r in rows if "encoder_matches" in r]
    out += ["", f"`refits.py encode` (the FP8 figures below) gave the server's deltas byte for byte on the "
            f"regions sampled (the largest, one cut by columns, the last: {sum(matches)} of {len(matches)} updates)."]
    return "\n".join(out), rows


def arithmetic(encoded, sizes):
    """Markdown: the format's bytes per changed element, and what a rank of DeepSeek-V3 and
    Kimi-K2 at TP=8 would fetch per update at each p with them, against its share."""
    out = ["The format on one 7168 x 2048 weight (14.7 M elements), `refits.py encode`: bytes per changed",
           "element, header included, and what zstd makes of the XOR of the two versions (ModelExpress's",
           "layout) at the same level.", "",
           "| weight | changed | delta / changed element | fewer bytes than the weight | XOR + zstd / changed element |",
           "|---|---|---|---|---|"]
    for key, e in encoded.items():
        kind, p = key.split()
        out.append(f"| {kind} | {float(p) * 100:g}% | {e['per_changed']:.2f} B | {e['region'] / e['bytes']:.1f}x | "
                   f"{e['xor_zstd_per_changed']:.2f} B |")
    out += ["", "Rank 0 of 8 (the load format's plan; F32 block scales counted whole, 52 bytes of header and CRC",
            "a region):", "",
            "| model | params | rank's share | regions | update at 2% | fewer | update at 0.5% | fewer |",
            "|---|---|---|---|---|---|---|---|"]
    for label, m in sizes.items():
        share = sum(m["rank_bytes"].values())
        row = [label, f"{m['params'] / 1e9:,.0f} B", gb(share), f"{m['regions']:,}"]
        for p in VERSIONS:
            fp8 = m["rank_bytes"].get("F8_E4M3", 0) * p * encoded[f"fp8 {p}"]["per_changed"]
            bf = m["rank_bytes"].get("BF16", 0) / 2 * p * encoded[f"bf16 {p}"]["per_changed"]
            update = fp8 + bf + m["rank_bytes"].get("F32", 0) + 52 * m["regions"]
            row += [gb(update), f"{share / update:.0f}x"]
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out)


def main():
    command = sys.argv[1]
    if command == "generate":
        generate(Path(sys.argv[2]))
    elif command == "measure":
        root, url, pid, tp, store = sys.argv[2:7]
        measure(Path(root), url, int(pid), int(tp), store, int(os.environ.get("BENCH_ROUNDS", "2")))
    elif command == "encode":
        print(json.dumps(encode_stats(int(os.environ.get("BENCH_ZSTD_LEVEL", "3")))))
    elif command == "sizes":
        print(json.dumps(big_sizes()))
    elif command == "arithmetic":
        print(arithmetic(json.loads(Path(sys.argv[2]).read_text()), json.loads(Path(sys.argv[3]).read_text())))
    elif command == "table":
        print(table(Path(sys.argv[2]), sys.argv[3:])[0])


if __name__ == "__main__":
    main()
