"""Plan a Haiku MLP train step with partir, run it sharded, print the rules.

`hk.transform` already gives pure `init` and `apply` functions, so the train step is a
plain function of `(params, opt_state, batch)`; Haiku names parameters by module path,
`params/mlp/~/linear_0/w`, and optax's moments end with the same path.

    python examples/ecosystem/haiku_mlp.py      # 8 fake CPU devices, a few seconds
"""

from __future__ import annotations

import haiku as hk
import jax
import optax


def train_step_and_args(*, d_in=256, hidden=1024, classes=16, layers=3, batch=64, seed=0):
    """A pure `train_step(params, opt_state, batch)` of a Haiku MLP classifier with
    optax.adamw, and its random-initialised args (real arrays)."""

    def forward(x):
        return hk.nets.MLP([hidden] * (layers - 1) + [classes], activation=jax.nn.gelu)(x)

    net = hk.without_apply_rng(hk.transform(forward))
    tx = optax.adamw(1e-3)

    def train_step(params, opt_state, batch):
        def loss_fn(p):
            logits = net.apply(p, batch["x"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss}

    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(k1, (batch, d_in))
    params = net.init(k2, x)
    data = {"x": x, "y": jax.random.randint(k3, (batch,), 0, classes)}
    return train_step, (params, tx.init(params), data)


def main() -> None:
    from _demo import plan_and_compare

    plan_and_compare(train_step_and_args)


if __name__ == "__main__":
    main()
