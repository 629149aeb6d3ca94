"""The plan from a model's config (`config_plan`, what `python -m ztserve_vllm plan` prints)
against the plan from the model vLLM builds (`weights`, what the load format fetches), for every
stand-in model of test_experts and every rank: they must cut every tensor alike. And the plan of
checkpoints of DeepSeek-V3's and Qwen3-235B's shapes at TP=8: every rank within its share."""

import json

import pytest
from test_experts import SPECS

import vllm_standins as standins
from ztserve_vllm import config_plan, weights


def shapes(spec):
    return {name: tuple(t.shape) for name, t in standins.checkpoint(spec).items()}


@pytest.mark.parametrize("size, ep", [(1, False), (2, False), (4, False), (4, True)])
@pytest.mark.parametrize("key", list(SPECS))
def test_the_config_plans_every_tensor_as_the_model_does(key, size, ep):
    spec = SPECS[key]
    tensors = shapes(spec)
    for rank in range(size):
        model = weights.plan_tensors(standins.build(spec, rank, size, ep), {n: (s, "") for n, s in tensors.items()})
        config = config_plan.plan(standins.config(spec), tensors, rank, size, ep)
        got = {p.name: (p.regions, bool(p.reason)) for p in config}
        want = {p.name: (p.regions, bool(p.reason)) for p in model}
        assert got == want, {n: (got[n], want[n]) for n in want if got[n] != want[n]}


def test_a_layer_the_model_does_not_have_is_not_fetched():
    spec = SPECS["deepseek-fp8-block"]
    tensors = shapes(spec)
    extra = {name.replace("model.layers.1.", "model.layers.2."): shape for name, shape in tensors.items() if "model.layers.1." in name}
    model = standins.build(spec, 0, 2)
    plans = weights.plan_tensors(model, {n: (s, "") for n, s in {**tensors, **extra}.items()})
    assert all(p.regions == [] for p in plans if p.name in extra)
    config = config_plan.plan(standins.config(spec), {**tensors, **extra}, 0, 2)
    assert all(p.regions == [] for p in config if p.name in extra)


@pytest.fixture(scope="module")
def shapes_server(tmp_path_factory):
    """Sparse checkpoints of DeepSeek-V3's and Qwen3-235B-A22B's shapes (bench/scale/generate.py,
    every dimension divided by 16, fewer layers and experts), served by a live ztserve."""
    import subprocess
    import sys

    from conftest import REPO, live

    models = tmp_path_factory.mktemp("shapes") / "models"
    generate = [sys.executable, str(REPO / "bench" / "scale" / "generate.py"), "checkpoint"]
    subprocess.run(generate + [str(models / "deepseek" / "v3"), "--scale", "16", "--layers", "5", "--experts", "16", "--shards", "2"],
                   check=True, capture_output=True)
    subprocess.run(generate + [str(models / "qwen" / "qwen3"), "--shape", "qwen3-235b", "--scale", "16", "--layers", "3", "--experts",
                               "16", "--shards", "2"], check=True, capture_output=True)
    server = live.Server(models)
    yield server
    server.stop()


@pytest.mark.parametrize("model", ["deepseek/v3", "qwen/qwen3"])
@pytest.mark.parametrize("ep", [False, True])
def test_the_models_fleets_run_are_planned_within_their_share_at_tp_8(shapes_server, model, ep):
    from ztserve_client import Client
    from ztserve_vllm import __main__ as command

    with Client(shapes_server.url) as client:
        manifest = client.manifest(model)
        config = json.loads(client.file(model, "config.json"))
    costs = command.rank_costs(manifest, config, 8, ep)
    for cost in costs:
        assert cost["whole"] == {}, cost["whole"]
        assert cost["planned"] <= 1.1 * cost["fair"]
    if model == "deepseek/v3":
        # The multi-token-prediction layer (model.layers.5 here) is loaded by no rank.
        names = {o["name"] for o in manifest["objects"] if o["name"].startswith("model.layers.5.")}
        plans = config_plan.plan(config, {o["name"]: tuple(o["shape"]) for o in manifest["objects"]}, 3, 8, ep)
        assert names and all(p.regions == [] for p in plans if p.name in names)
    text = command.report(model, "v", costs, 8, ep)
    assert "(within 1.1x)" in text and "Nothing is fetched whole though split." in text
