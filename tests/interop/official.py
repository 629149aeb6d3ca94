"""Drive the official `ztensor` package (0.1.4, 1.1.1 or 1.2.3, whichever is installed).

    official.py write DIR [v2-names]
                              write official.zt with every feature this release has (with
                              v2-names, only objects zTensor v2 can name: none named ""), plus
                              DIR/expect.json naming, for each object and component, a .bin
                              file of the exact little-endian bytes the writer was given
    official.py read FILE DIR read FILE with the official reader and dump each component's
                              bytes to DIR/<index>.bin, listed in DIR/read.json (an object
                              the reader fails on is listed with its error)

The Rust interop tests run this under each release's venv and compare bytes.
"""

import json
import os
import sys
from importlib.metadata import version

import numpy as np
import ztensor

VERSION = version("ztensor")
rng = np.random.default_rng(20261121)


class Expect:
    def __init__(self, out):
        self.out = out
        self.objects = {}
        self.count = 0

    def add(self, name, role, array):
        path = f"{self.count}.bin"
        self.count += 1
        with open(os.path.join(self.out, path), "wb") as f:
            f.write(np.ascontiguousarray(array).tobytes())
        self.objects.setdefault(name, {})[role] = path

    def save(self):
        with open(os.path.join(self.out, "expect.json"), "w") as f:
            json.dump({"version": VERSION, "objects": self.objects}, f, ensure_ascii=False)


def dense_arrays():
    """Arrays every release can write densely."""
    arrays = {
        "f64": rng.standard_normal((3, 5)),
        "f32.matrix": rng.standard_normal((17, 33)).astype(np.float32),
        "f16": rng.standard_normal(100).astype(np.float16),
        "i64": rng.integers(-(2**62), 2**62, size=50, dtype=np.int64),
        "i32": rng.integers(-(2**31), 2**31 - 1, size=(2, 3, 4), dtype=np.int32),
        "i16": rng.integers(-1000, 1000, size=7, dtype=np.int16),
        "i8": rng.integers(-128, 127, size=9, dtype=np.int8),
        "u64": rng.integers(0, 2**63, size=11, dtype=np.uint64),
        "u32": rng.integers(0, 2**32 - 1, size=13, dtype=np.uint32),
        "u16": rng.integers(0, 2**16 - 1, size=15, dtype=np.uint16),
        "u8": rng.integers(0, 255, size=19, dtype=np.uint8),
        "bool": rng.integers(0, 2, size=23).astype(bool),
        "scalar": np.array(3.25, dtype=np.float64),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "name with spaces/and slashes..ünï©ødé %?#": np.arange(5, dtype=np.int32),
        "large": np.arange(300_000, dtype=np.float32),
    }
    return arrays


def write_014(out, expect):
    w = ztensor.Writer(os.path.join(out, "official.zt"))
    for name, arr in dense_arrays().items():
        w.add_tensor(name, arr)
        expect.add(name, "data", arr)
    w.finalize()


def write_111(out, expect):
    w = ztensor.Writer(os.path.join(out, "official.zt"))
    for name, arr in dense_arrays().items():
        w.add_tensor(name, arr)
        expect.add(name, "data", arr)
        if arr.size > 1:
            w.add_tensor(name + ".zstd", arr, compress=True)
            expect.add(name + ".zstd", "data", arr)
    w.add_tensor("large.zstd19", dense_arrays()["large"], compress=19)
    expect.add("large.zstd19", "data", dense_arrays()["large"])
    values = np.array([1.5, -2.0, 3.25, 4.0], dtype=np.float32)
    indices = np.array([0, 3, 1, 2], dtype=np.uint64)
    indptr = np.array([0, 2, 2, 4], dtype=np.uint64)
    w.add_sparse_csr("csr", values, indices, indptr, (3, 4))
    expect.add("csr", "values", values)
    expect.add("csr", "indices", indices)
    expect.add("csr", "indptr", indptr)
    coo_values = np.array([7, 8, 9], dtype=np.int64)
    coords = np.array([[0, 1, 2], [3, 0, 1]], dtype=np.uint64)
    w.add_sparse_coo("coo", coo_values, coords, (3, 4))
    expect.add("coo", "values", coo_values)
    expect.add("coo", "coords", coords)
    w.finalize()


def write_123(out, expect, v2_names):
    from ztensor import Tensor

    w = ztensor.Writer(os.path.join(out, "official.zt"))
    for i, (name, arr) in enumerate(dense_arrays().items()):
        checksum = ["none", "crc32c", "sha256"][i % 3]
        w.write_numpy(name, arr, checksum=checksum)
        expect.add(name, "data", arr)
        if arr.size > 1:
            w.write_numpy(name + ".zstd", arr, compress=True, checksum=checksum)
            expect.add(name + ".zstd", "data", arr)
    try:
        import ml_dtypes

        bf = rng.standard_normal(64).astype(ml_dtypes.bfloat16)
        w.write_numpy("bf16", bf)
        expect.add("bf16", "data", bf)
    except ImportError:
        pass
    w.write("scalar.0d", Tensor({"data": np.array(1.5, dtype=np.float32)}))
    expect.add("scalar.0d", "data", np.array(1.5, dtype=np.float32))
    csr = {
        "values": np.array([1.0, 2.0, 3.0], dtype=np.float64),
        "indices": np.array([2, 0, 1], dtype=np.uint64),
        "indptr": np.array([0, 1, 3], dtype=np.uint64),
    }
    w.write("csr", Tensor(csr, shape=[2, 3], format="sparse_csr"), compress=True, checksum="sha256")
    for role, arr in csr.items():
        expect.add("csr", role, arr)
    coo = {"values": np.array([5, 6], dtype=np.int32), "coords": np.array([0, 1, 2, 0], dtype=np.uint64)}
    w.write("coo", Tensor(coo, shape=[2, 3], format="sparse_coo"))
    for role, arr in coo.items():
        expect.add("coo", role, arr)
    quant = {
        "packed_weight": rng.integers(-(2**31), 2**31 - 1, size=64, dtype=np.int32),
        "scales": rng.standard_normal(8).astype(np.float16),
        "zeros": rng.standard_normal(8).astype(np.float16),
    }
    attributes = {"bits": 4, "group_size": 64, "packing": "8_per_i32", "nested": {"list": [1, 2.5, None, True, b"\x00\x01"]}}
    w.write("quant", Tensor(quant, shape=[16, 32], format="quantized_group", dtype="int32", attributes=attributes), checksum="crc32c")
    for role, arr in quant.items():
        expect.add("quant", role, arr)
    custom = {"lut": np.arange(16, dtype=np.uint8), "meta": np.array([1, 2], dtype=np.uint64)}
    w.write("custom", Tensor(custom, shape=[4], format="x_vendor.lut", dtype="uint8"))
    for role, arr in custom.items():
        expect.add("custom", role, arr)
    fp8 = rng.integers(0, 255, size=32, dtype=np.uint8)
    w.write("fp8", Tensor({"data": fp8}, type="f8_e4m3fn"), compress=3)
    expect.add("fp8", "data", fp8)
    cx = rng.standard_normal(8).astype(np.float32)
    w.write("complex", Tensor({"data": cx}, shape=[4], type="complex64"))
    expect.add("complex", "data", cx)
    # 1.2.3 accepts an empty object name; it must be served at the URL the manifest gives.
    # v2 requires names of 1 to 1,024 bytes.
    if not v2_names:
        unnamed = np.arange(6, dtype=np.int16)
        w.write_numpy("", unnamed)
        expect.add("", "data", unnamed)
    w.finish()


def write(out, v2_names=False):
    os.makedirs(out, exist_ok=True)
    expect = Expect(out)
    if VERSION.startswith("0.1"):
        write_014(out, expect)
    elif VERSION.startswith("1.1"):
        write_111(out, expect)
    else:
        write_123(out, expect, v2_names)
    expect.save()


def read(path, out):
    os.makedirs(out, exist_ok=True)
    reader = ztensor.Reader(path)
    listing = {}
    n = 0
    for name in reader.keys():
        try:
            tensor = reader.read(name, copy=True)
        except ValueError as e:  # 1.2.3 cannot read back its own complex64 objects
            listing[name] = {"error": str(e)}
            continue
        roles = {}
        for role, arr in tensor.components.items():
            fname = f"{n}.bin"
            n += 1
            with open(os.path.join(out, fname), "wb") as f:
                f.write(np.ascontiguousarray(arr).tobytes())
            roles[role] = fname
        listing[name] = {"shape": list(tensor.shape), "format": tensor.format, "components": roles}
    with open(os.path.join(out, "read.json"), "w") as f:
        json.dump(listing, f, ensure_ascii=False)


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3:] == ["v2-names"])
    elif sys.argv[1] == "read":
        read(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
