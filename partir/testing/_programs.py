"""A tiny model that goal files can name by module path, for `partir.testing.goal_texts`.

    program "partir.testing._programs:train_step"
    inputs  "partir.testing._programs:example_args"(batch=8, width=16, layers=2)

`train_step(params, opt_state, batch)` is an embedding, `layers` residual MLP blocks with
a scale, and a mean-squared-error loss, trained with `optax.adam`; `forward(params, batch)`
is the same network without the update. Every dim is a small multiple of 2.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

OPTIMIZER = optax.adam(1e-3)


def _params(width: int, layers: int, vocab: int) -> dict:
    def f32(*shape: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, jnp.float32)

    return {
        "embed": f32(vocab, width),
        "layers": [
            {
                "norm": {"scale": f32(width)},
                "mlp": {"w_in": f32(width, 2 * width), "w_out": f32(2 * width, width)},
            }
            for _ in range(layers)
        ],
    }


def _batch(batch: int, seq: int, width: int) -> dict:
    return {
        "tokens": jax.ShapeDtypeStruct((batch, seq), jnp.int32),
        "y": jax.ShapeDtypeStruct((batch, seq, width), jnp.float32),
    }


def _check(**sizes: int) -> None:
    for name, n in sizes.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{name} must be a positive integer, not {n!r}")


def example_args(batch: int = 8, width: int = 16, layers: int = 2, vocab: int = 32, seq: int = 4):
    """(params, opt_state, batch) of `train_step`, as ShapeDtypeStructs."""
    _check(batch=batch, width=width, layers=layers, vocab=vocab, seq=seq)
    params = _params(width, layers, vocab)
    return params, jax.eval_shape(OPTIMIZER.init, params), _batch(batch, seq, width)


def forward_args(batch: int = 8, width: int = 16, layers: int = 2, vocab: int = 32, seq: int = 4):
    """(params, batch) of `forward`, as ShapeDtypeStructs."""
    _check(batch=batch, width=width, layers=layers, vocab=vocab, seq=seq)
    return _params(width, layers, vocab), _batch(batch, seq, width)


def _apply(params: dict, tokens: jax.Array) -> jax.Array:
    h = params["embed"][tokens]
    for layer in params["layers"]:
        x = h * layer["norm"]["scale"]
        h = h + jnp.tanh(x @ layer["mlp"]["w_in"]) @ layer["mlp"]["w_out"]
    return h


def loss_fn(params: dict, batch: dict) -> jax.Array:
    return jnp.mean(jnp.square(_apply(params, batch["tokens"]) - batch["y"]))


def forward(params: dict, batch: dict) -> dict:
    h = _apply(params, batch["tokens"])
    return {"h": h, "loss": jnp.mean(jnp.square(h - batch["y"]))}


def train_step(params: dict, opt_state, batch: dict):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, {"loss": loss}
