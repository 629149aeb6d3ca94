"""Read every model through ztserve's S3-compatible endpoint with the loaders GPU workers run.

    s3_loaders.py check PLAN.json   (the client venv: boto3, s3fs, runai-model-streamer(-s3),
                                     safetensors, torch)

PLAN.json (written by tests/it/s3_endpoint.rs) names the endpoint, the bucket, every key the
bucket must list, and for each model its view's files and, for each tensor, a .bin of the bytes
the official reader returned from the local file. Each loader reads each model unchanged and
every tensor is compared with its .bin:
  - the Run:ai streamer (`list_safetensors`, then `SafetensorsStreamer.stream_files`), set up
    as vLLM's `runai_streamer` load format sets it up for an S3-compatible store (a model with a
    dtype it has no torch type for must be refused with its own error);
  - the Run:ai streamer's `pull_files`, as vLLM fetches a repository's config and tokenizer:
    the files beside each model, byte for byte;
  - boto3: the listing, paginated 250 keys a page, must be exactly the expected keys; every
    view file's HEAD and a ranged GET;
  - s3fs: open each view file, read the header, seek to each tensor and read it;
  - `safetensors.safe_open` on each view file downloaded with curl, and
    `safetensors.torch.load` of its bytes.
Prints a JSON summary of what was compared; any difference raises.
"""

import json
import os
import subprocess
import sys
import tempfile


def expected_bytes(model):
    out = {}
    for name, path in model["tensors"].items():
        with open(path, "rb") as f:
            out[name] = f.read()
    return out


def tensor_bytes(tensor):
    import torch

    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def header_of(s3, bucket, key):
    import struct

    (length,) = struct.unpack("<Q", s3.get_object(Bucket=bucket, Key=key, Range="bytes=0-7")["Body"].read())
    text = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=8-{8 + length - 1}")["Body"].read()
    return {name: info for name, info in json.loads(text).items() if name != "__metadata__"}


def run_ai(plan, counts, refused):
    import boto3
    from botocore.config import Config
    from runai_model_streamer import SafetensorsStreamer, list_safetensors
    from runai_model_streamer.safetensors_streamer.safetensors_pytorch import safetensors_to_torch_dtype

    s3 = boto3.client("s3", config=Config(s3={"addressing_style": "path"}))
    for model_id, model in plan["models"].items():
        expected = expected_bytes(model)
        files = sorted(list_safetensors(f"s3://{plan['bucket']}/{model_id}"))
        wanted = sorted(f"s3://{plan['bucket']}/{model_id}/{name}" for name in model["files"] if name.endswith(".safetensors"))
        assert files == wanted, f"{model_id}: list_safetensors gave {files}, not {wanted}"
        dtypes = {}
        for path in files:
            dtypes.update({name: info["dtype"] for name, info in header_of(s3, plan["bucket"], path.split("/", 3)[3]).items()})
        # The streamer refuses a whole file holding a dtype it has no torch type for (F8_*FNUZ,
        # F4, F6), whatever tensors are asked for: such a model must be refused with that error.
        unreadable = sorted({dtype for dtype in dtypes.values() if dtype not in safetensors_to_torch_dtype})
        if unreadable:
            with SafetensorsStreamer() as streamer:
                try:
                    streamer.stream_files(files)
                    list(streamer.get_tensors())
                    raise AssertionError(f"{model_id}: the streamer read {unreadable} tensors")
                except ValueError as e:
                    assert "Unsupported dtype" in str(e), e
            refused.append({"model": model_id, "dtypes": unreadable, "tensors": len(dtypes)})
            continue
        seen = set()
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(files)
            for name, tensor in streamer.get_tensors():
                assert name in expected, f"{model_id}: the streamer gave {name!r}, which the model has not"
                assert tensor_bytes(tensor) == expected[name], f"{model_id}/{name}: bytes differ (Run:ai)"
                seen.add(name)
        assert seen == set(expected), f"{model_id}: the streamer missed {sorted(set(expected) - seen)}"
        counts["runai"] += len(seen)


# What vLLM's Run:ai path leaves out when it pulls a model's files from S3 (it fetches every
# other key below the model's prefix).
VLLM_WEIGHT_PATTERNS = ["*.pt", "*.safetensors", "*.bin", "*.tensors", "*.pth"]


def pulled(plan, counts):
    """The files beside each model, fetched as vLLM fetches a repository's config and tokenizer:
    every key below the model's prefix but the weights, so no second copy of them (a stored .zt)."""
    import fnmatch
    import urllib.request

    from runai_model_streamer import pull_files

    for model_id, files in plan["companions"].items():
        prefix = model_id + "/"
        wanted = sorted(
            k[len(prefix):] for k in plan["keys"]
            if k.startswith(prefix) and not any(fnmatch.fnmatch(k, p) for p in VLLM_WEIGHT_PATTERNS)
        )
        with tempfile.TemporaryDirectory() as dst:
            pull_files(f"s3://{plan['bucket']}/{model_id}", dst, ignore_pattern=VLLM_WEIGHT_PATTERNS)
            got = sorted(os.path.relpath(os.path.join(root, f), dst) for root, _, names in os.walk(dst) for f in names)
            assert got == wanted, f"{model_id}: pull_files gave {got}, not {wanted}"
            assert set(files) <= set(got), f"{model_id}: pull_files missed {sorted(set(files) - set(got))}"
            assert not [n for n in got if n.endswith(".zt")], f"{model_id}: a stored .zt was pulled: {got}"
            for name in got:
                with open(os.path.join(dst, name), "rb") as a:
                    pulled_bytes = a.read()
                if name in files:
                    with open(files[name], "rb") as b:
                        assert pulled_bytes == b.read(), f"{model_id}/{name} differs"
                else:
                    with urllib.request.urlopen(f"{plan['http']}/models/{model_id}/{name}") as r:
                        assert pulled_bytes == r.read(), f"{model_id}/{name} differs from its HTTP route"
                counts["pulled"] += 1


def boto(plan, counts):
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=plan["endpoint"], config=Config(s3={"addressing_style": "path"}))
    # 250 keys a page: the corpus's 600 small models page the listing.
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=plan["bucket"], PaginationConfig={"PageSize": 250})
    keys, page_count = [], 0
    for page in pages:
        page_count += 1
        keys.extend(item["Key"] for item in page.get("Contents", []))
    assert keys == plan["keys"], f"boto3 listed {len(keys)} keys, not the {len(plan['keys'])} expected"
    assert page_count >= 2, "the listing was not paginated"
    counts["listed"], counts["pages"] = len(keys), page_count
    for model_id in plan["models"]:
        for name in plan["models"][model_id]["files"]:
            key = f"{model_id}/{name}"
            head = s3.head_object(Bucket=plan["bucket"], Key=key)
            whole = s3.get_object(Bucket=plan["bucket"], Key=key)["Body"].read()
            assert head["ContentLength"] == len(whole), key
            last = len(whole) - 1
            part = s3.get_object(Bucket=plan["bucket"], Key=key, Range=f"bytes={last // 3}-{last}")
            assert part["Body"].read() == whole[last // 3 :], f"{key}: a ranged GET differs"
            assert part["ETag"] == head["ETag"], key
            counts["boto3"] += 1


def fsspec(plan, counts):
    import struct

    import s3fs

    fs = s3fs.S3FileSystem(anon=True, client_kwargs={"endpoint_url": plan["endpoint"]}, use_listings_cache=False)
    for model_id, model in plan["models"].items():
        expected = expected_bytes(model)
        for name in model["files"]:
            if not name.endswith(".safetensors"):
                continue
            with fs.open(f"{plan['bucket']}/{model_id}/{name}", "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length))
                start = 8 + length
                for tensor, info in header.items():
                    if tensor == "__metadata__":
                        continue
                    begin, end = info["data_offsets"]
                    f.seek(start + begin)
                    assert f.read(end - begin) == expected[tensor], f"{model_id}/{tensor}: bytes differ (s3fs)"
                    counts["s3fs"] += 1


def safetensors_readers(plan, counts, refused):
    import struct

    from safetensors import safe_open
    from safetensors.torch import _TYPES, load

    with tempfile.TemporaryDirectory() as tmp:
        for model_id, model in plan["models"].items():
            expected = expected_bytes(model)
            for name in model["files"]:
                if not name.endswith(".safetensors"):
                    continue
                path = os.path.join(tmp, "view.safetensors")
                url = f"{plan['http']}/models/{model_id}/{name}"
                subprocess.run(["curl", "-sSf", "-o", path, url], check=True)
                with safe_open(path, framework="pt") as f:
                    for tensor in f.keys():
                        assert tensor_bytes(f.get_tensor(tensor)) == expected[tensor], f"{model_id}/{tensor} (safe_open)"
                        counts["safe_open"] += 1
                with open(path, "rb") as f:
                    data = f.read()
                # `safetensors.torch.load` knows fewer dtypes than `safe_open` (no F8_E8M0 in
                # 0.8.0): a file holding one must be refused with that dtype named.
                (length,) = struct.unpack("<Q", data[:8])
                header = json.loads(data[8 : 8 + length])
                dtypes = {info["dtype"] for tensor, info in header.items() if tensor != "__metadata__"}
                lacking = sorted(dtypes - set(_TYPES))
                if lacking:
                    try:
                        load(data)
                        raise AssertionError(f"{model_id}/{name}: safetensors.torch.load read {lacking}")
                    except KeyError as e:
                        assert str(e).strip("'") in lacking, e
                    refused.append({"model": model_id, "file": name, "dtypes": lacking, "tensors": len(header) - ("__metadata__" in header)})
                    continue
                for tensor, value in load(data).items():
                    assert tensor_bytes(value) == expected[tensor], f"{model_id}/{tensor} (safetensors.torch.load)"
                    counts["torch_load"] += 1


def check(plan_path):
    with open(plan_path) as f:
        plan = json.load(f)
    # As vLLM's runai_streamer load format is set up for an S3-compatible store.
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": plan["endpoint"],
            "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_ACCESS_KEY_ID": "any",
            "AWS_SECRET_ACCESS_KEY": "any",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    counts = {"runai": 0, "boto3": 0, "s3fs": 0, "safe_open": 0, "torch_load": 0, "pulled": 0}
    refused = []
    run_ai(plan, counts, refused)
    pulled(plan, counts)
    boto(plan, counts)
    fsspec(plan, counts)
    torch_refused = []
    safetensors_readers(plan, counts, torch_refused)
    counts["torch_load_refused"] = torch_refused
    counts["runai_refused"] = refused
    print(json.dumps(counts))


if __name__ == "__main__":
    {"check": check}[sys.argv[1]](sys.argv[2])
