"""The compile cache against a live server, with stand-ins of the two vLLM functions it wraps:
node A's compile (a `{hash}/rank_0_0/model` and an Inductor cache written by the stand-in) is
published after the worker's warm-up, signed; node B restores it before vLLM's load looks for
`model`, under vLLM's own hash; a bundle another key signed is refused with "compile cache" in
the log and nothing placed; and the settings refuse what would run untrusted code."""

import logging
import os
import sys
import types

import pytest
from conftest import live

from ztserve_vllm import compile_cache

WRITER = "compile-cache-writer-0123456789"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    base = tmp_path_factory.mktemp("compile-cache")
    (base / "models").mkdir()
    server = live.Server(base / "models", env={"ZTSERVE_ARTIFACTS__DIR": str(base / "store"),
                                               "ZTSERVE_ARTIFACTS__WRITERS": f"{WRITER} vllm",
                                               "ZTSERVE_ARTIFACTS__ALLOW_UNSIGNED": "true"})
    yield server
    server.stop()


class StandIns:
    """`vllm.compilation.decorators._try_load_aot_compiled_fn` and a worker's
    `compile_or_warm_up_model`, as vLLM calls them: the load reads `model` when it is there,
    else the worker compiles (writes the rank's `model` and an Inductor cache entry)."""

    def __init__(self, monkeypatch, path):
        self.path = path
        self.loaded = None
        decorators = types.ModuleType("vllm.compilation.decorators")

        def load(model, aot_compilation_path):
            if os.path.exists(aot_compilation_path):
                with open(aot_compilation_path, "rb") as f:
                    self.loaded = f.read()
                return self.loaded
            return None

        decorators._try_load_aot_compiled_fn = load
        worker_module = types.ModuleType("vllm.v1.worker.cpu_worker")
        stand_in = self

        class CPUWorker:
            def compile_or_warm_up_model(self):
                loaded = sys.modules["vllm.compilation.decorators"]._try_load_aot_compiled_fn(None, stand_in.path)
                if loaded is None:
                    hash_dir = os.path.dirname(os.path.dirname(stand_in.path))
                    os.makedirs(os.path.join(hash_dir, "inductor_cache", "fx"), exist_ok=True)
                    with open(os.path.join(hash_dir, "inductor_cache", "fx", "graph"), "wb") as f:
                        f.write(b"compiled graph")
                    os.makedirs(os.path.dirname(stand_in.path), exist_ok=True)
                    with open(stand_in.path, "wb") as f:
                        f.write(b"aot artifact")
                return 1.5

        worker_module.CPUWorker = CPUWorker
        self.worker = CPUWorker
        for name, module in {"vllm": types.ModuleType("vllm"), "vllm.compilation": types.ModuleType("vllm.compilation"),
                             "vllm.compilation.decorators": decorators, "vllm.v1": types.ModuleType("vllm.v1"),
                             "vllm.v1.worker": types.ModuleType("vllm.v1.worker"),
                             "vllm.v1.worker.cpu_worker": worker_module}.items():
            monkeypatch.setitem(sys.modules, name, module)
        monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_worker", None)


def node(monkeypatch, store, root, mode, keys, signing_key=None):
    path = os.path.join(root, "torch_compile_cache", "torch_aot_compile", "4f" * 32, "rank_0_0", "model")
    stand_ins = StandIns(monkeypatch, path)
    settings = {"mode": mode, "url": store.url, "token": WRITER, "public_keys": keys, "signing_key": signing_key}
    compile_cache.install(compile_cache.CompileCache(settings))
    stand_ins.worker().compile_or_warm_up_model()
    return stand_ins


def test_node_b_restores_what_node_a_compiled_and_refuses_another_publishers(store, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="vllm.ztserve_compile_cache")
    publisher, publisher_pub = live.keypair(tmp_path, "publisher")
    _, other_pub = live.keypair(tmp_path, "other")
    node(monkeypatch, store, tmp_path / "a", "read-write", [publisher_pub], publisher)
    assert "compile cache: published vllm/" + "4f" * 32 + "/rank_0_0: 2 files, signed" in caplog.text

    b = node(monkeypatch, store, tmp_path / "b", "read", [publisher_pub])
    assert b.loaded == b"aot artifact", caplog.text
    assert "compile cache: restored vllm/" in caplog.text
    hash_dir = tmp_path / "b" / "torch_compile_cache" / "torch_aot_compile" / ("4f" * 32)
    assert (hash_dir / "inductor_cache" / "fx" / "graph").read_bytes() == b"compiled graph"
    assert [p.name for p in hash_dir.iterdir() if p.name.startswith(".")] == []

    caplog.clear()
    c = node(monkeypatch, store, tmp_path / "c", "read", [other_pub])
    assert "compile cache: refused vllm/" in caplog.text and "none of the keys trusted" in caplog.text
    assert c.loaded is None, "the refused bundle was not placed: the stand-in compiled"


@pytest.mark.parametrize("environ, wrong", [
    ({"ZTSERVE_COMPILE_CACHE": "sometimes"}, "must be one of"),
    ({"ZTSERVE_COMPILE_CACHE": "read"}, "ZTSERVE_URL"),
    ({"ZTSERVE_COMPILE_CACHE": "read", "ZTSERVE_URL": "http://x"}, "ZTSERVE_COMPILE_CACHE_PUBLIC_KEYS"),
    ({"ZTSERVE_COMPILE_CACHE": "read", "ZTSERVE_URL": "http://x", "ZTSERVE_COMPILE_CACHE_PUBLIC_KEYS": "/nonexistent.pub"},
     "is not a file"),
])
def test_settings_refuse_what_would_run_untrusted_code(environ, wrong):
    with pytest.raises(ValueError, match=wrong):
        compile_cache.settings_from(environ)


def test_read_write_needs_a_signing_key_and_off_is_nothing(tmp_path):
    _, public = live.keypair(tmp_path, "k")
    base = {"ZTSERVE_URL": "http://x", "ZTSERVE_COMPILE_CACHE_PUBLIC_KEYS": public}
    with pytest.raises(ValueError, match="ZTSERVE_COMPILE_CACHE_SIGNING_KEY"):
        compile_cache.settings_from({**base, "ZTSERVE_COMPILE_CACHE": "read-write"})
    assert compile_cache.settings_from({}) is None
    assert compile_cache.settings_from({**base, "ZTSERVE_COMPILE_CACHE": "read"})["mode"] == "read"
