"""`POST /models/{B}/deltas`: each asked region's delta between a base version A and B, in the
order asked, each followed by the CRC32C of its bytes (docs/notes/refits-design.md, "The
contract the pieces are built against"). The body has no length: each delta is read as its
48-byte header says (`format::delta`), then its CRC."""

import http.client
import json
import struct
import urllib.parse

import crc32c

from ._client import _fill
from ._delta import HEADER_LEN, MAGIC, DeltaError, parse_delta_header
from ._errors import TransferError, ZtserveError
from ._retry import _OUTAGE_STATUSES, _Patience

CHECKSUM_BYTES = 4
# The payload length, at offset 32 of the header (`<8sBB6sQQQQ`: magic, kind, width, reserved,
# elements, changed, payload_len, xxh3).
_COUNTS = struct.Struct("<QQQ")
_TRANSIENT = (OSError, http.client.HTTPException)


def region_request(region):
    """A region as the routes take it: a dict (`object`, `component`?, `slice`?) as given, or a
    `(name, box)` pair, `box` one `(start, stop)` per leading dimension (None: the whole object)."""
    if isinstance(region, dict):
        return region
    name, box = region
    if box is None:
        return {"object": name}
    return {"object": name, "slice": ",".join(f"{start}:{stop}" for start, stop in box)}


class DeltaStream:
    """The deltas of `regions` of `model` (B) from `base` (A), as an iterator of one bytes-like
    delta per region, in order, each checked against its CRC32C and its header (a delta that
    breaks the format raises DeltaError). After the first response, `version` is B's version
    token and `from_version` A's; `received` counts the body bytes read (deltas and CRCs, what
    the server sent for them). A connection broken mid-body, or a CRC that does not match, is
    tried again from the first region not yet handed out (`retries` times), then raised as
    TransferError; HTTP errors are raised as the client maps them (410 `VersionGone`, 404
    `NotFound`)."""

    def __init__(self, client, model, base, regions, *, pinned_version=None):
        self.client = client
        self.model = model
        self.base = base
        self.regions = [region_request(r) for r in regions]
        self.path = f"/models/{urllib.parse.quote(model, safe='')}/deltas"
        self.pinned_version = pinned_version
        self.version = None
        self.from_version = None
        self.received = 0

    def __iter__(self):
        client = self.client
        connections = client._connections
        patience = _Patience(client)
        done = 0
        while done < len(self.regions):
            asked = self.regions[done:]
            body = json.dumps({"from": self.base, "regions": asked}).encode()
            conn, replica = connections.get()
            fresh = conn.sock is None
            headers = client._headers({"Content-Type": "application/json", "Accept-Encoding": "identity"})
            response = None
            try:
                conn.request("POST", replica.base + self.path, body=body, headers=headers)
                response = conn.getresponse()
                if response.status != 200:
                    error = client._error(response, self.path, replica.url)
                    connections.drop()
                    if response.status >= 500 or response.status in (408, 429):
                        raise _Transient(error, response.getheader("Retry-After"))
                    raise error
                self._check_head(response, len(asked))
                for _ in asked:
                    delta = self._read_delta(response)
                    done += 1
                    patience.progressed()
                    yield delta
                if response.read(1):
                    raise ZtserveError(f"{self.path}: the body goes on after the {len(self.regions)} deltas asked for")
                if response.will_close:
                    connections.drop()
            except (_Transient, _BadCrc, *_TRANSIENT) as e:
                connections.drop()
                outage = e.error.status in _OUTAGE_STATUSES if isinstance(e, _Transient) else not isinstance(e, _BadCrc)
                if outage and (fresh or isinstance(e, _Transient)):
                    connections.failover(replica)
                if not patience.wait(outage, e.retry_after if isinstance(e, _Transient) else None):
                    if isinstance(e, _Transient):
                        raise e.error from None
                    raise TransferError(f"POST {replica.url}{self.path}: {e} ({patience.tried()})") from e
            except BaseException:
                connections.drop()
                raise

    def _check_head(self, response, count):
        version = response.getheader("X-Zt-Model-Version")
        if self.pinned_version is not None and version != self.pinned_version:
            from ._errors import ModelChanged

            raise ModelChanged(f"{self.path}: asked for version {self.pinned_version} of {self.model}, the server answered "
                               f"with {version}")
        if self.version is not None and version != self.version:
            from ._errors import ModelChanged

            raise ModelChanged(f"{self.path}: the model changed on the server between two requests ({self.version}, then {version})")
        self.version = version
        from_version = response.getheader("x-zt-from-version")
        if self.from_version is not None and from_version != self.from_version:
            from ._errors import ModelChanged

            # A retry's deltas would apply to another base than the first answer's.
            raise ModelChanged(f"{self.path}: the base {self.base} changed on the server between two requests "
                               f"({self.from_version}, then {from_version}); pin it (`{self.base}@VERSION`)")
        self.from_version = from_version
        regions = response.getheader("x-zt-regions")
        if regions is not None and regions.strip() != str(count):
            raise ZtserveError(f"{self.path}: asked for {count} deltas, the server answers {regions}")

    def _read_delta(self, response):
        header = _read(response, HEADER_LEN)
        if header[:8] != MAGIC:
            raise DeltaError("delta_bad_magic", f"{self.path}: a delta begins with {bytes(header[:8])!r}, not b'ZTDELTA1'")
        elements, changed, payload_len = _COUNTS.unpack_from(header, 16)
        width = header[9]
        # A bound before the payload is allocated: the whole region, or the most a patch of
        # `changed` elements takes (a 10-byte gap and the value each, and zstd's worst case).
        region = elements * max(width, 1)
        bound = max(region, changed * (10 + max(width, 1))) * 2 + (1 << 20)
        if payload_len > bound:
            raise DeltaError("delta_counts", f"{self.path}: a delta of {elements} elements declares a {payload_len}-byte payload")
        delta = bytearray(HEADER_LEN + payload_len)
        delta[:HEADER_LEN] = header
        _fill(response, memoryview(delta)[HEADER_LEN:])
        trailer = _read(response, CHECKSUM_BYTES)
        self.received += len(delta) + CHECKSUM_BYTES
        found, expected = crc32c.crc32c(delta), int.from_bytes(trailer, "big")
        if found != expected:
            raise _BadCrc(f"a delta's bytes hash to crc32c 0x{found:08X}, the server sent 0x{expected:08X}")
        parse_delta_header(delta)
        return delta


def _read(response, n):
    out = bytearray(n)
    _fill(response, memoryview(out))
    return out


class _BadCrc(Exception):
    pass


class _Transient(Exception):
    def __init__(self, error, retry_after):
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after
