"""Turns what bench/run recorded into the table of bench/results/latest.md.

usage: python3 report.py RESULTS VERSIONS ROUNDS SECONDS S3_SECONDS

RESULTS holds one line per measurement, as bench/run writes them:
  NAME times BASELINE_S ZTSERVE_S          hyperfine medians
  NAME runs B1,B2,... Z1,Z2,...             every hyperfine run, seconds
  NAME baseline|ztserve round=K requests=N bytes=N seconds=F p50_us=N p99_us=N errors=N
  NAME memory PEAK_RESIDENT PEAK_ANONYMOUS  bytes
  NAME size|frame N                         bytes
Every ratio is ztserve's throughput over the baseline's (above 1: ztserve is faster). A wrk
run with any error, or whose responses are not the size asked for, fails the report.
"""
import statistics
import sys
from collections import defaultdict

MIB = 1 << 20
GIB = 1 << 30

path, versions, rounds, seconds, s3_seconds = sys.argv[1:6]
times, every_time, memory, sizes = {}, {}, {}, {}
runs = defaultdict(lambda: defaultdict(list))
for line in open(path):
    name, kind, *rest = line.split()
    if kind == "times":
        times[name] = [float(x) for x in rest]
    elif kind == "runs":
        every_time[name] = [[float(x) for x in side.split(",")] for side in rest]
    elif kind == "cpu":
        times[f"{name}-cpu"] = [float(x) for x in rest]
    elif kind == "memory":
        memory[name] = [int(x) for x in rest]
    elif kind in ("size", "frame"):
        sizes[name] = int(rest[0])
    else:
        fields = dict(item.split("=") for item in rest)
        runs[name][kind].append({k: float(v) for k, v in fields.items()})


def wrk(name, side, payload):
    """Medians over the rounds of one side of a wrk comparison."""
    rounds_ = runs[name][side]
    for r in rounds_:
        if r["errors"]:
            sys.exit(f"bench: {name} ({side}): {int(r['errors'])} errors")
        each = r["bytes"] / r["requests"]
        # Headers ride along: ztserve's and nginx's are under 1 KiB, moto's over 2 KiB.
        if not payload <= each <= payload + 4096:
            sys.exit(f"bench: {name} ({side}): {each:.0f} bytes per response, expected {payload} and headers")
    rate = statistics.median(r["requests"] / r["seconds"] for r in rounds_)
    return {
        "rate": rate,
        "gbps": rate * payload / 1e9,
        "p50": statistics.median(r["p50_us"] for r in rounds_) / 1e3,
        "p99": statistics.median(r["p99_us"] for r in rounds_) / 1e3,
    }


NO_SPREAD = "—"


def spread_wrk(name):
    """The lowest and highest ratio of one round's ztserve rate over the baseline's round beside it."""
    ratios = [(o["requests"] / o["seconds"]) / (b["requests"] / b["seconds"])
              for b, o in zip(runs[name]["baseline"], runs[name]["ztserve"])]
    return f"{min(ratios):.2f}–{max(ratios):.2f}×"


def spread_times(name):
    """The lowest and highest ratio over every pair of one baseline run and one ztserve run."""
    base, ours = every_time[name]
    return f"{min(base) / max(ours):.2f}–{max(base) / min(ours):.2f}×"


def described(m, with_rate=True):
    rate = f"{m['rate']:,.0f} req/s, " if with_rate else ""
    return f"{rate}{m['gbps']:.2f} GB/s, p50 {m['p50']:.2f} ms, p99 {m['p99']:.2f} ms"


def verdict(ok, target):
    return f"{target}: {'PASS' if ok else 'MISS'}"


def mem(name):
    resident, anonymous = memory[name]
    return f"{resident // MIB} MiB ({anonymous // MIB} MiB anon)"


rows = []

base_s, ours_s = times["full"]
ratio = base_s / ours_s
rows.append(("1 GiB raw component, full GET, 1 connection", f"nginx: {GIB / base_s / 1e9:.2f} GB/s",
             f"{GIB / ours_s / 1e9:.2f} GB/s", ratio, spread_times("full"), verdict(ratio >= 1.0, "≥ 1.0×"), mem("full")))

for connections in (4, 16):
    name = f"ranges{connections}"
    b, o = wrk(name, "baseline", MIB), wrk(name, "ztserve", MIB)
    ratio = o["rate"] / b["rate"]
    target = verdict(ratio >= 1.0, "≥ 1.0×") if connections == 16 else "—"
    rows.append((f"random 1 MiB ranges of it, {connections} connections", "nginx: " + described(b),
                 described(o), ratio, spread_wrk(name), target, mem(name)))

size = sizes["manifest"]
b, o = wrk("manifest", "baseline", size), wrk("manifest", "ztserve", size)
ratio = o["rate"] / b["rate"]
ok = ratio >= 1.0 and o["p99"] <= b["p99"]
rows.append((f"manifest JSON of a 1,000-object model ({size // 1024} KiB), 32 connections",
             "nginx: " + described(b), described(o), ratio, spread_wrk("manifest"), verdict(ok, "≥ 1.0×, p99 no worse"), mem("manifest")))

base_s, ours_s = times["cold"]
ratio = base_s / ours_s
rows.append((f"256 MiB zstd component ({sizes['cold'] // MIB} MiB frame), cold full GET piped to wc -c",
             f"zstd -d: {256 * MIB / base_s / 1e9:.2f} GB/s", f"{256 * MIB / ours_s / 1e9:.2f} GB/s",
             ratio, spread_times("cold"), verdict(ratio >= 0.9, "≥ 0.9×"), mem("cold")))

b, o = wrk("warm", "baseline", MIB), wrk("warm", "ztserve", MIB)
ratio = o["rate"] / b["rate"]
rows.append(("random 1 MiB ranges of it, warm in the decode cache, 4 connections",
             "same bytes stored raw: " + described(b), described(o), ratio, spread_wrk("warm"), verdict(ratio >= 0.8, "≥ 0.8×"), mem("warm")))

base_s, ours_s = times["v2full"]
ratio = base_s / ours_s
rows.append(("v2: 1 GiB raw part (official writer), full GET, 1 connection", f"nginx: {GIB / base_s / 1e9:.2f} GB/s",
             f"{GIB / ours_s / 1e9:.2f} GB/s", ratio, spread_times("v2full"), verdict(ratio >= 1.0, "≥ 1.0×"), mem("v2full")))

zstd_s, ours_s = times["seekcold"]
ratio = zstd_s / ours_s
rows.append((f"v2: 256 MiB zt.zstd-seekable/1 part (1 MiB frames), cold full GET to /dev/null",
             f"zstd -d of one {sizes['seekcold'] // MIB} MiB frame: {256 * MIB / zstd_s / 1e9:.2f} GB/s",
             f"{256 * MIB / ours_s / 1e9:.2f} GB/s", ratio, spread_times("seekcold"), verdict(ratio >= 1.6, "≥ 1.6×"), mem("seekcold")))

# A random 1 MiB range spans two 1 MiB frames, each decoded whole: even with every core
# decoding at zstd's own rate and nothing else to do, the server answers at most this often.
cores = int(versions.split(" cores")[0].rsplit(" ", 1)[-1])
decode_bound = cores * (256 * MIB / zstd_s) / (2 * MIB)
for connections in (2, 4):
    name = f"seekranges{connections}"
    b, o = wrk(name, "baseline", MIB), wrk(name, "ztserve", MIB)
    ratio = o["rate"] / b["rate"]
    ceiling = decode_bound / b["rate"]
    rows.append((f"v2: random 1 MiB ranges of a 1 GiB seekable part, cold (decode cache off), {connections} connections",
                 "the raw part: " + described(b), described(o), ratio, spread_wrk(name),
                 verdict(ratio >= 0.3, "≥ 0.3×") + f" (decoding two frames per range on {cores} cores at zstd's rate"
                 f" bounds it at {ceiling:.2f}×)", mem(name)))

base_s, ours_s = times["stfull"]
ratio = base_s / ours_s
rows.append(("safetensors: 1 GiB tensor, full GET of the object vs the file, 1 connection",
             f"nginx: {GIB / base_s / 1e9:.2f} GB/s", f"{GIB / ours_s / 1e9:.2f} GB/s", ratio, spread_times("stfull"),
             verdict(ratio >= 1.0, "≥ 1.0×"), mem("stfull")))

b, o = wrk("stranges4", "baseline", MIB), wrk("stranges4", "ztserve", MIB)
ratio = o["rate"] / b["rate"]
rows.append(("safetensors: random 1 MiB ranges of the tensor, 4 connections", "nginx, the same ranges of the file: "
             + described(b), described(o), ratio, spread_wrk("stranges4"), verdict(ratio >= 1.0, "≥ 1.0×"), mem("stranges4")))

base_s, ours_s = times["viewfull"]
ratio = base_s / ours_s
view_size = sizes["viewfull"]
rows.append(("safetensors view (`/models/raw/model.safetensors`) of the 1 GiB raw model, full GET, 1 connection",
             f"nginx serving the same file: {view_size / base_s / 1e9:.2f} GB/s", f"{view_size / ours_s / 1e9:.2f} GB/s",
             ratio, spread_times("viewfull"), verdict(ratio >= 0.9, "≥ 0.9×"), mem("viewfull")))

base_s, ours_s = times["runai"]
ratio = base_s / ours_s
runai_size = sizes["runai"]
rows.append(("Run:ai streamer (concurrency 1) loading a 1 GiB model of 8 tensors into CPU memory through ztserve's S3 endpoint (local .zt)",
             f"s3s-fs over the same safetensors shards: {runai_size / base_s / 1e9:.2f} GB/s",
             f"{runai_size / ours_s / 1e9:.2f} GB/s", ratio, NO_SPREAD, verdict(ratio >= 1.0, "≥ 1.0×"), mem("runai")))

base_s, ours_s = times["runailocal"]
base_cpu, ours_cpu = times["runailocal-cpu"]
ratio = base_s / ours_s
runai_size = sizes["runailocal"]
rows.append(("Run:ai streamer (concurrency 2, 32 MiB chunks) loading the same model into CPU memory through ztserve's S3 endpoint",
             f"the streamer reading the same files from a local folder: {runai_size / base_s / 1e9:.2f} GB/s, "
             f"{base_cpu / runai_size * 1e9:.2f} CPU s/GB in the loader",
             f"{runai_size / ours_s / 1e9:.2f} GB/s, {ours_cpu / runai_size * 1e9:.2f} CPU s/GB in the loader", ratio, NO_SPREAD,
             verdict(ratio >= 0.9, "≥ 0.9×") + (" (the loader's own CPU per GB over S3 bounds it on 2 cores: docs/engines.md)"
                                               if ratio < 0.9 else ""), mem("runailocal")))

for dim, what in ((1, "columns (dimension 1, strided: 16,384 runs of 8 KiB per rank)"), (0, "rows (dimension 0)")):
    base_s, ours_s = times[f"tp{dim}"]
    ratio = base_s / ours_s
    wire = sizes[f"tp{dim}"]
    rows.append((f"tensor-parallel slices: 8 ranks at once, each its `?shard=R/8&dim={dim}` of a 1 GiB bf16 "
                 f"matrix [16384, 32768], {what}",
                 f"the same bytes as 8 contiguous ranges of it: {GIB / base_s / 1e9:.2f} GB/s",
                 f"{GIB / ours_s / 1e9:.2f} GB/s; {wire / GIB:.3f} GiB on the wire, {wire / (8 * GIB):.3f} of 8 whole loads",
                 ratio, spread_times(f"tp{dim}"), verdict(ratio >= 0.8 and wire == GIB, "≥ 0.8×, 1/8 of the bytes"), mem("tp1")))

for connections in (4, 16):
    name = f"s3ranges{connections}"
    b, o = wrk(name, "baseline", MIB), wrk(name, "ztserve", MIB)
    ratio = o["rate"] / b["rate"]
    rows.append((f"S3 (moto): random 1 MiB ranges of a 256 MiB raw component, {connections} connections",
                 "direct presigned GETs: " + described(b), described(o), ratio, spread_wrk(name), verdict(ratio >= 0.9, "≥ 0.9×"), mem(name)))

for cache, label in ((GIB, "1 GiB (default): one shared decode"), (64 * MIB, "64 MiB: 16 private decodes")):
    resident, anonymous = memory[f"s3rss{cache}"]
    limit = 256 * MIB + cache
    rows.append((f"S3 (moto): 16 concurrent full GETs of a 1 GiB zstd component, decode cache {label}",
                 f"limit 256 MiB + cache = {limit // MIB} MiB", f"peak RSS {resident // MIB} MiB",
                 resident / limit, NO_SPREAD, verdict(resident <= limit, "≤ limit"), mem(f"s3rss{cache}")))

print("# Benchmarks: ztserve beside the alternatives")
print()
print(versions)
print()
print("| scenario | baseline | ztserve | ratio | ratio's spread | target | ztserve peak memory |")
print("|---|---|---|---|---|---|---|")
for scenario, baseline, ours, ratio, spread, target, memory_ in rows:
    print(f"| {scenario} | {baseline} | {ours} | {ratio:.2f}× | {spread} | {target} | {memory_} |")
print(f"""
Reproduce with `bench/run`. Ratios are ztserve's throughput over the baseline's (above 1, ztserve
is faster); in the memory rows, the peak over the limit. A ratio's spread is the lowest and highest
ratio of one wrk round over the baseline's round beside it, or, for hyperfine rows, over every
pair of one baseline run and one ztserve run. Full GETs and the cold zstd row are
hyperfine medians of 10 runs (the cold row starts a fresh ztserve before each, untimed); wrk
rows are medians of {rounds} alternating rounds (the Run:ai row: medians of 3 alternating loads in one
Python process, after a checked warm-up load from each; at the streamer's default concurrency
s3s-fs, which hashes each whole object on every GET, fails every load) of {seconds} s ({s3_seconds} s for S3) with 2 threads, the
ranges drawn from the same fixed seeds on both sides. Every byte stream is checked against its source before
timing, and every wrk response for its size. Peak memory is of a fresh ztserve per scenario:
resident (VmHWM, which counts the pages of mapped model files, shared with the page cache) and
anonymous (sampled RssAnon: heap, decode cache, buffers). Client, servers and S3 server share
the machine's cores.""")
