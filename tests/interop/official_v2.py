"""Drive the official `ztensor` 2.x package (the v2 container) for the interop tests.

    official_v2.py write DIR   write v2 files with every feature the release has into DIR,
                               read each back with `ztensor.open`, and write DIR/expect.json:
                               for each file, object and part, a .bin file holding the bytes
                               `ztensor.open` returns (checked equal to what the writer was given)
    official_v2.py read FILE DIR
                               read FILE with `ztensor.open` and write each part's bytes to
                               DIR/<n>.bin, listed with dtype, type and shape in DIR/read.json

The Rust interop tests serve DIR (from a local directory and from S3) and compare every
component ztserve sends with these bytes.
"""

import json
import os
import sys
from importlib.metadata import version

import ml_dtypes
import numpy as np
import ztensor

VERSION = version("ztensor")
rng = np.random.default_rng(20261123)
SEEKABLE = "zt.zstd-seekable/1"


class Expect:
    """What each file holds: file -> object -> part -> .bin file of the given bytes."""

    def __init__(self, out):
        self.out = out
        self.files = {}
        self.given = {}
        self.count = 0

    def add(self, file, name, part, data):
        self.given.setdefault(file, {}).setdefault(name, {})[part] = bytes(np.ascontiguousarray(data).tobytes())

    def check_and_save(self):
        """Reads every file back with the official reader: its bytes must be the given ones."""
        for file, objects in self.given.items():
            source = ztensor.open(os.path.join(self.out, file))
            assert sorted(source.keys()) == sorted(objects), (file, source.keys())
            for name, parts in objects.items():
                tensor = source[name]
                for part, given in parts.items():
                    read = tensor[part].tobytes() if len(tensor.parts) > 1 else tensor.tobytes()
                    assert read == given, f"{file}: {name}.{part}: ztensor.open returns other bytes"
                    path = f"{self.count}.bin"
                    self.count += 1
                    with open(os.path.join(self.out, path), "wb") as f:
                        f.write(read)
                    self.files.setdefault(file, {}).setdefault(name, {})[part] = path
            source.close()
        with open(os.path.join(self.out, "expect.json"), "w") as f:
            json.dump({"version": VERSION, "files": self.files}, f, ensure_ascii=False)


def dense_arrays():
    """One array per storage dtype and per logical type: (name, array, dtype, logical)."""
    out = [
        ("f64", rng.standard_normal((3, 5)), "f64", None),
        ("f32.matrix", rng.standard_normal((17, 33)).astype(np.float32), "f32", None),
        ("f16", rng.standard_normal(100).astype(np.float16), "f16", None),
        ("bf16", rng.standard_normal((4, 8)).astype(ml_dtypes.bfloat16), "bf16", None),
        ("i64", rng.integers(-(2**62), 2**62, size=50, dtype=np.int64), "i64", None),
        ("i32", rng.integers(-(2**31), 2**31 - 1, size=(2, 3, 4), dtype=np.int32), "i32", None),
        ("i16", rng.integers(-1000, 1000, size=7, dtype=np.int16), "i16", None),
        ("i8", rng.integers(-128, 127, size=9, dtype=np.int8), "i8", None),
        ("u64", rng.integers(0, 2**63, size=5, dtype=np.uint64), "u64", None),
        ("u32", rng.integers(0, 2**32 - 1, size=6, dtype=np.uint32), "u32", None),
        ("u16", rng.integers(0, 65535, size=11, dtype=np.uint16), "u16", None),
        ("u8", rng.integers(0, 255, size=13, dtype=np.uint8), "u8", None),
        ("scalar", np.array(3.5, dtype=np.float32), "f32", None),
        ("empty", np.zeros((0, 4), dtype=np.float32), "f32", None),
        ("bool", rng.integers(0, 2, size=(3, 3), dtype=np.uint8), "u8", "bool"),
        ("complex64", (rng.standard_normal(6) + 1j * rng.standard_normal(6)).astype(np.complex64), "f32", "complex64"),
        ("complex128", rng.standard_normal(4) + 1j * rng.standard_normal(4), "f64", "complex128"),
    ]
    for logical in ["f8_e4m3fn", "f8_e5m2", "f8_e4m3fnuz", "f8_e5m2fnuz", "f8_e8m0"]:
        out.append((logical, rng.integers(0, 255, size=(4, 4), dtype=np.uint8), "u8", logical))
    # 7 elements of f4_e2m1 packed two per byte, the last high nibble zero.
    packed = rng.integers(0, 255, size=4, dtype=np.uint8)
    packed[-1] &= 0x0F
    out.append(("f4_e2m1", packed, "u8", "f4_e2m1"))
    return out


def shape_of(name, array):
    if name.startswith("complex"):
        return list(array.shape)
    if name == "f4_e2m1":
        return [7]
    return list(array.shape)


def dense_adds(writer, expect, file, encoding=None):
    """(name, add) for every dense array."""

    def adder(name, array, dtype, logical):
        def add():
            data = np.ascontiguousarray(array)
            raw = data.view(np.uint8).reshape(-1) if data.size else np.zeros(0, np.uint8)
            writer.add(name, raw, shape_of(name, data), dtype, logical=logical, encoding=encoding)
            expect.add(file, name, "data", raw)

        return name, add

    return [adder(*entry) for entry in dense_arrays()]


def structured_adds(writer, expect, file):
    """(name, add) for a CSR matrix and a group-quantized weight with object attributes."""

    def sparse():
        values = rng.standard_normal(5).astype(np.float32)
        indices = np.array([0, 3, 1, 2, 3], dtype=np.uint32)
        indptr = np.array([0, 2, 3, 5], dtype=np.uint32)
        writer.add_object(
            "sparse",
            [3, 4],
            {
                "values": {"dtype": "f32", "data": values.view(np.uint8)},
                "indices": {"dtype": "u32", "data": indices.view(np.uint8)},
                "indptr": {"dtype": "u32", "data": indptr.view(np.uint8)},
            },
            layout="zt.sparse_csr/1",
        )
        for part, array in [("values", values), ("indices", indices), ("indptr", indptr)]:
            expect.add(file, "sparse", part, array.view(np.uint8))

    def quantized():
        codes = rng.integers(0, 2**32 - 1, size=(8, 8), dtype=np.uint32)  # 8 x 64 int4 codes
        scales = rng.standard_normal((8, 2)).astype(np.float16)  # groups of 32 along axis 1
        writer.add_object(
            "quantized",
            [8, 64],
            {
                "data": {"dtype": "u32", "data": codes.view(np.uint8)},
                "scales": {"dtype": "f16", "data": scales.view(np.uint8)},
            },
            layout="zt.quant_group/1",
            attributes={
                "bits": 4,
                "group_size": 32,
                "axis": 1,
                "packing": {"word": "u32", "order": "lsb_first", "per_word": 8},
                "scale_form": "f16_factors",
                "zero_point": {"form": "implied", "value": 8},
            },
        )
        expect.add(file, "quantized", "data", codes.view(np.uint8))
        expect.add(file, "quantized", "scales", scales.view(np.uint8))

    return [("sparse", sparse), ("quantized", quantized)]


def add_all(adds):
    """Adds in name order, which canonical files require."""
    for _, add in sorted(adds, key=lambda entry: entry[0].encode()):
        add()


def write(out):
    expect = Expect(out)
    attributes = {"model": "interop", "layers": 2, "ratio": 0.5, "tags": ["a", "b"], "nested": {"x": True}}

    # The default: canonical (64 KiB placement, xxh3 digests on every part).
    w = ztensor.Writer(os.path.join(out, "canonical.zt"))
    add_all(dense_adds(w, expect, "canonical.zt") + structured_adds(w, expect, "canonical.zt"))
    w.set_attributes(attributes)
    w.finish()

    # 4 KiB placement.
    w = ztensor.Writer(os.path.join(out, "aligned.zt"), canonical=False, align=4096)
    add_all(dense_adds(w, expect, "aligned.zt"))
    w.finish()

    # Seekable zstd, including one part of 64 MiB and more that is not a whole number of
    # 1 MiB frames, and an appended generation.
    w = ztensor.Writer(os.path.join(out, "seekable.zt"), canonical=False)
    add_all(dense_adds(w, expect, "seekable.zt", encoding=SEEKABLE))
    big = np.arange((64 << 20) // 4 + 3001, dtype=np.uint32) * np.uint32(2654435761)
    big_bytes = big.view(np.uint8).reshape(-1)
    big_bytes[::7] = 0  # compressible, not trivially
    w.add("big", big_bytes, [big.size], "u32", encoding=SEEKABLE)
    expect.add("seekable.zt", "big", "data", big_bytes)
    w.finish()

    w = ztensor.Writer(os.path.join(out, "appended.zt"), canonical=False)
    first = rng.standard_normal(100).astype(np.float32)
    w.add("first", first.view(np.uint8), [100], "f32")
    w.finish()
    w = ztensor.Writer(os.path.join(out, "appended.zt"), canonical=False, append=True)
    second = rng.integers(0, 100, size=10, dtype=np.int64)
    w.add("second", second.view(np.uint8), [10], "i64")
    w.finish()
    expect.add("appended.zt", "first", "data", first.view(np.uint8))
    expect.add("appended.zt", "second", "data", second.view(np.uint8))

    expect.check_and_save()


def read(path, out):
    source = ztensor.open(path)
    listing = {"attributes": source.attributes, "objects": {}}
    count = 0
    for name in source.keys():
        tensor = source[name]
        parts = {}
        for part in tensor.parts:
            view = tensor[part] if len(tensor.parts) > 1 else tensor
            bin_path = f"{count}.bin"
            count += 1
            with open(os.path.join(out, bin_path), "wb") as f:
                f.write(view.tobytes())
            parts[part] = {"bin": bin_path, "dtype": view.dtype, "type": view.logical}
        listing["objects"][name] = {"shape": tensor.shape, "layout": tensor.layout, "parts": parts}
    with open(os.path.join(out, "read.json"), "w") as f:
        json.dump(listing, f, ensure_ascii=False)


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "write":
        write(sys.argv[2])
    elif command == "read":
        read(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {command!r}")
