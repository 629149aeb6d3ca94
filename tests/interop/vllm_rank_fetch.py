"""One tensor-parallel rank's fetch of its share, without vLLM, in alternating rounds on one
server (bench/engines runs it beside the engines): the loopback's ceiling for as many bytes of
the stored files (4 bare sockets reading into memory touched before, nothing parsed past the
head, nothing checked), the share as one
ranged GET per region (`?slice=`, how the load format fetched until the regions route), and the
share as the load format fetches it now (`Snapshot.stream`: many regions a request, each
checked against its CRC32C, into buffers fresh at each fetch as a load's are). Each way's time,
rate, and the server's CPU seconds per GB sent (from its /proc stat)."""

import json
import mmap
import os
import socket
import statistics
import threading
import time
import urllib.parse

import numpy as np
from bare_range import get_range_into
from ztserve_client import Client
from ztserve_client._client import _region_share
from ztserve_vllm import config_plan


def share(client, model, tp, rank=0):
    """Rank `rank` of `tp`'s share of `model` as the load format plans it from the model's config:
    `(name, region or None)` of every region it fetches."""
    manifest = client.manifest(model)
    config = json.loads(client.file(model, "config.json"))
    tensors = {o["name"]: tuple(o["shape"]) for o in manifest["objects"]}
    plans = config_plan.plan(config, tensors, rank, tp, False)
    return [(p.name, region) for p in plans for region in ([None] if p.regions is None else p.regions)]


def cpu_seconds(pid):
    """User and system CPU seconds process `pid` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def file_ranges(files, length):
    """`(name, start, end)` ranges of the stored `files` (from their starts) that make `length` bytes."""
    ranges, left = [], length
    for name, size in files:
        if left > 0 and size > 0:
            ranges.append((name, 0, min(size, left)))
            left -= min(size, left)
    return ranges


def file_path(model, name):
    return f"/models/{urllib.parse.quote(model, safe='')}/files/{urllib.parse.quote(name, safe='')}"


def touched(length):
    """Memory of `length` bytes, every page already touched."""
    buffer = np.frombuffer(mmap.mmap(-1, max(length, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.uint8)[:length]
    buffer[:] = 0
    return buffer


def bare_sockets(url, model, ranges, buffer, connections=4):
    """`ranges` of the model's stored files over `connections` plain sockets, each part read
    straight into its place in `buffer`, nothing parsed past the head."""
    parsed = urllib.parse.urlsplit(url)
    step = -(-sum(e - s for _, s, e in ranges) // connections)
    jobs, at = [], 0
    for name, start, end in ranges:
        for piece in range(start, end, step):
            stop = min(piece + step, end)
            jobs.append((name, piece, stop, at))
            at += stop - piece

    def fetch(batch):
        with socket.create_connection((parsed.hostname, parsed.port)) as sock:
            for name, start, end, into in batch:
                get_range_into(sock, parsed.netloc, file_path(model, name), start, memoryview(buffer)[into:into + end - start])

    threads = [threading.Thread(target=fetch, args=(jobs[i::connections],)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def rows(url, server_pid, model, tp, rounds, label):
    """Markdown rows: each way's median time, rate, ratio to the ceiling and the server's CPU
    per GB, for rank 0 of `tp` of `model`."""
    client = Client(url)
    snapshot = client.snapshot(model)
    requests = share(client, model, tp)
    objects = [_region_share(snapshot.objects[name], region) for name, region in requests]
    nbytes = sum(o["components"][0]["decoded_length"] for o in objects)
    ranges = file_ranges([(f["name"], f["size"]) for f in snapshot.manifest["files"]], nbytes)
    buffer = touched(nbytes)

    def per_region_gets():
        client._fetch(model, objects, False, snapshot.version)

    def regions():
        for pieces in snapshot.stream(requests, framework="numpy", pieces=True, concurrency=4):
            for _, piece in pieces:
                piece.result()

    ways = [
        ("ceiling: 4 bare sockets into memory touched before, nothing checked",
         lambda: bare_sockets(url, model, ranges, buffer)),
        ("one ranged GET per region (`?slice=`), as the load format fetched before", per_region_gets),
        ("`Snapshot.stream`: regions many to a request, each checked (CRC32C)", regions),
    ]
    times = {name: [] for name, _ in ways}
    cpu = {name: [] for name, _ in ways}
    for _ in range(rounds):
        for name, fn in ways:
            before, started = cpu_seconds(server_pid), time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
            cpu[name].append((cpu_seconds(server_pid) - before) / (nbytes / 1e9))
    ceiling = statistics.median(times[ways[0][0]])
    out = []
    for name, _ in ways:
        t = statistics.median(times[name])
        out.append(f"| {label}, rank 0 of {tp}: {nbytes / 1e6:,.0f} MB | {name} | {t:.3f} s | {nbytes / t / 1e9:.2f} GB/s | "
                   f"{ceiling / t:.2f}x | {statistics.median(cpu[name]):.2f} s/GB |")
    return out
