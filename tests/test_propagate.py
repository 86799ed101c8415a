"""Propagation: invariants, order independence, incremental states that hash."""

import math

import jax
import jax.numpy as jnp
import optax
from hypothesis import given, settings
from hypothesis import strategies as st

from partir.ir.program import trace
from partir.ir.propagate import Decision, Propagator, _entry_hash

S = jax.ShapeDtypeStruct
f32 = jnp.float32
MESH = {"a": 2, "b": 4}
TX = optax.adam(1e-3)


def _train_step(params, opt_state, batch):
    def loss(p):
        h = batch["x"]
        for layer in p["layers"]:
            h = jnp.tanh(h @ layer["w"] + layer["b"])
        return jnp.mean((h - batch["y"]) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = TX.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, {"loss": value}


def _args():
    params = {"layers": [{"w": S((16, 16), f32), "b": S((16,), f32)} for _ in range(2)]}
    return params, jax.eval_shape(TX.init, params), {"x": S((8, 16), f32), "y": S((8, 16), f32)}


PROG = trace(_train_step, _args())
PROP = Propagator(PROG, MESH)
INPUTS = sorted(PROG.inputs.values())


def _check_invariants(state):
    for vid, sharding in state.shardings.items():
        shape = PROG.values[vid].shape
        axes = [a for dim in sharding for a in dim]
        assert len(axes) == len(set(axes)), (vid, sharding)
        for size, dim in zip(shape, sharding):
            assert size % math.prod(MESH[a] for a in dim) == 0
    key = 0
    for vid, sharding in state.shardings.items():
        key ^= _entry_hash(vid, sharding)
    assert hash(state) == key


decisions = st.lists(
    st.builds(
        lambda v, d, a: Decision(0, v, d, a),
        st.sampled_from(INPUTS),
        st.integers(0, 1),
        st.sampled_from(sorted(MESH)),
    ),
    max_size=6,
)


@settings(max_examples=40, deadline=None)
@given(decisions, st.randoms(use_true_random=False))
def test_order_within_a_priority_does_not_matter(ds, rng):
    ds = [d for d in ds if d.dim < PROG.values[d.value].rank]
    first, _ = PROP.apply_all(PROP.empty(), ds)
    shuffled = list(ds)
    rng.shuffle(shuffled)
    second, _ = PROP.apply_all(PROP.empty(), shuffled)
    assert first == second and hash(first) == hash(second)
    _check_invariants(first)


@settings(max_examples=30, deadline=None)
@given(decisions)
def test_incremental_states_keep_invariants_and_never_mutate_parents(ds):
    state = PROP.empty()
    for d in ds:
        before = dict(state.shardings)
        nxt = PROP.apply(state, d)
        assert state.shardings == before
        if nxt is not None:
            _check_invariants(nxt)
            state = nxt


def test_batch_tiling_reaches_activations_and_targets_but_not_weights():
    x = PROG.inputs["batch/x"]
    state = PROP.apply(PROP.empty(), Decision(0, x, 0, "a"))
    assert PROP.sharding(state, PROG.inputs["batch/y"]) == (("a",), ())
    assert PROP.sharding(state, PROG.inputs["params/layers/0/w"]) == ((), ())


def test_megatron_pattern_propagates_row_sharding_to_the_next_weight():
    w0 = PROG.inputs["params/layers/0/w"]
    state = PROP.apply(PROP.empty(), Decision(0, w0, 1, "b"))
    assert PROP.sharding(state, PROG.inputs["params/layers/1/w"]) == (("b",), ())
    assert PROP.sharding(state, PROG.inputs["opt_state/0/mu/layers/0/w"]) == ((), ("b",))


def test_earlier_decision_wins_and_conflicts_are_rejected():
    w0 = PROG.inputs["params/layers/0/w"]
    state = PROP.apply(PROP.empty(), Decision(0, w0, 1, "b"))
    assert PROP.apply(state, Decision(1, w0, 0, "b")) is None  # axis already on the value
    state2, rejected = PROP.apply_all(
        PROP.empty(), [Decision(0, w0, 1, "b"), Decision(1, w0, 0, "b")]
    )
    assert rejected == [Decision(1, w0, 0, "b")] and state2 == state


def test_divisibility_is_respected():
    b0 = PROG.inputs["params/layers/0/b"]
    prop = Propagator(PROG, {"c": 3})
    assert prop.apply(prop.empty(), Decision(0, b0, 0, "c")) is None


def test_scan_carries_share_one_sharding():
    def f(w, x):
        def body(h, wi):
            return jnp.tanh(h @ wi), None

        return jax.lax.scan(body, x, w)[0]

    prog = trace(f, (S((3, 16, 16), f32), S((8, 16), f32)))
    prop = Propagator(prog, MESH)
    state = prop.apply(
        prop.empty(),
        Decision(0, prog.inputs["x/"] if "x/" in prog.inputs else prog.inputs["x"], 0, "a"),
    )
    assert prop.sharding(state, prog.outputs["out"]) == (("a",), ())
    state = prop.apply(prop.empty(), Decision(0, prog.inputs["w"], 2, "b"))
    # the stacked weight's layer dim stays whole; its columns tile the carry
    assert prop.sharding(state, prog.inputs["w"]) == ((), (), ("b",))
