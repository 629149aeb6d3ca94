"""A ztserve server's artifact store (`/artifacts`): a directory published as a signed bundle
(each file a blob under its SHA-256, then the bundle naming them) and restored on another node.
A restore checks the bundle's signature and paths before it fetches a byte, checks each blob
against its digest as it arrives into a staging directory, and only then links the files into
place, never over a file already there."""

import errno
import hashlib
import http.client
import json
import os
import shutil
import socket
import tempfile
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from . import _signing
from ._client import _Connections, replica_urls, tls_context
from ._errors import error_for

_PIECE = 1 << 20


def _check_path(path):
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or "\0" in path or any(p in ("", ".", "..") for p in parts):
        raise _signing.BundleRefused(f"path {path!r} leaves the bundle's directory")


def _files_below(directory, below=""):
    """Every file below `directory` (paths with "/"), refusing anything but regular files and
    directories: a symbolic link could publish, sign and serve a file from outside it."""
    files = []
    with os.scandir(os.path.join(directory, below)) as entries:
        for entry in entries:
            path = f"{below}/{entry.name}" if below else entry.name
            if entry.is_dir(follow_symlinks=False):
                files.extend(_files_below(directory, path))
            elif entry.is_file(follow_symlinks=False):
                files.append(path)
            else:
                raise ValueError(f"{os.path.join(directory, path)} is not a regular file or a directory: "
                                 "a bundle holds files only")
    return sorted(files)


def _open_below(directory, path):
    """File `path` below `directory`, opened for reading only if neither it nor a directory on
    the way is a symbolic link."""
    _check_path(path)
    at = directory
    for part in path.split("/")[:-1]:
        at = os.path.join(at, part)
        if os.path.islink(at):
            raise ValueError(f"{at} is a symbolic link: a bundle holds files only")
    try:
        return open(os.open(os.path.join(directory, path), os.O_RDONLY | os.O_NOFOLLOW), "rb")
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(f"{os.path.join(directory, path)} is a symbolic link: a bundle holds files only") from None
        raise


def _sha256_file(directory, path):
    digest, size = hashlib.sha256(), 0
    with _open_below(directory, path) as f:
        while piece := f.read(_PIECE):
            digest.update(piece)
            size += len(piece)
    return digest.hexdigest(), size


class ArtifactStore:
    """The artifact store of the server at `url`; `token` (default `ZTSERVE_TOKEN`) is sent as
    a bearer token, and must be granted writing (`[artifacts] writers`) to publish. Over
    https://, the server is verified against the system's roots or `ca_file` (default
    `ZTSERVE_CA_FILE`); `cert_file` and `key_file` present a client certificate (a writer
    identity of `[artifacts] writer_identities`). `url` may name replicas sharing a bucket
    (comma-separated, or a list): calls go to the first until it cannot be reached."""

    def __init__(self, url, token=None, *, concurrency=8, timeout=60.0, ca_file=None, cert_file=None, key_file=None):
        urls = replica_urls(url)
        self.token = token if token is not None else (os.environ.get("ZTSERVE_TOKEN") or None)
        self.concurrency = concurrency
        self._connections = _Connections(urls, timeout, tls_context(urls[0], ca_file, cert_file, key_file))

    @property
    def url(self):
        """The URL of the replica calls go to now."""
        return self._connections.replica.url

    def _call(self, method, path, body=None, headers=None, on_response=None):
        """`method` on `/artifacts/{path}`: the status and what `on_response` makes of the
        response (or its body); errors of 400 and up but 404 raise. `body` is bytes, or a
        callable that opens a file (so a retry sends it again). A connection the server closed
        while idle, or one that fails, is retried on a new connection (every call here may be
        repeated: blobs are named by their digest, and a bundle is published once)."""
        for attempt in range(3):
            conn, replica = self._connections.get()
            # A kept-alive connection closed while idle is tried again there; a new one that
            # fails (refused, timed out, a name that does not resolve) moves to the next replica.
            fresh = conn.sock is None
            try:
                return self._call_once(conn, replica, method, path, body, headers, on_response)
            except (ConnectionError, TimeoutError, socket.gaierror, http.client.RemoteDisconnected,
                    http.client.BadStatusLine):
                if fresh:
                    self._connections.failover(replica)
                if attempt == 2:
                    raise

    def _call_once(self, conn, replica, method, path, body, headers, on_response):
        sent = {"User-Agent": "ztserve-client/0.1", **(headers or {})}
        if self.token:
            sent["Authorization"] = f"Bearer {self.token}"
        opened = body() if callable(body) else None
        try:
            conn.request(method, f"{replica.base}/artifacts/{path}", body=opened or body, headers=sent)
            response = conn.getresponse()
            if response.status >= 400 and response.status != 404:
                raw = response.read(64 << 10)
                try:
                    error = json.loads(raw)["error"]
                    code, message = error["code"], error["message"]
                except (ValueError, KeyError, TypeError):
                    code, message = "http_error", raw[:200].decode("utf-8", "replace")
                self._connections.drop()
                raise error_for(response.status, code, message, f"{replica.url}/artifacts/{path}")
            result = on_response(response) if on_response and response.status < 300 else response.read()
            if response.will_close:
                self._connections.drop()
            return response.status, result
        except BaseException:
            self._connections.drop()
            raise
        finally:
            if opened is not None:
                opened.close()

    def bundle(self, name):
        """The bundle published as `name` (`files`, `signature`), or None."""
        status, body = self._call("GET", f"bundles/{urllib.parse.quote(name)}")
        return None if status == 404 else json.loads(body)

    def publish(self, name, directory, *, signing_key=None, files=None):
        """Publishes `files` (paths below `directory`; default every file below it) as bundle
        `name`, signed for that name with the PEM private key `signing_key`. A symbolic link
        among them (or on their way) is refused with ValueError, as `ztserve artifacts` does. Returns "created", or "exists"
        when a bundle of that name was published already (it is never written over)."""
        if self.bundle(name) is not None:
            return "exists"
        if files is None:
            files = _files_below(directory)
        listed = []
        for path in files:
            digest, size = _sha256_file(directory, path)
            listed.append({"path": path, "sha256": digest, "size": size})

        def upload(file):
            blob = f"blobs/sha256:{file['sha256']}"
            if self._call("HEAD", blob)[0] == 200:
                return
            opener = lambda: _open_below(directory, file["path"])  # noqa: E731
            self._call("PUT", blob, body=opener, headers={"Content-Length": str(file["size"])})

        with ThreadPoolExecutor(self.concurrency) as pool:
            list(pool.map(upload, listed))
        bundle = {"files": listed}
        if signing_key is not None:
            digests = {file["path"]: file["sha256"] for file in listed}
            # Signed for its name: a copy of the bundle under another name does not verify.
            bundle["signature"] = _signing.sign(signing_key, name, digests)
        try:
            self._call("PUT", f"bundles/{urllib.parse.quote(name)}", body=json.dumps(bundle).encode(),
                       headers={"Content-Type": "application/json"})
        except Exception as e:
            if getattr(e, "code", None) == "bundle_exists":
                return "exists"
            raise
        return "created"

    def restore(self, name, directory, *, public_keys=None, unsigned=False, last=()):
        """Restores bundle `name` below `directory` (created if missing): None when nothing is
        published as `name`, else a dict of `files`, `bytes`, `signer`, `placed` (files linked
        into place; one already there is left as it is). The signature must verify with one of
        `public_keys` (PEM paths) unless `unsigned`; BundleRefused says why not. Files whose
        paths start with one of `last` are placed after the others."""
        if not unsigned and not public_keys:
            raise ValueError("name the publishers' public keys, or restore unsigned")
        bundle = self.bundle(name)
        if bundle is None:
            return None
        files = {file["path"]: file for file in bundle.get("files", [])}
        for path in files:
            _check_path(path)
        signer = None
        if not unsigned:
            keys = _signing.load_public_keys(public_keys)
            signer = _signing.verify(keys, bundle.get("signature"), {p: f["sha256"] for p, f in files.items()}, name)
        os.makedirs(directory, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".ztserve-restoring-", dir=directory)
        try:
            with ThreadPoolExecutor(self.concurrency) as pool:
                list(pool.map(lambda file: self._fetch(file, staging), files.values()))
            order = sorted(files, key=lambda p: (any(p.startswith(prefix) for prefix in last), p))
            placed = 0
            for path in order:
                target = os.path.join(directory, path)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                try:
                    os.link(os.path.join(staging, path), target)
                    placed += 1
                except FileExistsError:
                    pass
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return {"files": len(files), "bytes": sum(f["size"] for f in files.values()), "signer": signer,
                "placed": placed}

    def _fetch(self, file, staging):
        target = os.path.join(staging, file["path"])
        os.makedirs(os.path.dirname(target), exist_ok=True)

        def read(response):
            digest, size = hashlib.sha256(), 0
            with open(target, "wb") as out:
                while piece := response.read(_PIECE):
                    size += len(piece)
                    if size > file["size"]:
                        raise _signing.BundleRefused(f"{file['path']!r}: the store sent more than its {file['size']} bytes")
                    digest.update(piece)
                    out.write(piece)
            return digest.hexdigest(), size

        status, got = self._call("GET", f"blobs/sha256:{file['sha256']}", on_response=read)
        if status == 404:
            raise _signing.BundleRefused(f"blob {file['sha256']} of {file['path']!r} is gone from the store")
        if got != (file["sha256"], file["size"]):
            raise _signing.BundleRefused(
                f"{file['path']!r}: the store sent bytes hashing to {got[0]}, not the {file['sha256']} signed")
