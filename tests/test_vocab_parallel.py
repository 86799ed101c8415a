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
import partir.strategies as st
from partir.ir.groups import find_groups, gathered_tables
from partir.ir.program import trace
from partir.ir.xla import compile_stats
from partir.models import gpt
from partir.strategies.compile import compile_axis
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
    "pick": (
        _pick,
        (S((4, 16, 64), jnp.float32), S((4, 16), jnp.int32)),
        "logits",
        P(None, None, "model"),
        4 * 16 * 4,
    ),
    "look_up": (
        _look_up,
        (S((64, 16), jnp.float32), S((8,), jnp.int32)),
        "table",
        P("model"),
        8 * 16 * 4,
    ),
}


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


def _gathered(fn, *args) -> dict[str, int]:
    prog = trace(fn, args)
    names = {v: p for p, v in prog.inputs.items()}
    return {names[v]: d for v, d in gathered_tables(prog).items()}


def test_gathered_tables_are_found_through_converts_transposes_and_loops():
    tokens = S((4, 8), jnp.int32)
    assert _gathered(lambda e, t: e[t].sum(), S((64, 16), jnp.float32), tokens) == {"e": 0}
    assert _gathered(
        lambda e, t: e.T.astype(jnp.bfloat16)[t], S((16, 64), jnp.float32), tokens
    ) == {"e": 1}
    assert _gathered(_look_up, S((64, 16), jnp.float32), S((8,), jnp.int32)) == {"table": 0}

    def scanned(stack, t):  # a stack of tables scanned over: each looked up on its rows
        return jax.lax.scan(lambda c, e: (c + e[t].sum(), None), 0.0, stack)[0]

    assert _gathered(scanned, S((3, 64, 16), jnp.float32), tokens) == {"stack": 1}

    def closed_over(e, t):  # a table the loop body closes over (a loop const)
        return jax.lax.scan(lambda c, _: (c + e[t].sum(), None), 0.0, None, length=2)[0]

    assert _gathered(closed_over, S((64, 16), jnp.float32), tokens) == {"e": 0}
    assert _gathered(lambda e, t: e.reshape(64, 4, 4)[t], S((64, 16), jnp.float32), tokens) == {
        "e": 0
    }
    # dims merged into the looked-up dim: only the major one tiles it in whole blocks
    flat = lambda e, t: e.reshape(-1)[t]  # noqa: E731
    assert _gathered(flat, S((64, 16), jnp.float32), tokens) == {"e": 0}
    assert _gathered(lambda e, t: flat(e.T, t), S((64, 16), jnp.float32), tokens) == {"e": 1}
    assert _gathered(lambda e, t: e.reshape(16, 64)[t], S((64, 16), jnp.float32), tokens) == {}
    # `x[:, i]` looks up columns; a dynamic slice is no gather
    assert _gathered(lambda x, i: x[:, i], S((64, 16), jnp.float32), S((4,), jnp.int32)) == {"x": 1}
    assert (
        _gathered(
            lambda x, i: jax.lax.dynamic_slice_in_dim(x, i, 8),
            S((64, 16), jnp.float32),
            S((), jnp.int32),
        )
        == {}
    )


def _model_axis_actions(tied: bool) -> dict[str, set[int]]:
    args = gpt.example_args(tied=tied)
    goal = partir.Goal(
        gpt.train_step,
        args,
        {"data": 2, "model": 4},
        device="tpu-v4",
        schedule=[st.batch("data"), st.megatron("model")],
    )
    prop, groups = goal.propagator, find_groups(goal.program)
    required = compile_axis(goal, "data", prop.empty(), groups, 10).required
    state = prop.apply_all(prop.empty(), required)[0]
    out: dict[str, set[int]] = {}
    for a in compile_axis(goal, "model", state, groups, 20).actions:
        out.setdefault(a.group, set()).add(a.dim)
    return out


def test_megatron_offers_an_untied_embedding_only_on_its_vocab_dim():
    untied = _model_axis_actions(tied=False)
    assert untied["embed"] == {0}  # rows: vocab-parallel; never d_model (an all-gather)
    assert untied["unembed"] == {0, 1}
    assert _model_axis_actions(tied=True)["embed"] == {0, 1}  # a matmul weight as well


@pytest.mark.slow
def test_the_search_tiles_an_untied_embedding_on_its_vocab_when_it_pays():
    # gpt untied 2 layers, d_model 256, vocab 8192, batch + megatron on 2x4: the embedding on
    # its vocab (XLA, this jaxlib: 10.57 MB of collectives, 79.1 MB allocated) against the same
    # plan with the embedding and its moments replicated, which is the plan searched before
    # megatron offered the embedding (16.34 MB, 109.5 MB)
    args = gpt.example_args(
        layers=2, d_model=256, heads=4, seq=64, batch=16, vocab=8192, tied=False
    )
    goal = partir.Goal(
        gpt.train_step,
        args,
        {"data": 2, "model": 4},
        device="tpu-v4",
        schedule=[st.batch("data"), st.megatron("model")],
        search=partir.Search(seed=0),
    )
    plan = partir.solve(goal)
    assert plan.specs["params/embed"] == P("model", None)
    replicated = partir.plan(
        goal, {k: P() if k.endswith("/embed") else v for k, v in plan.specs.items()}
    )
    assert plan.cost.step_time_s < replicated.cost.step_time_s
    searched, before = partir.verify(goal, plan), partir.verify(goal, replicated)
    assert searched.ok and before.ok, f"{searched}\n{before}"
    xla_bytes = lambda r: sum(r.stats.bytes_by_kind().values())  # noqa: E731
    assert xla_bytes(searched) < 0.7 * xla_bytes(before)
    assert searched.stats.allocated_bytes < 0.8 * before.stats.allocated_bytes
