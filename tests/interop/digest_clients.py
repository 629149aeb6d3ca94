"""Ask a large model's digests from a server that has just started, as real clients do, with
their default timeouts and retries.

    digest_clients.py hub ENDPOINT REPO    (any huggingface_hub venv) the metadata pass of
        `snapshot_download` with 8 workers: where the release has it, `snapshot_download`
        itself with `dry_run=True` (the recursive tree, then a HEAD per file); then every
        file's metadata (`get_hf_file_metadata`, a HEAD each, with the retries
        `hf_hub_download` makes) with 8 workers, and the recursive tree
    digest_clients.py oci REGISTRY REPO    (oras venv) the manifest at `latest`, as oras-py's
        pull asks it

Prints one JSON line: each file's SHA-256 as every answer gave it (HEAD ETag, tree LFS oid,
OCI layer digest), and the exceptions raised (a timeout counts). Nothing is downloaded.
"""

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor


def hub(endpoint, repo):
    os.environ["HF_ENDPOINT"] = endpoint
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ.pop("HF_TOKEN", None)
    import inspect
    import tempfile

    import huggingface_hub
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url, snapshot_download

    api = HfApi(endpoint=endpoint)
    errors = []
    dry_run = "dry_run" in inspect.signature(snapshot_download).parameters
    if dry_run:
        with tempfile.TemporaryDirectory() as cache:
            try:
                planned = snapshot_download(repo, cache_dir=cache, dry_run=True, max_workers=8)
                files = [f.filename for f in planned]
            except Exception as e:
                errors.append(f"snapshot_download(dry_run=True): {type(e).__name__}: {e}")
                files = [s.rfilename for s in api.model_info(repo).siblings]
    else:
        files = [s.rfilename for s in api.model_info(repo).siblings]
    # hf_hub_download asks again with retries when its first HEAD fails for a reason worth
    # retrying (2.x); 0.36 retries every HEAD.
    retrying = {"retry_on_errors": True} if "retry_on_errors" in inspect.signature(get_hf_file_metadata).parameters else {}

    def head(name):
        try:
            meta = get_hf_file_metadata(hf_hub_url(repo, name, endpoint=endpoint), **retrying)
            return name, {"etag": meta.etag, "size": meta.size}
        except Exception as e:  # a ReadTimeout or an HTTP error: the test fails on any
            errors.append(f"HEAD {name}: {type(e).__name__}: {e}")
            return name, None

    with ThreadPoolExecutor(8) as pool:
        heads = dict(pool.map(head, files))
    tree = {}
    try:
        for entry in api.list_repo_tree(repo, recursive=True):
            if getattr(entry, "lfs", None) is not None:
                tree[entry.path] = {"sha256": entry.lfs.sha256, "size": entry.size}
    except Exception as e:
        errors.append(f"tree: {type(e).__name__}: {e}")
    return {
        "version": huggingface_hub.__version__,
        "dry_run": dry_run,
        "files": files,
        "heads": heads,
        "tree": tree,
        "errors": errors,
    }


def oci(registry, repo):
    import oras.provider

    client = oras.provider.Registry(hostname=registry, insecure=True)
    errors, layers = [], {}
    try:
        manifest = client.get_manifest(f"{registry}/{repo}:latest")
        for layer in manifest["layers"]:
            title = layer["annotations"]["org.opencontainers.image.title"]
            layers[title] = {"digest": layer["digest"], "size": layer["size"]}
    except Exception as e:
        errors.append(f"manifest: {type(e).__name__}: {e}")
    return {"layers": layers, "errors": errors}


def main():
    mode, address, repo = sys.argv[1:4]
    print(json.dumps(hub(address, repo) if mode == "hub" else oci(address, repo)))


if __name__ == "__main__":
    main()
