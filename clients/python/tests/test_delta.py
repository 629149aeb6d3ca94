"""Refit deltas on the client: the Rust encoder's golden vectors apply to exactly the new bytes,
a reference encoder written here from the spec produces the same bodies, hostile deltas raise
`DeltaError` and leave the target as it was, and (printed, not asserted) the speed of applying
a 64 MiB bf16 region at 2% changed."""

import struct
import time
from pathlib import Path

import numpy as np
import pytest
import xxhash
import zstandard

from ztserve_client import DeltaError, apply_delta
from ztserve_client._delta import HEADER_LEN, PATCH, WHOLE

GOLDEN = Path(__file__).resolve().parents[3] / "format" / "tests" / "data" / "delta"
CASES = ["bf16_patch", "f32_patch", "u8_whole", "f64_patch_edges"]


def header(kind, width, elements, changed, payload_len, digest):
    return struct.pack("<8sBB6sQQQQ", b"ZTDELTA1", kind, width, bytes(6), elements, changed, payload_len, digest)


def varints(values):
    """LEB128 of each value (uint64 array), vectorized."""
    values = np.asarray(values, dtype=np.uint64)
    bits = np.where(values == 0, 1, np.floor(np.log2(np.maximum(values, 1).astype(np.float64))) + 1)
    lengths = np.maximum(1, -(-bits.astype(np.int64) // 7))
    # log2 in float rounds near powers of two: correct the lengths exactly.
    lengths = np.where((lengths < 10) & (values >> (7 * lengths).astype(np.uint64) != 0), lengths + 1, lengths)
    starts = np.cumsum(lengths) - lengths
    position = np.arange(lengths.sum()) - np.repeat(starts, lengths)
    owner = np.repeat(values, lengths)
    out = ((owner >> (7 * position).astype(np.uint64)) & np.uint64(0x7F)).astype(np.uint8)
    out[position < np.repeat(lengths, lengths) - 1] |= 0x80
    return out


def encode_body(old, new, width):
    """The uncompressed patch body (gaps, then values in planes), from the spec."""
    element = np.dtype(f"<u{width}")
    changed = np.flatnonzero(np.frombuffer(old, element) != np.frombuffer(new, element))
    gaps = np.diff(changed, prepend=-1) - 1
    rows = np.frombuffer(new, np.uint8).reshape(-1, width)[changed]
    return changed, varints(gaps).tobytes() + np.ascontiguousarray(rows.T).tobytes()


def encode_patch(old, new, width, level=3):
    changed, body = encode_body(old, new, width)
    frame = zstandard.ZstdCompressor(level=level).compress(body)
    elements = len(new) // width
    return header(PATCH, width, elements, len(changed), len(frame), xxhash.xxh3_64_intdigest(new)) + frame


@pytest.mark.parametrize("name", CASES)
def test_golden_vectors_apply_to_exactly_the_new_bytes(name):
    old, new, delta = ((GOLDEN / f"{name}.{ext}").read_bytes() for ext in ("old", "new", "delta"))
    target = np.frombuffer(old, np.uint8).copy()
    applied = apply_delta(delta, target)
    assert target.tobytes() == new
    assert applied.kind == (WHOLE if name.endswith("whole") else PATCH)
    # The same on a bytearray and a memoryview of one.
    for buffer in (bytearray(old), memoryview(bytearray(old))):
        apply_delta(delta, buffer)
        assert bytes(buffer) == new
    if applied.kind == PATCH:
        inflated = zstandard.ZstdDecompressor().decompress(delta[HEADER_LEN:])
        assert encode_body(old, new, applied.width)[1] == inflated, "the spec's body, byte for byte"


@pytest.mark.parametrize("width", [1, 2, 4, 8])
@pytest.mark.parametrize("fraction", [0.0, 0.005, 0.02, 0.3])
def test_reference_patches_round_trip(width, fraction):
    rng = np.random.default_rng(width)
    old = rng.integers(0, 256, 4099 * width, dtype=np.uint8)
    new = old.copy()
    moved = np.flatnonzero(rng.random(4099) < fraction)
    new.reshape(-1, width)[moved, 0] ^= 0x5A
    delta = encode_patch(old.tobytes(), new.tobytes(), width)
    if len(moved) == 0:
        delta = header(PATCH, width, 4099, 0, 0, xxhash.xxh3_64_intdigest(new))
    target = old.copy()
    apply_delta(delta, target)
    assert np.array_equal(target, new)


def test_varints_of_every_length_round_trip():
    elements = 1 << 62
    gaps = np.array([0, 127, 128, 16383, 16384, (1 << 35) - 1, 1 << 35, 1 << 60], dtype=np.uint64)
    from ztserve_client._delta import _indices

    indices = _indices(varints(gaps), len(gaps), elements)
    assert indices.tolist() == (np.cumsum(gaps + np.uint64(1)) - np.uint64(1)).astype(np.int64).tolist()


# --- hostile deltas ---------------------------------------------------------------------------

N = 256  # width 1: a patch changes at most 128 elements, its gaps take at most 2 bytes
EXPECTED = np.zeros(N, np.uint8)
EXPECTED[3], EXPECTED[10] = 0xAA, 0xBB
DIGEST = xxhash.xxh3_64_intdigest(EXPECTED)


def patch(payload, changed=2, elements=N, width=1, digest=DIGEST):
    return header(PATCH, width, elements, changed, len(payload), digest) + payload


def frame(body):
    return zstandard.ZstdCompressor(level=3).compress(bytes(body))


def code_of(delta, size=N):
    target = np.zeros(size, np.uint8)
    with pytest.raises(DeltaError) as raised:
        apply_delta(delta, target)
    assert not target.any(), "the target is left as it was"
    return raised.value.code


def test_a_hand_made_patch_applies():
    target = np.zeros(N, np.uint8)
    apply_delta(patch(frame([3, 6, 0xAA, 0xBB])), target)
    assert np.array_equal(target, EXPECTED)


def test_hostile_headers_raise():
    good = (GOLDEN / "bf16_patch.delta").read_bytes()
    size = len((GOLDEN / "bf16_patch.old").read_bytes())
    for length in range(len(good)):
        code_of(good[:length], size)
    assert code_of(good + b"\0", size) == "delta_trailing_bytes"

    def with_(at, data):
        return good[:at] + data + good[at + len(data) :]

    assert code_of(with_(0, b"ZTDELTA2"), size) == "delta_bad_magic"
    assert code_of(with_(8, b"\x02"), size) == "delta_bad_kind"
    assert code_of(with_(8, b"\x01"), size) == "delta_counts"
    assert code_of(with_(9, b"\x03"), size) == "delta_bad_width"
    assert code_of(with_(9, b"\x04"), size) == "delta_region_mismatch"
    assert code_of(with_(12, b"\x01"), size) == "delta_bad_header"
    assert code_of(with_(16, struct.pack("<Q", 2**64 - 1)), size) == "delta_counts"
    assert code_of(with_(16, struct.pack("<Q", 1 << 40)), size) == "delta_region_mismatch"
    assert code_of(with_(24, struct.pack("<Q", 0)), size) == "delta_counts"
    assert code_of(with_(24, struct.pack("<Q", 1)), size) == "delta_zstd"
    assert code_of(with_(32, struct.pack("<Q", 1)), size) == "delta_trailing_bytes"
    assert code_of(with_(32, struct.pack("<Q", 2**64 - 1)), size) == "delta_truncated"
    assert code_of(with_(40, bytes(8)), size) == "delta_digest_mismatch"
    with pytest.raises(TypeError):
        apply_delta(good, (GOLDEN / "bf16_patch.old").read_bytes())  # read-only


def test_a_delta_for_another_base_raises_and_leaves_the_target():
    old = bytearray((GOLDEN / "bf16_patch.old").read_bytes())
    old[4000] ^= 0x55
    before = bytes(old)
    with pytest.raises(DeltaError) as raised:
        apply_delta((GOLDEN / "bf16_patch.delta").read_bytes(), old)
    assert raised.value.code == "delta_digest_mismatch"
    assert bytes(old) == before


@pytest.mark.parametrize(
    "payload, why",
    [
        (b"\x28\xb5\x2f", "a cut frame"),
        (bytes([3, 6, 0xAA, 0xBB]), "not a frame"),
        (frame([3, 6, 0xAA, 0xBB]) * 2, "two frames"),
        (frame([3, 6, 0xAA, 0xBB]) + b"\0", "a byte after the frame"),
        (frame([0] * 7), "more than the bound"),
        (frame([0] * 3), "less than the least"),
    ],
)
def test_hostile_frames_raise(payload, why):
    assert code_of(patch(payload)) == "delta_zstd", why


@pytest.mark.parametrize("body, declared", [([3, 6, 0xAA, 0xBB, 0, 0], 4), ([3, 6, 0xAA, 0xBB], 6)])
def test_a_frame_that_lies_about_its_size_raises(body, declared):
    lying = bytearray(frame(body))
    # A small frame is one segment with a one-byte content size right after its descriptor.
    assert (lying[4] & 0x20, lying[4] >> 6, lying[5]) == (0x20, 0, len(body))
    lying[5] = declared
    assert code_of(patch(bytes(lying))) == "delta_zstd"


def test_a_frame_without_its_size_raises():
    out = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(bytes([3, 6, 0xAA, 0xBB]))
    assert code_of(patch(out)) == "delta_zstd"


@pytest.mark.parametrize(
    "body, why",
    [
        ([3, 0xAC, 0x02, 0xAA, 0xBB], "index past the end"),
        ([200, 60, 0xAA, 0xBB], "second index past the end"),
        ([0x83, 0, 0xAA, 0xBB], "gap not in its shortest form"),
        ([0x83, 0x80, 0xAA, 0xBB], "gaps end inside a varint"),
        ([3, 6, 0, 0xAA, 0xBB], "bytes after the gaps"),
    ],
)
def test_hostile_indices_raise(body, why):
    assert code_of(patch(frame(body))) == "delta_indices", why


def test_gaps_decoded_a_few_varints_at_a_time_give_the_same_indices_and_refusals(monkeypatch):
    from ztserve_client import _delta

    monkeypatch.setattr(_delta, "_VARINTS_AT_ONCE", 2)
    test_reference_patches_round_trip(2, 0.3)
    test_varints_of_every_length_round_trip()
    target = np.zeros(N, np.uint8)
    apply_delta(patch(frame([1, 1, 0, 0xAA, 0xBB, 0xCC]), changed=3, digest=xxhash.xxh3_64_intdigest(
        np.array([0, 0xAA, 0, 0xBB, 0xCC] + [0] * (N - 5), np.uint8))), target)
    assert target[:5].tolist() == [0, 0xAA, 0, 0xBB, 0xCC]
    # The third varint, in the second batch, runs past the end.
    assert code_of(patch(frame([1, 1, 0xFF, 0x01, 0xAA, 0xBB, 0xCC]), changed=3)) == "delta_indices"
    assert code_of(patch(frame([1, 1, 0x80, 0x00, 0xAA, 0xBB, 0xCC]), changed=3)) == "delta_indices"


def test_lying_counts_over_a_huge_region_raise():
    assert code_of(patch(frame([3, 6, 0xAA, 0xBB]), changed=1 << 39, elements=1 << 40)) == "delta_region_mismatch"
    ten = [0xFF] * 9 + [0x7F]
    with pytest.raises(DeltaError):
        apply_delta(patch(frame(ten + [0xAA]), changed=1, elements=2**63 - 1), np.zeros(64, np.uint8))


# --- speed ------------------------------------------------------------------------------------


def test_speed_of_a_64_mib_bf16_region_at_2_percent(capsys):
    import ml_dtypes

    rng = np.random.default_rng(70)
    elements = 32 << 20
    old = rng.normal(0, 0.02, elements).astype(ml_dtypes.bfloat16).view(np.uint16)
    new = old.copy()
    moved = np.flatnonzero(rng.random(elements) < 0.02)
    new[moved] ^= 1  # one ulp: what most elements of an optimizer step look like in bf16
    delta = encode_patch(old.tobytes(), new.tobytes(), 2)
    target = old.view(np.uint8).copy()
    started = time.perf_counter()
    apply_delta(delta, target)
    seconds = time.perf_counter() - started
    assert np.array_equal(target, new.view(np.uint8))
    with capsys.disabled():
        print(
            f"\napply_delta: 64 MiB bf16, {len(moved)} changed, delta {len(delta)} bytes "
            f"(ratio {target.nbytes / len(delta):.1f}): {seconds * 1e3:.0f} ms, {target.nbytes / 1e6 / seconds:.0f} MB/s"
        )
