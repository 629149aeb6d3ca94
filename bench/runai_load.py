"""Times the Run:ai model streamer loading one model (every .safetensors file under an S3
prefix) from two S3-compatible servers, alternating, in one process (so torch's import and the
library's start are paid once).

usage: runai_load.py ROUNDS BASELINE_ENDPOINT ZTSERVE_ENDPOINT S3_PREFIX

Each load lists the prefix's safetensors files as vLLM does (`list_safetensors`), streams
every tensor into CPU memory (as vLLM's `runai_streamer` load format does before moving them
to the GPU), and is timed from the listing to its last tensor; both servers must list the same
files and give the same bytes. After a warm-up load from each, ROUNDS alternating rounds;
prints "runai times BASELINE_MEDIAN_S ZTSERVE_MEDIAN_S" and "runai size BYTES".
"""
import hashlib
import os
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


def load(endpoint, prefix, check=False):
    credentials = S3Credentials(access_key_id="bench", secret_access_key="benchbench", region_name="us-east-1", endpoint=endpoint)
    os.environ["AWS_ENDPOINT_URL"] = endpoint  # the listing's boto3 client takes it from here
    started = time.perf_counter()
    files = sorted(list_safetensors(prefix, credentials))
    total, digests = 0, {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_files(files, s3_credentials=credentials)
        for name, tensor in streamer.get_tensors():
            total += tensor.numel() * tensor.element_size()
            if check:  # tensors arrive in whatever order their chunks complete
                data = tensor.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes()
                digests[name] = hashlib.sha256(data).hexdigest()
    return time.perf_counter() - started, (len(files), total, digests)


def main():
    rounds, baseline, ztserve, prefix = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    # Warm-up loads, checked: the same files, tensors and bytes from both servers.
    warm = [load(endpoint, prefix, check=True)[1] for endpoint in (baseline, ztserve)]
    assert warm[0] == warm[1], f"the two servers gave different models: {warm}"
    timings = [[], []]
    for _ in range(rounds):
        for i, endpoint in enumerate((baseline, ztserve)):
            seconds, (files, total, _) = load(endpoint, prefix)
            assert (files, total) == warm[0][:2]
            timings[i].append(seconds)
    print(f"runai times {statistics.median(timings[0])} {statistics.median(timings[1])}")
    print(f"runai size {warm[0][1]}")


main()
