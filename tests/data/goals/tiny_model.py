"""A tiny language-model-like train step for goal-file tests (tests/test_dsl.py)."""

import jax
import jax.numpy as jnp


def example_args(abstract=True, layers=2, d_model=32, vocab=64, batch=8, seq=16):
    """(params, opt_state, batch) as ShapeDtypeStructs (or zeros with abstract=False)."""
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")

    def leaf(*shape, dtype=jnp.float32):
        if abstract:
            return jax.ShapeDtypeStruct(shape, dtype)
        return jnp.zeros(shape, dtype)

    params = {
        "embed": leaf(vocab, d_model),
        "layers": [
            {
                "mlp": {"w_in": leaf(d_model, 4 * d_model), "w_out": leaf(4 * d_model, d_model)},
                "norm": {"scale": leaf(d_model)},
            }
            for _ in range(layers)
        ],
    }
    opt_state = {"step": leaf(dtype=jnp.int32), "mu": jax.tree_util.tree_map(lambda x: x, params)}
    data = {"tokens": leaf(batch, seq, dtype=jnp.int32)}
    return params, opt_state, data


def loss_fn(params, data):
    x = params["embed"][data["tokens"]]
    for layer in params["layers"]:
        h = x * layer["norm"]["scale"]
        x = x + jax.nn.relu(h @ layer["mlp"]["w_in"]) @ layer["mlp"]["w_out"]
    return jnp.mean(x**2)


def train_step(params, opt_state, data):
    loss, grads = jax.value_and_grad(loss_fn)(params, data)
    mu = jax.tree_util.tree_map(lambda m, g: 0.9 * m + g, opt_state["mu"], grads)
    params = jax.tree_util.tree_map(lambda p, m: p - 1e-3 * m, params, mu)
    return params, {"step": opt_state["step"] + 1, "mu": mu}, {"loss": loss}


not_a_function = 42


def returns_dict():
    return {"params": 1}
