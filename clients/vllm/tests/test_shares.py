"""Which region of each checkpoint tensor a rank's layers read, as vLLM's loaders cut them."""

import pytest
from ztserve_vllm import shares
from ztserve_vllm.shares import Layer, Param

WEIGHT = Param(output_dim=0, input_dim=1)
BIAS = Param(output_dim=0)


def test_checkpoint_names_resolve_to_their_module_and_stacked_part():
    modules = {"model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj", "model.norm", "lm_head"}
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    assert shares.resolve("model.layers.0.self_attn.k_proj.weight", modules, packed) == ("model.layers.0.self_attn.qkv_proj", "weight", 1)
    assert shares.resolve("model.layers.0.mlp.up_proj.weight", modules, packed) == ("model.layers.0.mlp.gate_up_proj", "weight", 1)
    assert shares.resolve("model.norm.weight", modules, packed) == ("model.norm", "weight", None)
    assert shares.resolve("lm_head.weight", modules, packed) == ("lm_head", "weight", None)
    assert shares.resolve("model.layers.0.self_attn.rotary_emb.inv_freq", modules, packed) is None


@pytest.mark.parametrize("size", [2, 3, 4])
def test_column_and_row_layers_split_their_output_rows_and_input_columns(size):
    for rank in range(size):
        column = Layer(shares.COLUMN, rank, size, per_rank=12 // size)
        assert shares.regions(column, WEIGHT, None, (12, 5)) == ([((rank * 12 // size, (rank + 1) * 12 // size),)], "")
        assert shares.regions(column, BIAS, None, (12,)) == ([((rank * 12 // size, (rank + 1) * 12 // size),)], "")
        row = Layer(shares.ROW, rank, size, per_rank=12 // size)
        assert shares.regions(row, WEIGHT, None, (5, 12)) == ([((0, 5), (rank * 12 // size, (rank + 1) * 12 // size))], "")
        assert shares.regions(row, BIAS, None, (5,)) == (None, "")  # added once, whole on every rank


def test_merged_layers_split_each_stacked_part_and_a_fused_tensor_part_by_part():
    layer = Layer(shares.MERGED, 1, 2, sizes=(8, 8))
    assert shares.regions(layer, WEIGHT, 0, (8, 4)) == ([((4, 8),)], "")
    assert shares.regions(layer, WEIGHT, 1, (8, 4)) == ([((4, 8),)], "")
    # gate_up_proj stored fused: rank 1 reads its half of gate, then its half of up.
    assert shares.regions(layer, WEIGHT, None, (16, 4)) == ([((4, 8),), ((12, 16),)], "")


def test_qkv_splits_query_heads_and_shares_key_value_heads_among_ranks_when_fewer():
    # 8 query heads and 2 key/value heads of 4, at 4 ranks: 2 query heads each; ranks 0-1
    # read key/value head 0, ranks 2-3 head 1 (vLLM's num_kv_head_replicas = 2).
    for rank in range(4):
        layer = Layer(shares.QKV, rank, 4, heads=2, kv_heads=1, head_size=4, v_head_size=4, kv_replicas=2)
        assert shares.regions(layer, WEIGHT, 0, (32, 16)) == ([((rank * 8, rank * 8 + 8),)], "")
        kv = rank // 2
        assert shares.regions(layer, WEIGHT, 1, (8, 16)) == ([((kv * 4, kv * 4 + 4),)], "")
        assert shares.regions(layer, WEIGHT, 2, (8, 16)) == ([((kv * 4, kv * 4 + 4),)], "")
        # qkv_proj stored fused: q rows, then k, then v.
        fused = shares.regions(layer, WEIGHT, None, (48, 16))[0]
        assert fused == [((rank * 8, rank * 8 + 8),), ((32 + kv * 4, 36 + kv * 4),), ((40 + kv * 4, 44 + kv * 4),)]
    more = Layer(shares.QKV, 1, 2, heads=4, kv_heads=2, head_size=4, v_head_size=4, kv_replicas=1)
    assert shares.regions(more, WEIGHT, 1, (16, 16)) == ([((8, 16),)], "")


def test_vocabulary_layers_read_their_rows_with_the_padding_removed():
    layer = Layer(shares.VOCAB, 1, 2, start=512, stop=1000)
    assert shares.regions(layer, WEIGHT, None, (1000, 8)) == ([((512, 1000),)], "")


def test_whole_tensors_say_why_when_the_layer_is_split():
    assert shares.regions(Layer(shares.REPLICATED), WEIGHT, None, (4, 4)) == (None, "")
    assert shares.regions(Layer(shares.COLUMN, 0, 1, per_rank=4), WEIGHT, None, (4, 4)) == (None, "")
    opaque = Layer(shares.OPAQUE, tp_size=2, reason="its layer is quantized (Fp8LinearMethod)")
    assert shares.regions(opaque, WEIGHT, None, (4, 4)) == (None, "its layer is quantized (Fp8LinearMethod)")
    sharded = Param(output_dim=0, input_dim=1, sharded=True)
    assert shares.regions(Layer(shares.COLUMN, 0, 2, per_rank=2), sharded, None, (4, 4))[1].startswith("the checkpoint tensor is marked")


def test_a_share_outside_the_tensor_is_an_error_not_a_short_read():
    with pytest.raises(ValueError, match="outside dimension 0"):
        shares.regions(Layer(shares.COLUMN, 1, 2, per_rank=8), WEIGHT, None, (12, 4))


def test_a_plan_cuts_what_it_can_and_names_why_the_rest_is_whole():
    modules = {
        "m.qkv_proj": Layer(shares.QKV, 0, 2, heads=1, kv_heads=1, head_size=4, v_head_size=4, kv_replicas=2),
        "m.o_proj": Layer(shares.ROW, 0, 2, per_rank=4),
        "m.fp8": Layer(shares.OPAQUE, tp_size=2, reason="its layer is quantized (Fp8LinearMethod)"),
    }
    params = {"m.qkv_proj.weight": WEIGHT, "m.o_proj.weight": WEIGHT, "m.fp8.weight": WEIGHT}
    tensors = {
        "m.q_proj.weight": ((8, 8), ""),
        "m.k_proj.weight": ((4, 8), ""),
        "m.o_proj.weight": ((8, 8), ""),
        "m.o_blocks.weight": ((8, 8), ""),
        "m.fp8.weight": ((8, 8), ""),
        "m.dropped": ((8,), ""),
    }
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}

    def rename(name):
        return None if name == "m.dropped" else (name, None)

    plans = {p.name: p for p in shares.plan(tensors, modules, packed, params, rename)}
    assert plans["m.q_proj.weight"].regions == [((0, 4),)]
    assert plans["m.k_proj.weight"].regions is None  # one key/value head, held by both ranks
    assert plans["m.o_proj.weight"].regions == [((0, 8), (0, 4))]
    assert plans["m.o_blocks.weight"].regions is None and plans["m.o_blocks.weight"].reason == ""
    assert plans["m.fp8.weight"].reason == "its layer is quantized (Fp8LinearMethod)"
    assert plans["m.dropped"].regions == [] and plans["m.dropped"].module is None  # vLLM drops it: never fetched
    uncuttable = shares.plan({"m.o_proj.weight": ((8, 8), "it is a gguf.q4_k/1 object")}, modules, packed, params)
    assert uncuttable[0].regions is None and uncuttable[0].reason == "it is a gguf.q4_k/1 object"


def test_a_stacked_shard_id_naming_several_parts_is_fetched_whole_with_the_reason():
    modules = {"m.gate_up_proj": Layer(shares.MERGED, 0, 2, sizes=(4, 4))}
    plans = shares.plan({"m.w": ((8, 4), "")}, modules, {}, {"m.gate_up_proj.weight": WEIGHT}, lambda name: ("m.gate_up_proj.weight", (0, 1)))
    assert plans[0].regions is None and "stacked part (0, 1)" in plans[0].reason


def test_region_bytes_count_the_whole_trailing_dimensions():
    assert shares.region_bytes((10, 6, 2), ((2, 5),), 2) == 3 * 6 * 2 * 2
    assert shares.region_bytes((10, 6), ((0, 10), (1, 3)), 4) == 10 * 2 * 4


def test_quantized_parameters_are_cut_in_their_own_units():
    # FP8 block scales of gate_up (2 x 512 rows, 128-row blocks) at rank 1 of 2: two blocks of each part.
    merged = Layer(shares.MERGED, 1, 2, sizes=(512, 512), block=(128, 128))
    scale = Param(output_dim=0, input_dim=1, block=True)
    assert shares.regions(merged, scale, 1, (4, 4)) == ([((2, 4),)], "")  # up_proj's own scales
    assert shares.regions(merged, scale, None, (8, 4)) == ([((2, 4),), ((6, 8),)], "")  # gate_up stored fused
    # AWQ packs eight 4-bit values along the output dimension: its share of up is 256/8 columns.
    packed = Param(output_dim=1, input_dim=0, packed_dim=1, packed_factor=8)
    assert shares.regions(merged, packed, 1, (64, 64)) == ([((0, 64), (32, 64))], "")
    # GPTQ packs along the input dimension: a row-parallel layer cuts its packed rows by its own shape.
    row = Layer(shares.ROW, 1, 2, per_rank=256)
    assert shares.regions(row, Param(output_dim=1, input_dim=0, packed_dim=0, shape=(32, 64)), None, (64, 64)) == ([((32, 64),)], "")
    # Per-part scalars (FP8 per-tensor scales) and act-order scales without an input dim: whole.
    assert shares.regions(merged, Param(scalar=True), 0, ()) == (None, "")
    assert shares.regions(row, Param(output_dim=1), None, (8, 64)) == (None, "")
    # Block scales of q, k and v at rank 3 of 4 (2 heads of 128 each for q, 1 kv head shared by 2 ranks).
    qkv = Layer(shares.QKV, 3, 4, heads=2, kv_heads=1, head_size=128, v_head_size=128, kv_replicas=2, block=(128, 128))
    assert shares.regions(qkv, scale, 0, (8, 4)) == ([((6, 8),)], "")
    assert shares.regions(qkv, scale, 2, (2, 4)) == ([((1, 2),)], "")


def test_experts_are_cut_along_their_intermediate_dimension_or_held_whole_by_their_rank():
    experts = Layer(shares.EXPERTS, 1, 2)
    weight = Param()
    # One expert's gate (w1) rows, down (w2) columns.
    assert shares.expert_regions(experts, shares.W1, weight, "weight", (64, 32), 5) == ([((32, 64),)], "")
    assert shares.expert_regions(experts, shares.W2, weight, "weight", (32, 64), 5) == ([((0, 32), (32, 64))], "")
    # GPTQ and AWQ store experts K-first: the cut flips to the other dimension.
    k_first = Param(transposed=True, scale="group")
    assert shares.expert_regions(experts, shares.W1, k_first, "qweight", (4, 64), 5) == ([((0, 4), (32, 64))], "")
    assert shares.expert_regions(experts, shares.W2, k_first, "scales", (2, 32), 5) == ([((1, 2),)], "")
    # Scales by kind: per tensor whole, per channel whole for down, block scales cut, refined ones read whole.
    assert shares.expert_regions(experts, shares.W1, Param(scale="tensor"), "weight_scale", (), 5) == (None, "")
    assert shares.expert_regions(experts, shares.W2, Param(scale="channel"), "weight_scale", (32, 1), 5) == (None, "")
    assert shares.expert_regions(experts, shares.W1, Param(scale="block"), "weight_scale_inv", (4, 2), 5) == ([((2, 4),)], "")
    refined = Layer(shares.EXPERTS, 1, 2, refined=True)
    cut, reason = shares.expert_regions(refined, shares.W1, Param(scale="block"), "weight_scale_inv", (3, 2), 5)
    assert cut is None and "upsamples these block scales" in reason
    # Gate and up stacked per expert ([2I, H]): each half's share.
    assert shares.expert_regions(experts, "w13", weight, "weight", (64, 32), 5) == ([((16, 32),), ((48, 64),)], "")
    # Every expert in one tensor ([E, 2I, H]; [E, H, 2I] when stored transposed).
    assert shares.expert_regions(experts, "w13", weight, "weight", (8, 64, 32)) == ([((0, 8), (16, 32)), ((0, 8), (48, 64))], "")
    assert shares.expert_regions(experts, shares.W2, weight, "weight", (8, 32, 32)) == ([((0, 8), (0, 32), (16, 32))], "")
    transposed = Layer(shares.EXPERTS, 1, 2, fused_transposed=True)
    assert shares.expert_regions(transposed, "w13", weight, "weight", (8, 32, 64)) == (
        [((0, 8), (0, 32), (16, 32)), ((0, 8), (0, 32), (48, 64))], "")
    # Expert parallelism: this rank's experts whole, the others' not at all.
    ep = Layer(shares.EXPERTS, 0, 1, experts=(4, 5, 6, 7), ep_size=2)
    assert shares.expert_regions(ep, shares.W1, weight, "weight", (64, 32), 5) == (None, "")
    assert shares.expert_regions(ep, shares.W1, weight, "weight", (64, 32), 2) == ([], "")
    assert shares.expert_regions(ep, "w13", weight, "weight", (8, 64, 32)) == ([((4, 8),)], "")


def test_gpt_oss_cuts_its_interleaved_experts_by_ceil_of_the_intermediate_size():
    layer = Layer(shares.EXPERTS, 2, 3, loader=shares.GPT_OSS, intermediate=10)
    # ceil(10 / 3) = 4 each: rank 2 takes 8..10, interleaved gate/up columns 16..20.
    assert shares.expert_regions(layer, "w13", Param(), "weight", (4, 16, 20)) == ([((0, 4), (0, 16), (16, 20))], "")
    assert shares.expert_regions(layer, shares.W2, Param(), "weight", (4, 10, 16)) == ([((0, 4), (8, 10))], "")
    assert shares.expert_regions(layer, "w13", Param(), "bias", (4, 20)) == ([((0, 4), (16, 20))], "")
    assert shares.expert_regions(layer, shares.W2, Param(), "bias", (4, 16)) == (None, "")


def test_expert_checkpoint_names_find_their_experts_layer():
    modules = {"m.layers.1.mlp.experts": Layer(shares.EXPERTS, 0, 2, names=("w1", "w2", "w3"))}
    tensors = {"m.layers.1.mlp.experts.3.w2.weight": ((16, 8), ""), "m.layers.1.mlp.experts.3.w9.weight": ((16, 8), "")}
    plans = {p.name: p for p in shares.plan(tensors, modules, {}, {})}
    assert plans["m.layers.1.mlp.experts.3.w2.weight"].regions == [((0, 16), (0, 4))]
    assert plans["m.layers.1.mlp.experts.3.w9.weight"].reason == "it is an expert tensor (w9) this loader cannot place"
