"""The cost model's kernels: what each reads and writes (its HBM traffic), held to XLA's cost
analysis where this machine can compile, and the device rules that decide what is fused."""

import jax
import jax.numpy as jnp
import pytest

from partir.goal import Goal
from partir.solver.plan import make_plan

S = jax.ShapeDtypeStruct
f32 = jnp.float32


def _two_reductions_of_one_product(x, w):
    y = x @ w
    a = y * y  # cheap: fused into both reductions, each of which reads y
    return a.max(axis=1), a.sum(axis=1)


def test_a_value_fused_into_two_kernels_is_read_by_each():
    # XLA's two reduction fusions read the matmul's result twice; the model counted it once
    # (0.71 of XLA's bytes accessed)
    args = (S((256, 256), f32), S((256, 256), f32))
    goal = Goal(_two_reductions_of_one_product, args, {"data": 1})
    (mul,) = [op.index for op in goal.program.ops if op.primitive == "mul"]
    assert goal.cost_model.liveness.kernels[mul] == 2
    compiled = jax.jit(_two_reductions_of_one_product).lower(*args).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    predicted = make_plan(goal, {}).cost.hbm_bytes
    assert predicted == pytest.approx(analysis["bytes accessed"], rel=0.02)


def _attention_scores(q, k):
    return jax.nn.softmax(q @ k.T, axis=-1).sum()


@pytest.mark.parametrize("device, stored", [("cpu", True), ("tpu-v5p", True), ("h100", False)])
def test_a_softmaxs_exp_is_computed_again_in_each_reader_only_on_gpus(device, stored):
    # XLA:GPU calls f32 exp, division and square roots cheap (GpuInstructionFusion::
    # IsExpensive) and fuses them into every reader; the generic rule keeps them a buffer
    args = (S((512, 64), f32), S((512, 64), f32))
    goal = Goal(_attention_scores, args, {"data": 1}, device=device)
    (exp,) = [op for op in goal.program.ops if op.primitive == "exp"]
    assert len(goal.cost_model.liveness.readers[exp.outputs[0]]) == 2
    assert bool(goal.cost_model.liveness.stored[exp.outputs[0]]) is stored
