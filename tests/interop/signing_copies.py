"""Copies of signed models taken back out of ztserve, verified with model_signing.

Usage: signing_copies.py HUB_ENDPOINT S3_ENDPOINT WORKDIR PUBLIC_KEY CA_FILE

Downloads Hub repositories with huggingface_hub's snapshot_download (as `hf download
--local-dir` does) and models' prefixes of the stored bucket with boto3 and with `aws s3 sync`,
then runs `model_signing verify` on each copy: by key, or by certificate for the
certificate-signed model. Prints one JSON object, each copy's verdict.
"""

import json
import os
import pathlib
import subprocess
import sys

hub, s3_endpoint, work, public_key, ca_file = sys.argv[1:6]
os.environ["HF_ENDPOINT"] = hub
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_HOME"] = os.path.join(work, "hf-home")

import boto3  # noqa: E402
from botocore import UNSIGNED  # noqa: E402
from botocore.config import Config  # noqa: E402
from huggingface_hub import snapshot_download  # noqa: E402

tool = str(pathlib.Path(sys.executable).parent / "model_signing")


def verify(directory, how):
    """model_signing verify on `directory`; `how` is ("key", PEM) or ("certificate", CA)."""
    directory = pathlib.Path(directory)
    args = [tool, "verify", how[0], "--signature", str(directory / "model.sig")]
    args += ["--public_key", how[1]] if how[0] == "key" else ["--certificate_chain", how[1]]
    # Where `hf download --local-dir` keeps its own state: not the model's.
    if (directory / ".cache").exists():
        args += ["--ignore-paths", str(directory / ".cache")]
    done = subprocess.run(args + [str(directory)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"model_signing verify {directory} failed:\n{done.stdout}\n{done.stderr}")
    return "verified"


verdicts = {}
for repo in ["local/key-sharded", "local/gguf"]:
    target = os.path.join(work, "hub", repo)
    snapshot_download(repo_id=repo, local_dir=target)
    verdicts[f"hub:{repo}"] = verify(target, ("key", public_key))

s3 = boto3.client(
    "s3",
    endpoint_url=s3_endpoint,
    region_name="us-east-1",
    config=Config(signature_version=UNSIGNED),
)
# A key-signed model's prefix with boto3.
prefix = "key-sharded"
target = pathlib.Path(work, "s3", prefix)
pages = s3.get_paginator("list_objects_v2").paginate(Bucket="models-stored", Prefix=prefix + "/")
for page in pages:
    for item in page.get("Contents", []):
        destination = target / item["Key"][len(prefix) + 1 :]
        destination.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file("models-stored", item["Key"], str(destination))
verdicts[f"s3:{prefix}"] = verify(target, ("key", public_key))

# A certificate-signed model's prefix with `aws s3 sync` (Debian's CLI, by path: a pip-installed
# `aws` may come first on PATH).
prefix = "cert-zt/dense"
target = pathlib.Path(work, "s3", prefix)
sync = ["/usr/bin/aws", "--endpoint-url", s3_endpoint, "--region", "us-east-1", "--no-sign-request"]
sync += ["s3", "sync", f"s3://models-stored/{prefix}/", str(target)]
done = subprocess.run(sync, capture_output=True, text=True)
if done.returncode != 0:
    raise SystemExit(f"aws s3 sync failed:\n{done.stdout}\n{done.stderr}")
verdicts[f"s3:{prefix}"] = verify(target, ("certificate", ca_file))

print(json.dumps(verdicts))
