"""Warm starts with vLLM's CPU build (compilation on): node A, with an empty cache root and
`ZTSERVE_COMPILE_CACHE=read-write`, compiles and publishes its compile cache, signed; node B, with
another empty cache root and `read`, restores it and must generate the same token ids with its
engine start at most 0.6x A's. Then a bundle with one changed byte and a bundle signed by another
key, each served under the same key by a store that does not check signatures itself: each node
must refuse it ("compile cache: refused"), compile, and generate the same ids.

    vllm_compile_cache.py WORK     (ZTSERVE_BIN: the server; prints a markdown table)
    vllm_compile_cache.py WORK --tp 2
        nodes A and B alone at TP=2: each rank restores its own bundle (rank_0_0, rank_1_0)
"""

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
import vllm_load  # noqa: E402


def keypair(path):
    subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{path}.pem"], check=True)
    subprocess.run(["openssl", "ec", "-in", f"{path}.pem", "-pubout", "-out", f"{path}.pub"], check=True,
                   stderr=subprocess.DEVNULL)
    return f"{path}.pem", f"{path}.pub"


@contextmanager
def store(work, name, token, signed_by=None):
    """ztserve with an artifact store in WORK/NAME, `token` granted writing below vllm/; with
    `signed_by`, a store that takes only bundles that key signed."""
    settings = {"ZTSERVE_ARTIFACTS__DIR": str(work / name), "ZTSERVE_ARTIFACTS__WRITERS": f"{token} vllm"}
    if signed_by:
        settings.update({"ZTSERVE_ARTIFACTS__REQUIRE_SIGNATURE": "true", "ZTSERVE_SIGNING__PUBLIC_KEYS": signed_by})
    else:
        # The refusals a reader makes itself are checked here: this store takes what it is given.
        settings["ZTSERVE_ARTIFACTS__ALLOW_UNSIGNED"] = "true"
    empty = work / "no-models"
    empty.mkdir(exist_ok=True)
    with vllm_load.serving(empty, work / f"{name}.log", settings) as served:
        yield served.url


def node(work, label, folder, url, token, mode, public_key, signing_key=None, tp=1):
    """One engine on an empty cache root: its ids, engine start (vLLM's "init engine" seconds),
    the whole LLM() time, and its log."""
    root, tmp = work / f"cache-{label}", work / f"tmp-{label}"
    for fresh in (root, tmp):
        shutil.rmtree(fresh, ignore_errors=True)
    tmp.mkdir()
    # A temporary directory of its own too: torch keeps its precompiled headers there.
    env = {"VLLM_CACHE_ROOT": str(root), "TMPDIR": str(tmp), "VLLM_CHECK_COMPILE": "1", "ZTSERVE_URL": url, "ZTSERVE_TOKEN": token,
           "ZTSERVE_COMPILE_CACHE": mode, "ZTSERVE_COMPILE_CACHE_PUBLIC_KEYS": public_key}
    if signing_key:
        env["ZTSERVE_COMPILE_CACHE_SIGNING_KEY"] = signing_key
    log = work / f"{label}.log"
    ids = vllm_load.engine(str(folder), "auto", tp, env, log).ids
    text = log.read_text()
    init = [float(m) for m in re.findall(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s", text)]
    whole = [json.loads(line[len("RESULT "):])["engine_start_s"] for line in text.splitlines() if line.startswith("RESULT ")]
    return ids, init[0] if init else float("nan"), whole[0], text, root


def published(root):
    """The hash directory node A's vLLM compiled into."""
    [hash_dir] = (root / "torch_compile_cache" / "torch_aot_compile").iterdir()
    return hash_dir


def main(work):
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    folder, _ = vllm_load.prepare(work / "model", "tiny")
    token = secrets.token_hex(24)
    publisher, publisher_pub = keypair(work / "publisher")
    other, _ = keypair(work / "other")
    rows = []
    with store(work, "store", token, signed_by=publisher_pub) as url:
        ids_a, init_a, whole_a, log_a, root_a = node(work, "node-a", folder, url, token, "read-write", publisher_pub, publisher)
        assert "compile cache: published vllm/" in log_a, log_a[-3000:]
        ids_b, init_b, whole_b, log_b, _ = node(work, "node-b", folder, url, token, "read", publisher_pub)
        assert "compile cache: restored vllm/" in log_b, log_b[-3000:]
        assert ids_b == ids_a, (ids_a, ids_b)
        rows += [("A: empty cache root, read-write (compiles, publishes)", init_a, whole_a),
                 ("B: empty cache root, read (restores A's)", init_b, whole_b)]
    from ztserve_client import ArtifactStore

    hash_dir = published(root_a)
    rank = "rank_0_0"
    name = f"vllm/{hash_dir.name}/{rank}"
    files = sorted(str(p.relative_to(hash_dir)) for p in hash_dir.rglob("*") if p.is_file() and p.suffix != ".tmp"
                   and (p.relative_to(hash_dir).parts[0] in ("inductor_cache", rank)))
    for case in ("tampered", "other-key"):
        with store(work, f"store-{case}", token) as url:
            artifacts = ArtifactStore(url, token)
            if case == "other-key":
                assert artifacts.publish(name, str(hash_dir), signing_key=other, files=files) == "created"
            else:
                good = ArtifactStore(url, token)
                # The good bundle's signature over files one of which then changes by a byte.
                changed = work / "changed"
                shutil.rmtree(changed, ignore_errors=True)
                shutil.copytree(hash_dir, changed)
                victim = changed / next(f for f in files if f.startswith(rank + "/"))
                data = bytearray(victim.read_bytes())
                data[len(data) // 2] ^= 1
                victim.write_bytes(bytes(data))
                from ztserve_client import _signing
                import hashlib

                digests = {f: hashlib.sha256((hash_dir / f).read_bytes()).hexdigest() for f in files}
                signature = _signing.sign(publisher, name, digests)
                listed = []
                for f in files:
                    body = (changed / f).read_bytes()
                    digest = hashlib.sha256(body).hexdigest()
                    good._call("PUT", f"blobs/sha256:{digest}", body=body)
                    listed.append({"path": f, "sha256": digest, "size": len(body)})
                good._call("PUT", f"bundles/{name}", body=json.dumps({"files": listed, "signature": signature}).encode(),
                           headers={"Content-Type": "application/json"})
            ids, init, whole, log, _ = node(work, f"node-{case}", folder, url, token, "read", publisher_pub)
            refusal = [line for line in log.splitlines() if "compile cache: refused" in line]
            assert refusal, log[-3000:]
            assert ids == ids_a, (case, ids_a, ids)
            print(f"{case}: {refusal[0].split('compile cache: ')[1][:240]}", file=sys.stderr)
            rows.append((f"{case} bundle, read (refused, compiles)", init, whole))
    print("| node | engine start (vLLM's init engine), s | LLM() whole, s | vs A |")
    print("|---|---:|---:|---:|")
    for label, init, whole in rows:
        print(f"| {label} | {init:.1f} | {whole:.1f} | {init / rows[0][1]:.2f}x |")
    ratio = rows[1][1] / rows[0][1]
    assert ratio <= 0.6, f"node B's engine start is {ratio:.2f}x node A's, over 0.6x"


def ranks(work, tp):
    """Nodes A and B at `tp` ranks: every rank publishes, then restores, its own bundle."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    folder, _ = vllm_load.prepare(work / "model", "tiny")
    token = secrets.token_hex(24)
    publisher, publisher_pub = keypair(work / "publisher")
    with store(work, "store", token, signed_by=publisher_pub) as url:
        ids_a, init_a, _, log_a, _ = node(work, "node-a", folder, url, token, "read-write", publisher_pub, publisher, tp)
        ids_b, init_b, _, log_b, _ = node(work, "node-b", folder, url, token, "read", publisher_pub, tp=tp)
    for rank in range(tp):
        assert re.search(rf"compile cache: published vllm/[0-9a-f]+/rank_{rank}_0", log_a), (rank, log_a[-3000:])
        assert re.search(rf"compile cache: restored vllm/[0-9a-f]+/rank_{rank}_0", log_b), (rank, log_b[-3000:])
    assert ids_b == ids_a, (ids_a, ids_b)
    print(f"TP={tp}: every rank published and restored its own bundle; engine start {init_a:.1f} s, then {init_b:.1f} s "
          f"({init_b / init_a:.2f}x); the same token ids")


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[2] == "--tp":
        ranks(sys.argv[1], int(sys.argv[3]))
    else:
        main(sys.argv[1])
