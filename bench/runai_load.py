"""Times the Run:ai model streamer loading one model (every .safetensors file under an S3
prefix) from ztserve's S3 endpoint and from a baseline, alternating, in one process (so torch's
import and the library's start are paid once).

usage: runai_load.py NAME ROUNDS BASELINE ZTSERVE_ENDPOINT S3_PREFIX

BASELINE is another S3-compatible server's endpoint (`http://…`, read at the same prefix) or a
local directory holding the same files. Each load lists the safetensors files as vLLM does
(`list_safetensors`), streams every tensor into CPU memory (as vLLM's `runai_streamer` load
format does before moving them to the GPU), and is timed from the listing to its last tensor;
both sides must list the same files and give the same bytes. After a warm-up load from each,
ROUNDS alternating rounds; prints "NAME times BASELINE_S ZTSERVE_S" (medians), "NAME cpu
BASELINE_S ZTSERVE_S" (the median CPU time of this process per load, every thread of the
streamer counted) and "NAME size BYTES". The streamer's settings come from the environment
(RUNAI_STREAMER_CONCURRENCY, RUNAI_STREAMER_CHUNK_BYTESIZE), the same for both sides.
"""
import hashlib
import os
import resource
import statistics
import sys
import time

os.environ.setdefault("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "0")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
os.environ.setdefault("RUNAI_STREAMER_LOG_LEVEL", "WARNING")
# Both servers take these (the listing's boto3 client reads them from the environment).
os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "benchbench", "AWS_DEFAULT_REGION": "us-east-1"})

from runai_model_streamer import SafetensorsStreamer, list_safetensors  # noqa: E402
from runai_model_streamer.s3_utils.s3_utils import S3Credentials  # noqa: E402


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def load(source, prefix, check=False):
    """Loads the model from `source` (an S3 endpoint, read at `prefix`, or a local directory):
    (seconds, CPU seconds, (files, bytes, digests))."""
    if source.startswith("http"):
        credentials = S3Credentials(access_key_id="bench", secret_access_key="benchbench", region_name="us-east-1", endpoint=source)
        os.environ["AWS_ENDPOINT_URL"] = source  # the listing's boto3 client takes it from here
        target = prefix
    else:
        credentials, target = None, source
    started, cpu = time.perf_counter(), cpu_seconds()
    files = sorted(list_safetensors(target, credentials) if credentials else list_safetensors(target))
    total, digests = 0, {}
    with SafetensorsStreamer() as streamer:
        if credentials:
            streamer.stream_files(files, s3_credentials=credentials)
        else:
            streamer.stream_files(files)
        for name, tensor in streamer.get_tensors():
            total += tensor.numel() * tensor.element_size()
            if check:  # tensors arrive in whatever order their chunks complete
                data = tensor.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes()
                digests[name] = hashlib.sha256(data).hexdigest()
    return time.perf_counter() - started, cpu_seconds() - cpu, (len(files), total, digests)


def main():
    name, rounds, baseline, ztserve, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    # Warm-up loads, checked: the same files, tensors and bytes from both sides.
    warm = [load(source, prefix, check=True)[2] for source in (baseline, ztserve)]
    assert warm[0][1:] == warm[1][1:], f"the two sides gave different models: {warm}"
    timings, cpus = [[], []], [[], []]
    for _ in range(rounds):
        for i, source in enumerate((baseline, ztserve)):
            seconds, cpu, (files, total, _) = load(source, prefix)
            assert (files, total) == warm[0][:2]
            timings[i].append(seconds)
            cpus[i].append(cpu)
    print(f"{name} times {statistics.median(timings[0])} {statistics.median(timings[1])}")
    print(f"{name} cpu {statistics.median(cpus[0])} {statistics.median(cpus[1])}")
    print(f"{name} size {warm[0][1]}")


main()
