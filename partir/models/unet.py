"""Convolutional UNet diffusion step (DDPM noise prediction, cosine schedule), NHWC / HWIO.

Level i has `base * 2**i` channels; each level has one time-conditioned residual block, levels
are joined by stride-2 convs going down and nearest-neighbour 2x upsampling + conv going up,
and the up path concatenates the down path's skips. Loss is MSE between predicted and true noise.
"""

from __future__ import annotations

import math
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
    dense,
    materialize,
    mlp_apply,
    mlp_spec,
    normal,
    ones,
    resolve_size,
    sds,
    zeros,
)

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"batch": 8, "image": 16, "channels": 3, "base": 8, "levels": 2},
    "small": {"batch": 16, "image": 32, "channels": 3, "base": 32, "levels": 3},
    "base": {"batch": 64, "image": 64, "channels": 3, "base": 64, "levels": 4},
}

TIMESTEPS = 1000
MAX_GROUPS = 32
MIN_GROUP_SIZE = 4


# ----------------------------------------------------------------------------- init


def conv_spec(c_in: int, c_out: int, size: int = 3) -> Params:
    std = 1.0 / math.sqrt(size * size * c_in)
    return {"w": normal((size, size, c_in, c_out), std), "b": zeros((c_out,))}


def group_norm_spec(c: int) -> Params:
    return {"scale": ones((c,)), "bias": zeros((c,))}


def res_block_spec(c_in: int, c_out: int, t_dim: int) -> Params:
    p = {
        "norm1": group_norm_spec(c_in),
        "conv1": conv_spec(c_in, c_out),
        "time": dense(t_dim, c_out),
        "norm2": group_norm_spec(c_out),
        "conv2": conv_spec(c_out, c_out),
    }
    if c_in != c_out:
        p["skip"] = conv_spec(c_in, c_out, size=1)
    return p


def init(
    key: Key,
    *,
    channels: int,
    base: int,
    levels: int,
    batch: int | None = None,
    image: int | None = None,
) -> Params:
    del batch
    if image is not None and image % 2 ** (levels - 1):
        raise ValueError(f"image {image} is not divisible by 2**(levels-1) = {2 ** (levels - 1)}")
    ch = [base * 2**i for i in range(levels)]
    t_dim = 4 * base
    down, up = [], []
    for i in range(levels):
        level = {"res": res_block_spec(base if i == 0 else ch[i - 1], ch[i], t_dim)}
        if i < levels - 1:
            level["downsample"] = conv_spec(ch[i], ch[i])
        down.append(level)
    for i in range(levels):
        level = {"res": res_block_spec(2 * ch[i], ch[i], t_dim)}
        if i > 0:
            level["upsample"] = conv_spec(ch[i], ch[i - 1])
        up.append(level)
    spec = {
        "time": mlp_spec([base, t_dim, t_dim]),
        "conv_in": conv_spec(channels, base),
        "down": down,
        "mid": res_block_spec(ch[-1], ch[-1], t_dim),
        "up": up,
        "norm_out": group_norm_spec(base),
        "conv_out": conv_spec(base, channels),
    }
    return materialize(key, spec)


def optimizer(**size: Any) -> optax.GradientTransformation:
    del size
    return optax.adamw(1e-3)


def batch_shapes(*, batch: int, image: int, channels: int, **_: Any) -> dict:
    shape = (batch, image, image, channels)
    return {"images": sds(shape), "noise": sds(shape), "t": sds((batch,), jnp.int32)}


def make_batch(
    rng: np.random.Generator, *, batch: int, image: int, channels: int, **_: Any
) -> dict:
    """Smooth images in [-1, 1] (random plane waves), N(0, 1) noise, t in [0, TIMESTEPS)."""
    coords = np.arange(image, dtype=np.float32) / image
    fy, fx, phase = rng.uniform(0, 2 * np.pi, (3, batch, 1, 1, channels))
    images = np.sin(fy * coords[:, None, None] + fx * coords[None, :, None] + phase)
    return {
        "images": images.astype(np.float32),
        "noise": rng.standard_normal((batch, image, image, channels), np.float32),
        "t": rng.integers(0, TIMESTEPS, batch).astype(np.int32),
    }


def example_args(
    abstract: bool = True, preset: str | None = "tiny", **size: Any
) -> tuple[Params, PyTree, dict]:
    cfg = resolve_size(PRESETS, preset, size)
    return build_example_args(init, optimizer, batch_shapes, make_batch, cfg, abstract)


def param_count(preset: str | None = None, **size: Any) -> int:
    return count_params(init, PRESETS, preset, size)


# ----------------------------------------------------------------------------- forward


def alpha_bar(t: jax.Array, s: float = 0.008) -> jax.Array:
    """Cosine schedule (Nichol & Dhariwal): cumulative signal fraction at integer step t."""
    f = jnp.cos((t.astype(jnp.float32) / TIMESTEPS + s) / (1 + s) * (jnp.pi / 2)) ** 2
    return jnp.clip(f / math.cos(s / (1 + s) * math.pi / 2) ** 2, 1e-5, 1.0)


def time_embedding(t: jax.Array, dim: int) -> jax.Array:
    """[B] int -> [B, dim] sinusoidal embedding."""
    half = dim // 2
    freqs = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
    angles = t.astype(jnp.float32)[:, None] * freqs[None, :]
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def conv(p: Params, x: jax.Array, stride: int = 1) -> jax.Array:
    y = jax.lax.conv_general_dilated(
        x,
        p["w"],
        window_strides=(stride, stride),
        padding="SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    return y + p["b"]


def group_norm(p: Params, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    b, h, w, c = x.shape
    groups = math.gcd(c, MAX_GROUPS)
    while groups > 1 and c // groups < MIN_GROUP_SIZE:
        # groups of one channel would normalise each channel on its own, which makes a
        # per-channel bias before the norm a no-op whose gradient is pure rounding noise
        groups //= 2
    xg = x.reshape(b, h, w, groups, c // groups)
    mean = jnp.mean(xg, axis=(1, 2, 4), keepdims=True)
    var = jnp.mean(jnp.square(xg - mean), axis=(1, 2, 4), keepdims=True)
    xg = (xg - mean) * jax.lax.rsqrt(var + eps)
    return xg.reshape(b, h, w, c) * p["scale"] + p["bias"]


def res_block(p: Params, x: jax.Array, temb: jax.Array) -> jax.Array:
    h = conv(p["conv1"], jax.nn.silu(group_norm(p["norm1"], x)))
    h = h + (temb @ p["time"]["w"] + p["time"]["b"])[:, None, None, :]
    h = conv(p["conv2"], jax.nn.silu(group_norm(p["norm2"], h)))
    skip = conv(p["skip"], x) if "skip" in p else x
    return skip + h


def upsample(x: jax.Array) -> jax.Array:
    """Nearest-neighbour 2x."""
    return jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)


def predict_noise(params: Params, x: jax.Array, t: jax.Array) -> jax.Array:
    t_dim_in = params["time"]["layers"][0]["w"].shape[0]
    temb = jax.nn.silu(mlp_apply(params["time"], time_embedding(t, t_dim_in), jax.nn.silu))
    h = conv(params["conv_in"], x)
    skips = []
    for level in params["down"]:
        h = res_block(level["res"], h, temb)
        skips.append(h)
        if "downsample" in level:
            h = conv(level["downsample"], h, stride=2)
    h = res_block(params["mid"], h, temb)
    for level, skip in reversed(list(zip(params["up"], skips))):
        h = res_block(level["res"], jnp.concatenate([h, skip], axis=-1), temb)
        if "upsample" in level:
            h = conv(level["upsample"], upsample(h))
    return conv(params["conv_out"], jax.nn.silu(group_norm(params["norm_out"], h)))


def loss_fn(params: Params, batch: dict) -> jax.Array:
    images, noise = batch["images"], batch["noise"]
    abar = alpha_bar(batch["t"])[:, None, None, None]
    x_t = jnp.sqrt(abar) * images + jnp.sqrt(1.0 - abar) * noise
    pred = predict_noise(params, x_t, batch["t"])
    return jnp.mean(jnp.square(pred - noise))


def train_step(params: Params, opt_state: PyTree, batch: dict) -> tuple[Params, PyTree, dict]:
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    params, opt_state = apply_updates(optimizer(), grads, opt_state, params)
    return params, opt_state, {"loss": loss}
