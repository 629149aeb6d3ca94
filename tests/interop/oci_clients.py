"""Pull models from ztserve's OCI registry API (/v2) with the oras Python SDK, and as images
with KServe's storage downloader.

    oci_clients.py pull PLAN.json    (oras venv) pull every repository at `latest` and at its
        version tag into directories of their own, and compare them with the plan
    oci_clients.py kserve PLAN.json  (oras venv) download every repository's image
        (`oci://HOST/NAME:latest-image`) as a KServe storage initializer does, into
        OUT/kserve/NAME, and compare it with the plan
    oci_clients.py clients PLAN.json (oras venv) the plan's `clients` pulls at once, each of
        every repository at `latest` into OUT/CLIENT/NAME, each compared with the plan (pulls
        through a registry mirror or an HTTP cache)
    oci_clients.py denied PLAN.json  (oras venv) pull the plan's `denied` repository with the
        plan's token: the error oras raises

PLAN.json (written by tests/it/oci_registry.rs) names the registry (HOST:PORT), an output
directory, an optional token (then `oras login` first, with it as the password), and for each
repository its version tag, its files beside the model (a local copy of each) and each
tensor's bytes as the official reader returned them from the source file (a .bin). Each pulled
directory is compared as tests/interop/hub_clients.py compares a Hub snapshot: every tensor of
every safetensors file with its .bin, every file beside the model with its copy. Prints a JSON
summary; any difference raises.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hub_clients import check_snapshot  # noqa: E402


def client(plan):
    import oras.client

    registry = oras.client.OrasClient(hostname=plan["registry"], insecure=True)
    if plan.get("token"):
        # The credentials oras keeps go to a file of the test's, not the user's ~/.docker.
        os.makedirs(plan["out"], exist_ok=True)
        config = os.path.join(plan["out"], "docker-config.json")
        registry.login(username="ztserve", password=plan["token"], hostname=plan["registry"], config_path=config)
    return registry


def pull(plan):
    registry = client(plan)
    summary = {"repos": 0, "tensors": 0, "files": 0, "pulls": 0}
    for name, repo in plan["repos"].items():
        for tag in ["latest", repo["version"]]:
            outdir = os.path.join(plan["out"], tag, name)
            pulled = registry.pull(target=f"{plan['registry']}/{name}:{tag}", outdir=outdir)
            assert pulled, f"{name}:{tag}: nothing pulled"
            tensors, files = check_snapshot(name, repo, outdir)
            summary["pulls"] += 1
        summary["repos"] += 1
        summary["tensors"] += tensors
        summary["files"] += files
    return summary


def kserve(plan):
    # What KServe's webhook sets for a registry without TLS (storageInitializer.ociInsecureRegistry).
    os.environ["KSERVE_OCI_INSECURE_REGISTRY"] = "true"
    from kserve_storage import Storage

    summary = {"repos": 0, "tensors": 0, "files": 0}
    for name, repo in plan["repos"].items():
        outdir = os.path.join(plan["out"], "kserve", name)
        written = Storage.download(f"oci://{plan['registry']}/{name}:latest-image", outdir)
        assert written == outdir, f"{name}: written to {written}, not {outdir}"
        tensors, files = check_snapshot(name, repo, outdir)
        summary["repos"] += 1
        summary["tensors"] += tensors
        summary["files"] += files
    return summary


def clients(plan):
    from concurrent.futures import ThreadPoolExecutor

    def one(client):
        registry = oras.client.OrasClient(hostname=plan["registry"], insecure=True)
        tensors = 0
        for name, repo in plan["repos"].items():
            outdir = os.path.join(plan["out"], str(client), name)
            pulled = registry.pull(target=f"{plan['registry']}/{name}:latest", outdir=outdir)
            assert pulled, f"client {client}, {name}: nothing pulled"
            tensors += check_snapshot(name, repo, outdir)[0]
        return tensors

    import oras.client

    with ThreadPoolExecutor(plan["clients"]) as pool:
        tensors = list(pool.map(one, range(plan["clients"])))
    return {"clients": len(tensors), "tensors": sum(tensors)}


def denied(plan):
    registry = client(plan)
    try:
        registry.pull(target=f"{plan['registry']}/{plan['denied']}:latest", outdir=plan["out"])
    except Exception as e:  # oras raises ValueError or requests' HTTPError by version
        return {"raised": type(e).__name__, "message": str(e)}
    raise AssertionError(f"{plan['denied']} was pulled with a token that may not read it")


def main():
    mode, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        plan = json.load(f)
    print(json.dumps({"pull": pull, "kserve": kserve, "clients": clients, "denied": denied}[mode](plan)))


if __name__ == "__main__":
    main()
