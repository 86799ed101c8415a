"""A table or logits tiled on the dim a gather indexes: each device looks up the rows it
holds and an all-reduce of the result completes it, in partir's estimate, in XLA's
partitioner and in plan.jit's numerics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partir
from partir.ir.xla import compile_stats
from partir.testing import check_numerics

S = jax.ShapeDtypeStruct


def _pick(logits, labels):
    """penzai's `lp[t]` under `nmap`: `x[i]` vmapped over batch and sequence, a gather whose
    vocab dim is an offset dim of slice size 1."""
    return jax.vmap(jax.vmap(lambda v, i: v[i]))(logits, labels)


def _look_up(table, tokens):
    """A token lookup vmapped over the tokens: the table's vocab dim is an offset dim too."""
    return jax.vmap(lambda e, i: e[i], in_axes=(None, 0))(table, tokens)


def _random(args, vocab: int):
    rng = np.random.default_rng(0)
    return tuple(
        jnp.asarray(rng.integers(0, vocab, a.shape), a.dtype)
        if jnp.issubdtype(a.dtype, jnp.integer)
        else jnp.asarray(rng.normal(size=a.shape), a.dtype)
        for a in args
    )


CASES = {
    "pick": (_pick, (S((4, 16, 64), jnp.float32), S((4, 16), jnp.int32)), "logits",
             P(None, None, "model"), 4 * 16 * 4),
    "look_up": (_look_up, (S((64, 16), jnp.float32), S((8,), jnp.int32)), "table",
                P("model"), 8 * 16 * 4),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_gather_over_a_tiled_vocab_dim_ends_in_an_all_reduce(case):
    fn, args, name, spec, result_bytes = CASES[case]
    goal = partir.Goal(fn, args, mesh={"model": 8}, device="cpu")
    plan = partir.plan(goal, {name: spec})
    assert [(c.kind, c.bytes) for c in plan.cost.collectives] == [("all-reduce", result_bytes)]
    # XLA given only the input shardings reduces the same way ...
    mesh = jax.make_mesh((8,), ("model",), axis_types=(jax.sharding.AxisType.Auto,))
    shardings = (NamedSharding(mesh, spec), NamedSharding(mesh, P()))
    alone = compile_stats(fn, args, shardings, None)
    assert [(c.kind, c.bytes) for c in alone.collectives] == [("all-reduce", result_bytes)]
    # ... and so does the plan's own program, with the same numbers to the bit
    report = partir.verify(goal, plan)
    assert report.ok, str(report)
    assert report.compiled["all-reduce"] == result_bytes
    assert report.compiled["all-gather"] == 0
    vocab = args[0].shape[-1] if case == "pick" else args[0].shape[0]
    assert check_numerics(goal, plan, _random(args, vocab), tolerance=0.0) == 0.0
