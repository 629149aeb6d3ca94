"""A checkpoint tensor that lives on the server: `RemoteTensor` has the tensor's full shape and
dtype but no data; `narrow` (and basic slicing) only narrow its region, and the first operation
that reads data gets exactly that region's bytes: from the pieces fetched ahead when one holds
it, otherwise fetched from the server there and then (and counted as a miss). So whatever a
vLLM weight loader does, it reads the same values it would from the whole tensor, and a
correct guess of what it reads (`shares`) makes every read a local one."""

import threading

import torch

# Operations that read only a tensor's metadata, answered without fetching anything.
_METADATA = set()
for _name in ("shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "layout", "is_sparse", "is_quantized", "is_meta", "is_nested"):
    _METADATA.add(getattr(torch.Tensor, _name).__get__)
for _name in ("size", "dim", "numel", "nelement", "ndimension", "element_size", "__len__", "is_floating_point", "is_complex", "is_contiguous"):
    _METADATA.add(getattr(torch.Tensor, _name))
_NARROW = {torch.Tensor.narrow, torch.narrow}


class Misses:
    """What was fetched on demand because no piece fetched ahead held it: a count and bytes,
    and the names, each logged once through `log`."""

    def __init__(self, log=None):
        self.count = 0
        self.bytes = 0
        self.names = set()
        self.log = log
        self._lock = threading.Lock()

    def add(self, name, region, nbytes):
        with self._lock:
            self.count += 1
            self.bytes += nbytes
            first = name not in self.names
            self.names.add(name)
        if first and self.log is not None:
            self.log(name, region)


class RemoteTensor(torch.Tensor):
    """`name`'s region `region` (one `(start, stop)` per dimension) of a tensor of `dtype`:
    `pieces` are `(region, tensor)` pairs fetched ahead, `fetch(region)` gets any other region
    from the server, and `misses` counts those."""

    @staticmethod
    def __new__(cls, name, shape, dtype, pieces, fetch, misses, region=None):
        region = tuple(region) if region is not None else tuple((0, n) for n in shape)
        size = [stop - start for start, stop in region]
        tensor = torch.Tensor._make_wrapper_subclass(cls, size, dtype=dtype, device="cpu", requires_grad=False)
        tensor._name = name
        tensor._region = region
        tensor._pieces = pieces
        tensor._fetch = fetch
        tensor._misses = misses
        return tensor

    def __repr__(self):
        return f"RemoteTensor({self._name!r}, region={list(self._region)}, dtype={self.dtype})"

    def narrowed(self, dim, start, length):
        """This tensor's `start:start+length` of dimension `dim`, still remote."""
        ndim = len(self._region)
        if not -ndim <= dim < ndim:
            raise IndexError(f"narrow(): dimension {dim} out of range for a tensor of {ndim} dimensions")
        dim %= ndim
        begin, end = self._region[dim]
        start = int(start)
        if start < 0:
            start += end - begin
        length = int(length)
        if start < 0 or length < 0 or begin + start + length > end:
            raise RuntimeError(f"narrow(): start {start} + length {length} exceeds dimension {dim} size {end - begin}")
        region = list(self._region)
        region[dim] = (begin + start, begin + start + length)
        return RemoteTensor(self._name, None, self.dtype, self._pieces, self._fetch, self._misses, region)

    def _sliced(self, index):
        """Basic slicing (`t[a:b]`, `t[:, a:b]`, no steps) as narrows; None for anything else."""
        items = index if isinstance(index, tuple) else (index,)
        if len(items) > len(self._region) or not all(isinstance(i, slice) and i.step in (None, 1) for i in items):
            return None
        out = self
        for dim, item in enumerate(items):
            start, stop, _ = item.indices(self._region[dim][1] - self._region[dim][0])
            out = out.narrowed(dim, start, max(stop - start, 0))
        return out

    def materialize(self):
        """The region's values as a plain tensor."""
        for region, tensor in self._pieces:
            if all(a <= start and stop <= b for (start, stop), (a, b) in zip(self._region, region)):
                view = tensor
                for dim, ((start, stop), (a, _)) in enumerate(zip(self._region, region)):
                    view = view.narrow(dim, start - a, stop - start)
                return view
        if any(start == stop for start, stop in self._region):
            return torch.empty([stop - start for start, stop in self._region], dtype=self.dtype)
        tensor = self._fetch(self._region)
        self._misses.add(self._name, self._region, tensor.numel() * tensor.element_size())
        return tensor

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _NARROW and isinstance(args[0], RemoteTensor):
            dim, start, length = (list(args[1:]) + [kwargs.get("dim"), kwargs.get("start"), kwargs.get("length")])[:3]
            return args[0].narrowed(dim, start, length)
        if func is torch.Tensor.__getitem__ and isinstance(args[0], RemoteTensor):
            sliced = args[0]._sliced(args[1])
            if sliced is not None:
                return sliced
        if func in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        args, kwargs = _materialized(args), _materialized(kwargs)
        return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return func(*_materialized(args), **_materialized(kwargs or {}))


def _materialized(value):
    """`value` with every RemoteTensor in it (nested in lists, tuples and dicts) replaced by its data."""
    if isinstance(value, RemoteTensor):
        return value.materialize()
    if isinstance(value, (list, tuple)):
        return type(value)(_materialized(v) for v in value)
    if isinstance(value, dict):
        return {k: _materialized(v) for k, v in value.items()}
    return value
