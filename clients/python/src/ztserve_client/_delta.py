"""Refit deltas, the receiving side: apply a delta (the elements of one region that changed
between two versions) to the region's old bytes, vectorized with numpy, with every check the
Rust codec makes (`format/src/delta.rs` specifies the wire format; its golden vectors in
`format/tests/data/delta/` test this module byte for byte). On any error the target is left as
it was."""

import struct
from typing import NamedTuple

import numpy as np
import xxhash
import zstandard

from ._errors import ZtserveError

MAGIC = b"ZTDELTA1"
_HEADER = struct.Struct("<8sBB6sQQQQ")
HEADER_LEN = _HEADER.size  # 48
PATCH, WHOLE = 0, 1
_MAX_VARINT_LEN = 10
# Varints decoded at once: a few MiB of temporaries, whatever a delta declares.
_VARINTS_AT_ONCE = 1 << 18


class DeltaError(ZtserveError):
    """A refit delta that breaks a rule of the format, or does not fit the region it is applied
    to; `code` names the rule, as the Rust codec's `FormatError::code` does."""

    def __init__(self, code, message):
        self.code = code
        super().__init__(f"refit delta: {message}")


class DeltaHeader(NamedTuple):
    kind: int  # PATCH or WHOLE
    width: int
    elements: int
    changed: int
    payload_len: int
    new_xxh3: int


def parse_delta_header(payload) -> DeltaHeader:
    """The header of `payload`, checked against itself and against the payload's length."""
    view = memoryview(payload).cast("B")
    if len(view) < HEADER_LEN:
        raise DeltaError("delta_truncated", f"{len(view)} bytes, shorter than the {HEADER_LEN}-byte header")
    magic, kind, width, reserved, elements, changed, payload_len, digest = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise DeltaError("delta_bad_magic", f"magic {magic!r} is not b'ZTDELTA1'")
    if kind not in (PATCH, WHOLE):
        raise DeltaError("delta_bad_kind", f"kind {kind} is not 0 (patch) or 1 (whole)")
    if width not in (1, 2, 4, 8):
        raise DeltaError("delta_bad_width", f"element width {width} is not 1, 2, 4 or 8")
    if reserved != bytes(6):
        raise DeltaError("delta_bad_header", "reserved header bytes 10..16 are not zero")
    region = elements * width
    if region >= 1 << 64:
        raise DeltaError("delta_counts", f"{elements} elements of {width} bytes overflow 64 bits")
    if kind == WHOLE:
        counts_ok = changed == elements and payload_len == region
    else:
        counts_ok = changed <= elements // 2 and (changed == 0) == (payload_len == 0)
    if not counts_ok:
        raise DeltaError(
            "delta_counts",
            f"{'whole' if kind else 'patch'} of {elements} elements says {changed} changed in a "
            f"{payload_len}-byte payload",
        )
    actual = len(view) - HEADER_LEN
    if actual != payload_len:
        code = "delta_truncated" if actual < payload_len else "delta_trailing_bytes"
        raise DeltaError(code, f"the header declares a {payload_len}-byte payload, {actual} bytes follow it")
    return DeltaHeader(kind, width, elements, changed, payload_len, digest)


def _writable_bytes(target):
    array = np.asarray(target)
    if array.dtype != np.uint8 or array.ndim != 1 or not array.flags.c_contiguous or not array.flags.writeable:
        raise TypeError("the target must be a writable, contiguous, one-dimensional uint8 array or buffer")
    return array


def _digest_mismatch(expected, actual):
    return DeltaError(
        "delta_digest_mismatch",
        f"the new region should hash to xxh3 {expected:016x}, it hashes to {actual:016x}: the old region is "
        "not the one this delta was made from, or the delta is corrupt (the target is left as it was)",
    )


def apply_delta(payload, target) -> DeltaHeader:
    """Applies `payload` (a delta, bytes-like) to `target` (the region's old bytes: a writable
    uint8 numpy array, bytearray or memoryview), which then holds the region's new bytes.
    Raises `DeltaError` for any malformed delta, a region of another size, or new bytes that do
    not hash to the delta's digest; the target is then unchanged."""
    header = parse_delta_header(payload)
    region = _writable_bytes(target)
    width, elements, changed = header.width, header.elements, header.changed
    if elements * width != len(region):
        raise DeltaError(
            "delta_region_mismatch",
            f"delta is for {elements} elements of {width} bytes, the target is {len(region)} bytes",
        )
    body = memoryview(payload).cast("B")[HEADER_LEN:]
    if header.kind == WHOLE:
        actual = xxhash.xxh3_64_intdigest(body)
        if actual != header.new_xxh3:
            raise _digest_mismatch(header.new_xxh3, actual)
        region[:] = np.frombuffer(body, dtype=np.uint8)
        return header
    if changed == 0:
        actual = xxhash.xxh3_64_intdigest(region)
        if actual != header.new_xxh3:
            raise _digest_mismatch(header.new_xxh3, actual)
        return header
    inflated = np.frombuffer(_inflate(body, changed, elements, width), dtype=np.uint8)
    values_len = changed * width
    indices = _indices(inflated[: len(inflated) - values_len], changed, elements)
    element = np.dtype(f"<u{width}")
    values = np.ascontiguousarray(inflated[len(inflated) - values_len :].reshape(width, changed).T).view(element)
    elements_view = region.view(element)
    saved = elements_view[indices]
    elements_view[indices] = values.reshape(-1)
    actual = xxhash.xxh3_64_intdigest(region)
    if actual != header.new_xxh3:
        elements_view[indices] = saved
        raise _digest_mismatch(header.new_xxh3, actual)
    return header


def _inflate(frame, changed, elements, width):
    """The patch payload inflated: one zstd frame that declares a size within what `changed`
    varints and values can take (checked before anything is allocated) and inflates to it."""
    try:
        declared = zstandard.get_frame_parameters(frame).content_size
    except zstandard.ZstdError as error:
        raise DeltaError("delta_zstd", f"payload is not a zstd frame: {error}") from None
    if declared == zstandard.CONTENTSIZE_UNKNOWN or declared == zstandard.CONTENTSIZE_ERROR:
        raise DeltaError("delta_zstd", "the zstd frame does not declare its content size")
    max_gap_len = min(max(1, -(-(elements - 1).bit_length() // 7)), _MAX_VARINT_LEN)
    least, most = changed * (1 + width), changed * (max_gap_len + width)
    if not least <= declared <= most:
        raise DeltaError(
            "delta_zstd",
            f"the zstd frame declares {declared} bytes; {changed} changed elements of {width} bytes "
            f"need {least} to {most}",
        )
    try:
        inflated = zstandard.ZstdDecompressor().decompress(frame, max_output_size=declared, allow_extra_data=False)
    except zstandard.ZstdError as error:
        raise DeltaError("delta_zstd", f"the zstd frame is corrupt or not alone in the payload: {error}") from None
    if len(inflated) != declared:
        raise DeltaError("delta_zstd", f"the zstd frame inflates to {len(inflated)} bytes, it declares {declared}")
    return inflated


def _indices(gaps, changed, elements):
    """The `changed` indices the LEB128 gaps encode, as int64, decoded without a Python loop
    per varint: a byte with its high bit clear ends each one. Checks each is in shortest form
    and fits a u64, that the indices stay below `elements`, and that the gaps hold nothing
    more. Decoded `_VARINTS_AT_ONCE` varints at a time, so the temporaries stay bounded
    however many gap bytes a delta declares."""
    terminal = gaps < 0x80
    if np.count_nonzero(terminal) != changed or not terminal[-1]:
        raise DeltaError("delta_indices", f"the gaps do not hold exactly {changed} varints")
    indices = np.empty(changed, dtype=np.int64)
    done, at, previous = 0, 0, -1
    while done < changed:
        window = slice(at, min(at + _VARINTS_AT_ONCE * _MAX_VARINT_LEN, len(gaps)))
        ends = np.flatnonzero(terminal[window])[:_VARINTS_AT_ONCE]
        if len(ends) == 0:
            raise DeltaError("delta_indices", "a gap is longer than a u64")
        chunk = gaps[at : at + int(ends[-1]) + 1]
        starts = np.empty_like(ends)
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
        lengths = ends - starts + 1
        if lengths.max() > _MAX_VARINT_LEN or np.any(chunk[ends[lengths == _MAX_VARINT_LEN]] > 1):
            raise DeltaError("delta_indices", "a gap is longer than a u64")
        if np.any((lengths > 1) & (chunk[ends] == 0)):
            raise DeltaError("delta_indices", "a gap is not in its shortest form")
        position = (np.arange(len(chunk)) - np.repeat(starts, lengths)).astype(np.uint8)
        groups = (chunk & 0x7F).astype(np.uint64) << (np.uint64(7) * position.astype(np.uint64))
        values = np.add.reduceat(groups, starts)  # the groups' bits never overlap: a sum is an or
        if np.any(values >= elements):
            raise DeltaError("delta_indices", f"a gap reaches past the {elements} elements")
        # Each step is below `elements` (itself under 2**62, the target's length): no wrap.
        found = previous + np.cumsum(values.astype(np.int64) + 1)
        if found[-1] >= elements:
            raise DeltaError("delta_indices", f"an index is past the {elements} elements")
        indices[done : done + len(found)] = found
        done, at, previous = done + len(found), at + len(chunk), int(found[-1])
    return indices
