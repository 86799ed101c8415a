"""Plan a Keras 3 (JAX backend) train step with partir, run it sharded, print the rules.

Keras layers hold their weights in `keras.Variable`s; with the JAX backend,
`model.stateless_call(trainable, non_trainable, x)` runs the model as a pure function of
the variables' values. The step takes the trainable values as a nested dict keyed by the
variables' paths (`sequential/dense/kernel` becomes `params/sequential/dense/kernel`)
and an optax state.

    KERAS_BACKEND=jax python examples/ecosystem/keras_mlp.py    # 8 fake CPU devices
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # before keras is imported

import jax  # noqa: E402
import keras  # noqa: E402
import optax  # noqa: E402
from _demo import get_path, nest_paths  # noqa: E402  # the script's folder is on sys.path


def train_step_and_args(*, d_in=256, hidden=1024, classes=16, batch=64, seed=0):
    """A pure `train_step(params, opt_state, batch)` of a Keras MLP classifier with
    optax.adamw, and its random-initialised args (real arrays)."""
    if keras.backend.backend() != "jax":
        raise RuntimeError("set KERAS_BACKEND=jax before keras is imported")
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((d_in,)),
            keras.layers.Dense(hidden, activation="gelu", name="dense"),
            keras.layers.Dense(hidden, activation="gelu", name="dense_1"),
            keras.layers.Dense(classes, name="logits"),
        ]
    )
    names = [v.path for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    tx = optax.adamw(1e-3)

    def train_step(params, opt_state, batch):
        def loss_fn(p):
            logits, _ = model.stateless_call(
                [get_path(p, n) for n in names], non_trainable, batch["x"], training=True
            )
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss}

    params = nest_paths({v.path: v.value for v in model.trainable_variables})
    k1, k2 = jax.random.split(jax.random.key(seed))
    data = {
        "x": jax.random.normal(k1, (batch, d_in)),
        "y": jax.random.randint(k2, (batch,), 0, classes),
    }
    return train_step, (params, tx.init(params), data)


def main() -> None:
    from _demo import plan_and_compare

    plan_and_compare(train_step_and_args)


if __name__ == "__main__":
    main()
