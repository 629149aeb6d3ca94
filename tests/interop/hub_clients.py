"""Load models through ztserve's Hugging Face Hub API with the clients GPU workers run.

    hub_clients.py companions DIR     (hub-2.4.0 venv) write a tiny Llama config.json,
        tokenizer.json (a `tokenizers` word-level tokenizer) and tokenizer_config.json into DIR,
        as `save_pretrained` leaves them.
    hub_clients.py check PLAN.json    (hub-2.4.0 venv: huggingface_hub 2.x, transformers)
    hub_clients.py snapshot PLAN.json (any huggingface_hub venv: 2.x, 1.x, 0.36)
    hub_clients.py offline PLAN.json  (the same cache, HF_HUB_OFFLINE=1: no request is sent)
    hub_clients.py resume PLAN.json   (hub-0.36.2: a download cut off midway, resumed with a range)
    hub_clients.py errors PLAN.json   (the exceptions a missing repo, revision or file raises;
                                       and the tree of a repository of more than 1,000 files,
                                       which pages)

PLAN.json (written by tests/it/hf_hub.rs) names the endpoint (HF_ENDPOINT), a cache directory,
and for each repository its files beside the model (a local copy of each) and each tensor's
bytes as the official reader returned them from the source file (a .bin). Every tensor of every
downloaded safetensors file is compared with its .bin, byte for byte; every file beside the
model with its local copy. Prints a JSON summary; any difference raises.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile


def load_plan(path):
    with open(path) as f:
        plan = json.load(f)
    # Read by huggingface_hub when it is imported.
    os.environ["HF_ENDPOINT"] = plan["endpoint"]
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.pop("HF_TOKEN", None)
    if plan.get("token"):
        os.environ["HF_TOKEN"] = plan["token"]
    return plan


def read(path):
    with open(path, "rb") as f:
        return f.read()


def safetensors_tensors(path):
    """Each tensor's bytes in a safetensors file, by name, read by its header's offsets."""
    data = read(path)
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    start = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        tensors[name] = data[start + begin : start + end]
    return tensors


def check_snapshot(repo, model, folder):
    """Compares a downloaded repository with the plan; returns (tensors, files) compared."""
    tensors = {}
    for root, _, names in os.walk(folder):
        for name in names:
            if name.endswith(".safetensors"):
                for tensor, data in safetensors_tensors(os.path.join(root, name)).items():
                    assert tensor not in tensors, f"{repo}: tensor {tensor} in two files"
                    tensors[tensor] = data
    for tensor, bin_path in model["tensors"].items():
        assert tensor in tensors, f"{repo}: tensor {tensor} missing from {sorted(tensors)}"
        assert tensors[tensor] == read(bin_path), f"{repo}: tensor {tensor} differs from the official reader's"
    for path, local in model["companions"].items():
        got = os.path.join(folder, path)
        assert os.path.isfile(got), f"{repo}: {path} was not downloaded"
        assert read(got) == read(local), f"{repo}: {path} differs"
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        weight_map = json.loads(read(index))["weight_map"]
        assert set(weight_map) == set(tensors), f"{repo}: the index does not list exactly the tensors"
    return len(model["tensors"]), len(model["companions"])


def snapshot(plan):
    from huggingface_hub import snapshot_download

    summary = {"tensors": 0, "files": 0, "repos": 0}
    for repo, model in plan["repos"].items():
        folder = snapshot_download(repo, cache_dir=plan["cache"])
        tensors, files = check_snapshot(repo, model, folder)
        summary["tensors"] += tensors
        summary["files"] += files
        summary["repos"] += 1
    return summary


def offline(plan):
    # Set before huggingface_hub is imported, as a worker's environment sets it.
    os.environ["HF_HUB_OFFLINE"] = "1"
    return snapshot(plan)


def check(plan):
    import huggingface_hub
    from huggingface_hub import HfApi, HfFileSystem, hf_hub_download

    summary = snapshot(plan)
    api = HfApi()
    # The model list: every repository of the plan, sorted by id; and by author.
    listed_repos = [m.id for m in api.list_models(limit=None, full=True) if m.id in plan["repos"]]
    assert listed_repos == sorted(plan["repos"]), (listed_repos, sorted(plan["repos"]))
    for namespace in {repo.split("/")[0] for repo in plan["repos"] if "/" in repo}:
        mine = sorted(r for r in plan["repos"] if r.startswith(namespace + "/"))
        assert [m.id for m in api.list_models(author=namespace) if m.id in plan["repos"]] == mine, namespace
    for repo, model in plan["repos"].items():
        info = api.model_info(repo, files_metadata=True)
        commit = info.sha
        assert len(commit) == 40, info
        listed = {s.rfilename: s for s in info.siblings}
        tree = {f.path: f for f in api.list_repo_tree(repo, recursive=True, revision=commit) if hasattr(f, "lfs")}
        assert set(tree) == set(listed), (repo, sorted(tree), sorted(listed))
        folder = huggingface_hub.snapshot_download(repo, cache_dir=plan["cache"], revision=commit)
        for path, entry in tree.items():
            data = read(os.path.join(folder, path))
            digest = hashlib.sha256(data).hexdigest()
            assert entry.lfs.sha256 == digest == listed[path].lfs.sha256, (repo, path)
            assert entry.size == len(data) == listed[path].size, (repo, path)
            assert len(data) < 50_000_000_000
        assert not [p for p in tree if p.endswith(".zt")], f"{repo}: stored .zt files are not listed"

        # A sharded checkpoint's metadata in one request, as the client reads it shard by shard.
        if "model.safetensors.index.json" in tree:
            together = api.get_sharded_safetensors_metadata(repo)
            apart = api.get_safetensors_metadata(repo, revision=commit)
            assert together.sharded and together.metadata == apart.metadata, (repo, together.metadata)
            assert together.weight_map == apart.weight_map, repo
            assert together.files_metadata == apart.files_metadata, repo
            summary["sharded_metadata"] = summary.get("sharded_metadata", 0) + 1

        # `hf cache verify` recomputes every file's digest against the tree.
        verify = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "hf"), "cache", "verify", repo, "--cache-dir", plan["cache"],
             "--fail-on-missing-files", "--fail-on-extra-files"],
            capture_output=True, text=True,
        )
        assert verify.returncode == 0, (repo, verify.stdout, verify.stderr)

        # One file pinned by commit, into a cache of its own.
        with tempfile.TemporaryDirectory() as cache:
            path = sorted(tree)[-1]
            got = hf_hub_download(repo, path, revision=commit, cache_dir=cache)
            assert read(got) == read(os.path.join(folder, path)), (repo, path)
            assert f"/snapshots/{commit}/" in got, got

        # `hf download --local-dir`: the same files, nothing else.
        with tempfile.TemporaryDirectory() as local:
            done = subprocess.run(
                [os.path.join(os.path.dirname(sys.executable), "hf"), "download", repo, "--local-dir", local],
                capture_output=True, text=True,
            )
            assert done.returncode == 0, (repo, done.stdout, done.stderr)
            downloaded = set()
            for root, dirs, names in os.walk(local):
                dirs[:] = [d for d in dirs if d != ".cache"]
                for name in names:
                    rel = os.path.relpath(os.path.join(root, name), local)
                    downloaded.add(rel)
                    assert read(os.path.join(local, rel)) == read(os.path.join(folder, rel)), (repo, rel)
            assert downloaded == set(tree), (repo, sorted(downloaded))

        # HfFileSystem: ls, open, seek and ranged reads of each safetensors file.
        fs = HfFileSystem()
        names = {os.path.relpath(p, repo) for p in fs.find(repo)}
        assert names == set(tree), (repo, sorted(names))
        top = fs.ls(repo, detail=True)
        assert {e["name"] for e in top} == {f"{repo}/{p.split('/')[0]}" for p in tree}, (repo, top)
        for path in (p for p in tree if p.endswith(".safetensors")):
            whole = read(os.path.join(folder, path))
            with fs.open(f"{repo}/{path}", "rb") as f:
                header_len = int.from_bytes(f.read(8), "little")
                f.seek(8 + header_len // 2)
                assert f.read(16) == whole[8 + header_len // 2 : 24 + header_len // 2], (repo, path)
                f.seek(-7, 2)
                assert f.read() == whole[-7:], (repo, path)
            middle = len(whole) // 2
            assert fs.cat_file(f"{repo}/{path}", start=middle, end=middle + 100) == whole[middle : middle + 100]
            summary["hffs_files"] = summary.get("hffs_files", 0) + 1

    # transformers, unchanged: the config and tokenizer of the repository that has them.
    if plan.get("transformers_repo"):
        from transformers import AutoConfig, AutoTokenizer

        repo = plan["transformers_repo"]
        config = AutoConfig.from_pretrained(repo, cache_dir=plan["cache"])
        assert config.model_type == "llama" and config.hidden_size == 8, config
        tokenizer = AutoTokenizer.from_pretrained(repo, cache_dir=plan["cache"])
        assert tokenizer("hello world")["input_ids"] == [2, 3], tokenizer("hello world")
        summary["transformers"] = repo
    return summary


def resume(plan):
    """A download cut off midway leaves `blobs/<etag>.incomplete`; the next download resumes
    from its end with a range and completes the same bytes."""
    from huggingface_hub import HfApi, hf_hub_download

    repo, path = plan["resume"]["repo"], plan["resume"]["path"]
    expected = read(plan["resume"]["local"])
    api = HfApi()
    digest = {f.path: f for f in api.list_repo_tree(repo, recursive=True) if hasattr(f, "lfs")}[path].lfs.sha256
    with tempfile.TemporaryDirectory() as cache:
        blobs = os.path.join(cache, "models--" + repo.replace("/", "--"), "blobs")
        os.makedirs(blobs)
        with open(os.path.join(blobs, digest + ".incomplete"), "wb") as f:
            f.write(expected[: len(expected) // 2])
        got = hf_hub_download(repo, path, cache_dir=cache)
        assert read(got) == expected, "the resumed download differs"
    return {"resumed": len(expected) - len(expected) // 2}


def errors(plan):
    """The exceptions huggingface_hub raises where the Hub would raise them."""
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    raised = {}

    def expect(name, exception, call):
        try:
            call()
        except exception as e:
            raised[name] = type(e).__name__
            return
        raise AssertionError(f"{name}: {exception.__name__} was not raised")

    cache = tempfile.mkdtemp()
    paged = plan["paged"]
    entries = list(HfApi().list_repo_tree(paged["repo"], recursive=True, token=paged["token"]))
    raised["paged_entries"] = len(entries)
    for name, call in plan["errors"].items():
        repo, kind = call["repo"], call["raises"]
        exception = {
            "RepositoryNotFoundError": RepositoryNotFoundError,
            "RevisionNotFoundError": RevisionNotFoundError,
            "EntryNotFoundError": EntryNotFoundError,
            "HfHubHTTPError": HfHubHTTPError,
        }[kind]
        token = call.get("token", False)
        if "file" in call:
            expect(name, exception, lambda: hf_hub_download(repo, call["file"], revision=call.get("revision"),
                                                            cache_dir=cache, token=token))
        elif "revision" in call:
            expect(name, exception, lambda: HfApi().model_info(repo, revision=call["revision"], token=token))
        else:
            expect(name, exception, lambda: snapshot_download(repo, cache_dir=cache, token=token))
        if kind != "HfHubHTTPError":
            # A more precise class than expected would pass `except` too: the names must match.
            assert raised[name] in (kind, "RemoteEntryNotFoundError"), (name, raised[name])
    return raised


def companions(folder):
    """A tiny Llama's config and a word-level tokenizer, as save_pretrained writes them."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    os.makedirs(folder, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "num_key_value_heads": 1,
        "vocab_size": 4,
        "torch_dtype": "float32",
    }
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0, "[PAD]": 1, "hello": 2, "world": 3}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "pad_token": "[PAD]"}, f)


def main():
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "companions":
        companions(path)
        return
    plan = load_plan(path)
    result = {"check": check, "snapshot": snapshot, "offline": offline, "resume": resume, "errors": errors}[mode](plan)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
