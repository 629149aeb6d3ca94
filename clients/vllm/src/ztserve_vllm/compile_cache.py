"""Warm starts: vLLM's compile cache restored from a ztserve artifact store before vLLM compiles,
and published once it has compiled, under vLLM's own cache key.

vLLM (with `VLLM_USE_AOT_COMPILE`, its default on torch 2.10 and later) keeps what it compiles
under `VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/{hash}/`, `{hash}` being its digest
of the configuration, the environment, Inductor's settings and the model's forward: one
`inductor_cache/` shared by the node's ranks and a `rank_{i}_{j}/model` each. Just before vLLM
looks for `model` (`_try_load_aot_compiled_fn`), the bundle `vllm/{hash}/rank_{i}_{j}` is
restored into `{hash}/`, its signature checked first against the keys trusted; vLLM's own checks
then decide what of it to use. After the worker's compile and warm-up, a `read-write` node whose
store held none publishes its own, signed. Any failure is logged ("compile cache: ...") and the
engine compiles as if there were no cache; a bad setting stops the start.

    ZTSERVE_COMPILE_CACHE=off|read|read-write   (default off)
    ZTSERVE_COMPILE_CACHE_PUBLIC_KEYS=a.pub,b.pub  publishers trusted (needed to read)
    ZTSERVE_COMPILE_CACHE_SIGNING_KEY=node.pem     the key a read-write node signs with
    ZTSERVE_URL, ZTSERVE_TOKEN                     the server, and a token granted writing
"""

import logging
import os

# Below vLLM's logger, so its lines go where vLLM's go, formatted as vLLM's.
logger = logging.getLogger("vllm.ztserve_compile_cache")

MODES = ("off", "read", "read-write")
# Bundle names: vllm/{hash}/rank_{i}_{j}.
PREFIX = "vllm"


def settings_from(environ):
    """The compile cache's settings from `environ`, or None when off; ValueError naming what is
    wrong otherwise."""
    mode = (environ.get("ZTSERVE_COMPILE_CACHE") or "off").strip().lower()
    if mode not in MODES:
        raise ValueError(f"compile cache: ZTSERVE_COMPILE_CACHE must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return None
    url = environ.get("ZTSERVE_URL")
    if not url:
        raise ValueError("compile cache: ZTSERVE_COMPILE_CACHE is on, and ZTSERVE_URL (the server) is not set")
    keys = [p.strip() for p in (environ.get("ZTSERVE_COMPILE_CACHE_PUBLIC_KEYS") or "").split(",") if p.strip()]
    if not keys:
        raise ValueError("compile cache: a compile cache is code the engine runs; name the publishers trusted "
                         "in ZTSERVE_COMPILE_CACHE_PUBLIC_KEYS (PEM files, comma-separated)")
    for path in keys:
        if not os.path.isfile(path):
            raise ValueError(f"compile cache: public key {path} (ZTSERVE_COMPILE_CACHE_PUBLIC_KEYS) is not a file")
    signing_key = environ.get("ZTSERVE_COMPILE_CACHE_SIGNING_KEY") or None
    if mode == "read-write" and signing_key is None:
        raise ValueError("compile cache: read-write publishes signed bundles; set ZTSERVE_COMPILE_CACHE_SIGNING_KEY "
                         "to the node's PEM private key")
    if signing_key is not None and not os.path.isfile(signing_key):
        raise ValueError(f"compile cache: signing key {signing_key} (ZTSERVE_COMPILE_CACHE_SIGNING_KEY) is not a file")
    return {"mode": mode, "url": url, "token": environ.get("ZTSERVE_TOKEN") or None, "public_keys": keys,
            "signing_key": signing_key}


def key_of(aot_compilation_path):
    """(bundle name, hash directory, rank directory's name) of vLLM's `{hash}/rank_i_j/model`."""
    rank_dir = os.path.dirname(aot_compilation_path)
    hash_dir = os.path.dirname(rank_dir)
    rank = os.path.basename(rank_dir)
    return f"{PREFIX}/{os.path.basename(hash_dir)}/{rank}", hash_dir, rank


class CompileCache:
    """Restores and publishes the bundles of one process's compiled models."""

    def __init__(self, settings, store=None):
        from ztserve_client import ArtifactStore

        self.settings = settings
        self.store = store or ArtifactStore(settings["url"], settings["token"])
        # (hash directory, rank) of each compile this process must publish after warm-up.
        self.to_publish = []

    def restore(self, aot_compilation_path):
        """Restores the bundle for `aot_compilation_path` unless vLLM's cache holds it already;
        whether the store had a bundle it could use."""
        from ztserve_client import BundleRefused

        name, hash_dir, rank = key_of(aot_compilation_path)
        if os.path.exists(aot_compilation_path):
            logger.info("compile cache: %s is on disk already; nothing restored", aot_compilation_path)
            return True
        try:
            restored = self.store.restore(name, hash_dir, public_keys=self.settings["public_keys"], last=(rank + "/",))
        except BundleRefused as e:
            logger.warning("compile cache: refused %s: %s; compiling as if none were stored", name, e)
            return False
        except Exception as e:  # the engine starts without the cache rather than not at all
            logger.warning("compile cache: cannot restore %s: %s; compiling as if none were stored", name, e)
            return False
        if restored is None:
            logger.info("compile cache: none stored as %s; vLLM compiles", name)
            return False
        logger.info("compile cache: restored %s: %d files, %.1f MB, signed by key %s", name, restored["files"],
                    restored["bytes"] / 1e6, restored["signer"])
        return True

    def publish(self, hash_dir, rank):
        """Publishes `hash_dir`'s shared Inductor cache and rank directory `rank`, signed."""
        name = f"{PREFIX}/{os.path.basename(hash_dir)}/{rank}"
        files = []
        for top in ("inductor_cache", rank):
            for root, dirs, names in os.walk(os.path.join(hash_dir, top)):
                dirs[:] = [d for d in dirs if not d.startswith(".ztserve-restoring-")]
                for file in names:
                    if not file.endswith(".tmp"):
                        files.append(os.path.relpath(os.path.join(root, file), hash_dir).replace(os.sep, "/"))
        if not any(f.startswith(rank + "/") for f in files):
            logger.warning("compile cache: vLLM saved nothing in %s; %s not published", rank, name)
            return
        try:
            outcome = self.store.publish(name, hash_dir, signing_key=self.settings["signing_key"], files=sorted(files))
        except Exception as e:  # publishing is a favour to the next node, never a reason to fail
            logger.warning("compile cache: cannot publish %s: %s", name, e)
            return
        if outcome == "exists":
            logger.info("compile cache: %s is published already; left as it is", name)
        else:
            logger.info("compile cache: published %s: %d files, signed", name, len(files))

    def publish_pending(self):
        pending, self.to_publish = self.to_publish, []
        for hash_dir, rank in pending:
            self.publish(hash_dir, rank)


def install(cache):
    """Hooks `cache` into vLLM: a restore before each AOT load, a publish after the worker's
    compile and warm-up."""
    import vllm.compilation.decorators as decorators

    load = decorators._try_load_aot_compiled_fn

    def restore_then_load(model, aot_compilation_path):
        had_bundle = cache.restore(aot_compilation_path)
        loaded = load(model, aot_compilation_path)
        if cache.settings["mode"] == "read-write" and not had_bundle:
            _, hash_dir, rank = key_of(aot_compilation_path)
            cache.to_publish.append((hash_dir, rank))
        return loaded

    decorators._try_load_aot_compiled_fn = restore_then_load
    for module, cls in (("vllm.v1.worker.gpu_worker", "Worker"), ("vllm.v1.worker.cpu_worker", "CPUWorker")):
        try:
            worker = getattr(__import__(module, fromlist=[cls]), cls)
        except (ImportError, AttributeError):
            continue
        _publish_after(worker, cache)


def _publish_after(worker, cache):
    warm_up = worker.compile_or_warm_up_model
    if getattr(warm_up, "_ztserve_publishes", False):
        return

    def warm_up_then_publish(self, *args, **kwargs):
        result = warm_up(self, *args, **kwargs)
        cache.publish_pending()
        return result

    warm_up_then_publish._ztserve_publishes = True
    worker.compile_or_warm_up_model = warm_up_then_publish


def install_from_environment(environ=os.environ):
    """Installs the compile cache the environment asks for (nothing when off)."""
    settings = settings_from(environ)
    if settings is None:
        return None
    import vllm.envs

    if not vllm.envs.VLLM_USE_AOT_COMPILE:
        logger.warning("compile cache: VLLM_USE_AOT_COMPILE is off, and only vLLM's AOT compile cache is stored; "
                       "nothing is restored or published")
        return None
    cache = CompileCache(settings)
    install(cache)
    return cache
