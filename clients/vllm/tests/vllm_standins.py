"""Stand-ins of vLLM 0.32's layers for the load format's tests: named as vLLM's classes are,
holding one rank's parameters, whose weight loaders narrow the checkpoint tensor as vLLM's do
(`parameter.py`'s vLLM parameters, `linear.py`'s weight_loader_v2, `RoutedExperts` and gpt-oss's
expert loaders), for unquantized, FP8 (per tensor and 128x128 blocks), GPTQ, AWQ and
compressed-tensors (W8A8 int8, packed W4A16) checkpoints, dense or with experts, under tensor
and expert parallelism. `Model` builds one rank of a small model from a `Spec`, `checkpoint`
writes its tensors, and `load` loads them the way vLLM's AutoWeightsLoader hands them out."""

from dataclasses import dataclass

import torch

# ---------------------------------------------------------------- vLLM's parameters


class BasevLLMParameter(torch.nn.Parameter):
    def __new__(cls, data, **kwargs):
        return super().__new__(cls, data=data, requires_grad=False)

    def __init__(self, data, weight_loader):
        self._weight_loader = weight_loader
        self.tp_rank, self.tp_size = 0, 1

    @property
    def weight_loader(self):
        return self._weight_loader

    def _assert_and_load(self, loaded):
        assert self.data.shape == loaded.shape or (self.data.numel() == 1 and loaded.numel() == 1), (self.data.shape, loaded.shape)
        self.data.copy_(loaded)

    def load_column_parallel_weight(self, loaded):
        self._assert_and_load(loaded)

    def load_row_parallel_weight(self, loaded):
        self._assert_and_load(loaded)

    def load_merged_column_weight(self, loaded, **kwargs):
        self._assert_and_load(loaded)

    def load_qkv_weight(self, loaded, **kwargs):
        self._assert_and_load(loaded)


class _ColumnvLLMParameter(BasevLLMParameter):
    def __init__(self, output_dim, **kwargs):
        self._output_dim = output_dim
        super().__init__(**kwargs)

    @property
    def output_dim(self):
        return self._output_dim

    def _packed(self, size, offset):
        if isinstance(self, (PackedColumnParameter, PackedvLLMParameter)) and self.packed_dim == self.output_dim:
            return size // self.packed_factor, offset // self.packed_factor
        return size, offset

    def load_column_parallel_weight(self, loaded):
        size = self.data.shape[self.output_dim]
        loaded = loaded.narrow(self.output_dim, self.tp_rank * size, size)
        assert self.data.shape == loaded.shape
        self.data.copy_(loaded)

    def _load_part(self, loaded, size, offset, at):
        """The `at`-th `size` of `loaded` into this parameter's part at `offset` (packed units)."""
        size, offset = self._packed(size, offset)
        target = self.data.narrow(self.output_dim, offset, size)
        loaded = loaded.narrow(self.output_dim, at * size, size)
        assert target.shape == loaded.shape
        target.copy_(loaded)

    def load_merged_column_weight(self, loaded, **kwargs):
        self._load_part(loaded, kwargs["shard_size"], kwargs["shard_offset"], self.tp_rank)

    def load_qkv_weight(self, loaded, **kwargs):
        at = self.tp_rank if kwargs["shard_id"] == "q" else self.tp_rank // kwargs["num_heads"]
        self._load_part(loaded, kwargs["shard_size"], kwargs["shard_offset"], at)


class RowvLLMParameter(BasevLLMParameter):
    def __init__(self, input_dim, **kwargs):
        self._input_dim = input_dim
        super().__init__(**kwargs)

    @property
    def input_dim(self):
        return self._input_dim

    def load_row_parallel_weight(self, loaded):
        size = self.data.shape[self.input_dim]
        loaded = loaded.narrow(self.input_dim, self.tp_rank * size, size)
        if len(loaded.shape) == 0:
            loaded = loaded.reshape(1)
        assert self.data.shape == loaded.shape
        self.data.copy_(loaded)


class ModelWeightParameter(_ColumnvLLMParameter, RowvLLMParameter):
    pass


class GroupQuantScaleParameter(_ColumnvLLMParameter, RowvLLMParameter):
    pass


class ChannelQuantScaleParameter(_ColumnvLLMParameter):
    pass


class BlockQuantScaleParameter(_ColumnvLLMParameter, RowvLLMParameter):
    pass


class PerTensorScaleParameter(BasevLLMParameter):
    def load_column_parallel_weight(self, loaded):
        BasevLLMParameter.load_row_parallel_weight(self, loaded)

    def load_merged_column_weight(self, loaded, **kwargs):
        self._into_part(loaded, kwargs["shard_id"])

    def load_qkv_weight(self, loaded, **kwargs):
        self._into_part(loaded, kwargs["shard_id"])

    def _into_part(self, loaded, shard_id):
        index = shard_id if isinstance(shard_id, int) else "qkv".index(shard_id)
        if len(loaded.shape) != 0:
            assert loaded.shape[0] == 1
            loaded = loaded[0]
        self.data[index].copy_(loaded)


class _Packed:
    def __init__(self, packed_factor, packed_dim, **kwargs):
        self._packed_factor, self._packed_dim = packed_factor, packed_dim
        super().__init__(**kwargs)

    @property
    def packed_dim(self):
        return self._packed_dim

    @property
    def packed_factor(self):
        return self._packed_factor


class PackedColumnParameter(_Packed, _ColumnvLLMParameter):
    pass


class PackedvLLMParameter(_Packed, ModelWeightParameter):
    pass


def plain(data, **attrs):
    """A plain parameter marked as `set_weight_attrs` marks one."""
    p = torch.nn.Parameter(data, requires_grad=False)
    for key, value in attrs.items():
        setattr(p, key, value)
    return p


# ---------------------------------------------------------------- linear methods


def _ceil(a, b):
    return -(-a // b)


class UnquantizedLinearMethod:
    dtype = torch.bfloat16

    def create_weights(self, layer, inputs, outputs, loader):
        layer.register_parameter("weight", ModelWeightParameter(
            data=torch.zeros(sum(outputs), inputs, dtype=self.dtype), input_dim=1, output_dim=0, weight_loader=loader))


class UnquantizedEmbeddingMethod:
    pass


class Fp8LinearMethod:
    """FP8: 128x128 block scales (`weight_scale_inv`, DeepSeek-V3's), or one scale per stacked
    part (`weight_scale`) with static input scales."""

    def __init__(self, block=None):
        self.block = block

    def create_weights(self, layer, inputs, outputs, loader):
        layer.weight_block_size = list(self.block) if self.block else None
        layer.register_parameter("weight", ModelWeightParameter(
            data=torch.zeros(sum(outputs), inputs, dtype=torch.float8_e4m3fn), input_dim=1, output_dim=0, weight_loader=loader))
        if self.block:
            bn, bk = self.block
            layer.register_parameter("weight_scale_inv", BlockQuantScaleParameter(
                data=torch.zeros(_ceil(sum(outputs), bn), _ceil(inputs, bk)), input_dim=1, output_dim=0, weight_loader=loader))
        else:
            layer.register_parameter("weight_scale", PerTensorScaleParameter(data=torch.zeros(len(outputs)), weight_loader=loader))
            layer.register_parameter("input_scale", PerTensorScaleParameter(data=torch.zeros(len(outputs)), weight_loader=loader))


class AutoGPTQLinearMethod:
    """GPTQ 4-bit as vLLM 0.32 holds it: `qweight` [K/8, N] packed along K, `qzeros` [K/g, N/8],
    `scales` [K/g, N], no `g_idx` (it refuses act-order checkpoints); channel-wise (group -1)
    scales and zeros of a row-parallel layer are every rank's."""

    def __init__(self, group=32):
        self.group = group

    def create_weights(self, layer, inputs, outputs, loader):
        out = sum(outputs)
        row = isinstance(layer, RowParallelLinear) and layer.tp_size > 1
        layer.register_parameter("qweight", PackedvLLMParameter(
            data=torch.zeros(inputs // 8, out, dtype=torch.int32), input_dim=0, output_dim=1, packed_dim=0, packed_factor=8,
            weight_loader=loader))
        if self.group == -1 and row:
            layer.register_parameter("scales", ChannelQuantScaleParameter(
                data=torch.zeros(1, out, dtype=torch.float16), output_dim=1, weight_loader=loader))
            layer.register_parameter("qzeros", PackedColumnParameter(
                data=torch.zeros(1, out // 8, dtype=torch.int32), output_dim=1, packed_dim=1, packed_factor=8, weight_loader=loader))
        else:
            groups = 1 if self.group == -1 else inputs // self.group
            layer.register_parameter("scales", GroupQuantScaleParameter(
                data=torch.zeros(groups, out, dtype=torch.float16), output_dim=1, input_dim=0, weight_loader=loader))
            layer.register_parameter("qzeros", PackedvLLMParameter(
                data=torch.zeros(groups, out // 8, dtype=torch.int32), input_dim=0, output_dim=1, packed_dim=1, packed_factor=8,
                weight_loader=loader))


class AutoAWQLinearMethod:
    """AWQ 4-bit: `qweight` [K, N/8] packed along N, `qzeros` [K/g, N/8], `scales` [K/g, N]."""

    def __init__(self, group=32):
        self.group = group

    def create_weights(self, layer, inputs, outputs, loader):
        out = sum(outputs)
        layer.register_parameter("qweight", PackedvLLMParameter(
            data=torch.zeros(inputs, out // 8, dtype=torch.int32), input_dim=0, output_dim=1, packed_dim=1, packed_factor=8,
            weight_loader=loader))
        layer.register_parameter("qzeros", PackedvLLMParameter(
            data=torch.zeros(inputs // self.group, out // 8, dtype=torch.int32), input_dim=0, output_dim=1, packed_dim=1,
            packed_factor=8, weight_loader=loader))
        layer.register_parameter("scales", GroupQuantScaleParameter(
            data=torch.zeros(inputs // self.group, out, dtype=torch.float16), input_dim=0, output_dim=1, weight_loader=loader))


class CompressedTensorsLinearMethod:
    """compressed-tensors: W8A8 int8 or FP8 (`weight`, `weight_scale` [N, 1] per channel) or packed
    W4A16 (`weight_packed` [N, K/8], `weight_scale` [N, K/g], `weight_shape`)."""

    def __init__(self, scheme="w8a8", group=32):
        self.scheme, self.group = scheme, group

    def create_weights(self, layer, inputs, outputs, loader):
        out = sum(outputs)
        if self.scheme in ("w8a8", "w8a8-fp8"):
            dtype = torch.int8 if self.scheme == "w8a8" else torch.float8_e4m3fn
            layer.register_parameter("weight", ModelWeightParameter(
                data=torch.zeros(out, inputs, dtype=dtype), input_dim=1, output_dim=0, weight_loader=loader))
            layer.register_parameter("weight_scale", ChannelQuantScaleParameter(
                data=torch.zeros(out, 1), output_dim=0, weight_loader=loader))
            return
        layer.register_parameter("weight_packed", PackedvLLMParameter(
            data=torch.zeros(out, inputs // 8, dtype=torch.int32), input_dim=1, output_dim=0, packed_dim=1, packed_factor=8,
            weight_loader=loader))
        layer.register_parameter("weight_scale", GroupQuantScaleParameter(
            data=torch.zeros(out, inputs // self.group, dtype=torch.bfloat16), output_dim=0, input_dim=1, weight_loader=loader))
        layer.register_parameter("weight_shape", BasevLLMParameter(data=torch.zeros(2, dtype=torch.int64), weight_loader=loader))


# ---------------------------------------------------------------- linear layers


def _fused_without_parts(param, loaded, load):
    """vLLM's first cases of a tensor fused on disk: one scale per stacked part, filled from the
    one stored (`load` by part), or a parameter without an output dimension, loaded whole;
    False for the others, which are cut part by part."""
    if isinstance(param, PerTensorScaleParameter):
        for i in range(param.data.shape[0]):
            load(loaded, shard_id=i)
        return True
    if type(param) in (RowvLLMParameter, BasevLLMParameter):
        load(loaded)
        return True
    return False


def _adjust_block(layer, param, size, offset):
    if isinstance(param, BlockQuantScaleParameter):
        bn = layer.weight_block_size[0]
        return _ceil(size, bn), _ceil(offset, bn)
    return size, offset


class _Linear(torch.nn.Module):
    def __init__(self, inputs, outputs, rank, size, quant, bias=False):
        super().__init__()
        self.tp_rank, self.tp_size = rank, size
        self.input_size = inputs
        self.quant_method = quant or UnquantizedLinearMethod()
        self._create(inputs, outputs)
        for p in self.parameters():
            if isinstance(p, BasevLLMParameter):
                p.tp_rank, p.tp_size = self.tp_rank, self.tp_size
        if bias:
            self.bias = plain(torch.zeros(self._bias_size(outputs), dtype=torch.float32), output_dim=0)
            self.bias.weight_loader = self.weight_loader


class ReplicatedLinear(_Linear):
    def __init__(self, inputs, outputs, quant=None):
        super().__init__(inputs, outputs, 0, 1, quant)

    def _create(self, inputs, outputs):
        self.quant_method.create_weights(self, inputs, [outputs], self.weight_loader)

    def weight_loader(self, param, loaded):
        if len(loaded.shape) == 0:
            loaded = loaded.reshape(1)
        assert param.size() == loaded.size()
        param.data.copy_(loaded)


class GateLinear(ReplicatedLinear):
    """A router gate: replicated, never quantized."""

    def __init__(self, inputs, outputs):
        super().__init__(inputs, outputs, UnquantizedLinearMethod())


class ColumnParallelLinear(_Linear):
    def __init__(self, inputs, outputs, rank, size, quant=None, bias=False):
        self.output_size_per_partition = outputs // size
        super().__init__(inputs, outputs, rank, size, quant, bias)

    def _bias_size(self, outputs):
        return outputs // self.tp_size

    def _create(self, inputs, outputs):
        self.quant_method.create_weights(self, inputs, [outputs // self.tp_size], self.weight_loader_v2)

    def weight_loader(self, param, loaded, shard=None):
        size = param.data.shape[param.output_dim]
        param.data.copy_(loaded.narrow(param.output_dim, self.tp_rank * size, size))

    def weight_loader_v2(self, param, loaded, shard=None):
        if len(loaded.shape) == 0:
            loaded = loaded.reshape(1)
        param.load_column_parallel_weight(loaded)


class MergedColumnParallelLinear(ColumnParallelLinear):
    def __init__(self, inputs, sizes, rank, size, quant=None):
        self.output_sizes = list(sizes)
        super().__init__(inputs, sum(sizes), rank, size, quant)

    def _create(self, inputs, outputs):
        self.quant_method.create_weights(self, inputs, [s // self.tp_size for s in self.output_sizes], self.weight_loader_v2)

    def weight_loader_v2(self, param, loaded, shard=None):
        if shard is None:
            if _fused_without_parts(param, loaded, param.load_merged_column_weight):
                return
            offset = 0
            for i, full in enumerate(self.output_sizes):
                size, at = param._packed(*_adjust_block(self, param, full, offset))
                self.weight_loader_v2(param, loaded.narrow(param.output_dim, at, size), i)
                offset += full
            return
        offset = sum(self.output_sizes[:shard]) // self.tp_size
        size = self.output_sizes[shard] // self.tp_size
        size, offset = _adjust_block(self, param, size, offset)
        param.load_merged_column_weight(loaded, shard_id=shard, shard_offset=offset, shard_size=size)


class QKVParallelLinear(ColumnParallelLinear):
    def __init__(self, hidden, head, heads, kv_heads, rank, size, quant=None, bias=False):
        self.total_heads, self.total_kv_heads, self.head_size = heads, kv_heads, head
        self.v_head_size = head
        self.num_heads = heads // size
        if size >= kv_heads:
            self.num_kv_heads, self.num_kv_head_replicas = 1, size // kv_heads
        else:
            self.num_kv_heads, self.num_kv_head_replicas = kv_heads // size, 1
        self.output_sizes = [self.num_heads * head * size, self.num_kv_heads * head * size, self.num_kv_heads * head * size]
        super().__init__(hidden, sum(self.output_sizes), rank, size, quant, bias)

    def _create(self, inputs, outputs):
        self.quant_method.create_weights(self, inputs, [s // self.tp_size for s in self.output_sizes], self.weight_loader_v2)

    def weight_loader(self, param, loaded, shard):
        q, kv = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        offset, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard]
        at = self.tp_rank if shard == "q" else self.tp_rank // self.num_kv_head_replicas
        target = param.data.narrow(param.output_dim, offset, size)
        target.copy_(loaded.narrow(param.output_dim, at * size, size))

    def weight_loader_v2(self, param, loaded, shard=None):
        if shard is None:
            if _fused_without_parts(param, loaded, param.load_qkv_weight):
                return
            head = self.head_size
            parts = [("q", 0, self.total_heads * head), ("k", self.total_heads * head, self.total_kv_heads * head),
                     ("v", (self.total_heads + self.total_kv_heads) * head, self.total_kv_heads * head)]
            for shard_id, offset, size in parts:
                size, offset = param._packed(*_adjust_block(self, param, size, offset))
                self.weight_loader_v2(param, loaded.narrow(param.output_dim, offset, size), shard_id)
            return
        q, kv = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        offset, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard]
        size, offset = _adjust_block(self, param, size, offset)
        param.load_qkv_weight(loaded, num_heads=self.num_kv_head_replicas, shard_id=shard, shard_offset=offset, shard_size=size)


class RowParallelLinear(_Linear):
    def __init__(self, inputs, outputs, rank, size, quant=None):
        self.input_size_per_partition = inputs // size
        super().__init__(inputs, outputs, rank, size, quant)

    def _create(self, inputs, outputs):
        self.quant_method.create_weights(self, inputs // self.tp_size, [outputs], self.weight_loader_v2)

    def weight_loader_v2(self, param, loaded, shard=None):
        if len(loaded.shape) == 0:
            loaded = loaded.reshape(1)
        param.load_row_parallel_weight(loaded)


class Indices:
    def __init__(self, start, stop):
        self.org_vocab_start_index, self.org_vocab_end_index = start, stop


class VocabParallelEmbedding(torch.nn.Module):
    def __init__(self, vocab, hidden, rank, size):
        super().__init__()
        self.tp_size = size
        self.quant_method = UnquantizedEmbeddingMethod()
        per = _ceil(vocab, 64) * 64 // size
        self.shard_indices = Indices(min(rank * per, vocab), min((rank + 1) * per, vocab))
        self.org_vocab_size = vocab
        self.weight = plain(torch.zeros(per, hidden, dtype=torch.bfloat16), output_dim=0, input_dim=1)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param, loaded, shard=None):
        assert loaded.shape[param.output_dim] == self.org_vocab_size
        start = self.shard_indices.org_vocab_start_index
        loaded = loaded.narrow(param.output_dim, start, self.shard_indices.org_vocab_end_index - start)
        param[: loaded.shape[0]].data.copy_(loaded)
        param[loaded.shape[0]:].data.fill_(0)


class ParallelLMHead(VocabParallelEmbedding):
    pass


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight = plain(torch.zeros(hidden, dtype=torch.bfloat16))
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param, loaded, shard=None):
        assert param.data.shape == loaded.shape
        param.data.copy_(loaded)


# ---------------------------------------------------------------- experts


class UnquantizedFusedMoEMethod:
    def create_weights(self, layer, e, h, i):
        layer.add("w13_weight", torch.zeros(e, 2 * i, h, dtype=torch.bfloat16))
        layer.add("w2_weight", torch.zeros(e, h, i, dtype=torch.bfloat16))


class Fp8MoEMethod:
    def __init__(self, block=None):
        self.block = block
        self.weight_scale_refine = None

    def create_weights(self, layer, e, h, i):
        layer.add("w13_weight", torch.zeros(e, 2 * i, h, dtype=torch.float8_e4m3fn))
        layer.add("w2_weight", torch.zeros(e, h, i, dtype=torch.float8_e4m3fn))
        if self.block:
            bn, bk = self.block
            layer.add("w13_weight_scale_inv", torch.zeros(e, 2 * _ceil(i, bn), _ceil(h, bk)), quant_method="block")
            layer.add("w2_weight_scale_inv", torch.zeros(e, _ceil(h, bn), _ceil(i, bk)), quant_method="block")
        else:
            layer.add("w13_weight_scale", torch.zeros(e, 2), quant_method="tensor")
            layer.add("w2_weight_scale", torch.zeros(e), quant_method="tensor")
            layer.add("w13_input_scale", torch.zeros(e), quant_method="tensor")
            layer.add("w2_input_scale", torch.zeros(e), quant_method="tensor")


class AutoGPTQMoEMethod:
    def __init__(self, group=32):
        self.group = group

    def create_weights(self, layer, e, h, i):
        attrs = {"quant_method": "group" if self.group != -1 else "channel", "is_transposed": True}
        g13, g2 = (h // self.group, i // self.group) if self.group != -1 else (1, 1)
        layer.add("w13_qweight", torch.zeros(e, h // 8, 2 * i, dtype=torch.int32), **attrs)
        layer.add("w2_qweight", torch.zeros(e, i // 8, h, dtype=torch.int32), **attrs)
        layer.add("w13_scales", torch.zeros(e, g13, 2 * i, dtype=torch.float16), **attrs)
        layer.add("w2_scales", torch.zeros(e, g2, h, dtype=torch.float16), **attrs)
        layer.add("w13_qzeros", torch.zeros(e, g13, 2 * i // 8, dtype=torch.int32), **attrs)
        layer.add("w2_qzeros", torch.zeros(e, g2, h // 8, dtype=torch.int32), **attrs)


class AutoAWQMoEMethod:
    def __init__(self, group=32):
        self.group = group

    def create_weights(self, layer, e, h, i):
        g, attrs = self.group, {"quant_method": "group", "is_transposed": True}
        layer.add("w13_qweight", torch.zeros(e, h, 2 * i // 8, dtype=torch.int32), **attrs)
        layer.add("w2_qweight", torch.zeros(e, i, h // 8, dtype=torch.int32), **attrs)
        layer.add("w13_scales", torch.zeros(e, h // g, 2 * i, dtype=torch.float16), **attrs)
        layer.add("w2_scales", torch.zeros(e, i // g, h, dtype=torch.float16), **attrs)
        layer.add("w13_qzeros", torch.zeros(e, h // g, 2 * i // 8, dtype=torch.int32), **attrs)
        layer.add("w2_qzeros", torch.zeros(e, i // g, h // 8, dtype=torch.int32), **attrs)


class CompressedTensorsW8A8Int8MoEMethod:
    dtype = torch.int8

    def create_weights(self, layer, e, h, i):
        layer.add("w13_weight", torch.zeros(e, 2 * i, h, dtype=self.dtype), quant_method="channel")
        layer.add("w2_weight", torch.zeros(e, h, i, dtype=self.dtype), quant_method="channel")
        layer.add("w13_weight_scale", torch.zeros(e, 2 * i, 1), quant_method="channel")
        layer.add("w2_weight_scale", torch.zeros(e, h, 1), quant_method="channel")


class CompressedTensorsW8A8Fp8MoEMethod(CompressedTensorsW8A8Int8MoEMethod):
    """The same per-channel layout with FP8 weights (a distinct method name in vLLM)."""

    dtype = torch.float8_e4m3fn


class CompressedTensorsWNA16MoEMethod:
    def __init__(self, group=32):
        self.group = group

    def create_weights(self, layer, e, h, i):
        g, attrs = self.group, {"quant_method": "group", "is_transposed": False}
        layer.add("w13_weight_packed", torch.zeros(e, 2 * i, h // 8, dtype=torch.int32), **attrs)
        layer.add("w2_weight_packed", torch.zeros(e, h, i // 8, dtype=torch.int32), **attrs)
        layer.add("w13_weight_scale", torch.zeros(e, 2 * i, h // g, dtype=torch.bfloat16), **attrs)
        layer.add("w2_weight_scale", torch.zeros(e, h, i // g, dtype=torch.bfloat16), **attrs)
        layer.add("w13_weight_shape", torch.zeros(e, 2), **attrs)
        layer.add("w2_weight_shape", torch.zeros(e, 2), **attrs)


class _Record:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class ExpertMapManager:
    def __init__(self, experts, ep_size, ep_rank):
        base, rest = divmod(experts, ep_size)
        count = base + (1 if ep_rank < rest else 0)
        start = ep_rank * base + min(ep_rank, rest)
        self.local = list(range(start, start + count)) if ep_size > 1 else list(range(experts))

    def get_local_expert_ids(self):
        return list(self.local)

    def map_global_to_local(self, expert):
        return self.local.index(expert) if expert in self.local else -1


class RoutedExperts(torch.nn.Module):
    """vLLM 0.32's RoutedExperts: w13 (gate and up stacked) and w2 of this rank's experts, each
    cut along the intermediate dimension, loaded by `weight_loader` as vLLM's is."""

    def __init__(self, experts, hidden, intermediate, rank, size, quant=None, ep=False, names=("gate_proj", "down_proj", "up_proj"),
                 fused_transposed=False):
        super().__init__()
        tp_size, tp_rank = (1, 0) if ep else (size, rank)
        self.moe_config = _Record(
            moe_parallel_config=_Record(tp_size=tp_size, tp_rank=tp_rank, ep_size=size if ep else 1, ep_rank=rank if ep else 0,
                                        use_ep=ep),
            intermediate_size=intermediate, num_logical_experts=experts, is_act_and_mul=True, tp_shard_with_padding=False)
        self.ckpt_gate_proj_name, self.ckpt_down_proj_name, self.ckpt_up_proj_name = names
        self.is_fused_checkpoint_transposed = fused_transposed
        self.expert_map_manager = ExpertMapManager(experts, size if ep else 1, rank if ep else 0)
        self.quant_method = quant or UnquantizedFusedMoEMethod()
        self.quant_method.create_weights(self, len(self.expert_map_manager.local), hidden, intermediate // tp_size)

    def add(self, name, data, **attrs):
        p = plain(data, weight_loader=self.weight_loader, **attrs)
        self.register_parameter(name, p)

    def _load_w13(self, expert_data, shard_dim, shard_id, loaded):
        size = expert_data.shape[shard_dim] // 2
        if loaded.ndim > 0:
            tp = self.moe_config.moe_parallel_config
            per = loaded.shape[shard_dim] // tp.tp_size
            start = per * tp.tp_rank
            if loaded.shape[shard_dim] - start <= 0:
                return
            loaded = loaded.narrow(shard_dim, start, min(per, loaded.shape[shard_dim] - start))
        expert_data = expert_data.narrow(shard_dim, 0 if shard_id == "w1" else size, size)
        expert_data.copy_(loaded)

    def _load_w2(self, expert_data, shard_dim, loaded):
        if loaded.ndim > 0:
            tp = self.moe_config.moe_parallel_config
            per = loaded.shape[shard_dim] // tp.tp_size
            start = per * tp.tp_rank
            if loaded.shape[shard_dim] - start <= 0:
                return
            loaded = loaded.narrow(shard_dim, start, min(per, loaded.shape[shard_dim] - start))
        expert_data.copy_(loaded)

    def weight_loader(self, param, loaded, weight_name, shard_id, expert_id, return_success=False):
        expert_id = self.expert_map_manager.map_global_to_local(expert_id)
        if expert_id == -1:
            return False
        shard_dim = {"w1": 0, "w2": 1, "w3": 0}[shard_id]
        if getattr(param, "is_transposed", False):
            shard_dim = int(not shard_dim)
        expert_data = param.data[expert_id]
        if "bias" in weight_name:
            if shard_id == "w2":
                expert_data.copy_(loaded)
            else:
                self._load_w13(expert_data, 0, shard_id, loaded)
            return True
        if "input_scale" in weight_name:
            param.data[expert_id] = loaded
            return True
        if "scale" in weight_name or "zero" in weight_name:
            kind = getattr(param, "quant_method", None)
            if kind == "channel":
                if shard_id == "w2":
                    expert_data.copy_(loaded)
                else:
                    self._load_w13(expert_data, shard_dim, shard_id, loaded)
            elif kind in ("group", "block"):
                (self._load_w2(expert_data, shard_dim, loaded) if shard_id == "w2"
                 else self._load_w13(expert_data, shard_dim, shard_id, loaded))
            else:
                if shard_id in ("w1", "w3"):
                    param.data[expert_id][0 if shard_id == "w1" else 1] = loaded.reshape(())
                else:
                    param.data[expert_id] = loaded.reshape(())
            return True
        if "weight_shape" in weight_name:
            param.data[expert_id] = loaded
            return True
        if "weight" in weight_name:
            (self._load_w2(expert_data, shard_dim, loaded) if shard_id == "w2"
             else self._load_w13(expert_data, shard_dim, shard_id, loaded))
            return True
        return False

    def mapping(self):
        gate, down, up = self.ckpt_gate_proj_name, self.ckpt_down_proj_name, self.ckpt_up_proj_name
        fused = "gate_up_proj" if (gate, up) == ("gate_proj", "up_proj") else "w13"
        experts = self.moe_config.num_logical_experts
        out = [("experts.w13_weight", f"experts.{fused}", chunk, shard) for chunk, shard in enumerate(("w1", "w3"))]
        out.append(("experts.w2_weight", f"experts.{down}", 0, "w2"))
        out += [("experts.w13_", f"experts.{e}.{fused}.", e, shard) for e in range(experts) for shard in ("w1", "w3")]
        out += [("experts.w13_" if name != down else "experts.w2_", f"experts.{e}.{name}.", e, shard)
                for e in range(experts) for shard, name in (("w1", gate), ("w2", down), ("w3", up))]
        return out

    def load_weights(self, prefix, weights):
        """RoutedExperts.load_weights: `prefix` is the layer's name (`…mlp.experts`)."""
        for name, loaded in weights:
            qual = f"{prefix}.{name}"
            is_fused = loaded.dim() == 3 and not qual.partition("experts.")[2].partition(".")[0].isdecimal()
            for param_name, weight_name, expert_id, shard_id in self.mapping():
                if weight_name not in qual:
                    continue
                per_expert_fused = not is_fused and shard_id in ("w1", "w3") and (".gate_up_proj." in qual or ".w13." in qual)
                param_qual = qual.replace(weight_name, param_name)
                param = getattr(self, param_qual.removeprefix(f"{prefix}."))
                if is_fused:
                    oriented = loaded
                    if self.is_fused_checkpoint_transposed and ("scale" not in param_qual or param.quant_method == "block"):
                        oriented = loaded.transpose(-1, -2)
                    shard = oriented.chunk(2, dim=1)[expert_id] if shard_id in ("w1", "w3") else oriented
                    start = 0
                elif per_expert_fused:
                    shard = loaded.chunk(2, dim=0)[0 if shard_id == "w1" else 1].unsqueeze(0)
                    start = expert_id
                else:
                    shard = loaded.unsqueeze(0)
                    start = expert_id
                for e, one in enumerate(shard.unbind(), start=start):
                    if param.weight_loader(param, one, param_qual, shard_id, e, True):
                        yield param_qual
                if not is_fused:
                    break


class MoERunner(torch.nn.Module):
    """vLLM 0.32's MoERunner: holds the experts as `routed_experts` and hands it their tensors."""

    def __init__(self, routed):
        super().__init__()
        self.routed_experts = routed

    def load_weights(self, prefix, weights):
        return list(self.routed_experts.load_weights(prefix, weights))


class GptOssExperts(RoutedExperts):
    """gpt-oss's experts in its own load_weights' naming (w13_weight [E, 2I/tp, H] and biases),
    loaded by `GptOss.load_weights` from fused [E, H, 2I] and [E, I, H] tensors."""

    def __init__(self, experts, hidden, intermediate, rank, size, ep=False):
        super().__init__(experts, hidden, intermediate, rank, size, None, ep)
        local = len(self.expert_map_manager.local)
        per = _ceil(intermediate, 1 if ep else size)
        self.w13_bias = plain(torch.zeros(local, 2 * per, dtype=torch.bfloat16))
        self.w2_bias = plain(torch.zeros(local, hidden, dtype=torch.bfloat16))


# ---------------------------------------------------------------- models


@dataclass
class Spec:
    """A small model: attention `gqa` (q, k, v stacked) or `mla` (DeepSeek's latent attention);
    `moe` layers of `experts` experts (`intermediate` wide each) after `dense` dense layers, with
    a shared expert when `shared`; checkpoint `layout` of experts: `per-expert`, `fused`
    ([E, 2I, H] and [E, H, I]), `fused-transposed`, `gate-up-per-expert`, or `gpt-oss`;
    `quant` one of none, fp8-block, fp8-tensor, gptq, gptq-channelwise, awq, ct-w8a8, ct-w8a8-fp8,
    ct-w4a16."""

    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    head: int = 64
    vocab: int = 1000
    ffn: int = 512
    dense: int = 1
    moe: int = 1
    experts: int = 4
    intermediate: int = 256
    shared: bool = False
    attention: str = "gqa"
    layout: str = "per-expert"
    quant: str = "none"
    names: tuple = ("gate_proj", "down_proj", "up_proj")
    q_rank: int = 128
    kv_rank: int = 128
    rope: int = 32


def linear_method(quant):
    return {
        "none": UnquantizedLinearMethod, "fp8-block": lambda: Fp8LinearMethod((128, 128)), "fp8-tensor": Fp8LinearMethod,
        "gptq": AutoGPTQLinearMethod, "gptq-channelwise": lambda: AutoGPTQLinearMethod(-1), "awq": AutoAWQLinearMethod,
        "ct-w8a8": CompressedTensorsLinearMethod, "ct-w8a8-fp8": lambda: CompressedTensorsLinearMethod("w8a8-fp8"),
        "ct-w4a16": lambda: CompressedTensorsLinearMethod("w4a16"),
    }[quant]()


def expert_method(quant):
    return {
        "none": UnquantizedFusedMoEMethod, "fp8-block": lambda: Fp8MoEMethod((128, 128)), "fp8-tensor": Fp8MoEMethod,
        "gptq": AutoGPTQMoEMethod, "gptq-channelwise": lambda: AutoGPTQMoEMethod(-1), "awq": AutoAWQMoEMethod,
        "ct-w8a8": CompressedTensorsW8A8Int8MoEMethod, "ct-w8a8-fp8": CompressedTensorsW8A8Fp8MoEMethod,
        "ct-w4a16": CompressedTensorsWNA16MoEMethod,
    }[quant]()


class Mapper:
    """vLLM's WeightsMapper of Qwen3-MoE and DeepSeek: q/k/v into qkv_proj, the dense and shared
    experts' gate/up into gate_up_proj (routed experts' names are left to RoutedExperts)."""

    stacked = {".q_proj.": (".qkv_proj.", "q"), ".k_proj.": (".qkv_proj.", "k"), ".v_proj.": (".qkv_proj.", "v"),
               ".mlp.gate_proj.": (".mlp.gate_up_proj.", 0), ".mlp.up_proj.": (".mlp.gate_up_proj.", 1),
               ".shared_experts.gate_proj.": (".shared_experts.gate_up_proj.", 0),
               ".shared_experts.up_proj.": (".shared_experts.gate_up_proj.", 1)}

    def _map_name_with_shard(self, name):
        if "rotary_emb" in name:
            return None
        for old, (new, shard) in self.stacked.items():
            if old in name:
                return name.replace(old, new, 1), shard
        return name, None

    def __or__(self, other):
        return _Merged(self, other)


class _Merged:
    """Two mappers applied as vLLM's merged WeightsMapper applies their rules: either may drop
    a name; the renaming and the stacked part come from whichever renames it."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def _map_name_with_shard(self, name):
        mapped = self.first._map_name_with_shard(name)
        if mapped is None:
            return None
        again = self.second._map_name_with_shard(mapped[0])
        return None if again is None else (again[0], mapped[1] if again[1] is None else again[1])


def _module(**children):
    m = torch.nn.Module()
    for key, value in children.items():
        setattr(m, key, value)
    return m


class CheckpointWeightMapper:
    """vLLM 0.32's QuantizationConfig.get_checkpoint_weight_mapper: every `.g_idx` dropped."""

    def _map_name_with_shard(self, name):
        return None if name.endswith(".g_idx") else (name, None)


class QuantizationConfig:
    """The part of vLLM's quantization config AutoWeightsLoader applies to checkpoint names."""

    @staticmethod
    def get_checkpoint_weight_mapper():
        return CheckpointWeightMapper()


class Model(torch.nn.Module):
    """One rank of `spec`'s model, named as Qwen3-MoE and DeepSeek-V3 are in vLLM."""

    hf_to_vllm_mapper = Mapper()

    def __init__(self, spec, rank, size, ep=False):
        super().__init__()
        self.spec = spec
        quant = lambda: linear_method(spec.quant)  # noqa: E731
        h = spec.hidden
        layers = []
        for i in range(spec.dense + spec.moe):
            layer = _module(input_layernorm=RMSNorm(h), post_attention_layernorm=RMSNorm(h))
            if spec.attention == "mla":
                rank_q, rank_kv, rope = spec.q_rank, spec.kv_rank, spec.rope
                layer.self_attn = _module(
                    q_a_proj=ReplicatedLinear(h, rank_q, quant()), q_a_layernorm=RMSNorm(rank_q),
                    q_b_proj=ColumnParallelLinear(rank_q, spec.heads * (spec.head + rope), rank, size, quant()),
                    kv_a_proj_with_mqa=ReplicatedLinear(h, rank_kv + rope, quant()), kv_a_layernorm=RMSNorm(rank_kv),
                    kv_b_proj=ColumnParallelLinear(rank_kv, spec.heads * 2 * spec.head, rank, size, quant()),
                    o_proj=RowParallelLinear(spec.heads * spec.head, h, rank, size, quant()))
            else:
                layer.self_attn = _module(
                    qkv_proj=QKVParallelLinear(h, spec.head, spec.heads, spec.kv_heads, rank, size, quant()),
                    o_proj=RowParallelLinear(spec.heads * spec.head, h, rank, size, quant()))
            if i < spec.dense:
                layer.mlp = _module(gate_up_proj=MergedColumnParallelLinear(h, [spec.ffn, spec.ffn], rank, size, quant()),
                                    down_proj=RowParallelLinear(spec.ffn, h, rank, size, quant()))
            else:
                if spec.layout == "gpt-oss":
                    routed = GptOssExperts(spec.experts, h, spec.intermediate, rank, size, ep)
                else:
                    routed = RoutedExperts(spec.experts, h, spec.intermediate, rank, size, expert_method(spec.quant), ep, spec.names,
                                           fused_transposed=spec.layout == "fused-transposed")
                layer.mlp = _module(gate=GateLinear(h, spec.experts), experts=MoERunner(routed))
                if spec.shared:
                    layer.mlp.shared_experts = _module(
                        gate_up_proj=MergedColumnParallelLinear(h, [spec.intermediate] * 2, rank, size, quant()),
                        down_proj=RowParallelLinear(spec.intermediate, h, rank, size, quant()))
            layers.append(layer)
        self.model = _module(embed_tokens=VocabParallelEmbedding(spec.vocab, h, rank, size), layers=torch.nn.ModuleList(layers),
                             norm=RMSNorm(h))
        self.lm_head = ParallelLMHead(spec.vocab, h, rank, size)
        self.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
        self.rank, self.size, self.ep = rank, size, ep
        if spec.quant != "none":
            self.quant_config = QuantizationConfig()

    def load_weights(self, tensors):
        """AutoWeightsLoader: experts' tensors to their runner, the rest to each parameter's
        weight loader with its stacked part."""
        params = dict(self.named_parameters())
        loaded = set()
        mapper = self.hf_to_vllm_mapper
        if getattr(self, "quant_config", None) is not None:
            mapper = mapper | self.quant_config.get_checkpoint_weight_mapper()
        for name, tensor in tensors:
            mapped = mapper._map_name_with_shard(name)
            if mapped is None:
                continue
            target, shard = mapped
            head, sep, rest = target.partition(".mlp.experts.")
            if sep:
                prefix = f"{head}.mlp.experts"
                runner = self.get_submodule(prefix)
                if isinstance(runner.routed_experts, GptOssExperts):
                    names = [self._gpt_oss(runner.routed_experts, rest, tensor)]
                else:
                    names = [n.removeprefix(prefix + ".") for n in runner.load_weights(prefix, [(rest, tensor)])]
                loaded |= {f"{prefix}.routed_experts.{n}" for n in names}
                continue
            param = params.get(target)
            if param is None:
                continue  # a tensor the model keeps no parameter for (GPTQ's g_idx): vLLM skips it
            if shard is None:
                param.weight_loader(param, tensor)
            else:
                param.weight_loader(param, tensor, shard)
            loaded.add(target)
        return loaded

    def _gpt_oss(self, experts, name, weight):
        """gpt-oss's `_load_weights_other` for its experts (already in vLLM's naming)."""
        ep_start, ep_stop = experts.expert_map_manager.local[0], experts.expert_map_manager.local[-1] + 1
        per = _ceil(self.spec.intermediate, self.size)
        start, stop = self.rank * per, min((self.rank + 1) * per, self.spec.intermediate)
        if name == "w13_weight":
            narrow = weight[ep_start:ep_stop, ...] if self.ep else weight[:, :, 2 * start: 2 * stop]
            experts.w13_weight.copy_(narrow.permute(0, 2, 1).contiguous())
        elif name == "w2_weight":
            narrow = weight[ep_start:ep_stop, ...] if self.ep else weight[:, start:stop, :]
            experts.w2_weight.copy_(narrow.permute(0, 2, 1).contiguous())
        elif name == "w13_bias":
            experts.w13_bias.copy_(weight[ep_start:ep_stop, ...] if self.ep else weight[:, 2 * start: 2 * stop])
        elif name == "w2_bias":
            if self.ep:
                weight = weight[ep_start:ep_stop, ...]
            elif self.rank != 0:
                weight = torch.zeros_like(weight)  # (vLLM zeroes the tensor it was handed in place)
            experts.w2_bias.copy_(weight)
        else:
            raise KeyError(name)
        return name


class GptOssMapper(Mapper):
    """gpt-oss's hf_to_vllm_mapper for its experts: `gate_up_proj` to `w13_weight` and so on."""

    suffixes = ((".gate_up_proj_bias", ".w13_bias"), (".down_proj_bias", ".w2_bias"), (".gate_up_proj", ".w13_weight"),
                (".down_proj", ".w2_weight"))

    def _map_name_with_shard(self, name):
        for old, new in self.suffixes:
            if ".mlp.experts" in name and name.endswith(old):
                return name[: -len(old)] + new, None
        return super()._map_name_with_shard(name)


class GptOssForCausalLM(Model):
    """A model whose experts gpt-oss's own load_weights places (vLLM picks it by class)."""

    hf_to_vllm_mapper = GptOssMapper()


def build(spec, rank, size, ep=False):
    """One rank of `spec`'s model."""
    return (GptOssForCausalLM if spec.layout == "gpt-oss" else Model)(spec, rank, size, ep)


# ---------------------------------------------------------------- checkpoints


class _Random:
    def __init__(self, seed):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, shape, dtype):
        if dtype in (torch.int32, torch.int8, torch.int64):
            info = torch.iinfo(dtype)
            return torch.randint(max(info.min, -(1 << 30)), min(info.max, 1 << 30), tuple(shape), generator=self.generator, dtype=dtype)
        values = torch.randn(tuple(shape), generator=self.generator)
        if dtype == torch.float8_e4m3fn:
            return values.clamp(-400, 400).to(dtype)
        return values.to(dtype)


def linear_tensors(prefix, n, k, quant, random, expert=False):
    """A linear layer's checkpoint tensors (`prefix.weight` and the rest) for an [n, k] weight
    quantized by `quant`, as the quantizers write them."""
    g = 32
    if quant == "none":
        return {f"{prefix}.weight": random((n, k), torch.bfloat16)}
    if quant == "fp8-block":
        return {f"{prefix}.weight": random((n, k), torch.float8_e4m3fn),
                f"{prefix}.weight_scale_inv": random((_ceil(n, 128), _ceil(k, 128)), torch.float32).abs()}
    if quant == "fp8-tensor":
        return {f"{prefix}.weight": random((n, k), torch.float8_e4m3fn), f"{prefix}.weight_scale": random((), torch.float32).abs(),
                f"{prefix}.input_scale": random((), torch.float32).abs()}
    if quant in ("gptq", "gptq-channelwise"):
        groups = 1 if quant == "gptq-channelwise" else k // g
        out = {f"{prefix}.qweight": random((k // 8, n), torch.int32), f"{prefix}.qzeros": random((groups, n // 8), torch.int32),
               f"{prefix}.scales": random((groups, n), torch.float16)}
        out[f"{prefix}.g_idx"] = random((k,), torch.int32)  # written by GPTQ quantizers, dropped by vLLM 0.32
        return out
    if quant == "awq":
        return {f"{prefix}.qweight": random((k, n // 8), torch.int32), f"{prefix}.qzeros": random((k // g, n // 8), torch.int32),
                f"{prefix}.scales": random((k // g, n), torch.float16)}
    if quant in ("ct-w8a8", "ct-w8a8-fp8"):
        dtype = torch.int8 if quant == "ct-w8a8" else torch.float8_e4m3fn
        return {f"{prefix}.weight": random((n, k), dtype), f"{prefix}.weight_scale": random((n, 1), torch.float32).abs()}
    if quant == "ct-w4a16":
        return {f"{prefix}.weight_packed": random((n, k // 8), torch.int32), f"{prefix}.weight_scale": random((n, k // g), torch.bfloat16),
                f"{prefix}.weight_shape": torch.tensor([n, k], dtype=torch.int64)}
    raise ValueError(quant)


def checkpoint(spec, seed=7):
    """Every checkpoint tensor of `spec`'s model, named as Hugging Face checkpoints name them."""
    random = _Random(seed)
    h, q = spec.hidden, spec.quant
    out = {"model.embed_tokens.weight": random((spec.vocab, h), torch.bfloat16), "model.norm.weight": random((h,), torch.bfloat16),
           "lm_head.weight": random((spec.vocab, h), torch.bfloat16)}
    for i in range(spec.dense + spec.moe):
        p = f"model.layers.{i}"
        out[f"{p}.input_layernorm.weight"] = random((h,), torch.bfloat16)
        out[f"{p}.post_attention_layernorm.weight"] = random((h,), torch.bfloat16)
        a = f"{p}.self_attn"
        if spec.attention == "mla":
            out.update(linear_tensors(f"{a}.q_a_proj", spec.q_rank, h, q, random))
            out[f"{a}.q_a_layernorm.weight"] = random((spec.q_rank,), torch.bfloat16)
            out.update(linear_tensors(f"{a}.q_b_proj", spec.heads * (spec.head + spec.rope), spec.q_rank, q, random))
            out.update(linear_tensors(f"{a}.kv_a_proj_with_mqa", spec.kv_rank + spec.rope, h, q, random))
            out[f"{a}.kv_a_layernorm.weight"] = random((spec.kv_rank,), torch.bfloat16)
            out.update(linear_tensors(f"{a}.kv_b_proj", spec.heads * 2 * spec.head, spec.kv_rank, q, random))
        else:
            out.update(linear_tensors(f"{a}.q_proj", spec.heads * spec.head, h, q, random))
            out.update(linear_tensors(f"{a}.k_proj", spec.kv_heads * spec.head, h, q, random))
            out.update(linear_tensors(f"{a}.v_proj", spec.kv_heads * spec.head, h, q, random))
        out.update(linear_tensors(f"{a}.o_proj", h, spec.heads * spec.head, q, random))
        m = f"{p}.mlp"
        if i < spec.dense:
            out.update(linear_tensors(f"{m}.gate_proj", spec.ffn, h, q, random))
            out.update(linear_tensors(f"{m}.up_proj", spec.ffn, h, q, random))
            out.update(linear_tensors(f"{m}.down_proj", h, spec.ffn, q, random))
            continue
        out[f"{m}.gate.weight"] = random((spec.experts, h), torch.bfloat16)
        if spec.shared:
            for name, n, k in (("gate_proj", spec.intermediate, h), ("up_proj", spec.intermediate, h), ("down_proj", h, spec.intermediate)):
                out.update(linear_tensors(f"{m}.shared_experts.{name}", n, k, q, random))
        out.update(expert_tensors(f"{m}.experts", spec, random))
    return out


def expert_tensors(prefix, spec, random):
    e, h, i = spec.experts, spec.hidden, spec.intermediate
    gate, down, up = spec.names
    if spec.layout == "per-expert":
        out = {}
        for x in range(e):
            out.update(linear_tensors(f"{prefix}.{x}.{gate}", i, h, spec.quant, random, expert=True))
            out.update(linear_tensors(f"{prefix}.{x}.{up}", i, h, spec.quant, random, expert=True))
            out.update(linear_tensors(f"{prefix}.{x}.{down}", h, i, spec.quant, random, expert=True))
        return out
    assert spec.quant == "none", "fused experts are tested unquantized"
    if spec.layout == "gate-up-per-expert":
        out = {}
        for x in range(e):
            out[f"{prefix}.{x}.gate_up_proj.weight"] = random((2 * i, h), torch.bfloat16)
            out[f"{prefix}.{x}.{down}.weight"] = random((h, i), torch.bfloat16)
        return out
    if spec.layout == "fused":
        return {f"{prefix}.gate_up_proj": random((e, 2 * i, h), torch.bfloat16), f"{prefix}.down_proj": random((e, h, i), torch.bfloat16)}
    if spec.layout == "fused-transposed":
        return {f"{prefix}.gate_up_proj": random((e, h, 2 * i), torch.bfloat16), f"{prefix}.down_proj": random((e, i, h), torch.bfloat16)}
    if spec.layout == "gpt-oss":
        return {f"{prefix}.gate_up_proj": random((e, h, 2 * i), torch.bfloat16), f"{prefix}.gate_up_proj_bias": random((e, 2 * i), torch.bfloat16),
                f"{prefix}.down_proj": random((e, i, h), torch.bfloat16), f"{prefix}.down_proj_bias": random((e, h), torch.bfloat16)}
    raise ValueError(spec.layout)


def same(a, b):
    """Whether two tensors hold the same bytes (float8 has no equality on the CPU)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def config(spec):
    """The `config.json` of `spec`'s model, as its Hugging Face model type writes it."""
    out = {
        "model_type": "gpt_oss" if spec.layout == "gpt-oss" else "deepseek_v3" if spec.attention == "mla" else "qwen3_moe",
        "hidden_size": spec.hidden, "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads, "head_dim": spec.head,
        "num_hidden_layers": spec.dense + spec.moe, "vocab_size": spec.vocab, "intermediate_size": spec.ffn,
        "moe_intermediate_size": spec.intermediate, "num_experts": spec.experts,
    }
    if spec.layout == "gpt-oss":
        out["intermediate_size"] = spec.intermediate
    if spec.attention == "mla":
        out.update(q_lora_rank=spec.q_rank, kv_lora_rank=spec.kv_rank, qk_rope_head_dim=spec.rope, n_routed_experts=spec.experts)
    quant = {
        "none": None, "fp8-block": {"quant_method": "fp8", "weight_block_size": [128, 128]},
        "fp8-tensor": {"quant_method": "fp8", "activation_scheme": "static"},
        "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False},
        "gptq-channelwise": {"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": False},
        "awq": {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True},
        "ct-w8a8": {"quant_method": "compressed-tensors", "format": "int-quantized",
                    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}}},
        "ct-w8a8-fp8": {"quant_method": "compressed-tensors", "format": "float-quantized",
                        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
                                                                                        "strategy": "channel"}}}},
        "ct-w4a16": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                     "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                                                                     "group_size": 32}}}},
    }[spec.quant]
    if quant:
        out["quantization_config"] = quant
    return out
