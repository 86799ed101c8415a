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


def _tanh_read_twice_in_one_kernel(x, w):
    t = jnp.tanh(x @ w)
    return t * t + t  # both readers of t run in the kernel that makes the result


def test_an_expensive_op_whose_readers_share_one_kernel_is_computed_there_once():
    # XLA keeps a transcendental with several readers as a buffer only where the readers run
    # in several kernels; here one loop fusion computes tanh once (the model stored it:
    # 1.80x XLA's bytes accessed)
    args = (S((512, 512), f32), S((512, 512), f32))
    goal = Goal(_tanh_read_twice_in_one_kernel, args, {"data": 1})
    (tanh,) = [op for op in goal.program.ops if op.primitive == "tanh"]
    assert len(goal.cost_model.liveness.readers[tanh.outputs[0]]) == 2
    assert tanh.outputs[0] in goal.cost_model.liveness.fused
    compiled = jax.jit(_tanh_read_twice_in_one_kernel).lower(*args).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    predicted = make_plan(goal, {}).cost.hbm_bytes
    assert predicted == pytest.approx(analysis["bytes accessed"], rel=0.02)


def _scaled_twice(x, w, y):
    s = x @ w
    a, b = s / 8.0, s / y  # each read by two reductions
    return a.max(axis=1) + a.sum(axis=1), b.max(axis=1) + b.sum(axis=1)


def test_a_division_by_a_constant_is_a_multiplication_fused_into_every_reader():
    # XLA's algebraic simplifier rewrites A / constant as A * (1 / constant), a cheap op
    # computed again in each kernel; a division by a computed value stays expensive: with
    # readers in two kernels it is a buffer (attention's `scores / sqrt(head_dim)` was one,
    # an S x S write and read per layer)
    args = (S((256, 256), f32), S((256, 256), f32), S((256, 256), f32))
    goal = Goal(_scaled_twice, args, {"data": 1})
    by_literal, by_value = [op.outputs[0] for op in goal.program.ops if op.primitive == "div"]
    lv = goal.cost_model.liveness
    assert by_literal in lv.fused and lv.kernels[goal.program.producer[by_literal]] == 2
    assert lv.stored[by_value]
    text = jax.jit(lambda x: x / 8.0).lower(args[0]).compile().as_text()
    assert "multiply(" in text and "divide(" not in text


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
