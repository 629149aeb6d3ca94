"""The plan from a model's config (`config_plan`, what `python -m ztserve_vllm plan` prints)
against the plan from the model vLLM builds (`weights`, what the load format fetches), for every
stand-in model of test_experts and every rank: they must cut every tensor alike."""

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
