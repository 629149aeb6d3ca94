"""Server-side slices against numpy slicing of what the official readers return (tests/it/slices.rs).

    slices.py write DIR       with the ztensor release of this venv, write DIR/<kind>.zt: under
                              2.x raw.zt and seekable.zt (1 MiB zstd frames), under 1.2.x zstd.zt
                              (one zstd frame per tensor); one tensor per element width
                              (1, 2, 4, 8 bytes, complex, fp8) and rank 1 to 4, every size odd
    slices.py check DIR URL   read every tensor of those files with the official reader of this
                              venv, and compare numpy's slices of it with the server's at URL
                              (model = the file's stem): every dimension split among 2, 3 and 8
                              ranks (first, middle and last rank, remainders included), explicit
                              slices, and a range within a slice; prints "compared N"
"""

import json
import os
import sys
import urllib.request
from importlib.metadata import version

import ml_dtypes
import numpy as np
import ztensor

VERSION = version("ztensor")
V2 = VERSION.startswith("2.")
SEEKABLE = "zt.zstd-seekable/1"
rng = np.random.default_rng(20261123)


def tensors():
    """name -> (array, zTensor dtype, logical type): each width and rank 1 to 4."""
    out = {
        "i8.r1": (rng.integers(-128, 127, size=37, dtype=np.int8), "i8", None),
        "u8.r3": (rng.integers(0, 255, size=(5, 7, 11), dtype=np.uint8), "u8", None),
        "bf16.r2": (rng.standard_normal((13, 29)).astype(ml_dtypes.bfloat16), "bf16", None),
        "f16.r4": (rng.standard_normal((3, 4, 5, 6)).astype(np.float16), "f16", None),
        "f32.r2": (rng.standard_normal((19, 23)).astype(np.float32), "f32", None),
        "i32.r3": (rng.integers(-(2**31), 2**31 - 1, size=(6, 5, 7), dtype=np.int32), "i32", None),
        "f64.r2": (rng.standard_normal((11, 9)), "f64", None),
        "i64.r4": (rng.integers(-(2**62), 2**62, size=(2, 3, 5, 7), dtype=np.int64), "i64", None),
        "fp8.r2": (rng.integers(0, 255, size=(9, 31), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn), "u8", "f8_e4m3fn"),
        # Several seekable frames: a slice decodes only those it touches.
        "big.f32": (rng.standard_normal((701, 1031)).astype(np.float32), "f32", None),
    }
    if V2:  # 1.2.3 cannot read its own complex objects back
        out["c64.r2"] = ((rng.standard_normal((7, 10)) + 1j * rng.standard_normal((7, 10))).astype(np.complex64), "f32", "complex64")
        out["c128.r1"] = (rng.standard_normal(13) + 1j * rng.standard_normal(13), "f64", "complex128")
    return out


def write(out):
    os.makedirs(out, exist_ok=True)
    if V2:
        for kind, encoding in [("raw", None), ("seekable", SEEKABLE)]:
            w = ztensor.Writer(os.path.join(out, f"{kind}.zt"), canonical=False)
            for name, (array, dtype, logical) in sorted(tensors().items()):
                raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
                w.add(name, raw, list(array.shape), dtype, logical=logical, encoding=encoding)
            w.finish()
    else:
        from ztensor import Tensor

        w = ztensor.Writer(os.path.join(out, "zstd.zt"))
        for name, (array, dtype, logical) in sorted(tensors().items()):
            if logical:
                data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
                w.write(name, Tensor({"data": data}, shape=list(array.shape), type=logical), compress=3)
            else:
                w.write_numpy(name, array, compress=True)
        w.finish()


def official(path, name, like):
    """The tensor as the official reader returns it, viewed as numpy slices it."""
    if V2:
        source = ztensor.open(path)
        data = source[name].tobytes()
        source.close()
    else:
        data = np.ascontiguousarray(ztensor.Reader(path).read(name, copy=True).components["data"]).tobytes()
    return np.frombuffer(data, dtype=like.dtype).reshape(like.shape)


def get(url, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request) as response:
        return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()


def shards(size, world):
    """(rank, start, stop) of the first, a middle and the last rank, as vLLM divides."""
    each = size // world
    for rank in sorted({0, world // 2, world - 1}):
        stop = size if rank == world - 1 else (rank + 1) * each
        yield rank, rank * each, stop


def check(out, url):
    compared = 0
    for file in sorted(f for f in os.listdir(out) if f.endswith(".zt")):
        model = file[: -len(".zt")]
        for name, (array, _, _) in sorted(tensors().items()):
            tensor = official(os.path.join(out, file), name, array)
            assert tensor.tobytes() == np.ascontiguousarray(array).tobytes(), f"{file}: {name}: the reader returns other bytes"
            base = f"{url}/models/{model}/objects/{name}"
            cases = []
            for dim, size in enumerate(tensor.shape):
                for world in (2, 3, 8):
                    for rank, start, stop in shards(size, world):
                        index = [slice(None)] * tensor.ndim
                        index[dim] = slice(start, stop)
                        negative = dim - tensor.ndim if dim % 2 else dim
                        cases.append((f"shard={rank}/{world}&dim={negative}", tuple(index)))
            cases.append(("slice=" + ",".join("1:-1" for _ in tensor.shape), tuple(slice(1, -1) for _ in tensor.shape)))
            cases.append(("slice=-2:", (slice(-2, None),)))
            cases.append(("slice=:,2:2" if tensor.ndim > 1 else "slice=2:2", (slice(None), slice(2, 2)) if tensor.ndim > 1 else (slice(2, 2),)))
            for query, index in cases:
                expected = np.ascontiguousarray(tensor[index])
                status, headers, body = get(f"{base}?{query}")
                assert status == 200, (file, name, query, status)
                assert body == expected.tobytes(), f"{file}: {name}?{query}: {len(body)} bytes differ from numpy's {expected.nbytes}"
                assert headers["x-zt-shape"] == ",".join(map(str, expected.shape)), (file, name, query, headers)
                compared += 1
            # A range within a slice: the same bytes of numpy's slice.
            query, index = cases[len(cases) // 2]
            whole = np.ascontiguousarray(tensor[index]).tobytes()
            if len(whole) > 4:
                first, last = 1, len(whole) - 3
                status, headers, body = get(f"{base}?{query}", {"Range": f"bytes={first}-{last}"})
                assert status == 206 and body == whole[first : last + 1], (file, name, query, status)
                assert headers["content-range"] == f"bytes {first}-{last}/{len(whole)}", headers
                compared += 1
    print(json.dumps({"compared": compared, "version": VERSION}))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    elif sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
