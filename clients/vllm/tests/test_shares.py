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
    assert plans["m.dropped"].regions is None and plans["m.dropped"].module is None
    uncuttable = shares.plan({"m.o_proj.weight": ((8, 8), "it is a gguf.q4_k/1 object")}, modules, packed, params)
    assert uncuttable[0].regions is None and uncuttable[0].reason == "it is a gguf.q4_k/1 object"


def test_a_stacked_shard_id_naming_several_parts_is_fetched_whole_with_the_reason():
    modules = {"m.gate_up_proj": Layer(shares.MERGED, 0, 2, sizes=(4, 4))}
    plans = shares.plan({"m.w": ((8, 4), "")}, modules, {}, {"m.gate_up_proj.weight": WEIGHT}, lambda name: ("m.gate_up_proj.weight", (0, 1)))
    assert plans[0].regions is None and "stacked part (0, 1)" in plans[0].reason


def test_region_bytes_count_the_whole_trailing_dimensions():
    assert shares.region_bytes((10, 6, 2), ((2, 5),), 2) == 3 * 6 * 2 * 2
    assert shares.region_bytes((10, 6), ((0, 10), (1, 3)), 4) == 10 * 2 * 4
