"""The load plan and stream against stand-ins of vLLM's layers: modules named as vLLM's
classes are, holding one rank's parameters, whose weight loaders narrow the checkpoint tensor
as vLLM 0.32's do (`parameter.py`'s load_*_weight, the vocabulary's weight_loader), loading
from a live ztserve server. Each rank must end with the parameters it would have loaded from
the whole tensors, having fetched its share only."""

import time

import pytest
import torch
from safetensors.torch import save_file
from conftest import live

import ztserve_client
from ztserve_client import Client
from ztserve_vllm import weights
from ztserve_vllm.remote import Misses, RemoteTensor
# The vocabulary layers, norms and name mapper as the MoE and quantization tests stand them in.
from vllm_standins import Mapper, ParallelLMHead, RMSNorm, VocabParallelEmbedding

HIDDEN, HEADS, KV_HEADS, HEAD, FFN, VOCAB = 32, 4, 1, 8, 48, 100


class UnquantizedLinearMethod:
    pass


def parameter(shape, output_dim=None, input_dim=None, dtype=torch.bfloat16):
    p = torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
    if output_dim is not None:
        p.output_dim = output_dim
    if input_dim is not None:
        p.input_dim = input_dim
    return p


class ColumnParallelLinear(torch.nn.Module):
    def __init__(self, inputs, outputs, rank, size, bias=False):
        super().__init__()
        self.tp_rank, self.tp_size = rank, size
        self.quant_method = UnquantizedLinearMethod()
        self.output_size_per_partition = outputs // size
        self.weight = parameter((outputs // size, inputs), 0, 1)
        if bias:
            self.bias = parameter((outputs // size,), 0, dtype=torch.float32)

    def weight_loader(self, param, loaded, shard=None):
        size = param.data.shape[param.output_dim]
        param.data.copy_(loaded.narrow(param.output_dim, self.tp_rank * size, size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    def __init__(self, inputs, sizes, rank, size):
        super().__init__(inputs, sum(sizes), rank, size)
        self.output_sizes = sizes

    def weight_loader(self, param, loaded, shard):
        offset = sum(self.output_sizes[:shard]) // self.tp_size
        size = self.output_sizes[shard] // self.tp_size
        target = param.data.narrow(param.output_dim, offset, size)
        loaded = loaded.narrow(param.output_dim, self.tp_rank * size, size)
        assert target.shape == loaded.shape
        target.copy_(loaded)


class QKVParallelLinear(ColumnParallelLinear):
    def __init__(self, hidden, head, heads, kv_heads, rank, size):
        self.num_heads = heads // size
        if size >= kv_heads:
            self.num_kv_heads, self.num_kv_head_replicas = 1, size // kv_heads
        else:
            self.num_kv_heads, self.num_kv_head_replicas = kv_heads // size, 1
        self.head_size = self.v_head_size = head
        total = (self.num_heads + 2 * self.num_kv_heads) * head * size
        super().__init__(hidden, total, rank, size, bias=True)

    def weight_loader(self, param, loaded, shard):
        q, kv = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        offset, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard]
        at = self.tp_rank if shard == "q" else self.tp_rank // self.num_kv_head_replicas
        target = param.data.narrow(param.output_dim, offset, size)
        loaded = loaded.narrow(param.output_dim, at * size, size)
        assert target.shape == loaded.shape
        target.copy_(loaded)


class RowParallelLinear(torch.nn.Module):
    def __init__(self, inputs, outputs, rank, size):
        super().__init__()
        self.tp_rank, self.tp_size = rank, size
        self.quant_method = UnquantizedLinearMethod()
        self.input_size_per_partition = inputs // size
        self.weight = parameter((outputs, inputs // size), 0, 1)

    def weight_loader(self, param, loaded, shard=None):
        size = param.data.shape[param.input_dim]
        loaded = loaded.narrow(param.input_dim, self.tp_rank * size, size)
        assert param.data.shape == loaded.shape
        param.data.copy_(loaded)


class Llama(torch.nn.Module):
    """One Llama layer of one rank, loading as vLLM's AutoWeightsLoader does."""

    hf_to_vllm_mapper = Mapper()
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, rank, size):
        super().__init__()
        layer = torch.nn.Module()
        layer.self_attn = torch.nn.Module()
        layer.self_attn.qkv_proj = QKVParallelLinear(HIDDEN, HEAD, HEADS, KV_HEADS, rank, size)
        layer.self_attn.o_proj = RowParallelLinear(HEADS * HEAD, HIDDEN, rank, size)
        layer.mlp = torch.nn.Module()
        layer.mlp.gate_up_proj = MergedColumnParallelLinear(HIDDEN, [FFN, FFN], rank, size)
        layer.mlp.down_proj = RowParallelLinear(FFN, HIDDEN, rank, size)
        layer.input_layernorm = RMSNorm(HIDDEN)
        self.model = torch.nn.Module()
        self.model.embed_tokens = VocabParallelEmbedding(VOCAB, HIDDEN, rank, size)
        self.model.layers = torch.nn.ModuleList([layer])
        self.model.norm = RMSNorm(HIDDEN)
        self.lm_head = ParallelLMHead(VOCAB, HIDDEN, rank, size)

    def load_weights(self, tensors):
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in tensors:
            mapped = self.hf_to_vllm_mapper._map_name_with_shard(name)
            if mapped is None:
                continue
            target, shard = mapped
            module = self.get_submodule(target.rpartition(".")[0])
            module.weight_loader(params[target], tensor, shard)
            loaded.add(target)
        return loaded


def checkpoint():
    torch.manual_seed(7)
    layer = "model.layers.0"
    return {
        "model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16),
        f"{layer}.self_attn.q_proj.weight": torch.randn(HEADS * HEAD, HIDDEN, dtype=torch.bfloat16),
        f"{layer}.self_attn.k_proj.weight": torch.randn(KV_HEADS * HEAD, HIDDEN, dtype=torch.bfloat16),
        f"{layer}.self_attn.v_proj.weight": torch.randn(KV_HEADS * HEAD, HIDDEN, dtype=torch.bfloat16),
        f"{layer}.self_attn.q_proj.bias": torch.randn(HEADS * HEAD),
        f"{layer}.self_attn.k_proj.bias": torch.randn(KV_HEADS * HEAD),
        f"{layer}.self_attn.v_proj.bias": torch.randn(KV_HEADS * HEAD),
        f"{layer}.self_attn.o_proj.weight": torch.randn(HIDDEN, HEADS * HEAD, dtype=torch.bfloat16),
        f"{layer}.mlp.gate_proj.weight": torch.randn(FFN, HIDDEN, dtype=torch.bfloat16),
        f"{layer}.mlp.up_proj.weight": torch.randn(FFN, HIDDEN, dtype=torch.bfloat16),
        f"{layer}.mlp.down_proj.weight": torch.randn(HIDDEN, FFN, dtype=torch.bfloat16),
        f"{layer}.input_layernorm.weight": torch.randn(HIDDEN, dtype=torch.bfloat16),
        f"{layer}.self_attn.rotary_emb.inv_freq": torch.randn(4),
        "model.norm.weight": torch.randn(HIDDEN, dtype=torch.bfloat16),
        "lm_head.weight": torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16),
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models = tmp_path_factory.mktemp("vllm") / "models"
    (models / "org" / "llama").mkdir(parents=True)
    save_file(checkpoint(), models / "org" / "llama" / "model.safetensors", metadata={"format": "pt"})
    server = live.Server(models)
    yield server
    server.stop()


def sent_bytes(url):
    """The tensor bytes the server has sent."""
    return live.tensor_bytes_sent(url)


def load(url, rank, size, prefetch_bytes=1 << 20, client=None, plan=None):
    model = Llama(rank, size)
    client = client or Client(url, chunk_size=4096)
    snapshot = client.snapshot("org/llama")
    plans = weights.plan_model(model, snapshot) if plan is None else plan(model, snapshot)
    misses = Misses()
    loaded = model.load_weights(weights.stream(snapshot, plans, misses, prefetch_bytes))
    return model, plans, misses, loaded


@pytest.mark.parametrize("size", [1, 2, 4])
def test_every_rank_loads_what_the_whole_tensors_give_from_its_share_alone(server, size):
    whole = checkpoint()
    total = sum(t.numel() * t.element_size() for t in whole.values())
    before = sent_bytes(server.url)
    for rank in range(size):
        expected = Llama(rank, size)
        expected.load_weights(whole.items())
        model, plans, misses, loaded = load(server.url, rank, size)
        assert misses.count == 0, misses.names
        assert loaded == {name for name, _ in model.named_parameters()}
        for (name, got), (_, want) in zip(model.named_parameters(), expected.named_parameters()):
            assert torch.equal(got, want), (name, rank, size)
        cut = {p.name for p in plans if p.regions is not None}
        if size > 1:
            assert "model.layers.0.self_attn.q_proj.weight" in cut and "lm_head.weight" in cut
            assert "model.layers.0.self_attn.o_proj.weight" in cut and "model.layers.0.mlp.up_proj.weight" in cut
        # One key/value head for every rank: k and v are whole, and no plan says why (nothing lost).
        assert all(p.reason == "" for p in plans)
    sent = sent_bytes(server.url) - before
    # Each rank's share of the split weights and the replicated ones (norms, k, v) once per
    # rank: the model once, plus the replicas; never the rotary table vLLM drops.
    dropped = whole["model.layers.0.self_attn.rotary_emb.inv_freq"].numel() * 4
    replicated = sum(whole[n].numel() * whole[n].element_size() for n in whole if "norm" in n or "k_proj" in n or "v_proj" in n)
    assert sent == total - dropped + (size - 1) * replicated, (sent, total, replicated)


def test_a_read_off_the_plan_is_fetched_on_demand_and_still_exact(server):
    whole = checkpoint()

    def blind(model, snapshot):  # a plan that cuts nothing right: every split weight misses
        plans = weights.plan_model(model, snapshot)
        for one in plans:
            if one.regions:
                one.regions = [tuple((0, 1) for _ in one.regions[0])]
        return plans

    model, _, misses, _ = load(server.url, 1, 2, plan=blind)
    expected = Llama(1, 2)
    expected.load_weights(whole.items())
    for (name, got), (_, want) in zip(model.named_parameters(), expected.named_parameters()):
        assert torch.equal(got, want), name
    assert misses.count > 0 and "lm_head.weight" in misses.names


def test_layers_it_cannot_cut_are_fetched_whole_with_the_reason(server):
    class HQQMarlinMethod:  # a quantization method whose loader this plan does not know
        pass

    model = Llama(0, 2)
    model.model.layers[0].mlp.down_proj.quant_method = HQQMarlinMethod()
    snapshot = Client(server.url).snapshot("org/llama")
    plans = {p.name: p for p in weights.plan_model(model, snapshot)}
    reason = "its layer is quantized by HQQMarlinMethod, whose cut this loader does not know"
    assert plans["model.layers.0.mlp.down_proj.weight"].regions is None
    assert plans["model.layers.0.mlp.down_proj.weight"].reason == reason
    assert weights.describe(type("MambaMixer2", (torch.nn.Module,), {"tp_size": 2})()).reason.startswith("its layer is a MambaMixer2")
    summary = weights.summary(snapshot, list(plans.values()))
    assert summary["whole"] == {("RowParallelLinear", reason): {"names": ["model.layers.0.mlp.down_proj.weight"], "bytes": HIDDEN * FFN * 2}}
    assert "1 fetched whole though split (0.0 MB)" in summary["line"]
    # Its fair share is half of it, which is what the strict setting measures against.
    assert summary["planned"] - summary["share"] == HIDDEN * FFN * 2 // 2
    assert weights.warnings(summary["whole"]) == [
        f"1 tensor(s) of RowParallelLinear layers (0.0 MB) fetched whole though the layer is split, because {reason}: "
        "model.layers.0.mlp.down_proj.weight"]


def test_a_model_replaced_during_a_load_fails_it_with_model_changed(tmp_path):
    models = tmp_path / "models"
    (models / "org" / "llama").mkdir(parents=True)
    path = models / "org" / "llama" / "model.safetensors"
    save_file(checkpoint(), path, metadata={"format": "pt"})
    server = live.Server(models, env={"ZTSERVE_SOURCES__RESCAN_INTERVAL_SECS": "1"})
    try:
        model = Llama(0, 2)
        snapshot = Client(server.url).snapshot("org/llama")
        # One region per request, one request ahead: what follows the first is fetched later.
        stream = weights.stream(snapshot, weights.plan_model(model, snapshot), Misses(), prefetch_bytes=1, request_bytes=1)
        next(stream)
        replaced = {k: v + 1 if v.is_floating_point() else v for k, v in checkpoint().items()}
        save_file(replaced, tmp_path / "next.safetensors", metadata={"format": "pt"})
        (tmp_path / "next.safetensors").replace(path)
        while Client(server.url).snapshot("org/llama").version == snapshot.version:
            time.sleep(0.05)  # until the server has rescanned (the test's own timeout bounds it)
        with pytest.raises(ztserve_client.ModelChanged, match="changed on the server during the load"):
            for _ in stream:
                pass
    finally:
        server.stop()


def test_a_server_that_disappears_mid_load_fails_it_with_a_transfer_error(tmp_path):
    models = tmp_path / "models"
    (models / "org" / "llama").mkdir(parents=True)
    save_file(checkpoint(), models / "org" / "llama" / "model.safetensors", metadata={"format": "pt"})
    server = live.Server(models)
    try:
        model = Llama(0, 2)
        snapshot = Client(server.url, retries=1).snapshot("org/llama")
        stream = weights.stream(snapshot, weights.plan_model(model, snapshot), Misses(), prefetch_bytes=1, request_bytes=1)
        next(stream)
    finally:
        server.stop()
    with pytest.raises(ztserve_client.TransferError):
        for _ in stream:
            pass


def test_bytes_that_miss_the_digest_the_server_states_fail_the_load_loudly(tmp_path):
    import subprocess

    # The checkpoint as a .zt with a SHA-256 per tensor, one byte of each flipped on disk, served
    # by a server that does not check digests itself: only the load can catch it.
    source, converted = tmp_path / "model.safetensors", tmp_path / "model.zt"
    save_file(checkpoint(), source, metadata={"format": "pt"})
    subprocess.run([str(live.binary()), "convert", "--digest", "sha256", str(source), str(converted)], check=True)
    models = tmp_path / "models"
    (models / "org").mkdir(parents=True)
    assert live.flip_digested_blobs(converted, models / "org" / "llama.zt")
    server = live.Server(models, env={"ZTSERVE_SERVING__VERIFY": "never"})
    try:
        # Tensors every rank reads whole (the norms) are checked against their digest.
        with pytest.raises(ztserve_client.DigestMismatch, match="sha256"):
            load(server.url, 0, 2)
    finally:
        server.stop()


def server_of(full, fetched):
    """A stand-in for the server's `?slice=` of `full`: each region asked for is recorded."""

    def fetch(region):
        fetched.append(region)
        out = full
        for dim, (start, stop) in enumerate(region):
            out = out.narrow(dim, start, stop - start)
        return out.clone()

    return fetch


def test_remote_tensors_answer_metadata_without_fetching_and_read_exact_regions():
    full = torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4)
    fetched = []
    fetch = server_of(full, fetched)
    misses = Misses()
    remote = RemoteTensor("w", (6, 4), torch.float32, [(((2, 4), (0, 4)), full[2:4].clone())], fetch, misses)
    assert remote.shape == (6, 4) and remote.dim() == 2 and remote.numel() == 24 and len(remote) == 6
    assert remote.dtype == torch.float32 and fetched == []
    assert torch.equal(remote.narrow(0, 2, 2).narrow(1, 1, 2) + 0, full[2:4, 1:3]) and fetched == []
    assert torch.equal(remote[2:4] * 1, full[2:4]) and fetched == []
    assert torch.equal(remote.narrow(0, -2, 2).contiguous(), full[4:6]) and fetched == [((4, 6), (0, 4))]
    target = torch.empty(6, 4)
    target.copy_(remote)
    assert torch.equal(target, full) and misses.count == 2 and misses.bytes == (2 + 6) * 4 * 4
    assert remote.narrow(1, 4, 0).shape == (6, 0)
    with pytest.raises(RuntimeError, match="exceeds dimension 0"):
        remote.narrow(0, 5, 2)
    with pytest.raises(IndexError):
        remote.narrow(2, 0, 1)


class _Arriving:
    """A piece still on its way: `result()` gives its tensor and counts the wait."""

    def __init__(self, tensor, waited):
        self.tensor, self.waited = tensor, waited

    def result(self):
        self.waited.append(tuple(self.tensor.shape))
        return self.tensor


def test_a_tensor_fetched_in_pieces_is_copied_piece_by_piece_and_read_from_them_without_the_server():
    full = torch.arange(8 * 3 * 5, dtype=torch.float32).reshape(8, 3, 5)
    fetched, waited = [], []
    # The rows 1:8 in three pieces, as a stream hands them out before the last has arrived.
    rows = [(1, 4), (4, 6), (6, 8)]
    pieces = [(((a, b), (0, 3), (0, 5)), _Arriving(full[a:b].clone(), waited)) for a, b in rows]
    remote = RemoteTensor("w", (8, 3, 5), torch.float32, pieces, server_of(full, fetched), Misses())
    share = remote.narrow(0, 1, 7)
    target = torch.zeros(7, 3, 5, dtype=torch.float64)
    target.copy_(share)
    assert torch.equal(target, full[1:8].double()) and fetched == [] and len(waited) == 3, "each piece, in place"
    # Views across pieces, transposed and indexed, read from the pieces alone.
    across = remote.narrow(0, 3, 3).transpose(0, 2)[1:4]
    columns = torch.empty(3, 3, 3)
    columns.copy_(across)
    assert torch.equal(columns, full[3:6].transpose(0, 2)[1:4]) and fetched == []
    assert torch.equal(remote[2:7, 1] * 1, full[2:7, 1]) and fetched == []
    assert torch.equal(remote[0:2].sum(0), full[0:2].sum(0)) and fetched == [((0, 2), (0, 3), (0, 5))], "row 0 was not fetched"


def test_a_model_with_objects_that_are_not_tensors_is_refused_with_a_clear_error(server):
    snapshot = Client(server.url).snapshot("org/llama")
    snapshot.objects["model.norm.weight"] = dict(snapshot.objects["model.norm.weight"], format="gguf.q4_k/1")
    with pytest.raises(ztserve_client.ZtserveError, match="'model.norm.weight' of 'org/llama' is a gguf.q4_k/1 object, not a dense tensor"):
        weights.plan_model(Llama(0, 2), snapshot)


def test_the_views_weight_loaders_take_before_reading_stay_remote():
    """vLLM's expert loaders unsqueeze, unbind, chunk and transpose a checkpoint tensor before
    they narrow it; none of that may fetch the whole tensor, and what they finally read is exact."""
    full = torch.arange(4 * 6 * 8, dtype=torch.float32).reshape(4, 6, 8)
    fetched = []
    fetch = server_of(full, fetched)

    def remote(pieces=()):
        return RemoteTensor("w", (4, 6, 8), torch.float32, list(pieces), fetch, Misses())

    # A per-expert tensor: unsqueeze(0).unbind() gives it back, then the rank's rows.
    one = remote()[2]
    [again] = one.unsqueeze(0).unbind()
    assert torch.equal(again.narrow(0, 3, 3) + 0, full[2, 3:6]) and fetched == [((2, 3), (3, 6), (0, 8))]
    # Experts fused on disk: gate and up as halves, each expert's share of each.
    fetched.clear()
    gate, up = remote().chunk(2, dim=1)
    assert torch.equal(up.unbind()[1].narrow(0, 1, 2) * 1, full[1, 4:6]) and fetched == [((1, 2), (4, 6), (0, 8))]
    # Stored K-first: transposed first, then cut; as gpt-oss slices with an ellipsis.
    fetched.clear()
    assert torch.equal(remote()[1].t().contiguous().narrow(1, 2, 2) * 1, full[1].t()[:, 2:4]) and fetched == [((1, 2), (2, 4), (0, 8))]
    assert torch.equal(remote()[..., 2:4].permute(0, 2, 1) * 1, full[..., 2:4].permute(0, 2, 1))
    assert torch.equal(remote().to("cpu").split([1, 3])[1] * 1, full[1:]) and remote().unsqueeze(1).shape == (4, 1, 6, 8)
    # Read from a piece fetched ahead: no request at all.
    fetched.clear()
    ahead = remote([(((0, 4), (0, 6), (4, 8)), full[:, :, 4:8].clone())])
    assert torch.equal(ahead.unsqueeze(0).unbind()[0][3].t()[6:8] * 1, full[3].t()[6:8]) and fetched == []
    # An operation that reads values (a reshape) fetches the view's region, no more.
    assert torch.equal(remote()[3, :2].reshape(-1), full[3, :2].reshape(-1)) and fetched == [((3, 4), (0, 2), (0, 8))]
