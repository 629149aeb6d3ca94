"""The load plan of a rank from a model's `config.json` and the checkpoint's tensor names and
shapes, without vLLM: each tensor's layer is told by its name, as vLLM's model files name and
build them (Llama, Qwen2/3 and their MoE, Mixtral, DeepSeek-V2/V3 and Kimi-K2 with latent
attention, gpt-oss), its sizes by the config, and how its parameter is split by the checkpoint's
quantization (FP8 per tensor and per block, GPTQ, AWQ, compressed-tensors); then `shares` cuts
it as the loader does for a model vLLM built. `python -m ztserve_vllm plan` prints it."""

import math

from . import shares

_QKV = ("q_proj", "k_proj", "v_proj")
_ROUTERS = {"gate", "router", "shared_expert_gate", "e_score_correction_bias"}
_VOCAB = {"embed_tokens", "lm_head", "embedding"}
_GPT_OSS_EXPERTS = ((".gate_up_proj_bias", ".w13_bias"), (".down_proj_bias", ".w2_bias"), (".gate_up_proj", ".w13_weight"),
                    (".down_proj", ".w2_weight"))


class Model:
    """What the plan needs of a model's config: attention, experts, vocabulary, quantization."""

    def __init__(self, config):
        text = config.get("text_config") or config
        self.type = text.get("model_type", config.get("model_type", ""))
        self.hidden = text["hidden_size"]
        self.heads = text["num_attention_heads"]
        self.kv_heads = text.get("num_key_value_heads") or self.heads
        self.head_dim = text.get("head_dim") or self.hidden // self.heads
        self.latent = "kv_lora_rank" in text  # DeepSeek's multi-head latent attention
        self.layers = text["num_hidden_layers"]
        self.vocab = text["vocab_size"]
        self.experts = next((text[k] for k in ("n_routed_experts", "num_experts", "num_local_experts") if text.get(k)), 0)
        self.intermediate = text.get("intermediate_size", 0)
        self.moe_intermediate = text.get("moe_intermediate_size") or self.intermediate
        quant = text.get("quantization_config") or config.get("quantization_config") or {}
        self.quant = Quantization(quant)


class Quantization:
    """A checkpoint's `quantization_config`: its method, FP8 blocks, GPTQ/AWQ packing and groups,
    compressed-tensors' weight strategy."""

    def __init__(self, config):
        method = (config.get("quant_method") or "").lower()
        self.method = "compressed-tensors" if method == "compressed_tensors" else method
        block = config.get("weight_block_size")
        self.block = tuple(block) if block else None
        self.bits = config.get("bits", config.get("w_bit", 4))
        self.pack = 32 // self.bits if self.bits else 8
        self.group = config.get("group_size", config.get("q_group_size", 128))
        weights = next(iter((config.get("config_groups") or {}).values()), {}).get("weights") or {}
        self.ct_strategy = weights.get("strategy")
        self.ct_bits = weights.get("num_bits", 8)

    def param(self, suffix, kind):
        """The marks of a linear layer's parameter named `suffix` (`weight`, `qweight`,
        `scales`…) in a layer of `kind`, as the method's create_weights makes it."""
        row = kind == shares.ROW
        weight = shares.Param(output_dim=0, input_dim=1)
        if suffix in ("weight_scale", "input_scale") and self.method == "fp8" or suffix == "input_scale":
            return shares.Param(scalar=True)
        if suffix == "weight_scale_inv":
            return shares.Param(output_dim=0, input_dim=1, block=True)
        if self.method == "gptq":
            # A row layer's channel-wise scales and zeros (group size -1) are every rank's.
            grouped = not (self.group == -1 and row)
            return {
                "qweight": shares.Param(output_dim=1, input_dim=0, packed_dim=0, packed_factor=self.pack),
                "qzeros": shares.Param(output_dim=1, input_dim=0 if grouped else None, packed_dim=1, packed_factor=self.pack),
                "scales": shares.Param(output_dim=1, input_dim=0 if grouped else None),
            }.get(suffix, weight)
        if self.method in ("awq", "awq_marlin"):
            return {
                "qweight": shares.Param(output_dim=1, input_dim=0, packed_dim=1, packed_factor=self.pack),
                "qzeros": shares.Param(output_dim=1, input_dim=0, packed_dim=1, packed_factor=self.pack),
                "scales": shares.Param(output_dim=1, input_dim=0),
            }.get(suffix, weight)
        if self.method == "compressed-tensors":
            pack = 32 // self.ct_bits
            return {
                "weight_packed": shares.Param(output_dim=0, input_dim=1, packed_dim=1, packed_factor=pack),
                "weight_scale": (shares.Param(scalar=True) if self.ct_strategy == "tensor" else shares.Param(output_dim=0)
                                 if self.ct_strategy == "channel" else shares.Param(output_dim=0, input_dim=1)),
                "weight_zero_point": shares.Param(output_dim=0, input_dim=1 if self.ct_strategy == "group" else None,
                                                  packed_dim=0, packed_factor=pack),
                "weight_g_idx": shares.Param(input_dim=0),
                "weight_shape": shares.Param(),
            }.get(suffix, weight)
        return weight

    def expert_param(self, suffix):
        """The marks of an experts layer's parameter named `…_{suffix}`."""
        if self.method == "fp8":
            return shares.Param(scale="block" if self.block else "tensor")
        if self.method in ("gptq", "awq", "awq_marlin"):
            return shares.Param(transposed=True, scale="group" if self.group != -1 else "channel")
        if self.method == "compressed-tensors":
            return shares.Param(scale=self.ct_strategy)
        return shares.Param()

    def expert_reason(self):
        """Why this method's experts are fetched whole, or "" when `shares` cuts them."""
        if self.method in ("", "fp8", "gptq", "awq", "awq_marlin", "compressed-tensors"):
            return ""
        return f"its experts are quantized by {self.method}, whose cut this loader does not know"


def _split(name):
    """A checkpoint name as (module, parameter suffix)."""
    module, _, suffix = name.rpartition(".")
    return module, suffix


def _out_features(model, module, tensors):
    """The output size of linear `module` from one of its tensors (AWQ packs its qweight's
    outputs, GPTQ its inputs)."""
    packed_outputs = model.quant.pack if model.quant.method != "gptq" else 1
    for suffix, dim, factor in (("weight", 0, 1), ("weight_packed", 0, 1), ("scales", 1, 1), ("qweight", 1, packed_outputs)):
        shape = tensors.get(f"{module}.{suffix}")
        if shape is not None and len(shape) > dim:
            return shape[dim] * factor
    return 0


class Rank:
    """One rank of `tp` ranks (expert parallel when `ep`) of `model`: the layers and parameters
    of every checkpoint tensor in `tensors` (name -> shape), for `shares.plan`."""

    def __init__(self, model, tensors, rank, tp, ep=False):
        self.model, self.tensors, self.rank, self.tp, self.ep = model, tensors, rank, tp, ep
        self.modules, self.params = {}, {}
        names = list(tensors)
        self.expert_names = ("w1", "w2", "w3") if any(".experts.0.w1." in n for n in names) else ("gate_proj", "down_proj", "up_proj")
        for name in names:
            self._describe(name)

    def rename(self, name):
        """(the name the model gives, its stacked part) as vLLM's mappers do; None for a tensor
        the model does not load (a layer it does not have: DeepSeek's multi-token prediction)."""
        parts = name.split(".")
        if "layers" in parts:
            at = parts.index("layers") + 1
            if at < len(parts) and parts[at].isdecimal() and int(parts[at]) >= self.model.layers:
                return None
        if "rotary_emb" in name or name.endswith(".g_idx") and self.model.quant.method:
            return None  # vLLM drops rotary tables and, for every quantization, `g_idx`
        module, suffix = _split(name)
        head, _, leaf = module.rpartition(".")
        if ".experts." in f".{name}":
            if self.model.type == "gpt_oss":  # its mapper names its fused experts as vLLM's parameters
                for old, new in _GPT_OSS_EXPERTS:
                    if name.endswith(old):
                        return name[: -len(old)] + new, None
            return name, None
        if leaf in _QKV and not self.model.latent:
            return f"{head}.qkv_proj.{suffix}", _QKV.index(leaf)
        if leaf in ("gate_proj", "up_proj"):
            return f"{head}.gate_up_proj.{suffix}", ("gate_proj", "up_proj").index(leaf)
        return name, None

    def _layer(self, kind, **kw):
        return shares.Layer(kind, self.rank, self.tp, cls=kw.pop("cls", kind), block=self.model.quant.block, **kw)

    def _describe(self, name):
        renamed = self.rename(name)
        if renamed is None:
            return
        mapped, index = renamed
        model = self.model
        parts = mapped.split(".")
        if "experts" in parts and ".shared_experts." not in f".{mapped}.":
            key = ".".join(parts[: parts.index("experts") + 1])
            if key not in self.modules:
                self.modules[key] = self._experts(key)
            rest = mapped[len(key) + 1:]
            head, _, tail = rest.partition(".")
            suffix = tail.partition(".")[2] if head.isdecimal() else rest.partition(".")[2] or "weight"
            for stem in ("w13", "w2"):
                self.params[f"{key}.{stem}_{suffix}"] = model.quant.expert_param(suffix)
            return
        module, suffix = _split(mapped)
        leaf = module.rpartition(".")[2]
        if module in self.modules:
            layer = self.modules[module]
        elif leaf in _VOCAB:
            padded = -(-model.vocab // 64) * 64
            per = padded // self.tp
            layer = self._layer(shares.VOCAB, start=min(self.rank * per, model.vocab), stop=min((self.rank + 1) * per, model.vocab),
                                cls="VocabParallelEmbedding")
        elif leaf == "qkv_proj":
            replicas = max(self.tp // model.kv_heads, 1)
            layer = self._layer(shares.QKV, heads=model.heads // self.tp, kv_heads=max(model.kv_heads // self.tp, 1),
                                head_size=model.head_dim, v_head_size=model.head_dim, kv_replicas=replicas, cls="QKVParallelLinear")
        elif leaf == "gate_up_proj":
            original = name.rpartition(".")[0]
            size = _out_features(model, original, self.tensors)
            sizes = (size, size) if index is not None else (size // 2, size // 2)
            layer = self._layer(shares.MERGED, sizes=sizes, cls="MergedColumnParallelLinear")
        elif leaf in ("o_proj", "down_proj", "out_proj"):
            layer = self._layer(shares.ROW, cls="RowParallelLinear")
        elif leaf in ("q_proj", "q_b_proj", "kv_b_proj"):
            layer = self._layer(shares.COLUMN, cls="ColumnParallelLinear")
        elif leaf in ("q_a_proj", "kv_a_proj_with_mqa") or leaf in _ROUTERS or suffix in _ROUTERS:
            layer = shares.Layer(shares.REPLICATED, cls="ReplicatedLinear")
        else:
            return  # norms and the like: every rank reads them whole
        self.modules[module] = layer
        param = model.quant.param(suffix, layer.kind) if layer.kind != shares.VOCAB else shares.Param(output_dim=0, input_dim=1)
        self.params[f"{module}.{suffix}"] = self._local(param, layer, self.tensors[name])

    def _local(self, param, layer, shape):
        """`param` with its shape on this rank, where the cut follows it (column and row layers)."""
        if layer.kind not in (shares.COLUMN, shares.ROW) or not shape:
            return param
        dim = param.output_dim if layer.kind == shares.COLUMN else param.input_dim
        if dim is None or dim >= len(shape):
            return param
        local = list(shape)
        local[dim] = shape[dim] // self.tp
        return shares.Param(**{**param.__dict__, "shape": tuple(local)})

    def _experts(self, key):
        model = self.model
        # Experts fused on disk as [E, H, 2I] (Qwen3-VL-MoE's) rather than [E, 2I, H].
        fused = self.tensors.get(f"{key}.gate_up_proj")
        transposed = bool(fused and len(fused) == 3 and fused[1] == model.hidden and fused[2] == 2 * model.moe_intermediate)
        experts = None
        tp_rank, tp_size, ep_size = self.rank, self.tp, 1
        if self.ep:
            base, rest = divmod(model.experts, self.tp)
            start = self.rank * base + min(self.rank, rest)
            experts = tuple(range(start, start + base + (1 if self.rank < rest else 0)))
            tp_rank, tp_size, ep_size = 0, 1, self.tp
        common = dict(cls="RoutedExperts", experts=experts, ep_size=ep_size, names=self.expert_names, intermediate=model.moe_intermediate,
                      fused_transposed=transposed)
        if model.type == "gpt_oss":
            if model.quant.method:
                return shares.Layer(shares.EXPERTS, tp_rank, tp_size, reason=f"vLLM reshapes gpt-oss's {model.quant.method} expert "
                                    "blocks before it cuts them", **common)
            return shares.Layer(shares.EXPERTS, tp_rank, tp_size, loader=shares.GPT_OSS, **common)
        reason = model.quant.expert_reason()
        block = model.quant.block
        refined = False
        if block and tp_size > 1:
            per = model.moe_intermediate // tp_size
            refined = (per % block[0] or per % block[1]) and math.gcd(block[0], block[1], per, model.hidden) >= 32
        return shares.Layer(shares.EXPERTS, tp_rank, tp_size, reason=reason, refined=bool(refined), **common)


def plan(config, tensors, rank, tp, ep=False):
    """The `shares.Plan` of every tensor (name -> shape) for rank `rank` of `tp`."""
    one = Rank(Model(config), tensors, rank, tp, ep)
    packed = {"qkv_proj": list(_QKV), "gate_up_proj": ["gate_proj", "up_proj"]}
    return shares.plan({name: (shape, "") for name, shape in tensors.items()}, one.modules, packed, one.params, one.rename,
                       complete=True)
