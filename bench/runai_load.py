"""Times the Run:ai model streamer loading one safetensors file from two S3-compatible servers,
alternating, in one process (so torch's import and the library's start are paid once).

usage: runai_load.py ROUNDS BASELINE_ENDPOINT BASELINE_URL ZTSERVE_ENDPOINT ZTSERVE_URL

Each load streams every tensor of the file into CPU memory (as vLLM's `runai_streamer` load
format does before moving them to the GPU), checks the bytes add up to the file's tensors, and
is timed to its last tensor. After a warm-up load from each, ROUNDS alternating rounds; prints
"runai times BASELINE_MEDIAN_S ZTSERVE_MEDIAN_S" and "runai size BYTES".
"""
import os
import statistics
import sys
import time

os.environ.setdefault("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "0")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
os.environ.setdefault("RUNAI_STREAMER_LOG_LEVEL", "WARNING")

from runai_model_streamer import SafetensorsStreamer  # noqa: E402
from runai_model_streamer.s3_utils.s3_utils import S3Credentials  # noqa: E402


def load(endpoint, url):
    credentials = S3Credentials(access_key_id="bench", secret_access_key="benchbench", region_name="us-east-1", endpoint=endpoint)
    started = time.perf_counter()
    total = 0
    with SafetensorsStreamer() as streamer:
        streamer.stream_file(url, s3_credentials=credentials)
        for _, tensor in streamer.get_tensors():
            total += tensor.numel() * tensor.element_size()
    return time.perf_counter() - started, total


def main():
    rounds = int(sys.argv[1])
    sides = [(sys.argv[2], sys.argv[3]), (sys.argv[4], sys.argv[5])]
    sizes = {load(*side)[1] for side in sides}
    assert len(sizes) == 1, f"the two servers gave different sizes: {sizes}"
    timings = [[], []]
    for _ in range(rounds):
        for i, side in enumerate(sides):
            seconds, total = load(*side)
            assert total in sizes
            timings[i].append(seconds)
    print(f"runai times {statistics.median(timings[0])} {statistics.median(timings[1])}")
    print(f"runai size {sizes.pop()}")


main()
