"""Times bench/clients' comparisons in alternating rounds; prints a Markdown table."""

import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from importlib.metadata import version
from pathlib import Path

import numpy as np
import ztensor

from ztserve_client import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "interop"))
from bare_range import get_range_into  # noqa: E402

url, work, binary, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
GIB = 1 << 30


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def official_read(path):
    reader = ztensor.Reader(path)
    arrays = reader.read_numpy(reader.keys(), copy=True)
    assert sum(a.nbytes for a in arrays.values()) == GIB


def client_load(model):
    arrays = Client(url).load(model)
    assert sum(a.nbytes for a in arrays.values()) == GIB


def bare_sockets(file_url, length, connections=8):
    """What any Python client could reach over this loopback: `connections` plain sockets, one
    ranged GET of the stored file each, read with recv_into into fresh numpy memory, with no
    HTTP parsing past the header's end and no digest check."""
    parsed = urllib.parse.urlsplit(file_url)
    step = -(-length // connections)
    buffers = [np.empty(min(step, length - start), np.uint8) for start in range(0, length, step)]

    def fetch(start, buffer):
        with socket.create_connection((parsed.hostname, parsed.port)) as sock:
            get_range_into(sock, parsed.netloc, parsed.path, start, memoryview(buffer))

    threads = [threading.Thread(target=fetch, args=(i * step, b)) for i, b in enumerate(buffers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(len(b) for b in buffers) == length


def parallel_curl(file_url, length, connections=2):
    """The loopback with no memory to fill: `connections` curls, one ranged GET each, to /dev/null."""
    step = -(-length // connections)
    curls = [subprocess.Popen(["curl", "-sf", "-o", "/dev/null", "-r", f"{start}-{min(start + step, length) - 1}", file_url])
             for start in range(0, length, step)]
    assert all(c.wait() == 0 for c in curls)


def run(*command):
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def check_once(model):
    """Before timing: the client's arrays equal the official reader's, and pulled files read back equal."""
    ours, theirs = Client(url).load(model), ztensor.Reader(f"{work}/models/{model}.zt")
    for name, array in ours.items():
        assert np.array_equal(array, theirs.read_numpy(name)), name
    run(binary, "pull", "--progress", "none", f"{url}/models/{model}", f"{work}/pulled.zt")
    pulled = ztensor.Reader(f"{work}/pulled.zt")
    for name in ours:
        assert np.array_equal(pulled.read_numpy(name), ours[name]), name
    run("curl", "-sf", "-o", f"{work}/curl.zt", f"{url}/models/{model}/file")
    assert open(f"{work}/curl.zt", "rb").read() == open(f"{work}/models/{model}.zt", "rb").read()


scenarios = []
for checksum in ["crc32c", "sha256"]:
    model = f"gib-{checksum}"
    path = f"{work}/models/{model}.zt"
    check_once(model)
    official = ("ztensor 1.2.3 reading the local file", lambda p=path: official_read(p))
    scenarios.append((
        f"load a 1 GiB model ({checksum} digests) into numpy",
        official,
        ("Python client over loopback", lambda m=model: client_load(m)),
        0.8,
    ))
    if checksum == "crc32c":
        file_url = f"{url}/models/{model}/file"
        length = os.path.getsize(path)
        scenarios.append(("ceiling: the loopback itself, no HTTP client, no digests", official,
                          ("2 parallel curls to /dev/null", lambda: parallel_curl(file_url, length)), None))
        scenarios.append(("ceiling: the loopback into fresh numpy memory, no HTTP client, no digests", official,
                          ("8 bare Python sockets", lambda: bare_sockets(file_url, length)), None))
        curl = ("curl -o of the stored file", lambda u=file_url: run("curl", "-sf", "-o", f"{work}/curl.zt", u))
        scenarios.append((f"copy the 1 GiB model ({checksum}) to local disk", curl,
                          ("ztserve pull (rebuilt)", lambda m=model: run(binary, "pull", "--progress", "none", f"{url}/models/{m}", f"{work}/pulled.zt")), 0.8))
        scenarios.append((f"copy the 1 GiB model ({checksum}) to local disk", curl,
                          ("ztserve pull --raw", lambda m=model: run(binary, "pull", "--raw", "--progress", "none", f"{url}/models/{m}", f"{work}/pulled.zt")), 0.8))

rows = []
for title, (base_name, base), (ours_name, ours), target in scenarios:
    base_times, our_times = [], []
    for _ in range(rounds):
        base_times.append(timed(base))
        our_times.append(timed(ours))
    b, o = statistics.median(base_times), statistics.median(our_times)
    ratio = b / o
    verdict = "(what the target would need)" if target is None else f"≥ {target}×: {'PASS' if ratio >= target else 'FAIL'}"
    rows.append(f"| {title} | {base_name}: {b:.3f} s ({GIB / b / 1e9:.2f} GB/s) | {ours_name}: {o:.3f} s ({GIB / o / 1e9:.2f} GB/s) | {ratio:.2f}× | {verdict} |")

print(f"# Benchmarks: the clients\n")
print(f"{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}; {os.cpu_count()} cores, {platform.platform()}; "
      f"ztensor {version('ztensor')}, numpy {np.__version__}, ztserve-client {version('ztserve-client')}, "
      f"{subprocess.run(['curl', '--version'], capture_output=True, text=True).stdout.split()[1]} curl\n")
print("| scenario | baseline | ours | ratio | target |")
print("|---|---|---|---|---|")
print("\n".join(rows))
print(f"""
Reproduce with `bench/clients`. Medians of {rounds} alternating rounds; ratio is the baseline's
time over ours (above 1, ours is faster). Before timing, the client's arrays are compared with
the official reader's, the pulled file is read back by ztensor 1.2.3, and curl's copy with the
stored file. Our clients verify every digest (the baselines verify none); `ztserve pull` also
fsyncs the file before renaming it into place (curl does not). Client, server and disk share
the machine's 2 cores; the page cache holds the models.

The two "ceiling" rows are not clients of ours: they measure what the loopback allows any
client on this machine, in the same run. When even bare sockets with no HTTP parsing and no
digest check stay under the target, no Python client that checks digests can reach it here.""")
