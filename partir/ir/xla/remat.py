"""Whether the installed XLA:CPU keeps a checkpoint region's recompute.

JAX puts an optimization barrier on the operands of a checkpoint region's backward pass
(residuals and cotangents), so that XLA recomputes the region there instead of reusing the
forward pass's values. XLA:CPU of jaxlib 0.10 removes the barrier and merges the recompute
with the forward pass by CSE: the step runs, and allocates, as if nothing were
rematerialised. XLA:CPU of jaxlib 0.12 keeps it. Read off the installed XLA once, by
compiling a one-matmul checkpoint.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.cache
def cpu_merges_recompute() -> bool:
    """Whether XLA:CPU here merges a checkpoint region's recompute with its forward pass.

    The probe's loss and gradient need one matmul in the forward pass and one in the
    backward; a kept recompute is a third."""

    def loss(w, x):
        return jax.checkpoint(lambda w, x: jnp.tanh(x @ w).sum())(w, x)

    w = jax.ShapeDtypeStruct((32, 32), jnp.float32)
    with jax.default_device(jax.devices("cpu")[0]):
        text = jax.jit(jax.value_and_grad(loss)).lower(w, w).compile().as_text() or ""
    return text.count(" dot(") < 3
