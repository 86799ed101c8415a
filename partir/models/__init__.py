"""Model zoo: pure-JAX train steps (optax optimizers) for the planner to trace and tests to run.

Every module has `PRESETS`, `init`, `optimizer`, `example_args`, `param_count` and `train_step`.
"""

from __future__ import annotations

from types import ModuleType

from partir.models import gns, gpt, llama, mlp, moe, unet

MODELS: dict[str, ModuleType] = {
    "mlp": mlp,
    "gpt": gpt,
    "gns": gns,
    "unet": unet,
    "moe": moe,
    "llama": llama,
}


def get(name: str) -> ModuleType:
    """The model module called `name`; ValueError naming the known models otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}") from None


__all__ = ["MODELS", "get", "gns", "gpt", "llama", "mlp", "moe", "unet"]
