"""A checkpoint tensor that lives on the server: `RemoteTensor` has a view's shape and dtype but
no data. The views vLLM's weight loaders take before they read (`narrow`, basic indexing,
`select`, `unsqueeze`, `unbind`, `chunk`, `split`, `t`, `transpose`, `permute`, and the
`contiguous` or same-dtype `to` that precede them) only change which region of the stored
tensor it names and how that region's dimensions are laid out; the first operation that reads
data gets exactly that region's bytes: from the pieces fetched ahead when one holds it,
otherwise from the server there and then (counted as a miss). So whatever a weight loader does,
it reads the values it would from the whole tensor, and a correct guess of what it reads
(`shares`) makes every read a local one."""

import threading

import torch

# Operations that read only a tensor's metadata, answered without fetching anything.
_METADATA = set()
for _name in ("shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "layout", "is_sparse", "is_quantized", "is_meta",
              "is_nested", "nbytes", "itemsize"):
    _METADATA.add(getattr(torch.Tensor, _name).__get__)
for _name in ("size", "dim", "numel", "nelement", "ndimension", "element_size", "__len__", "is_floating_point", "is_complex",
              "is_contiguous"):
    _METADATA.add(getattr(torch.Tensor, _name))


class Misses:
    """What was fetched on demand because no piece fetched ahead held it: a count and bytes,
    and the names; the first `logged` names are handed to `log`. `limit`, when set, is the
    most bytes the misses may add: one more raises (the load's `strict` setting)."""

    def __init__(self, log=None, logged=5, limit=None):
        self.count = 0
        self.bytes = 0
        self.names = set()
        self.log = log
        self.logged = logged
        self.limit = limit
        self._lock = threading.Lock()

    def add(self, name, region, nbytes):
        with self._lock:
            self.count += 1
            self.bytes += nbytes
            first = name not in self.names
            self.names.add(name)
            over = self.limit is not None and self.bytes > self.limit
            log = first and self.log is not None and len(self.names) <= self.logged
        if log:
            self.log(name, region)
        if over:
            raise OverShare(f"reading {name} off the plan brings what was fetched on demand to {self.bytes / 1e6:.1f} MB, "
                            f"past the {self.limit / 1e6:.1f} MB the strict setting allows")


class OverShare(RuntimeError):
    """A rank would fetch more than the strict setting allows."""


class RemoteTensor(torch.Tensor):
    """A view of stored tensor `name` (of `shape` and `dtype`): `region` is one `(start, stop)`
    per stored dimension; `dims` gives, for each dimension of the view, the stored dimension it
    is (or None for a dimension of size 1 the view inserted); a stored dimension the view does
    not list was indexed away (its region is one element). `pieces` are `(region, tensor)`
    pairs fetched ahead (regions over every stored dimension; a tensor still on its way is a
    pending piece whose `result()` waits for it), `fetch(region)` gets any other region from
    the server, and `misses` counts those. Copied into a tensor (`destination.copy_(view)`,
    as weight loaders do), it is copied piece by piece, each as it arrives."""

    @staticmethod
    def __new__(cls, name, shape, dtype, pieces, fetch, misses, region=None, dims=None):
        region = tuple(region) if region is not None else tuple((0, n) for n in shape)
        dims = tuple(dims) if dims is not None else tuple(range(len(region)))
        size = [1 if d is None else region[d][1] - region[d][0] for d in dims]
        tensor = torch.Tensor._make_wrapper_subclass(cls, size, dtype=dtype, device="cpu", requires_grad=False)
        tensor._name = name
        tensor._region = region
        tensor._dims = dims
        tensor._pieces = pieces
        tensor._fetch = fetch
        tensor._misses = misses
        return tensor

    def __repr__(self):
        return f"RemoteTensor({self._name!r}, region={list(self._region)}, dims={list(self._dims)}, dtype={self.dtype})"

    def _view(self, region=None, dims=None):
        return RemoteTensor(self._name, None, self.dtype, self._pieces, self._fetch, self._misses,
                            self._region if region is None else region, self._dims if dims is None else dims)

    def _dim(self, dim, ndim=None):
        ndim = len(self._dims) if ndim is None else ndim
        if not -ndim <= dim < max(ndim, 1):
            raise IndexError(f"dimension {dim} out of range for a tensor of {len(self._dims)} dimensions")
        return dim % max(ndim, 1)

    def narrowed(self, dim, start, length):
        """This view's `start:start+length` of dimension `dim`, still remote."""
        dim = self._dim(dim)
        size = self.shape[dim]
        start, length = int(start), int(length)
        if start < 0:
            start += size
        if start < 0 or length < 0 or start + length > size:
            raise RuntimeError(f"narrow(): start {start} + length {length} exceeds dimension {dim} size {size}")
        stored = self._dims[dim]
        if stored is None:
            # An inserted dimension has size 1: narrowing it keeps the view whole or empties it.
            return self if length == 1 else torch.empty([0 if d == dim else n for d, n in enumerate(self.shape)], dtype=self.dtype)
        begin = self._region[stored][0]
        region = list(self._region)
        region[stored] = (begin + start, begin + start + length)
        return self._view(region=region)

    def selected(self, dim, index):
        """This view with dimension `dim` indexed at `index` (removed), still remote."""
        dim = self._dim(dim)
        size = self.shape[dim]
        index = int(index)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError(f"index {index} is out of bounds for dimension {dim} with size {size}")
        stored = self._dims[dim]
        dims = self._dims[:dim] + self._dims[dim + 1:]
        if stored is None:
            return self._view(dims=dims)
        begin = self._region[stored][0]
        region = list(self._region)
        region[stored] = (begin + index, begin + index + 1)
        return self._view(region=region, dims=dims)

    def unsqueezed(self, dim):
        dim = self._dim(dim, len(self._dims) + 1)
        return self._view(dims=self._dims[:dim] + (None,) + self._dims[dim:])

    def permuted(self, order):
        order = [self._dim(d) for d in order]
        if sorted(order) != list(range(len(self._dims))):
            raise RuntimeError(f"permute(): {order} is not a permutation of {len(self._dims)} dimensions")
        return self._view(dims=tuple(self._dims[d] for d in order))

    def transposed(self, a, b):
        order = list(range(len(self._dims)))
        a, b = self._dim(a), self._dim(b)
        order[a], order[b] = order[b], order[a]
        return self.permuted(order)

    def split_at(self, sizes, dim):
        """Consecutive narrows of dimension `dim`, of `sizes`."""
        out, start = [], 0
        for size in sizes:
            out.append(self.narrowed(dim, start, size))
            start += size
        return tuple(out)

    def _indexed(self, index):
        """Basic indexing (slices of step 1, integers, `...`, None) as views; None for anything else."""
        items = list(index) if isinstance(index, tuple) else [index]
        if any(not isinstance(i, (slice, int, type(Ellipsis), type(None))) or isinstance(i, bool) for i in items):
            return None
        if any(isinstance(i, slice) and i.step not in (None, 1) for i in items):
            return None
        if items.count(Ellipsis) > 1:
            return None
        consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
        if consumed > len(self._dims):
            return None
        if Ellipsis in items:
            at = items.index(Ellipsis)
            items[at:at + 1] = [slice(None)] * (len(self._dims) - consumed)
        out, dim = self, 0
        for item in items:
            if item is None:
                out = out.unsqueezed(dim)
                dim += 1
            elif isinstance(item, int):
                out = out.selected(dim, item)
            else:
                start, stop, _ = item.indices(out.shape[dim])
                out = out.narrowed(dim, start, max(stop - start, 0))
                dim += 1
        return out

    def _local(self, region):
        """`region` of the stored tensor from the pieces fetched ahead: a view of the piece that
        holds it, or the pieces that tile it copied into one tensor; None when they do not
        cover it."""
        for piece_region, tensor in self._pieces:
            if _within(region, piece_region):
                return _narrowed(_value(tensor), region, piece_region)
        overlaps = [(r, t) for r, t in self._pieces if _meets(region, r)]
        if sum(_volume(_intersection(region, r)) for r, _ in overlaps) != _volume(region):
            return None
        out = torch.empty([stop - start for start, stop in region], dtype=self.dtype)
        for piece_region, tensor in overlaps:
            common = _intersection(region, piece_region)
            _narrowed(out, common, region).copy_(_narrowed(_value(tensor), common, piece_region))
        return out

    def _as_view(self, data):
        """`data` (of the stored dimensions of this view's region) laid out as this view's
        dimensions: those indexed away squeezed, the rest in the view's order, inserted ones added."""
        kept = [d for d in self._dims if d is not None]
        for stored in sorted(set(range(len(self._region))) - set(kept), reverse=True):
            data = data.squeeze(stored)
        remaining = sorted(kept)
        data = data.permute([remaining.index(d) for d in kept]) if kept != remaining else data
        for at, stored in enumerate(self._dims):
            if stored is None:
                data = data.unsqueeze(at)
        return data

    def materialize(self):
        """The view's values as a plain tensor."""
        region = self._region
        data = self._local(region)
        if data is None:
            if any(start == stop for start, stop in region):
                data = torch.empty([stop - start for start, stop in region], dtype=self.dtype)
            else:
                data = self._fetch(region)
                self._misses.add(self._name, region, data.numel() * data.element_size())
        return self._as_view(data)

    def copy_into(self, destination, non_blocking=False):
        """`destination.copy_(self)` one fetched piece at a time, each into its own part of
        `destination`, so a tensor fetched in several pieces is never copied into one first;
        False (nothing copied) when the pieces do not cover the view or the shapes differ."""
        if tuple(destination.shape) != tuple(self.shape):
            return False
        region = self._region
        overlaps = [(r, t) for r, t in self._pieces if _meets(region, r)]
        if sum(_volume(_intersection(region, r)) for r, _ in overlaps) != _volume(region):
            return False
        for piece_region, tensor in overlaps:
            common = _intersection(region, piece_region)
            target = destination
            for at, stored in enumerate(self._dims):
                if stored is not None:
                    target = target.narrow(at, common[stored][0] - region[stored][0], common[stored][1] - common[stored][0])
            target.copy_(self._as_view(_narrowed(_value(tensor), common, piece_region)), non_blocking=non_blocking)
        return True

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.copy_ and len(args) >= 2 and isinstance(args[1], RemoteTensor) \
                and not isinstance(args[0], RemoteTensor):
            with torch._C.DisableTorchFunctionSubclass():
                if args[1].copy_into(args[0], *args[2:], **kwargs):
                    return args[0]
        if args and isinstance(args[0], RemoteTensor):
            viewed = _lazy(func, args[0], args[1:], kwargs)
            if viewed is not NotImplemented:
                return viewed
        if func in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        args, kwargs = _materialized(args), _materialized(kwargs)
        return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return func(*_materialized(args), **_materialized(kwargs or {}))


def _value(piece):
    """A piece's tensor: as given, or waited for (a piece still on its way has `result()`)."""
    result = getattr(piece, "result", None)
    return piece if result is None or isinstance(piece, torch.Tensor) else result()


def _within(region, outer):
    return all(a <= start and stop <= b for (start, stop), (a, b) in zip(region, outer))


def _meets(region, other):
    return all(start < b and a < stop for (start, stop), (a, b) in zip(region, other))


def _intersection(region, other):
    return tuple((max(start, a), min(stop, b)) for (start, stop), (a, b) in zip(region, other))


def _volume(region):
    count = 1
    for start, stop in region:
        count *= max(stop - start, 0)
    return count


def _narrowed(tensor, region, tensor_region):
    """`region` of `tensor`, which holds `tensor_region` (both over every stored dimension)."""
    for dim, ((start, stop), (a, _)) in enumerate(zip(region, tensor_region)):
        tensor = tensor.narrow(dim, start - a, stop - start)
    return tensor


def _arguments(args, kwargs, names, defaults):
    """`args` and `kwargs` of a call as one value per name in `names`."""
    values = list(args) + [kwargs.get(name, default) for name, default in list(zip(names, defaults))[len(args):]]
    return values[: len(names)]


def _chunk_sizes(size, chunks):
    each = -(-size // chunks) if size else 0
    sizes = []
    while size > 0:
        sizes.append(min(each, size))
        size -= each
    return sizes or [0]


def _split_sizes(size, split):
    if isinstance(split, int):
        return [min(split, size - start) for start in range(0, size, split)] or [0]
    return list(split)


def _keeps_values(args, kwargs, dtype):
    """Whether a `to` call only moves the tensor (device, non_blocking, memory format, no copy
    asked for), so the view may stay remote."""
    if kwargs.get("copy") or "dtype" in kwargs and kwargs["dtype"] != dtype:
        return False
    for arg in args:
        if isinstance(arg, torch.dtype) and arg != dtype or isinstance(arg, torch.Tensor):
            return False
    return True


_NARROW = {torch.Tensor.narrow, torch.narrow}
_SELECT = {torch.Tensor.select, torch.select}
_UNSQUEEZE = {torch.Tensor.unsqueeze, torch.unsqueeze}
_UNBIND = {torch.Tensor.unbind, torch.unbind}
_CHUNK = {torch.Tensor.chunk, torch.chunk}
_SPLIT = {torch.Tensor.split, torch.split, torch.functional.split}
_TRANSPOSE = {torch.Tensor.transpose, torch.transpose, torch.Tensor.swapaxes, torch.swapaxes}
_PERMUTE = {torch.Tensor.permute, torch.permute}
_T = {torch.Tensor.t, torch.t}
_SAME = {torch.Tensor.contiguous, torch.Tensor.detach, torch.detach}


def _lazy(func, tensor, args, kwargs):
    """`func` applied to remote `tensor` as a view, or NotImplemented when it reads data."""
    if func in _NARROW:
        dim, start, length = _arguments(args, kwargs, ("dim", "start", "length"), (None, None, None))
        return tensor.narrowed(dim, start, length)
    if func is torch.Tensor.__getitem__:
        viewed = tensor._indexed(args[0])
        return NotImplemented if viewed is None else viewed
    if func in _SELECT:
        dim, index = _arguments(args, kwargs, ("dim", "index"), (None, None))
        return tensor.selected(dim, index)
    if func in _UNSQUEEZE:
        return tensor.unsqueezed(_arguments(args, kwargs, ("dim",), (None,))[0])
    if func in _UNBIND:
        dim = _arguments(args, kwargs, ("dim",), (0,))[0]
        return tuple(tensor.selected(dim, i) for i in range(tensor.shape[tensor._dim(dim)]))
    if func in _CHUNK:
        chunks, dim = _arguments(args, kwargs, ("chunks", "dim"), (None, 0))
        return tensor.split_at(_chunk_sizes(tensor.shape[tensor._dim(dim)], chunks), dim)
    if func in _SPLIT:
        split, dim = _arguments(args, kwargs, ("split_size_or_sections", "dim"), (None, 0))
        if split is None:
            split = kwargs.get("split_size")
        return tensor.split_at(_split_sizes(tensor.shape[tensor._dim(dim)], split), dim)
    if func in _TRANSPOSE:
        a, b = _arguments(args, kwargs, ("dim0", "dim1"), (None, None))
        return tensor.transposed(a, b)
    if func in _PERMUTE:
        order = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else (args or kwargs.get("dims"))
        return tensor.permuted(order)
    if func in _T:
        if tensor.dim() > 2:
            return NotImplemented
        return tensor.transposed(0, 1) if tensor.dim() == 2 else tensor
    if func in _SAME:
        return tensor
    if func is torch.Tensor.to and _keeps_values(args, kwargs, tensor.dtype):
        return tensor
    return NotImplemented


def _materialized(value):
    """`value` with every RemoteTensor in it (nested in lists, tuples and dicts) replaced by its data."""
    if isinstance(value, RemoteTensor):
        return value.materialize()
    if isinstance(value, (list, tuple)):
        return type(value)(_materialized(v) for v in value)
    if isinstance(value, dict):
        return {k: _materialized(v) for k, v in value.items()}
    return value
