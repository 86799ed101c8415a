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

import partir
from partir import strategies as st


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
    jax.config.update("jax_num_cpu_devices", 8)  # fake devices: a script may, a library not
    from partir.testing import check_plan, max_relative_error

    train_step, args = train_step_and_args()
    goal = partir.Goal(train_step, args, mesh={"batch": 2, "model": 4}, device="tpu-v4",
                       schedule=[st.batch("batch"), st.megatron("model")],
                       search=partir.Search(seed=0, episodes=40))  # fmt: skip
    plan = partir.solve(goal)
    check_plan(goal, plan)
    print(plan)
    got, want = plan.jit()(*args), jax.jit(train_step)(*args)
    print("loss sharded / unsharded:", float(got[2]["loss"]), float(want[2]["loss"]))
    print("max relative error of the gradients (Adam's mu):",
          max_relative_error(got[1][0].mu, want[1][0].mu))  # fmt: skip
    print(plan.rules_source())


if __name__ == "__main__":
    main()
