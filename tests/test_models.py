"""Tests for the model zoo (partir/models): contract, training, gpt layouts, moe routing."""

from __future__ import annotations

import gc
import math

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import pytest

from partir import models
from partir.models import gpt, moe

NAMES = sorted(models.MODELS)
RANDOM_PRIMITIVES = {"random_bits", "random_seed", "random_wrap", "threefry2x32"}


def primitive_names(jaxpr: jex.core.Jaxpr) -> set[str]:
    """Primitive names in `jaxpr` and all of its sub-jaxprs."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in jex.core.jaxprs_in_params(eqn.params):
            names |= primitive_names(sub)
    return names


def float_dtypes(jaxpr: jex.core.Jaxpr) -> set[str]:
    """Floating dtypes of every equation output, recursively."""
    found = set()
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            dtype = getattr(v.aval, "dtype", None)
            if dtype is not None and jnp.issubdtype(dtype, jnp.floating):
                found.add(str(dtype))
        for sub in jex.core.jaxprs_in_params(eqn.params):
            found |= float_dtypes(sub)
    return found


def shapes_and_dtypes(tree):
    return jax.tree.structure(tree), [(x.shape, x.dtype) for x in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def trained():
    """name -> (initial args, losses over 5 jitted steps, final (params, opt_state))."""
    cache = {}

    def run(name):
        if name not in cache:
            mod = models.get(name)
            params, opt_state, batch = mod.example_args(abstract=False)
            step = jax.jit(mod.train_step)
            losses = []
            p, o = params, opt_state
            for _ in range(5):
                p, o, metrics = step(p, o, batch)
                losses.append(float(metrics["loss"]))
            cache[name] = ((params, opt_state, batch), losses, (p, o, metrics))
        return cache[name]

    return run


# ----------------------------------------------------------------------------- registry


def test_registry():
    assert set(NAMES) == {"mlp", "gpt", "gns", "unet", "moe", "llama"}
    assert models.get("gpt") is gpt
    with pytest.raises(ValueError, match="gpt") as err:
        models.get("resnet")
    for name in NAMES:
        assert name in str(err.value)


@pytest.mark.parametrize("name", NAMES)
def test_interface(name):
    mod = models.get(name)
    for attr in ("PRESETS", "init", "optimizer", "example_args", "train_step", "param_count"):
        assert hasattr(mod, attr), attr
    assert {"tiny", "small"} <= set(mod.PRESETS)


def test_gpt_presets():
    assert {"tiny", "small", "1b", "8b"} <= set(gpt.PRESETS)
    assert set(gpt.PRESETS["1b"]) == {"layers", "d_model", "heads", "seq", "batch", "vocab"}


# ----------------------------------------------------------------------------- example args


@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.parametrize("name", NAMES)
def test_abstract_args_allocate_nothing(name, preset):
    gc.collect()
    before = {id(a) for a in jax.live_arrays()}
    args = models.get(name).example_args(abstract=True, preset=preset)
    gc.collect()
    leaves = jax.tree.leaves(args)
    assert leaves and all(type(x) is jax.ShapeDtypeStruct for x in leaves)
    assert {str(x.dtype) for x in leaves} <= {"float32", "int32"}
    assert [a for a in jax.live_arrays() if id(a) not in before] == []


@pytest.mark.parametrize("name", NAMES)
def test_real_args_match_abstract_and_are_deterministic(name):
    mod = models.get(name)
    real = mod.example_args(abstract=False)
    assert shapes_and_dtypes(real) == shapes_and_dtypes(mod.example_args(abstract=True))
    again = mod.example_args(abstract=False)
    for a, b in zip(jax.tree.leaves(real), jax.tree.leaves(again)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", NAMES)
def test_size_overrides_and_errors(name):
    mod = models.get(name)
    key = "batch" if "batch" in mod.PRESETS["tiny"] else "nodes"
    _, _, batch = mod.example_args(preset="tiny", **{key: 16})
    assert max(x.shape[0] for x in jax.tree.leaves(batch)) >= 16
    with pytest.raises(TypeError, match="unknown size"):
        mod.example_args(preset="tiny", no_such_size=3)
    with pytest.raises(ValueError, match="unknown preset"):
        mod.example_args(preset="huge")
    with pytest.raises(TypeError):
        mod.example_args(preset=None)
    full = mod.example_args(preset=None, **mod.PRESETS["tiny"])
    assert shapes_and_dtypes(full) == shapes_and_dtypes(mod.example_args())


def test_init_with_jax_key():
    """init is traceable with a JAX key: jitted, deterministic, same shapes as abstract."""
    mlp = models.get("mlp")
    cfg = mlp.PRESETS["tiny"]
    init = jax.jit(lambda key: mlp.init(key, **cfg))
    a, b = init(jax.random.key(1)), init(jax.random.key(1))
    assert shapes_and_dtypes(a) == shapes_and_dtypes(mlp.example_args()[0])
    np.testing.assert_array_equal(a["layers"][0]["w"], b["layers"][0]["w"])
    assert float(jnp.std(a["layers"][0]["w"])) == pytest.approx(cfg["d_in"] ** -0.5, rel=0.2)
    np.testing.assert_array_equal(a["layers"][-1]["b"], 0.0)


def test_batches_are_meaningful():
    _, _, b = gpt.example_args(abstract=False)
    vocab = gpt.PRESETS["tiny"]["vocab"]
    for k in ("tokens", "targets"):
        assert b[k].dtype == jnp.int32 and int(b[k].min()) >= 0 and int(b[k].max()) < vocab
    np.testing.assert_array_equal(b["tokens"][:, 1:], b["targets"][:, :-1])

    _, _, b = models.get("gns").example_args(abstract=False)
    n = b["nodes"].shape[0]
    for k in ("senders", "receivers"):
        assert b[k].dtype == jnp.int32 and int(b[k].min()) >= 0 and int(b[k].max()) < n

    _, _, b = models.get("unet").example_args(abstract=False)
    assert int(b["t"].min()) >= 0 and int(b["t"].max()) < 1000
    assert float(jnp.abs(b["images"]).max()) <= 1.0


# ----------------------------------------------------------------------------- train step


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in ("unet", "moe") else n for n in NAMES]
)
def test_train_step_runs_and_learns(name, trained):
    (params, opt_state, _), losses, (new_params, new_opt_state, metrics) = trained(name)
    assert set(metrics) == {"loss"} and metrics["loss"].shape == ()
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses
    assert shapes_and_dtypes(new_params) == shapes_and_dtypes(params)
    assert shapes_and_dtypes(new_opt_state) == shapes_and_dtypes(opt_state)


@pytest.mark.parametrize("name", NAMES)
def test_train_step_traces_abstractly(name):
    """small preset: eval_shape keeps structures; jaxpr is float32, no randomness inside."""
    mod = models.get(name)
    params, opt_state, batch = mod.example_args(preset="small")
    out_params, out_opt, metrics = jax.eval_shape(mod.train_step, params, opt_state, batch)
    assert shapes_and_dtypes(out_params) == shapes_and_dtypes(params)
    assert shapes_and_dtypes(out_opt) == shapes_and_dtypes(opt_state)
    assert metrics["loss"].shape == () and metrics["loss"].dtype == jnp.float32

    jaxpr = jax.make_jaxpr(mod.train_step)(*mod.example_args()).jaxpr
    assert not primitive_names(jaxpr) & RANDOM_PRIMITIVES
    # llama computes in bf16 over f32 master weights by design.
    assert float_dtypes(jaxpr) == ({"float32", "bfloat16"} if name == "llama" else {"float32"})


# ----------------------------------------------------------------------------- gpt


def test_gpt_param_paths():
    cfg = gpt.PRESETS["tiny"]
    params, _, _ = gpt.example_args()
    paths = {
        jax.tree_util.keystr(path, simple=True, separator="/"): leaf.shape
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    d, h, layers = cfg["d_model"], cfg["heads"], cfg["layers"]
    hd = d // h
    assert paths["layers/0/attn/q"] == (d, h, hd)
    assert paths[f"layers/{layers - 1}/attn/o"] == (h, hd, d)
    assert paths["layers/0/mlp/w_in"] == (d, 4 * d)
    assert paths["layers/1/ln2/scale"] == (d,)
    assert paths["embed"] == (cfg["vocab"], d)
    assert paths["pos_embed"] == (cfg["seq"], d)
    assert paths["unembed"] == (d, cfg["vocab"])
    assert paths["ln_f/bias"] == (d,)

    tied, _, _ = gpt.example_args(tied=True, d_ff=48)
    assert "unembed" not in tied and tied["layers"][0]["mlp"]["w_out"].shape == (48, d)

    scanned, _, _ = gpt.example_args(scan=True)
    assert isinstance(scanned["layers"], dict)
    assert scanned["layers"]["attn"]["q"].shape == (layers, d, h, hd)


def test_gpt_scan_matches_unrolled(trained):
    """Five scanned steps from the stacked weights track the five unrolled steps."""
    (params, opt_state, batch), losses, (final, _, _) = trained("gpt")
    stacked = {**params, "layers": gpt.stack_layers(params["layers"])}
    assert shapes_and_dtypes(stacked) == shapes_and_dtypes(gpt.example_args(scan=True)[0])
    p, o = stacked, gpt.optimizer().init(stacked)
    step = jax.jit(gpt.train_step)
    scan_losses = []
    for _ in range(5):
        p, o, metrics = step(p, o, batch)
        scan_losses.append(float(metrics["loss"]))
    np.testing.assert_allclose(scan_losses, losses, rtol=1e-5)
    np.testing.assert_allclose(
        p["layers"]["attn"]["q"][1], final["layers"][1]["attn"]["q"], rtol=1e-3, atol=1e-5
    )
    np.testing.assert_allclose(p["embed"], final["embed"], rtol=1e-3, atol=1e-5)

    # init with scan=True stacks the very weights scan=False gives.
    scan_params = gpt.init(np.random.default_rng(3), **gpt.PRESETS["tiny"], scan=True)
    flat_params = gpt.init(np.random.default_rng(3), **gpt.PRESETS["tiny"])
    np.testing.assert_array_equal(
        scan_params["layers"]["mlp"]["w_in"][0], flat_params["layers"][0]["mlp"]["w_in"]
    )


def test_gpt_tied_loss_finite():
    params, _, batch = gpt.example_args(abstract=False, tied=True)
    loss = jax.jit(gpt.loss_fn)(params, batch)
    # Near-uniform predictions at init: loss close to log(vocab).
    assert abs(float(loss) - math.log(gpt.PRESETS["tiny"]["vocab"])) < 0.5


@pytest.mark.parametrize(("preset", "low", "high"), [("1b", 1.0e9, 1.4e9), ("8b", 7e9, 9e9)])
def test_gpt_large_param_counts(preset, low, high):
    n = gpt.param_count(preset)
    assert low <= n <= high
    assert gpt.param_count(**gpt.PRESETS[preset]) == n
    params, opt_state, batch = gpt.example_args(preset=preset, scan=True)
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(params)) == n
    assert batch["tokens"].shape == (gpt.PRESETS[preset]["batch"], gpt.PRESETS[preset]["seq"])


# ----------------------------------------------------------------------------- moe


def test_moe_route_respects_capacity_and_drops():
    groups, size, experts, k, slots = 2, 16, 4, 2, 3
    logits = jax.random.normal(jax.random.key(0), (groups, size, experts))
    logits = logits.at[:, :, 0].add(5.0)  # everyone wants expert 0: drops are certain
    routing = moe.Routing(top_k=k, capacity_factor=1.0)
    dispatch, combine, aux = jax.jit(moe.route, static_argnums=(1, 2))(logits, routing, slots)
    assert dispatch.shape == combine.shape == (groups, size, experts, slots)
    d = np.asarray(dispatch)
    assert set(np.unique(d)) <= {0.0, 1.0}
    assert (d.sum(axis=1) <= 1).all()  # a slot holds at most one token
    assert (d.sum(axis=(2, 3)) <= k).all()  # a token goes to at most k experts
    assert (d.sum(axis=3) <= 1).all()  # at most one slot per (token, expert)
    assert d.sum() < groups * size * k  # some assignments were dropped
    assert (d[:, :, 0].sum(axis=(1, 2)) == slots).all()  # expert 0 is full
    assert (np.asarray(combine) <= d + 1e-6).all() and (np.asarray(combine) >= 0).all()
    assert float(aux) > 1.0  # imbalanced routing costs more than the balanced optimum of 1


def test_moe_tiny_routing_drops_tokens():
    params, _, batch = moe.example_args(abstract=False)
    cfg = moe.PRESETS["tiny"]
    x = gpt.embed_tokens(params, batch["tokens"])
    p = params["layers"][0]["moe"]
    slots = moe.capacity(cfg["seq"], cfg["experts"], cfg["top_k"], cfg["capacity_factor"])
    assert slots == math.ceil(cfg["top_k"] * cfg["seq"] * cfg["capacity_factor"] / cfg["experts"])
    logits = jnp.einsum("bsd,de->bse", x, p["router"])
    dispatch, _, _ = jax.jit(moe.route, static_argnums=(1, 2))(logits, batch["routing"], slots)
    per_expert = np.asarray(dispatch.sum(axis=(1, 3)))
    assert (per_expert <= slots).all()
    assert 0 < dispatch.sum() <= cfg["batch"] * cfg["seq"] * cfg["top_k"]
    assert jax.tree.leaves(batch["routing"]) == []  # static, not traced


def test_moe_param_paths():
    params, _, _ = moe.example_args()
    cfg = moe.PRESETS["tiny"]
    e, d = cfg["experts"], cfg["d_model"]
    m = params["layers"][0]["moe"]
    assert m["router"].shape == (d, e)
    assert m["w_in"].shape == (e, d, 4 * d) and m["w_out"].shape == (e, 4 * d, d)
    assert params["layers"][1]["attn"]["q"].shape == (d, cfg["heads"], d // cfg["heads"])
