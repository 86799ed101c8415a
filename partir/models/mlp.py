"""Deep MLP regression: dense layers with ReLU, MSE loss, Adam."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from partir.models._common import (
    Key,
    Params,
    PyTree,
    apply_updates,
    build_example_args,
    count_params,
    materialize,
    mlp_apply,
    mlp_spec,
    resolve_size,
    sds,
)

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"layers": 3, "width": 64, "batch": 8, "d_in": 32, "d_out": 16},
    "small": {"layers": 8, "width": 1024, "batch": 64, "d_in": 512, "d_out": 512},
    "1b": {"layers": 16, "width": 8192, "batch": 256, "d_in": 8192, "d_out": 8192},
}


def _sizes(layers: int, width: int, d_in: int, d_out: int) -> list[int]:
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    return [d_in] + [width] * (layers - 1) + [d_out]


def init(
    key: Key, *, layers: int, width: int, d_in: int, d_out: int, batch: int | None = None
) -> Params:
    """`{"layers": [{"w": [d_in, d_out], "b": [d_out]}, ...]}` with `layers` dense layers."""
    del batch
    return materialize(key, mlp_spec(_sizes(layers, width, d_in, d_out)))


def optimizer(**size: Any) -> optax.GradientTransformation:
    del size
    return optax.adam(1e-3)


def batch_shapes(*, batch: int, d_in: int, d_out: int, **_: Any) -> dict:
    return {"x": sds((batch, d_in)), "y": sds((batch, d_out))}


def make_batch(rng: np.random.Generator, *, batch: int, d_in: int, d_out: int, **_: Any) -> dict:
    """Inputs ~ N(0, 1); targets a fixed smooth function of them, so the loss can fall."""
    x = rng.standard_normal((batch, d_in), np.float32)
    w = rng.standard_normal((d_in, d_out), np.float32) / np.sqrt(d_in)
    return {"x": x, "y": np.tanh(x @ w).astype(np.float32)}


def example_args(
    abstract: bool = True, preset: str | None = "tiny", **size: Any
) -> tuple[Params, PyTree, dict]:
    cfg = resolve_size(PRESETS, preset, size)
    return build_example_args(init, optimizer, batch_shapes, make_batch, cfg, abstract)


def param_count(preset: str | None = None, **size: Any) -> int:
    return count_params(init, PRESETS, preset, size)


def loss_fn(params: Params, batch: dict) -> jax.Array:
    pred = mlp_apply(params, batch["x"], jax.nn.relu)
    return jnp.mean(jnp.square(pred - batch["y"]))


def train_step(params: Params, opt_state: PyTree, batch: dict) -> tuple[Params, PyTree, dict]:
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    params, opt_state = apply_updates(optimizer(), grads, opt_state, params)
    return params, opt_state, {"loss": loss}
