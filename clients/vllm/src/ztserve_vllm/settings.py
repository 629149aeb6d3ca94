"""The load format's settings: each a key of vLLM's `--model-loader-extra-config` or a
`ZTSERVE_*` environment variable, the extra config winning; checked before anything loads."""

# key: type. Each is also the environment variable ZTSERVE_<KEY>.
KEYS = {
    "url": str, "model": str, "token": str, "concurrency": int, "chunk_size": int, "prefetch_bytes": int,
    "request_bytes": int, "hub_namespace": str, "strict": bool, "outage_secs": int,
}
# The most a rank fetches ahead of vLLM's loaders: what its buffers take, reused throughout.
PREFETCH_BYTES = 128 << 20
# The regions one request carries, in bytes.
REQUEST_BYTES = 16 << 20
# Connections a rank fetches on.
CONCURRENCY = 4
# How long a load waits for a server that cannot be reached (restarted, or replaced by another
# replica behind its address) before it fails.
OUTAGE_SECS = 60
# The server's `[serving] hub_namespace`: the namespace of its models at the top of a source.
HUB_NAMESPACE = "local"
# With `strict`, the most a rank may fetch against its share (what it would fetch were every
# split weight cut to it).
STRICT_RATIO = 1.1
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _boolean(key, value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"ztserve load format: {key} must be true or false, got {value!r}")


def _integer(key, value):
    if isinstance(value, bool):
        raise ValueError(f"ztserve load format: {key} must be an integer, got {value!r}")
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"ztserve load format: {key} must be an integer, got {value!r}") from None
    if value < 1:
        raise ValueError(f"ztserve load format: {key} must be at least 1, got {value}")
    return value


def parse(extra, environ):
    """The settings from `extra` (the loader's extra config) over `environ`; ValueError with
    what is wrong for an unknown key, a value of the wrong type, or no URL."""
    extra = extra or {}
    if not isinstance(extra, dict):
        raise ValueError(f"model_loader_extra_config must be a dict for load format ztserve, got {type(extra).__name__}")
    unknown = set(extra) - set(KEYS)
    if unknown:
        raise ValueError(f"unexpected extra config keys for load format ztserve: {sorted(unknown)} (known: {sorted(KEYS)})")
    settings = {}
    for key, kind in KEYS.items():
        value = extra.get(key, environ.get(f"ZTSERVE_{key.upper()}"))
        if value is None:
            continue
        if kind is int:
            value = _integer(key, value)
        elif kind is bool:
            value = _boolean(key, value)
        elif not isinstance(value, str) or not value:
            raise ValueError(f"ztserve load format: {key} must be a non-empty string, got {value!r}")
        settings[key] = value
    if "url" not in settings:
        raise ValueError(
            "--load-format ztserve needs the server's URL: set ZTSERVE_URL=http://HOST:PORT "
            "or --model-loader-extra-config '{\"url\": \"http://HOST:PORT\"}'"
        )
    settings.setdefault("prefetch_bytes", PREFETCH_BYTES)
    settings.setdefault("request_bytes", REQUEST_BYTES)
    settings.setdefault("concurrency", CONCURRENCY)
    settings.setdefault("outage_secs", OUTAGE_SECS)
    settings.setdefault("hub_namespace", HUB_NAMESPACE)
    settings.setdefault("strict", False)
    if "token" not in settings and environ.get("HF_TOKEN"):
        settings["token"] = environ["HF_TOKEN"]  # the Hub API on the same server takes the same token
    return settings


def repo_to_model_ids(repo, namespace=HUB_NAMESPACE):
    """The ztserve model ids Hub repository `repo` may name, the likelier first, as the server
    maps them: a deeper id is `namespace/a__b` for `namespace/a/b`, and a model at the top of a
    source (`llama`) is `{hub_namespace}/llama` unless a model has that id."""
    first, _, name = repo.partition("/")
    if not name:
        return [repo]
    ids = [f"{first}/{name.replace('__', '/')}"]
    if first == namespace and "__" not in name:
        ids.append(name)
    return ids
