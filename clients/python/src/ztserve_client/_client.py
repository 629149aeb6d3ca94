"""The client: JSON routes, concurrent ranged GETs into final buffers, digest checks, and
assembly into numpy arrays, scipy sparse arrays or torch tensors."""

import fnmatch
import hashlib
import http.client
import json
import os
import ssl
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import _dtypes, _regions
from ._errors import DigestMismatch, ModelChanged, NotFound, TransferError, ZtserveError, error_for
from ._retry import _OUTAGE_STATUSES, _Patience

# Connection failures and timeouts are OSErrors; a body cut short is an HTTPException.
_TRANSIENT = (OSError, http.client.HTTPException)


def _segment(text):
    """A model id or object name as one percent-encoded path segment (`/` becomes `%2F`)."""
    return urllib.parse.quote(text, safe="")


def tls_context(url, ca_file, cert_file, key_file):
    """The TLS context for `url` (None over http://): the system's roots or `ca_file` (default
    `ZTSERVE_CA_FILE`), and the client certificate `cert_file` with `key_file` when given."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("give both cert_file and key_file, or neither")
    if not url.startswith("https://"):
        return None
    ca_file = ca_file if ca_file is not None else (os.environ.get("ZTSERVE_CA_FILE") or None)
    context = ssl.create_default_context(cafile=ca_file)
    if cert_file is not None:
        context.load_cert_chain(cert_file, key_file)
    return context


def replica_urls(url):
    """The replicas `url` names: one URL, several comma-separated, or a list of them; all
    http:// or all https://."""
    urls = [u.strip().rstrip("/") for u in (url.split(",") if isinstance(url, str) else url)]
    if not urls or not all(urls):
        raise ValueError(f"{url!r} names no server URL")
    schemes = {urllib.parse.urlsplit(u).scheme for u in urls}
    if len(schemes) > 1:
        raise ValueError(f"{url!r}: the replicas are all http:// or all https://, not a mix")
    return urls


class _Replica:
    """One server of the replicas a client may use."""

    def __init__(self, url):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        self.url = url
        self.scheme = parsed.scheme
        self.host = parsed.hostname
        self.port = parsed.port
        self.base = parsed.path.rstrip("/")


class _Connections:
    """One keep-alive connection per thread, so concurrent GETs never share a socket, each to
    the replica in use: the first URL until it cannot be reached, then the next (`failover`)."""

    def __init__(self, urls, timeout, context=None):
        self.replicas = [_Replica(url) for url in urls]
        self.current = 0
        self.timeout = timeout
        self.context = context
        self.local = threading.local()
        self.lock = threading.Lock()

    @property
    def replica(self):
        """The replica requests go to now."""
        return self.replicas[self.current]

    def failover(self, replica):
        """Moves on from `replica`, which could not be reached, to the next one; once, however
        many threads saw it fail."""
        with self.lock:
            if len(self.replicas) > 1 and self.replicas[self.current] is replica:
                self.current = (self.current + 1) % len(self.replicas)

    def get(self):
        """This thread's connection to the replica in use, and that replica."""
        replica = self.replica
        conn = getattr(self.local, "conn", None)
        if conn is not None and self.local.replica is not replica:
            self.drop()
            conn = None
        if conn is None:
            if replica.scheme == "https":
                conn = http.client.HTTPSConnection(replica.host, replica.port, timeout=self.timeout,
                                                   context=self.context)
            else:
                conn = http.client.HTTPConnection(replica.host, replica.port, timeout=self.timeout)
            self.local.conn, self.local.replica = conn, replica
        return conn, replica

    def drop(self):
        conn = getattr(self.local, "conn", None)
        if conn is not None:
            conn.close()
            self.local.conn = None


_MODEL_VERSION = "X-Zt-Model-Version"

# Which dimension of each weight a tensor-parallel rank holds a share of, for the usual
# transformer layouts (Llama, Mistral, Qwen and their kin, as vLLM divides them): column-parallel
# layers (q, k, v, gate, up, and the fused qkv and gate_up) and the embeddings and lm_head split
# their rows (dimension 0); row-parallel layers (o, down) split their columns (dimension 1);
# norms are whole on every rank. The first pattern (fnmatch, on the whole name) that matches
# wins; a name no pattern matches is loaded whole.
TRANSFORMER_SHARD_DIMS = {
    "*norm*": None,
    "*.q_proj.*": 0,
    "*.k_proj.*": 0,
    "*.v_proj.*": 0,
    "*.qkv_proj.*": 0,
    "*.gate_proj.*": 0,
    "*.up_proj.*": 0,
    "*.gate_up_proj.*": 0,
    "*.o_proj.weight": 1,
    "*.down_proj.weight": 1,
    "*embed_tokens.weight": 0,
    "lm_head.weight": 0,
}


class _Component:
    """One component being fetched: its buffer, its pending chunks, and the model version
    (from the manifest's response) every response for it must come from."""

    def __init__(self, obj, meta, buffer, version):
        self.object = obj
        self.meta = meta
        self.buffer = buffer
        self.version = version
        self.pending = 0
        self.lock = threading.Lock()
        # `Repr-Digest` of the representation the ranges were cut from, when the server sent one.
        self.repr_digest = None
        # The declared digest computed span by span as they arrive, when there is one.
        self.hashing = None


class Client:
    """A ztserve server. `token` defaults to the `ZTSERVE_TOKEN` environment variable.

    Over https://, the server is always verified: against the system's roots, or `ca_file` (a
    PEM bundle; default `ZTSERVE_CA_FILE`). `cert_file` and `key_file` present a client
    certificate to a server that asks for one (mTLS).

    `url` may name replicas of one store (comma-separated, or a list): requests go to the
    first until it cannot be reached, then to the next.

    A failed request is tried again `retries` times with backoff; while the server cannot be
    reached or is restarting (a refused or broken connection, 502, 503, 504), for up to
    `outage_secs` without progress, so a load goes on across a server that is restarted, or
    replaced behind its address, and moves to another replica where there are several. A load
    is pinned to the model's version throughout: a replica serving another version fails it
    with ModelChanged."""

    def __init__(self, url, token=None, *, concurrency=8, chunk_size=8 << 20, retries=4, timeout=60.0,
                 outage_secs=60.0, ca_file=None, cert_file=None, key_file=None):
        if concurrency < 1 or chunk_size < 1:
            raise ValueError("concurrency and chunk_size must be at least 1")
        urls = replica_urls(url)
        context = tls_context(urls[0], ca_file, cert_file, key_file)
        self.token = token if token is not None else (os.environ.get("ZTSERVE_TOKEN") or None)
        self.concurrency = concurrency
        self.chunk_size = chunk_size
        self.retries = retries
        self.outage_secs = outage_secs
        self._connections = _Connections(urls, timeout, context)
        # One pool for the client's life: its threads keep their keep-alive connections from
        # one load to the next (a loader fetching in batches would otherwise reconnect each time).
        self._pool = None
        self._pool_lock = threading.Lock()

    @property
    def url(self):
        """The URL of the replica requests go to now."""
        return self._connections.replica.url

    def close(self):
        """Ends the transfer threads and their connections; the client opens new ones if used again."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _executor(self):
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="ztserve-client")
            return self._pool

    # ---------------------------------------------------------------- requests

    def _headers(self, extra=None):
        headers = {"User-Agent": "ztserve-client/0.1"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if extra:
            headers.update(extra)
        return headers

    def _request(self, path, headers, on_response):
        """GET `path` and hand the open response to `on_response`; retries transient failures
        (connection errors, bodies ended early, 5xx, 408, 429) with exponential backoff, an
        unreachable server for up to `outage_secs`."""
        patience = _Patience(self)
        while True:
            conn, replica = self._connections.get()
            # A kept-alive connection the server closed while idle is tried again there, on a
            # new one; a new one that fails means the replica cannot be reached.
            fresh = conn.sock is None
            try:
                conn.request("GET", replica.base + path, headers=self._headers(headers))
                response = conn.getresponse()
                if response.status >= 400:
                    error = self._error(response, path, replica.url)
                    if response.status >= 500 or response.status in (408, 429):
                        raise _Retry(error, response.getheader("Retry-After"))
                    raise error
                result = on_response(response)
                if response.will_close:
                    self._connections.drop()
                return result
            except _Retry as retry:
                self._connections.drop()
                outage = retry.error.status in _OUTAGE_STATUSES
                if outage:
                    self._connections.failover(replica)
                if not patience.wait(outage, retry.retry_after):
                    raise retry.error from None
            except _TRANSIENT as e:
                self._connections.drop()
                if fresh:
                    self._connections.failover(replica)
                if not patience.wait(True, None):
                    raise TransferError(f"GET {replica.url}{path}: {e} ({patience.tried()})") from e
            except BaseException:
                self._connections.drop()
                raise

    def _error(self, response, path, url=None):
        """The error `response` carries, for `path` at `url` (default: the replica in use)."""
        body = response.read(64 << 10)
        if (response.getheader("Content-Encoding") or "").strip().lower() == "gzip":
            import gzip

            try:
                body = gzip.decompress(body)
            except (OSError, EOFError):
                pass
        try:
            error = json.loads(body)["error"]
            code, message = error["code"], error["message"]
        except (ValueError, KeyError, TypeError):
            code, message = "http_error", body[:200].decode("utf-8", "replace").strip() or response.reason
        return error_for(response.status, code, message, (url or self.url) + path)

    def _json(self, path):
        return self._request(path, _JSON_CODING, _read_json)

    # ---------------------------------------------------------------- JSON routes

    def models(self):
        """Every model the server lists (for this token): dicts with id, status, size, url, …"""
        return self._json("/models")["models"]

    def manifest(self, model):
        """The model's manifest: version, attributes and every object with its components."""
        return self._json(f"/models/{_segment(model)}")

    def file(self, model, name, limit=64 << 20):
        """A file beside the model (`config.json`, a tokenizer file), by its path below the
        model's directory, as bytes; ZtserveError when it is larger than `limit`."""
        path = f"/models/{_segment(model)}/files/{_segment(name)}"

        def read(response):
            length = response.getheader("Content-Length")
            if length is not None and int(length) > limit:
                raise ZtserveError(f"{self.url}{path} is {int(length)} bytes, more than the {limit} bytes asked for")
            body = response.read(limit + 1)
            if len(body) > limit:
                raise ZtserveError(f"{self.url}{path} is more than the {limit} bytes asked for")
            return body

        return self._request(path, None, read)

    def snapshot(self, model):
        """The model as it is now: its manifest and version. Everything fetched through the
        snapshot (`Snapshot.fetch`) must come from that version, or `ModelChanged` is raised."""
        manifest, version = self._versioned_manifest(model)
        return Snapshot(self, model, manifest, version)

    def _versioned_manifest(self, model):
        """The manifest and the version of the stored file it was read from."""
        path = f"/models/{_segment(model)}"

        def read(response):
            version = response.getheader(_MODEL_VERSION)
            if not version:
                raise ZtserveError(f"{self.url}{path} sent no {_MODEL_VERSION} header, so a load could mix versions of the model; is it a ztserve server?")
            return _read_json(response), version

        return self._request(path, _JSON_CODING, read)

    def deltas(self, model, base, regions):
        """Each of `regions` of `model` (B; may be pinned `id@version`) as a delta from `base`
        (A, `id` or `id@version`): an iterator of one checked delta (bytes-like, header and
        payload, for `apply_delta`) per region, in order, by `POST /models/{B}/deltas`. A region
        is a dict (`object`, `component`?, `slice`?) or a `(name, box)` pair. A body cut short
        or a CRC32C that does not match is asked for again from the first delta not yet handed
        out, then raised as TransferError; a version no longer served raises `VersionGone` (a
        `ModelChanged`), a model not there `NotFound`. The iterator's `version`,
        `from_version` and `received` (bytes read) are set as it goes."""
        from ._deltas import DeltaStream

        return DeltaStream(self, model, base, regions)

    # ---------------------------------------------------------------- loading

    def load(self, model, names=None, device="cpu", framework="numpy", *, tp_rank=None, tp_size=None, shard_dims=None):
        """The model's objects (all, or those in `names`) as a dict name → array or tensor.

        With `tp_rank` and `tp_size`, only that tensor-parallel rank's share of each weight is
        fetched, cut by the server: `shard_dims` maps name patterns (fnmatch, first match
        wins) to the dimension to split evenly among `tp_size` ranks (the last rank taking
        any remainder), or to None for a weight every rank holds whole; by default
        `TRANSFORMER_SHARD_DIMS`. A name no pattern matches is loaded whole."""
        if (tp_rank is None) != (tp_size is None):
            raise ValueError("give both tp_rank and tp_size, or neither")
        if tp_size is not None and not (isinstance(tp_size, int) and isinstance(tp_rank, int) and 0 <= tp_rank < tp_size):
            raise ValueError(f"tp_rank must be an integer in [0, tp_size), and tp_size a positive integer; got {tp_rank} of {tp_size}")
        if shard_dims is not None and tp_size is None:
            raise ValueError("shard_dims needs tp_rank and tp_size")
        device, pinned = _target(framework, device)
        manifest, version = self._versioned_manifest(model)
        objects = manifest["objects"]
        if names is not None:
            wanted = list(dict.fromkeys(names))
            by_name = {o["name"]: o for o in objects}
            missing = [n for n in wanted if n not in by_name]
            if missing:
                raise NotFound(404, "object_not_found", f"model {model!r} has no object named {missing[0]!r}", self.url)
            objects = [by_name[n] for n in wanted]
        if tp_size is not None:
            rules = TRANSFORMER_SHARD_DIMS if shard_dims is None else shard_dims
            objects = [_rank_share(obj, _shard_dim(obj, rules), tp_rank, tp_size) for obj in objects]
        components = self._fetch(model, objects, pinned, version)
        return {obj["name"]: value for obj, value in zip(objects, _assemble(objects, components, framework, device, pinned))}

    def _fetch(self, model, objects, pinned, version):
        """Every component's decoded bytes, each in its own buffer, fetched concurrently, every
        response from the file `version` the manifest came from. Objects are keyed by position:
        one object may be asked for several times (different slices of it)."""
        out = []
        tasks = []
        for obj in objects:
            out.append([])
            for meta in obj["components"]:
                component = _Component(obj, meta, _buffer(meta["decoded_length"], pinned), version)
                out[-1].append(component)
                path = f"/models/{_segment(model)}/objects/{_segment(obj['name'])}/components/{_segment(meta['role'])}"
                if "query" in obj:
                    path += "?" + obj["query"]
                # A 1.x zstd frame travels compressed and is checked against its stored digest.
                # Everything else (raw, and v2 seekable parts, whose frames the server decodes
                # in parallel and whose digest covers the decoded bytes) arrives decoded, by ranges.
                if meta["encoding"] == "zstd":
                    component.pending = 1
                    tasks.append((meta["stored_length"], self._fetch_frame, (component, path)))
                else:
                    length = meta["decoded_length"]
                    spans = [(start, min(start + self.chunk_size, length)) for start in range(0, length, self.chunk_size)]
                    component.pending = len(spans)
                    if meta.get("digest") and spans:
                        # Hashed in order while later spans are still arriving.
                        component.hashing = _Hashing(_Hash(component, meta["digest"], "the manifest declares"), spans)
                    tasks.extend((end - start, self._fetch_range, (component, path, index, (start, end))) for index, (start, end) in enumerate(spans))
                    if not spans:
                        _check(component, component.buffer)
        # Largest first, so one big component is not left to run alone at the end.
        tasks.sort(key=lambda task: -task[0])
        pool = self._executor()
        futures = [pool.submit(function, *args) for _, function, args in tasks]
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            # Let the transfers already running end before the buffers are dropped.
            for future in futures:
                try:
                    future.result()
                except BaseException:
                    pass
            raise
        return out

    def _fetch_range(self, component, path, index, span):
        start, end = span
        view = memoryview(component.buffer)[start:end]

        def read_into(response):
            _check_version(component, response, path)
            component.repr_digest = response.getheader("Repr-Digest") or component.repr_digest
            if response.status != 206 or response.getheader("Content-Range", "").split("/")[0] != f"bytes {start}-{end - 1}":
                raise ZtserveError(f"asked for bytes {start}-{end - 1} of {path}, got {response.status} {response.getheader('Content-Range')}")
            _read_exactly(response, view)

        self._request(path, {"Range": f"bytes={start}-{end - 1}"}, read_into)
        if component.hashing is not None:
            component.hashing.arrived(index, component.buffer)
            return
        with component.lock:
            component.pending -= 1
            last = component.pending == 0
        if last:
            _check(component, component.buffer)

    def _fetch_frame(self, component, path):
        """A zstd component: its stored frame, checked against the stored digest, then
        decompressed into the component's buffer. Legacy big-endian data is not sent as a
        frame; its decoded bytes arrive instead and are used as they are."""
        meta = component.meta

        def read(response):
            _check_version(component, response, path)
            if response.getheader("Content-Encoding") == "zstd":
                frame = bytearray(meta["stored_length"])
                _read_exactly(response, memoryview(frame))
                return frame
            _read_exactly(response, memoryview(component.buffer))
            return None

        frame = self._request(path, {"Accept-Encoding": "zstd"}, read)
        if frame is not None:
            _check(component, frame)
            _decompress(frame, component, path)


def _shard_dim(obj, rules):
    """The dimension of `obj` the first matching rule splits, or None to load it whole."""
    for pattern, dim in rules.items():
        if fnmatch.fnmatchcase(obj["name"], pattern):
            if dim is not None and not -len(obj["shape"]) <= dim < len(obj["shape"]):
                raise ValueError(f"{obj['name']!r} (shape {obj['shape']}) has no dimension {dim}, which {pattern!r} splits")
            return dim
    return None


def _rank_share(obj, dim, rank, size):
    """`obj` as rank `rank` of `size` loads it: whole when `dim` is None, otherwise its share of
    dimension `dim` (an even split, the last rank taking any remainder), cut by the server."""
    if dim is None:
        return obj
    shape = obj["shape"]
    dim %= len(shape)
    each = shape[dim] // size
    start = rank * each
    stop = shape[dim] if rank == size - 1 else start + each
    return _region_share(obj, tuple((start, stop) if d == dim else (0, n) for d, n in enumerate(shape)))


def _region_share(obj, region):
    """`obj` cut to `region` (one `(start, stop)` per leading dimension, the rest whole), fetched
    as the server's slice (`?slice=`), whose bytes the whole object's digest does not cover."""
    if region is None:
        return obj
    if obj["format"] != "dense" or len(obj["components"]) != 1:
        raise ValueError(f"{obj['name']!r} is a {obj['format']} object of {len(obj['components'])} components; only dense tensors are split")
    meta = obj["components"][0]
    if meta.get("type") == "f4_e2m1":
        raise ValueError(f"{obj['name']!r} packs two f4_e2m1 elements per byte, so it cannot be split")
    shape = list(obj["shape"])
    if len(region) > len(shape):
        raise ValueError(f"{obj['name']!r} (shape {shape}) has no dimension {len(shape)}, which the region {region} cuts")
    for d, (start, stop) in enumerate(region):
        if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop <= shape[d]):
            raise ValueError(f"{obj['name']!r} (shape {shape}): {start}:{stop} is not within dimension {d}")
        shape[d] = stop - start
    itemsize = _dtypes.numpy_dtype(meta["dtype"], meta.get("type")).itemsize
    length = int(np.prod(shape, dtype=np.int64)) * itemsize
    share = dict(meta, decoded_length=length, digest=None, encoding="raw")
    spec = ",".join(f"{start}:{stop}" for start, stop in region)
    return dict(obj, shape=shape, components=[share], query=f"slice={spec}", region=tuple(region))


class Snapshot:
    """A model at one version: `manifest`, `version`, and `objects` by name. `fetch` loads
    whole objects or regions of dense ones, every byte from that version."""

    def __init__(self, client, model, manifest, version):
        self.client = client
        self.model = model
        self.manifest = manifest
        self.version = version
        self.objects = {o["name"]: o for o in manifest["objects"]}

    def fetch(self, requests, framework="torch", device="cpu"):
        """One array or tensor per `(name, region)` of `requests`, in order: the whole object
        when `region` is None, else the sub-tensor of one `(start, stop)` per leading dimension,
        cut by the server. Dense tensors come as `stream` fetches them, the rest (sparse and
        other objects of several components) by ranges of each component. Raises
        `ModelChanged` if the model's version is no longer the snapshot's."""
        device, pinned = _target(framework, device)
        dense = [i for i, (name, _) in enumerate(requests) if _is_dense(self._object(name))]
        out = [None] * len(requests)
        if dense:
            wanted = [requests[i] for i in dense]
            total = sum(_share_bytes(self._object(name), region) for name, region in wanted)
            for i, value in zip(dense, self.stream(wanted, framework, device, ahead_bytes=max(total, 1))):
                out[i] = value
        fetched = set(dense)
        others = [i for i in range(len(requests)) if i not in fetched]
        if others:
            objects = [_region_share(self._object(requests[i][0]), requests[i][1]) for i in others]
            components = self.client._fetch(self.model, objects, pinned, self.version)
            for i, value in zip(others, _assemble(objects, components, framework, device, pinned)):
                out[i] = value
        return out

    def stream(self, requests, framework="torch", device="cpu", *, ahead_bytes=128 << 20, request_bytes=16 << 20,
               concurrency=None, pieces=False, cpus=None):
        """The arrays or tensors of `requests` (`(name, region)` of dense tensors, as `fetch`
        takes them) one at a time, in order, as an iterator: fetched ahead in requests of about
        `request_bytes` that carry many regions each (`POST .../regions`, pinned to this
        snapshot's version, every region checked against its CRC32C and a whole component against
        the digest its manifest declares), on `concurrency`
        connections (default: the client's; their threads confined to `cpus` when given), with
        at most about `ahead_bytes` fetched and not yet yielded. Buffers are reused once nothing
        yielded refers to them. A whole zstd frame travels compressed, checked against its
        stored digest.

        With `pieces`, each request comes as a list of `(box, pending)` that tile it (`box`: one
        `(start, stop)` per dimension of the object), as it is fetched: a region larger than
        `request_bytes` in several, never copied into one, handed out once its first piece is in;
        `pending.result()` waits for a piece and gives its array."""
        device, pinned = _target(framework, device)
        items = []
        for name, region in requests:
            obj = self._object(name)
            if not _is_dense(obj):
                raise ValueError(f"{name!r} is a {obj['format']} object of {len(obj['components'])} components; "
                                 "stream() fetches dense tensors (fetch() takes any object)")
            share = _region_share(obj, region)
            items.append(_regions.Item(share, obj["shape"], share["components"][0]["decoded_length"]))

        def convert(share, view):
            component = _Component(share, share["components"][0], view, self.version)
            return _assemble([share], [[component]], framework, device, pinned)[0]

        def fetch_frame(share, view):
            meta = share["components"][0]
            component = _Component(share, meta, view, self.version)
            path = f"/models/{_segment(self.model)}/objects/{_segment(share['name'])}/components/{_segment(meta['role'])}"
            self.client._fetch_frame(component, path)

        def check_whole(share, view):
            _check(_Component(share, share["components"][0], view, self.version), view)

        fetched = _regions.RegionStream(
            self.client, self.model, self.version, items, convert, fetch_frame=fetch_frame, check_whole=check_whole,
            ahead_bytes=ahead_bytes,
            request_bytes=request_bytes, concurrency=concurrency or self.client.concurrency, pinned=pinned, cpus=cpus)
        if pieces:
            return iter(fetched)
        return (_joined(item.box(), [(box, piece.result()) for box, piece in tiles], framework)
                for item, tiles in zip(items, fetched))

    def deltas(self, base, regions):
        """`Client.deltas` of this snapshot's model pinned to its version (B), from `base`."""
        from ._deltas import DeltaStream

        pinned = f"{self.model}@{self.version.strip(chr(34))}"
        return DeltaStream(self.client, pinned, base, regions, pinned_version=self.version)

    def _object(self, name):
        if name not in self.objects:
            raise NotFound(404, "object_not_found", f"model {self.model!r} has no object named {name!r}", self.client.url)
        return self.objects[name]


def _joined(box, tiles, framework):
    """One array of `box` from the `(box, array)` tiles that cover it (the tile itself when one)."""
    if len(tiles) == 1:
        return tiles[0][1]
    first = tiles[0][1]
    shape = [stop - start for start, stop in box]
    if framework == "numpy":
        out = np.empty(shape, dtype=first.dtype)
    else:
        import torch

        out = torch.empty(shape, dtype=first.dtype, device=first.device)
    for tile_box, tile in tiles:
        out[tuple(slice(a - start, b - start) for (a, b), (start, _) in zip(tile_box, box))] = tile
    return out


def _is_dense(obj):
    return obj["format"] == "dense" and len(obj["components"]) == 1


def _share_bytes(obj, region):
    """The decoded bytes of `region` of dense `obj` (all of it when None)."""
    return _region_share(obj, region)["components"][0]["decoded_length"]


def _target(framework, device):
    """The device to put arrays on, and whether buffers are pinned for a CUDA copy."""
    if framework not in ("numpy", "torch"):
        raise ValueError(f"framework must be 'numpy' or 'torch', not {framework!r}")
    if framework == "numpy":
        if device != "cpu":
            raise ValueError("numpy arrays live on the CPU; use framework='torch' for another device")
        return device, False
    import torch

    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ZtserveError(f"device {device} was asked for, but torch sees no CUDA device")
    return device, device.type == "cuda"


def _assemble(objects, components, framework, device, pinned):
    """The arrays or tensors of `objects`, from their fetched `components` (same order). To a
    CUDA device, the copies from the pinned buffers run on a stream of their own, so they
    overlap what the caller's stream is doing; the tensors are complete when this returns and
    are marked as used by the caller's stream, so their memory is not reused under it."""
    parts = [{c.meta["role"]: c for c in fetched} for fetched in components]
    if not pinned:
        return [_as_numpy(obj, p) if framework == "numpy" else _as_torch(obj, p, device) for obj, p in zip(objects, parts)]
    import torch

    consumer = torch.cuda.current_stream(device)
    copies = torch.cuda.Stream(device)
    with torch.cuda.stream(copies):
        result = [_as_torch(obj, p, device) for obj, p in zip(objects, parts)]
    copies.synchronize()
    for value in result:
        _used_by(value, consumer)
    return result


def _used_by(value, stream):
    """Marks every CUDA tensor in `value` (dense, sparse, or a dict of them) as used by `stream`."""
    import torch

    if isinstance(value, dict):
        for one in value.values():
            _used_by(one, stream)
    elif value.layout == torch.sparse_csr:
        for one in (value.crow_indices(), value.col_indices(), value.values()):
            one.record_stream(stream)
    elif value.layout == torch.sparse_coo:
        for one in (value._indices(), value._values()):
            one.record_stream(stream)
    else:
        value.record_stream(stream)


# A manifest of 100,000 tensors is tens of MB of JSON, a tenth of it gzipped.
_JSON_CODING = {"Accept-Encoding": "gzip"}


def _read_json(response):
    body = response.read()
    coding = (response.getheader("Content-Encoding") or "identity").strip().lower()
    if coding == "gzip":
        import gzip

        body = gzip.decompress(body)
    elif coding != "identity":
        raise ZtserveError(f"the server answered JSON in {coding!r}, which was not asked for")
    return json.loads(body)


class _Retry(Exception):
    def __init__(self, error, retry_after):
        self.error = error
        self.retry_after = retry_after


def _buffer(length, pinned):
    """A writable byte buffer: numpy memory, or page-locked torch memory for a CUDA copy."""
    if pinned:
        import torch

        return torch.empty(length, dtype=torch.uint8, pin_memory=True).numpy()
    return np.empty(length, dtype=np.uint8)


def _check_version(component, response, path):
    found = response.getheader(_MODEL_VERSION)
    if found != component.version:
        raise ModelChanged(f"{path}: the model changed on the server during the load (the manifest came from file version "
                           f"{component.version}, this response from {found}); load it again")


def _fill(response, view):
    """Reads the next `len(view)` bytes of the body into `view`; a body that ends first raises
    `IncompleteRead`."""
    got = 0
    while got < len(view):
        n = response.readinto(view[got:])
        if not n:
            raise http.client.IncompleteRead(bytes(), len(view) - got)
        got += n


def _read_exactly(response, view):
    _fill(response, view)
    # The server promised exactly this many bytes; anything more is a protocol error.
    if response.read(1):
        raise ZtserveError(f"the body is longer than the {len(view)} bytes expected")


def _check(component, received):
    """Checks the bytes a component's digest covers (its stored frame, or its decoded bytes:
    `digest_covers` says which, and the caller passes those) against the declared digest, or
    else the server's `Repr-Digest` of them."""
    digest, source = component.meta.get("digest"), "the manifest declares"
    if not digest:
        digest, source = _repr_sha256(component), "the server's Repr-Digest states"
    if digest:
        check = _Hash(component, digest, source)
        check.update(received)
        check.verify()


class _Hash:
    """An incremental digest of a component's bytes, against the `digest` (`ALGORITHM:VALUE`)
    that `source` states."""

    def __init__(self, component, digest, source):
        self.component, self.digest, self.source = component, digest, source
        self.algorithm, _, self.expected = digest.partition(":")
        if self.algorithm == "xxh3":
            import xxhash

            self.state = xxhash.xxh3_64()
        elif self.algorithm == "sha256":
            self.state = hashlib.sha256()
        elif self.algorithm == "crc32c":
            self.state = 0
        else:
            raise ZtserveError(f"{self._name()}: unknown digest algorithm {self.algorithm!r}")

    def _name(self):
        return f"{self.component.object['name']!r}.{self.component.meta['role']!r}"

    def update(self, data):
        if self.algorithm == "crc32c":
            import crc32c

            self.state = crc32c.crc32c(data, self.state)
        else:
            self.state.update(data)

    def verify(self):
        if self.algorithm == "crc32c":
            found = f"0x{self.state:08X}"
            matches = int(self.expected, 16) == self.state
        else:
            found = self.state.hexdigest()
            matches = found == self.expected.lower()
        if not matches:
            raise DigestMismatch(f"{self._name()}: bytes received hash to {self.algorithm}:{found}, {self.source} {self.digest}")


class _Hashing:
    """Feeds a component's spans to its digest in order as they arrive: the thread whose span
    is next hashes it and every later one already there, so the check overlaps the transfer
    and ends just after the last span; that thread raises a mismatch."""

    def __init__(self, check, spans):
        self.check = check
        self.spans = spans
        self.arrived_spans = set()
        self.next = 0
        self.busy = False
        self.lock = threading.Lock()

    def arrived(self, index, buffer):
        with self.lock:
            self.arrived_spans.add(index)
            if self.busy or index != self.next:
                return
            self.busy = True
        view = memoryview(buffer)
        while True:
            start, end = self.spans[self.next]
            self.check.update(view[start:end])
            with self.lock:
                self.next += 1
                if self.next not in self.arrived_spans:
                    self.busy = False
                    done = self.next == len(self.spans)
                    break
        if done:
            self.check.verify()


def _repr_sha256(component):
    """The server's `Repr-Digest` (RFC 9530) of the bytes it sent, as `sha256:HEX`, if any."""
    header = component.repr_digest
    if not header:
        return None
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        if key.strip().lower() == "sha-256" and value.startswith(":") and value.endswith(":"):
            import base64
            import binascii

            try:
                return "sha256:" + base64.b64decode(value[1:-1], validate=True).hex()
            except binascii.Error:
                raise ZtserveError(f"{component.object['name']!r}: the server sent a malformed Repr-Digest {header!r}") from None
    return None


def _decompress(frame, component, path):
    import zstandard

    out = memoryview(component.buffer)
    reader = zstandard.ZstdDecompressor().stream_reader(frame)
    got = 0
    while got < len(out):
        n = reader.readinto(out[got:])
        if not n:
            break
        got += n
    if got != len(out) or reader.read(1):
        raise ZtserveError(f"{path}: the zstd frame does not decode to the {len(out)} bytes the manifest declares")


# -------------------------------------------------------------------- assembly


def _typed(component):
    meta = component.meta
    dtype = _dtypes.numpy_dtype(meta["dtype"], meta.get("type"))
    return component.buffer.view(dtype)


def _as_numpy(obj, parts):
    fmt, shape = obj["format"], tuple(obj["shape"])
    if fmt == "dense" and set(parts) == {"data"} and parts["data"].meta.get("type") == "f4_e2m1":
        return _dtypes.unpack_f4(parts["data"].buffer, shape)
    if fmt == "dense" and set(parts) == {"data"}:
        return _typed(parts["data"]).reshape(shape)
    if fmt in ("sparse_csr", "zt.sparse_csr/1"):
        import scipy.sparse

        indices = _typed(parts["indices"]).astype(np.int64, copy=False)
        indptr = _typed(parts["indptr"]).astype(np.int64, copy=False)
        return scipy.sparse.csr_array((_typed(parts["values"]), indices, indptr), shape=shape)
    if fmt in ("sparse_coo", "zt.sparse_coo/1"):
        import scipy.sparse

        values = _typed(parts["values"])
        coords = _typed(parts["coords"]).astype(np.int64, copy=False).reshape(len(shape), values.shape[0])
        return scipy.sparse.coo_array((values, tuple(coords)), shape=shape)
    return {role: _typed(c) for role, c in parts.items()}


def _torch_tensor(component, device):
    import torch

    meta = component.meta
    raw = torch.from_numpy(component.buffer)
    tensor = raw.view(_dtypes.torch_dtype(meta["dtype"], meta.get("type"))) if raw.numel() else torch.empty(
        0, dtype=_dtypes.torch_dtype(meta["dtype"], meta.get("type")))
    return tensor.to(device, non_blocking=True) if device.type != "cpu" else tensor


def _as_torch(obj, parts, device):
    import torch

    fmt, shape = obj["format"], tuple(obj["shape"])
    if fmt == "dense" and set(parts) == {"data"} and parts["data"].meta.get("type") == "f4_e2m1":
        # torch has no unpacked 4-bit float: the codes, one per byte, as uint8 (low nibble first).
        codes = _dtypes.unpack_f4(parts["data"].buffer, shape).view(np.uint8)
        tensor = torch.from_numpy(np.ascontiguousarray(codes))
        return tensor.to(device, non_blocking=True) if device.type != "cpu" else tensor
    if fmt == "dense" and set(parts) == {"data"}:
        return _torch_tensor(parts["data"], device).reshape(shape)
    if fmt in ("sparse_csr", "zt.sparse_csr/1"):
        values = _torch_tensor(parts["values"], device)
        indices = _torch_tensor(parts["indices"], device).to(torch.int64)
        indptr = _torch_tensor(parts["indptr"], device).to(torch.int64)
        return torch.sparse_csr_tensor(indptr, indices, values, size=shape, check_invariants=True)
    if fmt in ("sparse_coo", "zt.sparse_coo/1"):
        values = _torch_tensor(parts["values"], device)
        coords = _torch_tensor(parts["coords"], device).to(torch.int64).reshape(len(shape), values.shape[0])
        return torch.sparse_coo_tensor(coords, values, size=shape, check_invariants=True)
    return {role: _torch_tensor(c, device) for role, c in parts.items()}
