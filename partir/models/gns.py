"""Graph network simulator (encode-process-decode, Sanchez-Gonzalez et al. 2020).

Node and edge MLP encoders, `steps` residual message-passing steps (edge MLP on
[edge, node[senders], node[receivers]]; node MLP on [node, segment_sum of messages by receiver]),
an MLP decoder, MSE on node targets, Adam.
"""

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
    layer_norm,
    layer_norm_spec,
    materialize,
    mlp_apply,
    mlp_spec,
    resolve_size,
    sds,
)

_FEATURES = {"node_features": 8, "edge_features": 8, "out": 8}
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"nodes": 64, "edges": 256, "latent": 32, "steps": 2, "mlp_layers": 2, **_FEATURES},
    "small": {
        "nodes": 1024,
        "edges": 8192,
        "latent": 128,
        "steps": 10,
        "mlp_layers": 2,
        **_FEATURES,
    },
    "base": {
        "nodes": 16384,
        "edges": 262144,
        "latent": 128,
        "steps": 10,
        "mlp_layers": 2,
        **_FEATURES,
    },
}


def _mlp(d_in: int, latent: int, mlp_layers: int, d_out: int, norm: bool = True) -> Params:
    """`mlp_layers` hidden layers of width `latent`, a projection to `d_out`, then LayerNorm."""
    spec = mlp_spec([d_in] + [latent] * mlp_layers + [d_out])
    if norm:
        spec["ln"] = layer_norm_spec(d_out)
    return spec


def init(
    key: Key,
    *,
    latent: int,
    steps: int,
    mlp_layers: int,
    node_features: int,
    edge_features: int,
    out: int,
    nodes: int | None = None,
    edges: int | None = None,
) -> Params:
    del nodes, edges
    spec = {
        "encoder": {
            "node": _mlp(node_features, latent, mlp_layers, latent),
            "edge": _mlp(edge_features, latent, mlp_layers, latent),
        },
        "processor": [
            {
                "edge_mlp": _mlp(3 * latent, latent, mlp_layers, latent),
                "node_mlp": _mlp(2 * latent, latent, mlp_layers, latent),
            }
            for _ in range(steps)
        ],
        "decoder": _mlp(latent, latent, mlp_layers, out, norm=False),
    }
    return materialize(key, spec)


def optimizer(**size: Any) -> optax.GradientTransformation:
    del size
    return optax.adam(1e-3)


def batch_shapes(
    *, nodes: int, edges: int, node_features: int, edge_features: int, out: int, **_: Any
) -> dict:
    return {
        "nodes": sds((nodes, node_features)),
        "edges": sds((edges, edge_features)),
        "senders": sds((edges,), jnp.int32),
        "receivers": sds((edges,), jnp.int32),
        "targets": sds((nodes, out)),
    }


def make_batch(
    rng: np.random.Generator,
    *,
    nodes: int,
    edges: int,
    node_features: int,
    edge_features: int,
    out: int,
    **_: Any,
) -> dict:
    """Random graph; targets are a fixed function of neighbour features (learnable)."""
    node_x = rng.standard_normal((nodes, node_features), np.float32)
    edge_x = rng.standard_normal((edges, edge_features), np.float32)
    senders = rng.integers(0, nodes, edges).astype(np.int32)
    receivers = rng.integers(0, nodes, edges).astype(np.int32)
    w = rng.standard_normal((node_features, out), np.float32) / np.sqrt(node_features)
    total = np.zeros((nodes, out), np.float32)
    np.add.at(total, receivers, (node_x[senders] - node_x[receivers]) @ w)
    incoming = np.bincount(receivers, minlength=nodes).astype(np.float32)
    targets = np.tanh(total / np.maximum(incoming, 1.0)[:, None]).astype(np.float32)
    return {
        "nodes": node_x,
        "edges": edge_x,
        "senders": senders,
        "receivers": receivers,
        "targets": targets,
    }


def example_args(
    abstract: bool = True, preset: str | None = "tiny", **size: Any
) -> tuple[Params, PyTree, dict]:
    cfg = resolve_size(PRESETS, preset, size)
    return build_example_args(init, optimizer, batch_shapes, make_batch, cfg, abstract)


def param_count(preset: str | None = None, **size: Any) -> int:
    return count_params(init, PRESETS, preset, size)


def normed_mlp(p: Params, x: jax.Array) -> jax.Array:
    """MLP (ReLU) followed by LayerNorm."""
    return layer_norm(p["ln"], mlp_apply(p, x))


def process_step(p: Params, node_h: jax.Array, edge_h: jax.Array, batch: dict) -> tuple:
    """One residual message-passing step: update edges, aggregate to receivers, update nodes."""
    senders, receivers = batch["senders"], batch["receivers"]
    edge_in = jnp.concatenate([edge_h, node_h[senders], node_h[receivers]], axis=-1)
    edge_h = edge_h + normed_mlp(p["edge_mlp"], edge_in)
    messages = jax.ops.segment_sum(edge_h, receivers, num_segments=node_h.shape[0])
    node_h = node_h + normed_mlp(p["node_mlp"], jnp.concatenate([node_h, messages], axis=-1))
    return node_h, edge_h


def forward(params: Params, batch: dict) -> jax.Array:
    node_h = normed_mlp(params["encoder"]["node"], batch["nodes"])
    edge_h = normed_mlp(params["encoder"]["edge"], batch["edges"])
    for p in params["processor"]:
        node_h, edge_h = process_step(p, node_h, edge_h, batch)
    return mlp_apply(params["decoder"], node_h)


def loss_fn(params: Params, batch: dict) -> jax.Array:
    return jnp.mean(jnp.square(forward(params, batch) - batch["targets"]))


def train_step(params: Params, opt_state: PyTree, batch: dict) -> tuple[Params, PyTree, dict]:
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    params, opt_state = apply_updates(optimizer(), grads, opt_state, params)
    return params, opt_state, {"loss": loss}
