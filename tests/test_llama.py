"""The Llama-style model (partir/models/llama.py): shapes, options, and a train step that runs."""

from __future__ import annotations

import math
import sys
import time

import jax
import numpy as np
import pytest

from partir.models import llama
from partir.models._common import SEED

TINY = llama.PRESETS["tiny"]


def paths(tree) -> dict[str, tuple[int, ...]]:
    return {
        jax.tree_util.keystr(p, simple=True, separator="/"): leaf.shape
        for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def train(steps: int = 4, **options):
    params, opt_state, batch = llama.example_args(abstract=False, **options)
    step = jax.jit(llama.train_step)
    losses = []
    for _ in range(steps):
        params, opt_state, metrics = step(params, opt_state, batch)
        losses.append(float(metrics["loss"]))
    return losses, params, opt_state


def scan_bodies(**options) -> list[set[str]]:
    """Primitive names of each scan body in the train step's jaxpr."""
    jaxpr = jax.make_jaxpr(llama.train_step)(*llama.example_args(**options))
    return [
        {x.primitive.name for x in e.params["jaxpr"].jaxpr.eqns}
        for e in jaxpr.eqns
        if e.primitive.name == "scan"
    ]


def test_tiny_traces_fast_with_scan_and_remat():
    args = llama.example_args()
    start = time.perf_counter()
    jax.make_jaxpr(llama.train_step)(*args)
    assert time.perf_counter() - start < 2.0
    # Forward and backward loops; the backward one recomputes the layer (remat2).
    bodies = scan_bodies()
    assert len(bodies) == 2 and any("remat2" in b for b in bodies)
    assert not any("remat2" in b for b in scan_bodies(remat=False))
    assert scan_bodies(scan=False) == []


def test_param_paths_and_gqa_shapes():
    d, h, g, ff = TINY["d_model"], TINY["heads"], TINY["kv_heads"], TINY["d_ff"]
    hd = d // h
    flat = paths(llama.example_args(scan=False)[0])
    assert flat["layers/0/attn/q"] == (d, h, hd)
    assert flat["layers/0/attn/k"] == flat["layers/0/attn/v"] == (d, g, hd)
    assert flat["layers/1/attn/o"] == (h, hd, d)
    assert flat["layers/0/mlp/w_gate"] == flat["layers/0/mlp/w_in"] == (d, ff)
    assert flat["layers/0/mlp/w_out"] == (ff, d)
    assert flat["layers/0/attn_norm/scale"] == flat["final_norm/scale"] == (d,)
    assert flat["embed"] == (TINY["vocab"], d) and flat["unembed"] == (d, TINY["vocab"])
    stacked = paths(llama.example_args()[0])  # scan=True is the default
    assert stacked["layers/attn/q"] == (TINY["layers"], d, h, hd)


def test_params_and_moments_are_float32_and_config_is_static():
    params, opt_state, batch = llama.example_args()
    assert {str(x.dtype) for x in jax.tree.leaves((params, opt_state)) if x.ndim} == {"float32"}
    assert jax.tree.leaves(batch["config"]) == []
    assert batch["config"] == llama.Config()


@pytest.mark.parametrize("compute_dtype", ["bfloat16", "float32"])
def test_compute_dtype_reaches_the_matmuls(compute_dtype):
    jaxpr = jax.make_jaxpr(llama.train_step)(*llama.example_args(compute_dtype=compute_dtype))

    def dot_dtypes(j):
        out = set()
        for e in j.eqns:
            if e.primitive.name == "dot_general":
                out |= {str(v.aval.dtype) for v in e.invars}
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                out |= dot_dtypes(sub)
        return out

    assert dot_dtypes(jaxpr.jaxpr) == {compute_dtype}


@pytest.mark.parametrize("compute_dtype", ["bfloat16", "float32"])
def test_train_step_runs_and_decreases_loss(compute_dtype):
    losses, params, opt_state = train(compute_dtype=compute_dtype)
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.1, losses
    # Near-uniform predictions at init: loss close to log(vocab).
    assert abs(losses[0] - math.log(TINY["vocab"])) < 0.5
    assert str(jax.tree.leaves(params)[0].dtype) == "float32"


def test_scan_remat_and_unrolled_steps_agree():
    base, scanned, _ = train(steps=3, compute_dtype="float32")
    flat, unrolled, _ = train(steps=3, compute_dtype="float32", scan=False, remat=False)
    np.testing.assert_allclose(base, flat, rtol=1e-5)
    np.testing.assert_allclose(
        scanned["layers"]["mlp"]["w_gate"][1],
        unrolled["layers"][1]["mlp"]["w_gate"],
        rtol=1e-4,
        atol=1e-6,
    )
    # init with scan=True stacks the very weights scan=False gives.
    a = llama.init(np.random.default_rng(SEED), **TINY, scan=True)
    b = llama.init(np.random.default_rng(SEED), **TINY, scan=False)
    np.testing.assert_array_equal(a["layers"]["attn"]["k"][1], b["layers"][1]["attn"]["k"])


def test_remat_policy_changes_what_is_saved():
    def saved(policy):
        params, _, batch = llama.example_args(remat_policy=policy, compute_dtype="float32")
        vjp = jax.eval_shape(
            lambda p, b: jax.vjp(lambda q: llama.loss_fn(q, b), p)[1], params, batch
        )
        return sum(math.prod(x.shape) for x in jax.tree.leaves(vjp))

    assert saved("nothing_saveable") < saved("dots_saveable")


def test_causal_attention_ignores_the_future():
    params, _, batch = llama.example_args(abstract=False, compute_dtype="float32", scan=False)
    x = params["embed"][batch["tokens"]]
    block = jax.jit(llama.block)  # the Config is a static pytree node
    out = block(params["layers"][0], x, batch["config"])
    later = x.at[:, -1].set(0.0)
    np.testing.assert_allclose(
        block(params["layers"][0], later, batch["config"])[:, :-1],
        out[:, :-1],
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.parametrize(("preset", "low", "high"), [("8b", 7.9e9, 8.1e9), ("70b", 68e9, 70e9)])
def test_large_presets_have_their_parameter_counts(preset, low, high):
    assert low <= llama.param_count(preset) <= high
    cfg = llama.PRESETS[preset]
    params, _, batch = llama.example_args(preset=preset)
    assert params["layers"]["attn"]["k"].shape == (
        cfg["layers"],
        cfg["d_model"],
        cfg["kv_heads"],
        cfg["d_model"] // cfg["heads"],
    )
    assert batch["tokens"].shape == (cfg["batch"], cfg["seq"])


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"compute_dtype": "float16"}, "compute_dtype 'float16'.*bfloat16, float32"),
        ({"remat_policy": "dots"}, "remat_policy 'dots'.*nothing_saveable"),
        ({"heads": 6}, "d_model 64 is not divisible by heads 6"),
        ({"kv_heads": 3}, "heads 8 is not divisible by kv_heads 3"),
    ],
)
def test_bad_options_say_what_to_use(options, match):
    with pytest.raises(ValueError, match=match):
        llama.example_args(**options)


def _fidelity_bench():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "xla_fidelity.py"
    spec = importlib.util.spec_from_file_location("xla_fidelity", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("scan", [True, False])
def test_maxtext_plan_shards_every_weight_as_maxtext_does(scan):
    from jax.sharding import PartitionSpec as P

    import partir

    bench = _fidelity_bench()
    mesh = {"data": 2, "fsdp": 2, "tensor": 2}
    goal = partir.Goal(llama.train_step, llama.example_args(scan=scan), mesh)
    specs = partir.plan(goal, [bench.maxtext_rules(goal)]).specs  # strict: every rule matches
    lead = (None,) if scan else ()
    layer = "layers" if scan else "layers/1"
    for prefix in ("params", "opt_state/0/mu"):
        assert specs[f"{prefix}/{layer}/attn/q"] == P(*lead, "fsdp", "tensor", None)
        assert specs[f"{prefix}/{layer}/attn/o"] == P(*lead, "tensor", None, "fsdp")
        assert specs[f"{prefix}/{layer}/mlp/w_out"] == P(*lead, "tensor", "fsdp")
        assert specs[f"{prefix}/embed"] == P("tensor", "fsdp")
    assert specs["batch/tokens"] == P(("data", "fsdp"), None)
