"""Regions of one model version fetched ahead of their reader (`Snapshot.stream`).

Every wanted region (a whole dense tensor, or a rank's slice of one) is cut, in order, into
parts that fill buffers of `request_bytes` each (a region larger than that becomes several
parts, cut along its first dimension of more than one element, so each part's bytes are
contiguous). Each buffer's parts travel in one `POST /models/{id}@{version}/regions`, whose body
is every part's bytes followed by its CRC32C: read straight into place, checked as they land
(a whole component against the digest its writer declared as well), and a region is handed to
the reader as soon as its last part is in. Workers (`concurrency`
threads, each with a connection of its own) fetch buffers in order while the bytes fetched and
not yet handed out stay under `ahead_bytes`; a broken connection resumes at the first part not
yet checked. Buffers are reused once nothing handed out refers to them any more: what a fresh
buffer costs is its pages' first touch, on a VM as much as the transfer itself, so the memory a
load touches is about `ahead_bytes` plus twice its largest region, whatever the model's size."""

import http.client
import json
import mmap
import os
import sys
import threading
import urllib.parse

import crc32c
import numpy as np

from ._errors import DigestMismatch, ModelChanged, TransferError, ZtserveError
from ._retry import _OUTAGE_STATUSES, _Patience
from ._wire import Wire

# What `POST .../regions` may ask at once on a server with its default limits (4096 regions).
MAX_REGIONS = 1024
# The bytes after each part of a regions body: its CRC32C, big-endian.
CHECKSUM_BYTES = 4


class Item:
    """One wanted region: `share` (a dense object as `_region_share` cut it, or whole) of an
    object of shape `full_shape`, and `nbytes` of its decoded bytes."""

    __slots__ = ("index", "share", "full_shape", "nbytes", "frame", "parts")

    def __init__(self, share, full_shape, nbytes):
        self.index = 0
        self.share = share
        self.full_shape = tuple(full_shape)
        self.nbytes = nbytes
        meta = share["components"][0]
        # A whole zstd frame (zTensor 1.x) travels compressed, on its own route, in one piece.
        self.frame = share.get("region") is None and meta["encoding"] == "zstd"
        self.parts = []

    def box(self):
        """The region as one `(start, stop)` per dimension of the object."""
        region = self.share.get("region") or ()
        return tuple(tuple(region[d]) if d < len(region) else (0, n) for d, n in enumerate(self.full_shape))


class Part:
    """A contiguous run of an item's bytes: `box` of the object, at `offset` of `unit`'s buffer."""

    __slots__ = ("item", "box", "nbytes", "unit", "offset", "whole", "ready")

    def __init__(self, item, box, nbytes, whole):
        self.item, self.box, self.nbytes, self.whole = item, box, nbytes, whole
        self.unit, self.offset = None, 0
        self.ready = threading.Event()  # its bytes are in place and checked (or the stream failed)

    def spec(self):
        """The part as the server's `slice`, or None for a whole object."""
        return None if self.whole else ",".join(f"{start}:{stop}" for start, stop in self.box)


class _Frame:
    """A whole zstd frame: fetched compressed and decoded into its part's place."""

    __slots__ = ("part",)

    def __init__(self, part):
        self.part = part


class _Unit:
    """Parts fetched into one buffer, by one request (or one frame)."""

    __slots__ = ("index", "parts", "nbytes", "capacity", "first_item", "last_item", "slab", "task", "done", "passed")

    def __init__(self, index):
        self.index = index
        self.parts = []
        self.nbytes = 0
        self.capacity = 0  # the buffer it takes: `request_bytes`, so any unit's may be reused, or more
        self.first_item = self.last_item = 0
        self.slab = None
        self.task = None
        # Its buffer goes back to the pool once it is both fetched and passed by the reader.
        self.done = self.passed = False


def _parts(item, request_bytes):
    """`item` cut into parts of at most `request_bytes` (but whole rows) along its first
    dimension of more than one element; one part when it fits, is a frame or packs several
    elements into a byte (`f4_e2m1`), which only ever travels whole."""
    box = item.box()
    whole = item.share.get("region") is None
    shape = [stop - start for start, stop in box]
    cut = next((d for d, n in enumerate(shape) if n > 1), None)
    packed = item.share["components"][0].get("type") == "f4_e2m1"
    if item.nbytes <= request_bytes or item.frame or packed or cut is None:
        return [Part(item, box, item.nbytes, whole)]
    inner = item.nbytes // shape[cut]
    rows = max(1, request_bytes // max(inner, 1))
    parts = []
    for first in range(0, shape[cut], rows):
        last = min(first + rows, shape[cut])
        cut_box = list(box)
        cut_box[cut] = (box[cut][0] + first, box[cut][0] + last)
        parts.append(Part(item, tuple(cut_box), (last - first) * inner, False))
    return parts


def _overlaps(unit, part):
    """Whether `part` shares an element with a part of the same object in `unit` (the server
    refuses a request that asks for a byte twice)."""
    name = part.item.share["name"]
    return any(other.item.share["name"] == name and other.nbytes and part.nbytes
               and all(a < d and c < b for (a, b), (c, d) in zip(part.box, other.box)) for other in unit.parts)


def plan_units(items, request_bytes, max_regions=MAX_REGIONS):
    """Every item's parts packed in order into units of `request_bytes` and at most
    `max_regions` parts, no two of one unit overlapping (a part longer than that, a single row
    or a frame, fills a unit of its own size); a frame is a unit of its own."""
    units, unit = [], None
    for index, item in enumerate(items):
        item.index = index
        item.parts = _parts(item, request_bytes)
        for part in item.parts:
            fits = unit is not None and unit.task is None and unit.nbytes + part.nbytes <= request_bytes
            if not fits or item.frame or len(unit.parts) >= max_regions or _overlaps(unit, part):
                unit = _Unit(len(units))
                unit.first_item = index
                units.append(unit)
            part.unit, part.offset = unit, unit.nbytes
            unit.parts.append(part)
            unit.nbytes += part.nbytes
            unit.last_item = index
            if item.frame:
                unit.task = _Frame(part)
    for unit in units:
        unit.capacity = max(unit.nbytes, request_bytes)
        if unit.task is None:
            unit.task = list(unit.parts)
    return units


class _Slabs:
    """Buffers, each reused once nothing outside this pool refers to it: an array handed out
    (or the torch tensor made from it, which holds the array) keeps its buffer. At most `keep`
    bytes of free buffers are kept."""

    def __init__(self, pinned, keep):
        self.pinned = pinned
        self.keep = keep
        self.lock = threading.Lock()
        self.held = []  # buffers handed out; free once released
        self.free = []

    @staticmethod
    def _released(holder, index):
        # Two references: the holder's slot and getrefcount's own argument.
        return sys.getrefcount(holder[index]) <= 2

    def take(self, size):
        """A buffer of at least `size` bytes (and at most a quarter more): a released one, or new."""
        with self.lock:
            still = []
            for i in range(len(self.held)):
                if self._released(self.held, i):
                    self.free.append(self.held[i])
                else:
                    still.append(self.held[i])
            self.held = still
            fits = [i for i, b in enumerate(self.free) if size <= len(b) <= size + size // 4]
            buffer = self.free.pop(min(fits, key=lambda i: len(self.free[i]))) if fits else None
            while sum(len(b) for b in self.free) > self.keep:
                self.free.pop(max(range(len(self.free)), key=lambda i: len(self.free[i])))
        return buffer if buffer is not None else _allocate(size, self.pinned)

    def give(self, buffer):
        with self.lock:
            self.held.append(buffer)


def _allocate(size, pinned):
    """Page-locked memory for a copy to CUDA; otherwise an anonymous private mapping of ordinary
    pages (numpy asks for transparent huge pages for large arrays: fresh ones are zeroed 2 MiB
    at a time, which on a VM took four times as long per byte)."""
    if pinned:
        import torch

        return torch.empty(size, dtype=torch.uint8, pin_memory=True).numpy()
    if size == 0:
        return np.empty(0, dtype=np.uint8)
    return np.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), dtype=np.uint8)


class RegionStream:
    """Iterates over the wanted items, in order, each as a list of `(box, value)` pieces that
    tile it (`convert(share, buffer_view)` makes each value), fetching ahead on `concurrency`
    threads of its own (each confined to `cpus` when given). Iteration ends the stream, as does
    `close()` (or leaving a `with` block): the fetching stops and its threads are waited for."""

    def __init__(self, client, model, version, items, convert, *, fetch_frame, check_whole, ahead_bytes, request_bytes,
                 concurrency, pinned=False, cpus=None):
        self.client = client
        self.path = f"/models/{_segment(model + '@' + version.strip(chr(34)))}/regions"
        self.version = version
        self.items = items
        self.units = plan_units(items, request_bytes)
        self.convert = convert
        self.fetch_frame = fetch_frame
        self.check_whole = check_whole
        self.ahead_bytes = ahead_bytes
        self.cpus = cpus
        # A region's buffers are all held while it is read, whatever the budget, and a reader
        # holds the one before until it has the next: free buffers are kept up to the budget and
        # twice the largest region, so the regions after reuse them.
        largest = max((sum(max(p.nbytes, request_bytes) for p in item.parts) for item in items), default=0)
        self.slabs = _Slabs(pinned, keep=ahead_bytes + 2 * largest)
        self.cond = threading.Condition()
        self.next_task = 0  # the next unit a worker fetches
        self.next_unit = 0  # the next unit whose buffer is taken, in order
        self.waiting_item = 0  # the item the reader is at: the units holding it are always fetched
        self.ahead = 0  # bytes of the buffers taken and not yet handed out whole
        self.closed = False
        self.stopped = threading.Event()  # set by close(): a worker waiting to try again ends
        self.wires = []  # the workers' connections, cut by close() to end a read in progress
        self.failure = None
        self.threads = [threading.Thread(target=self._work, name=f"ztserve-regions-{i}", daemon=True)
                        for i in range(min(concurrency, len(self.units)))]
        self.started = False  # the workers start with the iteration, so an unread stream holds none

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Stops the fetching at once, a worker waiting out an outage or reading a region too,
        and waits for the threads; a piece handed out and not read yet then raises."""
        self._stop(cut=True)

    def _stop(self, cut):
        """Ends the stream: the workers take no more units (and with `cut`, leave the one they
        are at), and are waited for."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
            started = self.started
        if not started:
            return
        if cut:
            self.stopped.set()
        while any(thread.is_alive() for thread in self.threads):
            if cut:
                # Again until they end: a worker still connecting has no socket to cut yet.
                with self.cond:
                    wires = list(self.wires)
                for wire in wires:
                    wire.interrupt()
            for thread in self.threads:
                thread.join(0.1)
        if cut:
            # A piece handed out and not read yet raises rather than waits for bytes never coming.
            with self.cond:
                if self.failure is None:
                    self.failure = ZtserveError(f"{self.path}: the stream was closed")
            for item in self.items:
                for part in item.parts:
                    part.ready.set()

    def __iter__(self):
        with self.cond:
            start, self.started = not self.started and not self.closed, True
        if start:
            for thread in self.threads:
                thread.start()
        passed, completed = 0, False
        try:
            for item in self.items:
                with self.cond:
                    self.waiting_item = item.index
                    self.cond.notify_all()
                item.parts[0].ready.wait()
                self._raise_failure()
                pieces = [(part.box, _Pending(self, part, self._slab_of(part))) for part in item.parts]
                pieces[0][1].result()
                # Every unit whose items have now all been handed out is passed: its bytes no
                # longer count ahead, and once fetched its buffer goes back to the pool.
                with self.cond:
                    while passed < len(self.units) and self.units[passed].last_item <= item.index:
                        unit = self.units[passed]
                        self.ahead -= unit.capacity
                        unit.passed = True
                        self._give_back(unit)
                        passed += 1
                    self.cond.notify_all()
                # Every item handed out: a close from here on lets the pieces still arriving land.
                completed = item is self.items[-1]
                yield pieces
                del pieces
        finally:
            self._stop(cut=not completed)

    def _slab_of(self, part):
        """The buffer `part` lands in, once a worker has taken it (the units of the item the
        reader is at are taken first)."""
        with self.cond:
            while part.unit.slab is None:
                if self.failure is not None or self.closed:
                    break
                self.cond.wait()
        self._raise_failure()
        return part.unit.slab

    def _give_back(self, unit):
        """Hands a fetched and passed unit's buffer to the pool (under the lock)."""
        if unit.done and unit.passed and unit.slab is not None:
            self.slabs.give(unit.slab)
            unit.slab = None

    @staticmethod
    def _share(part):
        """The object as `part` cuts it: its shape and one component of its bytes."""
        share = part.item.share
        if len(part.item.parts) == 1:
            return share
        meta = dict(share["components"][0], decoded_length=part.nbytes)
        return dict(share, shape=[stop - start for start, stop in part.box], components=[meta], region=part.box)

    def _raise_failure(self):
        with self.cond:
            failure = self.failure
        if failure is not None:
            raise failure

    # ------------------------------------------------------------ workers

    def _work(self):
        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus)
        connections = self.client._connections
        wire = Wire(connections.timeout, connections.context)
        with self.cond:
            self.wires.append(wire)
        try:
            while True:
                with self.cond:
                    if self.closed or self.failure is not None or self.next_task >= len(self.units):
                        return
                    unit = self.units[self.next_task]
                    self.next_task += 1
                if not self._reserve(unit):
                    return
                if isinstance(unit.task, _Frame):
                    part = unit.task.part
                    self.fetch_frame(part.item.share, unit.slab[part.offset:part.offset + part.nbytes])
                    part.ready.set()
                else:
                    self._fetch(wire, unit, list(unit.task))
                with self.cond:
                    unit.done = True
                    self._give_back(unit)
        except BaseException as e:  # handed to the reader, who raises it
            with self.cond:
                if self.failure is None:
                    self.failure = e
                self.cond.notify_all()
            for item in self.items:
                for part in item.parts:
                    part.ready.set()
        finally:
            wire.close()

    def _reserve(self, unit):
        """Takes `unit`'s buffer, in unit order, once the bytes ahead of the reader leave room
        (or the reader waits for an item in it, or nothing is ahead); False when the stream ends
        first."""
        with self.cond:
            while True:
                if self.closed or self.failure is not None:
                    return False
                room = self.ahead == 0 or self.ahead + unit.capacity <= self.ahead_bytes
                if unit.index == self.next_unit and (room or unit.first_item <= self.waiting_item):
                    self.ahead += unit.capacity
                    self.next_unit += 1
                    self.cond.notify_all()  # the worker with the next unit may go on
                    break
                self.cond.wait()
        slab = self.slabs.take(unit.capacity)  # outside the lock: a new buffer takes time
        with self.cond:
            unit.slab = slab
            self.cond.notify_all()
        return True

    def _fetch(self, wire, unit, parts):
        """POSTs the parts' regions and reads each into the unit's buffer, checked against its
        CRC32C; after a broken connection, asks again for the parts not yet checked."""
        client = self.client
        headers = client._headers({"Content-Type": "application/json"})
        patience = _Patience(client, self.stopped)
        while parts:
            if self.stopped.is_set():
                raise ZtserveError(f"{self.path}: the stream was closed")
            body = json.dumps({"regions": [{"object": p.item.share["name"], **({"slice": p.spec()} if not p.whole else {})}
                                           for p in parts]}).encode()
            replica = client._connections.replica
            # A kept-alive connection the server closed while idle is tried again there, on a
            # new one; a new one that fails means the replica cannot be reached.
            fresh = not wire.connected_to(replica)
            try:
                response = wire.post(replica, replica.base + self.path, headers, body)
                if response.status != 200:
                    error = client._error(response, self.path, replica.url)
                    wire.close()
                    if response.status == 404 and error.code == "version_gone":
                        raise ModelChanged(f"{self.path}: the model changed on the server during the load ({error.message}); "
                                           "load it again")
                    if response.status >= 500 or response.status in (408, 429):
                        raise _Transient(error, response.getheader("Retry-After"))
                    raise error
                self._check_head(response, parts)
                while parts:
                    self._read_part(response, unit, parts[0])
                    parts.pop(0)
                    patience.progressed()
                if (response.getheader("Connection") or "").lower() == "close":
                    wire.close()
            except (_Transient, OSError, http.client.HTTPException, DigestMismatch) as e:
                wire.close()
                # A server gone (refused, broken, 502-504) is waited for up to outage_secs; a
                # region that hashes wrong is asked for again only `retries` times.
                outage = e.error.status in _OUTAGE_STATUSES if isinstance(e, _Transient) else not isinstance(e, DigestMismatch)
                if outage and (fresh or isinstance(e, _Transient)) and not self.stopped.is_set():
                    client._connections.failover(replica)
                if not patience.wait(outage, e.retry_after if isinstance(e, _Transient) else None):
                    if isinstance(e, _Transient):
                        raise e.error from None
                    if isinstance(e, DigestMismatch):
                        raise
                    raise TransferError(f"POST {replica.url}{self.path}: {e} ({patience.tried()})") from e
            except BaseException:
                wire.close()
                raise

    def _check_head(self, response, parts):
        found = response.getheader("X-Zt-Model-Version")
        if found != self.version:
            raise ModelChanged(f"{self.path}: the model changed on the server during the load (the load began at version "
                               f"{self.version}, this response is of {found}); load it again")
        expected = sum(p.nbytes + CHECKSUM_BYTES for p in parts)
        if response.length != expected:
            raise ZtserveError(f"{self.path}: {len(parts)} regions of {expected} bytes with their checksums were asked for; "
                               f"the server answers {response.length} bytes")

    def _read_part(self, response, unit, part):
        view = memoryview(unit.slab)[part.offset:part.offset + part.nbytes]
        trailer = bytearray(CHECKSUM_BYTES)
        try:
            response.readinto(view)
            response.readinto(memoryview(trailer))
            found = crc32c.crc32c(view)
        finally:
            view.release()
        expected = int.from_bytes(trailer, "big")
        if found != expected:
            raise DigestMismatch(f"{part.item.share['name']!r} ({part.spec() or 'whole'}): bytes received hash to crc32c "
                                 f"0x{found:08X}, the server sent 0x{expected:08X}")
        if part.whole:
            # What the writer declared of a whole component is checked too, end to end.
            self.check_whole(part.item.share, unit.slab[part.offset:part.offset + part.nbytes])
        part.ready.set()


class _Pending:
    """A part handed to the reader before its bytes may have arrived: `result()` waits for them
    and gives the part's array. It holds the part's buffer, so the buffer is never reused
    while the part can still be read."""

    __slots__ = ("stream", "part", "slab", "value")

    def __init__(self, stream, part, slab):
        self.stream, self.part, self.slab, self.value = stream, part, slab, None

    def result(self):
        if self.value is None:
            part = self.part
            part.ready.wait()
            self.stream._raise_failure()
            view = self.slab[part.offset:part.offset + part.nbytes]
            self.value = self.stream.convert(self.stream._share(part), view)
            self.slab = None
        return self.value


class _Transient(Exception):
    def __init__(self, error, retry_after):
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


def _segment(text):
    return urllib.parse.quote(text, safe="")
