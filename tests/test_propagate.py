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


def test_relayouts_follow_a_weight_stack_into_the_loop_that_scans_it():
    from partir.ir.groups import relayouts

    def step(w, x):  # w: (layers, in, out), scanned; each slice cast and transposed
        def body(h, wl):
            return jnp.tanh(h @ wl.astype(jnp.bfloat16).T.astype(jnp.float32)) @ wl, None

        return jax.lax.scan(body, x, w)[0]

    prog = trace(step, (jax.ShapeDtypeStruct((3, 16, 8), jnp.float32), jnp.ones((4, 8))))
    w = prog.inputs["w"]
    shapes = {prog.values[v].shape: dims for v, dims in relayouts(prog, w)}
    assert shapes[(16, 8)] == (None, 0, 1)  # the layer's slice: the scanned dim is gone
    assert shapes[(8, 16)] == (None, 1, 0)  # its transpose
    assert all(prog.values[v].shape != (4, 8) for v, _ in relayouts(prog, w))  # no activation


def test_the_users_constraints_propagate_with_the_state_and_still_hold():
    """MaxText's pattern: activations constrained with their features on `model`, a scanned
    weight stack (stored transposed, cast in the loop) with its outputs on `model`. XLA keeps
    the weight's sharding into the loop; so does partir, and its estimate is XLA's bytes."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import partir
    from partir.ir.groups import relayouts
    from partir.ir.xla import as_cpu_kinds, compile_stats

    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    act = NamedSharding(mesh, P("data", "model"))

    def step(params, x):
        def loss(w):
            def body(h, wl):
                h = jax.lax.with_sharding_constraint(h, act)
                return jnp.tanh(h @ wl.astype(jnp.bfloat16).astype(jnp.float32)), None

            return jnp.sum(jax.lax.scan(body, x, jnp.transpose(w, (0, 2, 1)))[0])

        return {"w": params["w"] - 0.1 * jax.grad(loss)(params["w"])}  # carried state

    w = jax.ShapeDtypeStruct((3, 64, 64), jnp.float32)
    args = ({"w": w}, jax.ShapeDtypeStruct((16, 64), jnp.float32))
    goal = partir.Goal(step, args, mesh)
    specs = {"params/w": P(None, "model", None), "x": P("data")}
    plan = partir.plan(goal, specs)
    prog, prop = goal.program, goal.propagator
    layer = [
        v for v, _ in relayouts(prog, prog.inputs["params/w"]) if len(prog.values[v].shape) == 2
    ]
    # the layer's weight keeps the stack's sharding (outputs on `model`), not the one the
    # constrained activation implies through the matmul (inputs on `model`)
    assert layer and {prop.sharding(plan.state, v) for v in layer} == {((), ("model",))}
    for op in prog.ops:  # and every constraint holds
        if op.primitive == "sharding_constraint":
            assert prop.sharding(plan.state, op.outputs[0]) == (("data",), ("model",))
    ins = ({"w": NamedSharding(mesh, specs["params/w"])}, NamedSharding(mesh, specs["x"]))
    alone = compile_stats(step, args, ins, ins[0])  # XLA on its own, given the same shardings
    assert as_cpu_kinds(plan.cost.bytes_by_kind()) == as_cpu_kinds(alone.bytes_by_kind())
    assert partir.verify(goal, plan).ok


def test_where_two_factors_claim_one_axis_the_larger_operand_keeps_it():
    # the weight gradient of a layer whose input and output are both tiled on "b": the
    # product takes the larger operand's tiling, so only the smaller one is gathered
    def grad_like(x, h):
        return jnp.einsum("ni,nj->ij", x, h)

    for large in (1, 0):
        shapes = [S((8, 16), f32), S((8, 16), f32)]
        shapes[large] = S((8, 64), f32)
        prog = trace(grad_like, shapes)
        prop = Propagator(prog, MESH)
        x, h = prog.inputs["x"], prog.inputs["h"]
        state, rejected = prop.apply_all(
            prop.empty(), [Decision(0, x, 1, "b"), Decision(0, h, 1, "b")]
        )
        assert not rejected
        tiled = ((), ("b",)) if large == 1 else (("b",), ())
        assert prop.sharding(state, prog.outputs["out"]) == tiled
