"""The artifact store from Python against a live server: a directory published signed and
restored whole for its publisher's key only; a bundle signed by another key, one whose bytes
changed after signing, one missing a signed file, one copied to another name and one whose path
leaves its directory refused before anything is placed; a directory holding a symbolic link
refused before anything is sent; and the same bundles read and written by `ztserve artifacts`."""

import hashlib
import json
import os
import subprocess

import pytest
from conftest import Server, binary, keypair

from ztserve_client import ArtifactStore, BundleRefused
from ztserve_client import _signing

WRITER = "artifact-writer-0123456789abcdef"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    directory = tmp_path_factory.mktemp("keys")
    return {"publisher": keypair(directory, "publisher"), "other": keypair(directory, "other", "P-384")}


@pytest.fixture(scope="module")
def stores(tmp_path_factory, keys):
    """A store that takes only the publisher's bundles, and one that checks no signature."""
    base = tmp_path_factory.mktemp("stores")
    (base / "models").mkdir()
    common = {"ZTSERVE_ARTIFACTS__WRITERS": f"{WRITER} cache"}
    checking = Server(base / "models", env={**common, "ZTSERVE_ARTIFACTS__DIR": str(base / "checking"),
                                            "ZTSERVE_ARTIFACTS__REQUIRE_SIGNATURE": "true",
                                            "ZTSERVE_SIGNING__PUBLIC_KEYS": keys["publisher"][1]})
    trusting = Server(base / "models", env={**common, "ZTSERVE_ARTIFACTS__DIR": str(base / "trusting"),
                                            "ZTSERVE_ARTIFACTS__ALLOW_UNSIGNED": "true"})
    yield checking, trusting
    checking.stop()
    trusting.stop()


@pytest.fixture
def cache(tmp_path):
    directory = tmp_path / "cache"
    (directory / "inductor_cache" / "ab").mkdir(parents=True)
    (directory / "inductor_cache" / "ab" / "graph.py").write_text("def call(): pass\n")
    (directory / "rank_0_0").mkdir()
    (directory / "rank_0_0" / "model").write_bytes(os.urandom(200_000))
    return directory


def tree(directory):
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_signed_directory_is_restored_whole_for_its_publisher_only(stores, keys, cache, tmp_path):
    checking, _ = stores
    store = ArtifactStore(checking.url, WRITER)
    name = f"cache/{tmp_path.name}"
    with pytest.raises(Exception, match="signature"):
        store.publish(name, str(cache), signing_key=keys["other"][0])
    assert store.publish(name, str(cache), signing_key=keys["publisher"][0]) == "created"
    assert store.publish(name, str(cache), signing_key=keys["publisher"][0]) == "exists"
    with pytest.raises(BundleRefused, match="none of the keys trusted"):
        store.restore(name, str(tmp_path / "refused"), public_keys=[keys["other"][1]])
    assert not (tmp_path / "refused").exists() or not tree(tmp_path / "refused")
    restored = store.restore(name, str(tmp_path / "out"), public_keys=[keys["publisher"][1]], last=("rank_0_0/",))
    assert restored["signer"] == "publisher.pub" and restored["files"] == restored["placed"] == 2
    assert tree(tmp_path / "out") == tree(cache)
    assert store.restore("cache/none", str(tmp_path / "none"), public_keys=[keys["publisher"][1]]) is None
    # `ztserve artifacts restore` reads what Python published, with the same verdicts.
    command = [str(binary()), "artifacts", "restore", checking.url, name]
    done = subprocess.run(command + [str(tmp_path / "cli"), "--public-key", keys["publisher"][1]], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert tree(tmp_path / "cli") == tree(cache)
    done = subprocess.run(command + [str(tmp_path / "cli-other"), "--public-key", keys["other"][1]], capture_output=True, text=True)
    assert done.returncode == 1 and "not trusted" in done.stderr


def test_a_signed_bundle_copied_to_another_name_is_refused_everywhere(stores, keys, cache, tmp_path):
    checking, trusting = stores
    name, copy = f"cache/{tmp_path.name}/rank_0_0", f"cache/{tmp_path.name}/rank_1_0"
    for server in (checking, trusting):
        assert ArtifactStore(server.url, WRITER).publish(name, str(cache), signing_key=keys["publisher"][0]) == "created"
    bundle = json.dumps(ArtifactStore(checking.url).bundle(name)).encode()
    # A server that requires signatures refuses the copy; one that does not takes it, and every
    # reader refuses it with the reason.
    with pytest.raises(Exception, match="signed as"):
        ArtifactStore(checking.url, WRITER)._call("PUT", f"bundles/{copy}", body=bundle,
                                                  headers={"Content-Type": "application/json"})
    ArtifactStore(trusting.url, WRITER)._call("PUT", f"bundles/{copy}", body=bundle,
                                              headers={"Content-Type": "application/json"})
    with pytest.raises(BundleRefused, match=f"signed as '{name}', not '{copy}'"):
        ArtifactStore(trusting.url).restore(copy, str(tmp_path / "out"), public_keys=[keys["publisher"][1]])
    assert not (tmp_path / "out").exists() or not tree(tmp_path / "out")
    done = subprocess.run([str(binary()), "artifacts", "restore", trusting.url, copy, str(tmp_path / "cli"),
                           "--public-key", keys["publisher"][1]], capture_output=True, text=True)
    assert done.returncode == 1 and f'signed as "{name}", not "{copy}"' in done.stderr, done.stderr


def test_python_restores_what_the_ztserve_command_published(stores, keys, cache, tmp_path):
    checking, _ = stores
    name = f"cache/cli-{tmp_path.name}"
    done = subprocess.run([str(binary()), "artifacts", "publish", checking.url, name, str(cache), "--signing-key",
                           keys["publisher"][0]], capture_output=True, text=True, env={**os.environ, "ZTSERVE_TOKEN": WRITER})
    assert done.returncode == 0, done.stderr
    ArtifactStore(checking.url).restore(name, str(tmp_path / "out"), public_keys=[keys["publisher"][1]])
    assert tree(tmp_path / "out") == tree(cache)


def publish_raw(store, name, files, signature):
    """Puts `files` (path: bytes) and a bundle naming them with `signature`, as a hostile
    publisher would to a store that checks no signature."""
    listed = []
    for path, body in files.items():
        digest = hashlib.sha256(body).hexdigest()
        store._call("PUT", f"blobs/sha256:{digest}", body=body)
        listed.append({"path": path, "sha256": digest, "size": len(body)})
    store._call("PUT", f"bundles/{name}", body=json.dumps({"files": listed, "signature": signature}).encode(),
                headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("case", ["changed byte", "missing file", "added file", "unsigned", "another name"])
def test_a_bundle_that_is_not_what_was_signed_is_refused_before_anything_is_placed(stores, keys, cache, tmp_path, case):
    _, trusting = stores
    store = ArtifactStore(trusting.url, WRITER)
    files = tree(cache)
    name = f"cache/{case.replace(' ', '-')}-{tmp_path.name}"
    signed_as = "cache/elsewhere" if case == "another name" else name
    signature = _signing.sign(keys["publisher"][0], signed_as, {p: hashlib.sha256(b).hexdigest() for p, b in files.items()})
    if case == "changed byte":
        body = bytearray(files["rank_0_0/model"])
        body[1000] ^= 1
        files["rank_0_0/model"] = bytes(body)
    elif case == "missing file":
        del files["inductor_cache/ab/graph.py"]
    elif case == "added file":
        files["rank_0_0/extra.so"] = b"\x7fELF"
    elif case == "unsigned":
        signature = None
    publish_raw(store, name, files, signature)
    reasons = {"changed byte": "not the", "missing file": "not those signed", "added file": "not those signed",
               "unsigned": "unsigned", "another name": "signed as 'cache/elsewhere'"}
    with pytest.raises(BundleRefused, match=reasons[case]):
        store.restore(name, str(tmp_path / "out"), public_keys=[keys["publisher"][1]])
    assert not tree(tmp_path / "out")


@pytest.mark.parametrize("link", ["file", "directory", "named file"])
def test_a_symbolic_link_in_a_published_directory_is_refused_before_anything_is_sent(stores, keys, cache, tmp_path,
                                                                                    link):
    _, trusting = stores
    secret = tmp_path / "outside"
    (secret / "keys").mkdir(parents=True)
    (secret / "keys" / "id.pem").write_text("a key that must not leave this node\n")
    if link == "directory":
        (cache / "rank_0_0" / "keys").symlink_to(secret / "keys")
    else:
        (cache / "rank_0_0" / "id.pem").symlink_to(secret / "keys" / "id.pem")
    files = ["rank_0_0/model", "rank_0_0/id.pem"] if link == "named file" else None
    store = ArtifactStore(trusting.url, WRITER)
    name = f"cache/link-{tmp_path.name}"
    with pytest.raises(ValueError, match="symbolic link|not a regular file"):
        store.publish(name, str(cache), signing_key=keys["publisher"][0], files=files)
    assert store.bundle(name) is None
    # The CLI refuses it alike.
    done = subprocess.run([str(binary()), "artifacts", "publish", trusting.url, name, str(cache)],
                          capture_output=True, text=True, env={**os.environ, "ZTSERVE_TOKEN": WRITER})
    assert done.returncode != 0 and "not a regular file" in done.stderr, done.stderr


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "a/../../b", "a//b", ""])
def test_a_path_leaving_its_directory_is_refused(path):
    with pytest.raises(BundleRefused, match="leaves"):
        from ztserve_client._artifacts import _check_path

        _check_path(path)


def test_a_store_named_by_replicas_goes_on_at_the_next_when_the_first_is_unreachable(stores, keys, cache, tmp_path):
    from conftest import free_port

    checking, _ = stores
    # Nothing listens at the first: every call moves on to the second.
    store = ArtifactStore(f"http://127.0.0.1:{free_port()},{checking.url}", WRITER)
    name = f"cache/{tmp_path.name}"
    assert store.publish(name, str(cache), signing_key=keys["publisher"][0]) == "created"
    assert store.url == checking.url
    restored = store.restore(name, str(tmp_path / "out"), public_keys=[keys["publisher"][1]])
    assert restored["placed"] == 2 and tree(tmp_path / "out") == tree(cache)
