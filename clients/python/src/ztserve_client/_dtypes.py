"""zTensor dtypes and logical types as numpy and torch dtypes."""

import numpy as np

_NUMPY = {
    "f64": np.float64, "f32": np.float32, "f16": np.float16,
    "i64": np.int64, "i32": np.int32, "i16": np.int16, "i8": np.int8,
    "u64": np.uint64, "u32": np.uint32, "u16": np.uint16, "u8": np.uint8,
    "bool": np.bool_,
}

# Logical types over a storage dtype, and how many storage elements make one logical element.
# (v2's `f4_e2m1` packs two elements per byte: `unpack_f4`.)
_LOGICAL = {
    "f8_e4m3fn": ("u8", 1), "f8_e5m2": ("u8", 1), "f8_e4m3fnuz": ("u8", 1), "f8_e5m2fnuz": ("u8", 1),
    "f8_e8m0": ("u8", 1), "bool": ("u8", 1), "complex64": ("f32", 2), "complex128": ("f64", 2),
}

# The same logical types by their name in ml_dtypes and in torch.
_LOGICAL_NAMES = {
    "f8_e4m3fn": "float8_e4m3fn", "f8_e5m2": "float8_e5m2", "f8_e4m3fnuz": "float8_e4m3fnuz",
    "f8_e5m2fnuz": "float8_e5m2fnuz", "f8_e8m0": "float8_e8m0fnu", "bool": "bool", "complex64": "complex64",
    "complex128": "complex128",
}


def unpack_f4(packed, shape):
    """v2's `f4_e2m1` (two 4-bit codes per byte, low nibble first) as ml_dtypes.float4_e2m1fn,
    one element per byte, in `shape`."""
    import ml_dtypes

    count = int(np.prod(shape, dtype=np.int64))
    codes = np.empty(2 * len(packed), dtype=np.uint8)
    codes[0::2] = packed & 0x0F
    codes[1::2] = packed >> 4
    return codes[:count].view(ml_dtypes.float4_e2m1fn).reshape(shape)


def numpy_dtype(dtype, logical=None):
    """The numpy dtype for a component; an unknown logical type reads as its storage dtype."""
    if logical in _LOGICAL and _LOGICAL[logical][0] == dtype:
        if logical == "bool":
            return np.dtype(np.bool_)
        if logical == "complex64":
            return np.dtype(np.complex64)
        if logical == "complex128":
            return np.dtype(np.complex128)
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, _LOGICAL_NAMES[logical]))
    if dtype == "bf16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(_NUMPY[dtype])
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}") from None


def torch_dtype(dtype, logical=None):
    import torch

    if logical in _LOGICAL and _LOGICAL[logical][0] == dtype:
        name = _LOGICAL_NAMES[logical]
        found = getattr(torch, name, None)
        if found is None:
            raise ValueError(f"this torch has no {name} for logical type {logical!r}")
        return found
    names = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16", "i64": "int64",
             "i32": "int32", "i16": "int16", "i8": "int8", "u64": "uint64", "u32": "uint32", "u16": "uint16",
             "u8": "uint8", "bool": "bool"}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}")
    found = getattr(torch, names[dtype], None)
    if found is None:
        raise ValueError(f"this torch has no {names[dtype]}")
    return found
