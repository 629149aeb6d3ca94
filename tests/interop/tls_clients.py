"""Real clients reading ztserve over TLS, each verifying the server against the test CA.

    tls_clients.py client PLAN.json   (the client venv: boto3, s3fs, huggingface_hub, the
                                        Python client)
    tls_clients.py oras PLAN.json     (the oras venv: oras-py, kserve-storage, huggingface_hub)

PLAN.json (written by tests/it/tls.rs) names the HTTPS URL, the S3 endpoint's URL, the CA
file, a CA file of another CA, the model id, its view file's bytes as the server sent them
(`expected`), and for mTLS a second server's URL with a client certificate and key. Each
client must read the same bytes, and each must refuse the server when it trusts the other CA:
  - boto3 (`AWS_CA_BUNDLE`, as operators set it) and s3fs (`client_kwargs.verify`);
  - huggingface_hub's `snapshot_download` and the `hf download` CLI (`SSL_CERT_FILE`, which
    its HTTP client reads);
  - the Python client (`ca_file`, and with mTLS `cert_file`/`key_file`);
  - oras-py and KServe's storage initializer for `oci://` (`REQUESTS_CA_BUNDLE`, which the
    initializer documents for private registries) and for `hf://` (`HF_ENDPOINT` and
    `SSL_CERT_FILE`, which its huggingface_hub reads).
Prints a JSON summary of what was compared; any difference raises.
"""

import json
import os
import subprocess
import sys
import tempfile


def expected_of(plan):
    with open(plan["expected"], "rb") as f:
        return f.read()


def refused(what, call):
    try:
        call()
    except Exception as e:  # each client has its own SSL error type; all name the certificate
        text = f"{type(e).__name__}: {e}".lower()
        assert "certificate" in text or "ssl" in text, f"{what}: not a certificate error: {text}"
        return
    raise AssertionError(f"{what}: a server with a certificate from another CA was trusted")


def client(plan):
    import boto3
    import s3fs
    from botocore.config import Config

    expected = expected_of(plan)
    key = f"{plan['model']}/model.safetensors"
    checked = []

    os.environ["AWS_ACCESS_KEY_ID"] = "unused"
    os.environ["AWS_SECRET_ACCESS_KEY"] = "unused"
    os.environ["AWS_CA_BUNDLE"] = plan["ca_file"]
    s3 = boto3.client("s3", endpoint_url=plan["s3_url"], region_name="us-east-1",
                      config=Config(s3={"addressing_style": "path"}))
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket="models")["Contents"]]
    assert key in listed, listed
    assert s3.get_object(Bucket="models", Key=key)["Body"].read() == expected
    checked.append("boto3")
    os.environ["AWS_CA_BUNDLE"] = plan["other_ca_file"]
    stranger = boto3.client("s3", endpoint_url=plan["s3_url"], region_name="us-east-1")
    refused("boto3", lambda: stranger.list_objects_v2(Bucket="models"))
    del os.environ["AWS_CA_BUNDLE"]

    fs = s3fs.S3FileSystem(anon=True, client_kwargs={"endpoint_url": plan["s3_url"], "verify": plan["ca_file"]})
    assert fs.cat(f"models/{key}") == expected
    checked.append("s3fs")

    os.environ["SSL_CERT_FILE"] = plan["ca_file"]
    from huggingface_hub import snapshot_download

    repo = plan["repo"]
    with tempfile.TemporaryDirectory() as out:
        path = snapshot_download(repo, endpoint=plan["hf_url"], local_dir=out)
        with open(os.path.join(path, "model.safetensors"), "rb") as f:
            assert f.read() == expected
    checked.append("snapshot_download")
    hf = os.path.join(os.path.dirname(sys.executable), "hf")
    env = dict(os.environ, HF_ENDPOINT=plan["hf_url"], HF_HUB_DISABLE_TELEMETRY="1")
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([hf, "download", repo, "model.safetensors", "--local-dir", out], env=env, check=True,
                       capture_output=True)
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            assert f.read() == expected
    checked.append("hf download")
    env["SSL_CERT_FILE"] = plan["other_ca_file"]
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run([hf, "download", repo, "model.safetensors", "--local-dir", out], env=env,
                             capture_output=True, text=True)
        assert run.returncode != 0 and "certificate" in (run.stdout + run.stderr).lower(), run.stderr[-2000:]
    del os.environ["SSL_CERT_FILE"]

    import ztserve_client

    tensor = bytes(plan["tensor"])
    with ztserve_client.Client(plan["url"], ca_file=plan["ca_file"]) as zt:
        assert zt.load(plan["model"])["w"].tobytes() == tensor
    refused("ztserve_client", lambda: ztserve_client.Client(plan["url"], ca_file=plan["other_ca_file"],
                                                            retries=0).load(plan["model"]))
    with ztserve_client.Client(plan["mtls_url"], ca_file=plan["ca_file"], cert_file=plan["client_cert"],
                               key_file=plan["client_key"]) as zt:
        assert zt.load(plan["model"])["w"].tobytes() == tensor
    refused("ztserve_client without a client certificate",
            lambda: ztserve_client.Client(plan["mtls_url"], ca_file=plan["ca_file"], retries=0).load(plan["model"]))
    checked.append("ztserve_client")
    return {"checked": checked}


def oras(plan):
    import oras.client

    os.environ["REQUESTS_CA_BUNDLE"] = plan["ca_file"]
    registry = plan["registry"]
    name = plan["model"]
    with tempfile.TemporaryDirectory() as out:
        files = oras.client.OrasClient(hostname=registry).pull(target=f"{registry}/{name}:latest", outdir=out)
        assert files, "oras pulled nothing"
    from kserve_storage import Storage

    with tempfile.TemporaryDirectory() as out:
        written = Storage.download(f"oci://{registry}/{name}:latest-image", out)
        held = {}
        for root, _, names in os.walk(written):
            for n in names:
                with open(os.path.join(root, n), "rb") as f:
                    held[os.path.relpath(os.path.join(root, n), written)] = f.read()
        assert held, "kserve wrote nothing"
    # KServe's hf:// handler: huggingface_hub's snapshot_download at HF_ENDPOINT, which trusts
    # SSL_CERT_FILE (read when the library is first imported, inside the download).
    os.environ.update(HF_ENDPOINT=plan["hf_url"], SSL_CERT_FILE=plan["ca_file"], HF_HUB_DISABLE_TELEMETRY="1")
    with tempfile.TemporaryDirectory() as out:
        written = Storage.download(f"hf://{plan['repo']}", out)
        with open(os.path.join(written, "model.safetensors"), "rb") as f:
            assert f.read() == expected_of(plan), "kserve hf:// read other bytes"
    os.environ["REQUESTS_CA_BUNDLE"] = plan["other_ca_file"]
    refused("oras", lambda: oras.client.OrasClient(hostname=registry).pull(target=f"{registry}/{name}:latest",
                                                                           outdir=tempfile.mkdtemp()))
    return {"checked": ["oras", "kserve oci://", "kserve hf://"], "kserve_files": sorted(held)}


def main():
    mode, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        plan = json.load(f)
    print(json.dumps({"client": client, "oras": oras}[mode](plan)))


if __name__ == "__main__":
    main()
