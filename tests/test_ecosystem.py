"""What real train steps from the JAX ecosystem hold, in small synthetic steps: state leaves
that are not float arrays, Keras/Flax containers, primitives beyond the zoo's, the user's
own sharding constraints, layer stacks scanned along a dim that is not the first, and
primitives partir does not know. Each traces, propagates, costs, plans and runs under
`plan.jit` on the 8 fake CPU devices, matching the unsharded step."""

import collections
import dataclasses
import functools
import inspect
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.interpreters import mlir
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import partir
from partir import strategies as st
from partir.ir.constraints import ConstraintWarning
from partir.ir.groups import find_groups
from partir.ir.propagate import attach_rules
from partir.ir.rules import UnknownPrimitiveWarning
from partir.ir.specs import resolve
from partir.testing import check_plan, max_relative_error

TOLERANCE = 1e-5


def assert_same(got, expected) -> None:
    """Same pytree; key arrays and integers equal exactly, floats within TOLERANCE."""
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    floats_got, floats_want = [], []
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        assert g.dtype == e.dtype and g.shape == e.shape
        if jax.dtypes.issubdtype(e.dtype, jax.dtypes.prng_key):
            np.testing.assert_array_equal(jax.random.key_data(g), jax.random.key_data(e))
        elif jnp.issubdtype(e.dtype, jnp.floating):
            floats_got.append(g)
            floats_want.append(e)
        else:
            np.testing.assert_array_equal(g, e)
    assert max_relative_error(floats_got, floats_want) <= TOLERANCE


def run_and_compare(goal: partir.Goal, plan: partir.Plan, args) -> None:
    check_plan(goal, plan)
    assert_same(plan.jit()(*args), jax.jit(goal.fn)(*args))


def rules_by_primitive(goal: partir.Goal) -> dict[str, list[str]]:
    attach_rules(goal.program)
    out: dict[str, list[str]] = {}
    for op in goal.program.ops:
        out.setdefault(op.primitive, []).append(str(op.rule))
    return out


# ------------------------------------------------------------- 1. leaves that are no floats


def dropout_step(state, batch):
    """Flax-style state: params, a typed PRNG key, counters, Python numbers, None, ()."""
    rng, sub = jax.random.split(state["rng"])

    def loss(params):
        h = batch["x"] @ params["w"]
        keep = jax.random.bernoulli(sub, 0.9, h.shape)
        h = jnp.where(keep, h / 0.9, 0.0)
        # per-example keys: a key array with a batch dim
        noise = jax.vmap(lambda k: jax.random.normal(k, h.shape[1:]))(batch["keys"])
        return jnp.mean((h + 0.01 * noise - batch["y"]) ** 2)

    value, grads = jax.value_and_grad(loss)(state["params"])
    updates, opt = state["tx"].update(grads, state["opt"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    params = jax.tree.map(lambda p, g: p - state["lr"] * g, params, grads)
    new = dict(
        state,
        params=params,
        rng=rng,
        opt=opt,
        step=state["step"] + 1,
        count=state["count"] + jnp.uint32(1),
        epoch=state["epoch"] + 0,
    )
    return new, {"loss": value}


def dropout_args(batch_size: int = 32):
    params = {"w": jnp.linspace(-1, 1, 16 * 8, dtype=jnp.float32).reshape(16, 8)}
    tx = optax.set_to_zero()
    state = {
        "params": params,
        "rng": jax.random.key(0),
        "step": jnp.int32(0),
        "count": jnp.uint32(7),
        "lr": 0.1,
        "epoch": 3,
        "ema": None,
        "opt": tx.init(params),
        "empty": (),
        "tx": _Static(tx),
    }
    x = jnp.linspace(0, 1, batch_size * 16, dtype=jnp.float32).reshape(batch_size, 16)
    batch = {
        "x": x,
        "y": jnp.zeros((batch_size, 8)),
        "keys": jax.random.split(jax.random.key(1), batch_size),
    }
    return state, batch


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Static:
    """A static leaf (an optimizer's functions), as Flax's TrainState keeps `tx`."""

    tx: optax.GradientTransformation

    def update(self, *a):
        return self.tx.update(*a)


@pytest.mark.slow
def test_non_float_leaves_trace_cost_plan_and_run():
    args = dropout_args()
    goal = partir.Goal(dropout_step, args, {"batch": 8})
    prog = goal.program
    assert list(prog.inputs) == [
        "state/count",
        "state/epoch",
        "state/lr",
        "state/params/w",
        "state/rng",
        "state/step",
        "batch/keys",
        "batch/x",
        "batch/y",
    ]
    key = prog.values[prog.inputs["state/rng"]]
    assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) and key.nbytes == 8
    assert prog.values[prog.inputs["batch/keys"]].nbytes == 32 * 8  # key<fry>: 2 x uint32
    assert prog.carried["out/0/rng"] == "state/rng"
    assert prog.carried["out/0/count"] == "state/count"

    plan = partir.plan(goal, {"batch/**": P("batch"), "state/**": P()})
    assert plan.specs["batch/keys"] == P("batch")
    assert plan.specs["state/rng"] == P() and plan.out_specs["out/0/rng"] == P()
    report = partir.verify(goal, plan)
    assert report.stats.argument_bytes == plan.cost.argument_bytes  # keys sized as XLA does
    run_and_compare(goal, plan, args)


def test_non_float_leaves_in_a_searched_plan():
    args = dropout_args()
    goal = partir.Goal(
        dropout_step,
        args,
        {"batch": 2, "model": 4},
        schedule=[st.batch("batch"), st.auto("model")],
        search=partir.Search(seed=0, episodes=20),
    )
    plan = partir.solve(goal, baselines=False)
    assert plan.specs["batch/x"][0] == "batch" and plan.specs["state/rng"] == P()
    run_and_compare(goal, plan, args)


def test_random_bits_are_generated_in_the_consumers_sharding():
    goal = partir.Goal(dropout_step, dropout_args(), {"batch": 8})
    rules = rules_by_primitive(goal)
    assert "([])->([i, j]) {i=32, j=8}" in rules["random_bits"]  # both dims free to tile
    assert "([i])->([i, j]) {i=32, j=8}" in rules["random_bits"]  # per-example keys pass
    plan = partir.plan(goal, {"batch/x": P("batch")})
    bits = [op for op in goal.program.ops if op.primitive == "random_bits"]
    assert plan.value_sharding(bits[0].outputs[0]) == (("batch",), ())


# --------------------------------------------------------------------------- 2. containers

Head = collections.namedtuple("Head", ["kernel", "bias"])


@functools.partial(jax.tree_util.register_dataclass, data_fields=["scale"], meta_fields=["eps"])
@dataclasses.dataclass
class Norm:
    scale: jax.Array
    eps: float = 1e-6


def keras_step(params, x):
    """Keras 3 keeps variables in a flat dict keyed by '/'-joined paths."""

    def loss(p):
        h = x @ p["transformer_layer_0/self_attention/query/kernel"]
        h = h * p["norm"].scale / jnp.sqrt(jnp.mean(h * h, -1, keepdims=True) + p["norm"].eps)
        h = h @ p["head"].kernel + p["head"].bias
        for w in p["extra"]:
            h = h @ w
        return jnp.mean(h**2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def keras_args():
    r = np.random.default_rng(0)

    def a(*shape):
        return jnp.asarray(r.normal(size=shape) * 0.1, jnp.float32)

    params = {
        "transformer_layer_0/self_attention/query/kernel": a(16, 32),
        "norm": Norm(a(32)),
        "head": Head(a(32, 8), a(8)),
        "extra": [a(8, 8), a(8, 8)],
    }
    return params, a(16, 16)


def test_container_paths_are_readable_and_globs_match_them():
    goal = partir.Goal(keras_step, keras_args(), {"batch": 2, "model": 4})
    paths = list(goal.program.inputs)
    assert paths == [
        "params/extra/0",
        "params/extra/1",
        "params/head/kernel",
        "params/head/bias",
        "params/norm/scale",
        "params/transformer_layer_0/self_attention/query/kernel",
        "x",
    ]
    assert set(goal.program.carried.values()) == set(paths) - {"x"}
    hits = resolve({"**/query/kernel": 1, "params/*/self_attention/*/kernel": 2}, paths)
    assert hits == {"params/transformer_layer_0/self_attention/query/kernel": 1}
    plan = partir.plan(
        goal,
        {"x": P("batch"), "**/query/kernel": P(None, "model"), "params/head/kernel": P("model")},
    )
    assert plan.out_specs["out/transformer_layer_0/self_attention/query/kernel"] == P(None, "model")
    run_and_compare(goal, plan, keras_args())


def test_paths_that_would_read_alike_are_told_apart():
    def step(params):
        return jax.tree.map(lambda p: p * 2, params)

    params = {"a/b": jnp.ones((8, 4)), "a": {"b": jnp.zeros((8, 4)), "c": jnp.ones(8)}}
    goal = partir.Goal(step, (params,), {"batch": 8})
    assert list(goal.program.inputs) == ["params/a/b", "params/a/c", "params/'a/b'"]
    assert list(goal.program.outputs) == ["out/a/b", "out/a/c", "out/'a/b'"]
    plan = partir.plan(goal, {"params/'a/b'": P("batch")})
    assert plan.specs["params/'a/b'"] == P("batch", None)
    assert plan.specs["params/a/b"] == P(None, None)
    run_and_compare(goal, plan, (params,))


# --------------------------------------------------------------- 3. primitives beyond the zoo


def many_primitives(x, w, i, key):
    """The primitives of the ecosystem's train steps that the zoo does not use."""
    from jax.ad_checkpoint import checkpoint_name

    h = checkpoint_name(x @ w, "hidden")
    h = jnp.copy(h)
    bits = jax.random.bits(jax.random.fold_in(key, i), h.shape)
    raw = jax.random.key_data(jax.random.wrap_key_data(jax.random.key_data(key)))
    seeded = jax.random.key_data(jax.random.clone(jax.random.split(jax.random.key(i))[1]))
    bits = bits ^ jax.extend.random.threefry_2x32(raw, bits)
    h = h + (jax.lax.shift_right_logical(bits, jnp.uint32(9)) | jnp.uint32(0x3F800000)).view(
        jnp.float32
    )
    halves = jax.lax.bitcast_convert_type(h, jnp.uint16)  # [b, d, 2]: the width changes
    h = h + jax.lax.bitcast_convert_type(halves, jnp.float32) * 1e-3
    stacked = jnp.stack([h, 2 * h], axis=1)  # the stack primitive
    cat = jnp.concatenate([h[:, None], -h[:, None]], axis=1)  # concatenate used as stack
    window = jax.lax.dynamic_slice_in_dim(h, i, 4, axis=1)
    h = jax.lax.dynamic_update_slice_in_dim(h, window * 2, i, axis=1)
    c = jnp.cumsum(h, 1) + jnp.cumprod(jnp.tanh(h), 1) + jax.lax.cummax(h, 1)
    am = jnp.argmax(h, 1) + jnp.argmin(h, 1)
    flip = jnp.flip(h, 1)
    pad = jnp.pad(h, ((0, 0), (1, 1)))
    e = jax.lax.erfc(h) + jax.lax.erf_inv(jnp.clip(h, -0.5, 0.5))
    sel = jax.lax.select_n(h > 0, h, -h)
    clamp = jax.lax.clamp(-1.0, h, 1.0)
    iota = jax.lax.broadcasted_iota(jnp.int32, h.shape, 1)
    srt = jnp.sort(h, axis=1)
    vals, idx = jax.lax.top_k(h, 3)
    vals0, _ = jax.lax.top_k(h, 2, axis=0)
    low = jax.lax.reduce_precision(h, exponent_bits=5, mantissa_bits=10)
    le = (h <= 0.5).astype(jnp.float32)
    out = (
        c.sum()
        + am.sum()
        + flip.sum()
        + pad.sum()
        + e.sum()
        + sel.sum()
        + clamp.sum()
        + iota.sum()
        + srt.sum()
        + vals.sum()
        + idx.sum()
        + vals0.sum()
        + low.sum()
        + le.sum()
        + stacked.sum()
        + cat.sum()
    )
    return out, raw, seeded, stacked


def many_args():
    x = jnp.linspace(-1, 1, 16 * 8, dtype=jnp.float32).reshape(16, 8)
    w = jnp.linspace(-0.5, 0.5, 8 * 8, dtype=jnp.float32).reshape(8, 8)
    return x, w, 2, jax.random.key(3)


def test_every_primitive_has_a_rule_and_runs_sharded():
    goal = partir.Goal(many_primitives, many_args(), {"batch": 8})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownPrimitiveWarning)
        rules = rules_by_primitive(goal)
    for p in (
        "name",
        "copy",
        "random_bits",
        "random_wrap",
        "random_unwrap",
        "random_fold_in",
        "random_seed",
        "bitcast_convert_type",
        "shift_right_logical",
        "stack",
        "concatenate",
        "dynamic_slice",
        "dynamic_update_slice",
        "cumsum",
        "cumprod",
        "cummax",
        "argmin",
        "argmax",
        "rev",
        "pad",
        "erfc",
        "erf_inv",
        "select_n",
        "clamp",
        "iota",
        "sort",
        "top_k",
        "reduce_precision",
        "convert_element_type",
        "le",
        "threefry2x32",
        "random_split",
        "random_clone",
    ):
        assert p in rules, p
    plan = partir.plan(goal, {"x": P("batch")})
    run_and_compare(goal, plan, many_args())


@pytest.mark.parametrize(
    "fn, args, expected",
    [
        (
            lambda x: jnp.stack([x, x], axis=1),
            [(4, 8)],
            "stack ([i, j], [i, j])->([i, k, j]) {i=4, j=8, k=2} permutation={k}",
        ),
        (
            lambda x: jax.lax.top_k(x, 2, axis=0),
            [(4, 8)],
            "top_k ([j, i])->([k, i], [l, i]) {i=8, j=4, k=2, l=2} need-replication={j, k, l}",
        ),
        (
            lambda x: jax.lax.bitcast_convert_type(x, jnp.uint16),
            [(4, 8)],
            "bitcast_convert_type ([i, j])->([i, j, k]) {i=4, j=8, k=2} need-replication={k}",
        ),
        (
            lambda x: jax.lax.bitcast_convert_type(x, jnp.float32),
            [(4, 8, 2, jnp.uint16)],
            "bitcast_convert_type ([i, j, k])->([i, j]) {i=4, j=8, k=2} need-replication={k}",
        ),
        (
            lambda x: jax.lax.dynamic_slice_in_dim(x, 2, 4, axis=1),
            [(4, 8)],
            "dynamic_slice ([i, j], _, _)->([i, k]) {i=4, j=8, k=4} permutation={j, k}",
        ),
        (
            lambda x, u: jax.lax.dynamic_update_slice_in_dim(x, u, 2, axis=1),
            [(4, 8), (4, 2)],
            "dynamic_update_slice ([i, j], [i, k], _, _)->([i, l]) {i=4, j=8, k=2, l=8} "
            "permutation={j, k, l}",
        ),
        (
            lambda x: jax.lax.cummax(x, 0),
            [(4, 8)],
            "cummax ([i, j])->([i, j]) {i=4, j=8} need-replication={i}",
        ),
        (
            lambda x: jnp.argmin(x, 0),
            [(4, 8)],
            "argmin ([j, i])->([i]) {i=8, j=4} need-replication={j}",
        ),
        (
            lambda x: jnp.flip(x, 1),
            [(4, 8)],
            "rev ([i, j])->([i, k]) {i=4, j=8, k=8} permutation={j, k}",
        ),
        (lambda k: jax.random.split(k, 4), [(0, "key")], "random_split ([])->([i]) {i=4}"),
        (
            lambda k: jax.random.key_data(k),
            [(4, "key")],
            "random_unwrap ([i])->([i, j]) {i=4, j=2} need-replication={j}",
        ),
        (lambda x: x <= 0, [(4, 8)], "le ([i, j], _)->([i, j]) {i=4, j=8}"),
    ],
)
def test_golden_rules_of_ecosystem_primitives(fn, args, expected):
    def sds(spec):
        if spec[-1] == "key":
            return jax.eval_shape(
                lambda: jax.random.split(jax.random.key(0), spec[0] or 1)[
                    0 if spec[0] == 0 else slice(None)
                ]
            )
        dtype = spec[-1] if not isinstance(spec[-1], int) else jnp.float32
        return jax.ShapeDtypeStruct(tuple(d for d in spec if isinstance(d, int)), dtype)

    goal = partir.Goal(fn, [sds(a) for a in args], {"batch": 8})
    rules = [f"{p} {r}" for p, rs in rules_by_primitive(goal).items() for r in rs]
    assert expected in rules, rules


# ------------------------------------------------------------- 4. the user's own constraints

USER_MESH = jax.make_mesh((2, 4), ("batch", "model"), axis_types=(AxisType.Auto,) * 2)


USER_SPEC = P("batch", "model")


def constrained_step(params, x, spec=USER_SPEC, mesh=USER_MESH):
    """An MLP whose hidden layer the user pins with with_sharding_constraint."""

    def loss(p):
        h = jnp.tanh(x @ p["w1"])
        h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, spec))
        return jnp.mean((h @ p["w2"]) ** 2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def mlp_args():
    r = np.random.default_rng(1)
    params = {
        "w1": jnp.asarray(r.normal(size=(16, 32)) * 0.1, jnp.float32),
        "w2": jnp.asarray(r.normal(size=(32, 16)) * 0.1, jnp.float32),
    }
    return params, jnp.asarray(r.normal(size=(8, 16)), jnp.float32)


def constrained_value(goal: partir.Goal) -> int:
    """The forward constraint's value (the backward pass constrains the cotangent too)."""
    ops = [op for op in goal.program.ops if op.primitive == "sharding_constraint"]
    assert len(ops) == 2
    return ops[0].outputs[0]


def test_user_constraint_is_honoured_with_top_priority():
    goal = partir.Goal(constrained_step, mlp_args(), {"batch": 2, "model": 4})
    # the inputs alone would shard the hidden layer on batch only; the user's constraint wins
    plan = partir.plan(goal, {"x": P("batch")})
    assert plan.value_sharding(constrained_value(goal)) == (("batch",), ("model",))
    searched = partir.solve(goal, baselines=False)
    assert searched.value_sharding(constrained_value(goal)) == (("batch",), ("model",))
    run_and_compare(goal, plan, mlp_args())
    hlo = plan.jit(constrain=False).lower(*mlp_args()).as_text()
    assert '[{"batch"}, {"model"}]' in hlo
    # with constrain=False only the user's constraint is applied, as partir maps it
    assert_same(plan.jit(constrain=False)(*mlp_args()), jax.jit(constrained_step)(*mlp_args()))


def test_user_constraint_on_axes_the_goal_lacks_warns_once_and_runs():
    other = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    step = functools.partial(constrained_step, spec=P("data", P.UNCONSTRAINED), mesh=other)
    goal = partir.Goal(step, mlp_args(), {"batch": 2, "model": 4})
    with pytest.warns(ConstraintWarning) as caught:
        plan = partir.plan(goal, {"x": P("batch")})
    assert len(caught) == 1
    assert "mesh axis 'data' is not in the goal mesh" in str(caught[0].message)
    assert plan.value_sharding(constrained_value(goal)) == (("batch",), ())
    run_and_compare(goal, plan, mlp_args())


def test_user_constraint_that_does_not_divide_is_dropped_with_a_warning():
    step = functools.partial(constrained_step, spec=P("model", "batch"))
    args = (mlp_args()[0], jnp.ones((2, 16)))
    goal = partir.Goal(step, args, {"batch": 2, "model": 4})
    with pytest.warns(ConstraintWarning, match="dim 0 of size 2 is not divisible by 4") as caught:
        plan = partir.plan(goal, {})
    assert len(caught) == 1
    assert plan.value_sharding(constrained_value(goal)) == ((), ("batch",))
    run_and_compare(goal, plan, args)


def test_user_constraints_can_be_ignored():
    goal = partir.Goal(
        constrained_step, mlp_args(), {"batch": 2, "model": 4}, honour_constraints=False
    )
    plan = partir.plan(goal, {"x": P("batch")})
    assert plan.value_sharding(constrained_value(goal)) == (("batch",), ())
    run_and_compare(goal, plan, mlp_args())
    # the user's constraint is dropped from the replay: nothing shards on model in the HLO
    hlo = plan.jit().lower(*mlp_args()).as_text()
    assert '{"model"}' not in hlo and '{"batch"}' in hlo


def explicit_step(x, w):
    """Explicit-axes code: the user reshards a matmul's result (primitive `reshard`)."""
    h = jax.sharding.reshard(x @ w, P("batch", "model"))
    return jnp.tanh(h).sum(0)


def test_reshard_under_an_explicit_mesh_is_honoured():
    mesh = jax.make_mesh((2, 4), ("batch", "model"), axis_types=(AxisType.Explicit,) * 2)
    args = (jnp.linspace(0, 1, 8 * 16).reshape(8, 16), jnp.linspace(-1, 1, 16 * 32).reshape(16, 32))
    with jax.set_mesh(mesh):  # explicit code traces only under its mesh
        goal = partir.Goal(explicit_step, args, {"batch": 2, "model": 4})
        plan = partir.plan(goal, {"x": P("batch")})
        expected = np.asarray(jax.jit(explicit_step)(*args))
    (op,) = [op for op in goal.program.ops if op.primitive == "reshard"]
    assert plan.value_sharding(op.outputs[0]) == (("batch",), ("model",))
    np.testing.assert_allclose(plan.jit()(*args), expected, rtol=TOLERANCE)


def test_goal_file_can_ignore_constraints(tmp_path):
    text = inspect.cleandoc(
        """
        program "tests.test_ecosystem:constrained_step"
        inputs  "tests.test_ecosystem:mlp_args"
        mesh    batch=2, model=4
        axis batch { batch }
        constraints ignore
        """
    )
    goal = partir.load_goal_text(text)
    assert goal.honour_constraints is False
    assert partir.load_goal_text(text.replace("ignore", "honour")).honour_constraints
    with pytest.raises(partir.GoalError, match="did you mean 'ignore'"):
        partir.load_goal_text(text.replace("ignore", "ingore"))


# ------------------------------------------------- 5. layers scanned along another dim


def scanned_step(params, x):
    """A layer stack kept as (d_model, layers, d_ff), moved to layers-first for the scan;
    the second stack is (d_ff, d_model, layers), scanned as a transposed xs."""

    def loss(p):
        w_in = jnp.moveaxis(p["w_in"], 1, 0)  # (layers, d_model, d_ff)
        w_out = jnp.transpose(p["w_out"], (2, 0, 1))  # (layers, d_ff, d_model)

        def layer(h, ws):
            a, b = ws
            return h + jnp.tanh(h @ a) @ b, None

        h, _ = jax.lax.scan(layer, x, (w_in, w_out))
        return jnp.mean(h**2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def scanned_args():
    r = np.random.default_rng(2)
    params = {
        "w_in": jnp.asarray(r.normal(size=(16, 3, 32)) * 0.1, jnp.float32),
        "w_out": jnp.asarray(r.normal(size=(32, 16, 3)) * 0.1, jnp.float32),
    }
    return params, jnp.asarray(r.normal(size=(8, 16)), jnp.float32)


def test_layer_stack_scanned_along_a_middle_dim():
    goal = partir.Goal(
        scanned_step,
        scanned_args(),
        {"batch": 2, "model": 4},
        schedule=[st.batch("batch"), st.megatron("model")],
        search=partir.Search(seed=0, episodes=30),
    )
    groups = {g.name: g for g in find_groups(goal.program)}
    assert groups["w_in"].shape == (16, 3, 32) and len(groups["w_in"].params) == 1
    plan = partir.plan(
        goal, {"x": P("batch"), "params/w_in": P(None, None, "model"), "params/w_out": P("model")}
    )
    assert plan.cost.collectives  # the Megatron pair all-reduces inside the loop
    run_and_compare(goal, plan, scanned_args())
    searched = partir.solve(goal, baselines=False)
    run_and_compare(goal, searched, scanned_args())


# ------------------------------------------------------- 6. primitives partir does not know

mystery_p = jax.extend.core.Primitive("mystery")
mystery_p.def_impl(lambda x: jnp.sin(x) * 2)
mystery_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
mlir.register_lowering(mystery_p, mlir.lower_fun(lambda x: jnp.sin(x) * 2, False))


def mystery_step(x):
    with jax.named_scope("layers"), jax.named_scope("3"), jax.named_scope("attn"):
        y = mystery_p.bind(x)  # the line the warning names
    return y + mystery_p.bind(y)


MYSTERY_LINE = inspect.getsourcelines(mystery_step)[1] + 2


def test_unknown_primitive_warns_once_with_where_it_is():
    goal = partir.Goal(mystery_step, (jnp.ones((8, 4)),), {"batch": 8})
    with pytest.warns(UnknownPrimitiveWarning) as caught:
        attach_rules(goal.program)
    assert [str(w.message) for w in caught] == [
        f"primitive 'mystery' at layers/3/attn (from {os.path.basename(__file__)}:"
        f"{MYSTERY_LINE} in mystery_step) has no sharding rule; it is kept replicated "
        "(here and in 1 more ops)"
    ]
    plan = partir.plan(goal, {"x": P("batch")})
    assert plan.cost.collectives  # the replicated op gathers its sharded operand
    run_and_compare(goal, plan, (jnp.linspace(0, 1, 32).reshape(8, 4),))
