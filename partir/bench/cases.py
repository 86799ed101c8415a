"""Cases: the models, sizes, meshes and schedules the suite runs."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from partir import strategies as S

DEVICES = 8  # fake CPU devices for the XLA checks; meshes of more devices are not compiled
DEVICE = "tpu-v4"
MEMORY_LIMIT = "32GiB"  # tpu-v4 HBM

# Realistic sizes: a preset and overrides. gpt 1b at batch 32, as examples/gpt.partir
# (at the preset's batch 256, f32 without rematerialisation, no plan fits 32 GiB on 64 chips).
REALISTIC: dict[str, tuple[str, dict[str, Any]]] = {
    "mlp": ("1b", {}),
    "gpt": ("1b", {"batch": 32}),
    "gns": ("base", {}),
    "unet": ("base", {}),
    "moe": ("base", {}),
}
MODELS = ("mlp", "gpt", "gns", "unet", "moe")
GNS_EDGE_INPUTS = ("batch/edges", "batch/senders", "batch/receivers")

# Meshes by rank: the first axis is data, the second model (or fsdp on 3-D), the third tensor.
MESH_1D = {"data": 8}
MESH_2D_SMALL = {"data": 2, "model": 4}
MESH_2D = {"data": 8, "model": 8}
MESH_2D_LARGE = {"data": 16, "model": 16}
MESH_3D_SMALL = {"data": 2, "fsdp": 2, "tensor": 2}
MESH_3D = {"data": 4, "fsdp": 4, "tensor": 4}

# Scaling: gpt of this width at these depths, on the small 2-D mesh, natural schedule.
SCALING_LAYERS = (12, 24, 48, 96)
# tiny models also searched for the fewest collective bytes (objective "comm") on 2x4: the
# natural schedule's time-optimal plan trades bytes for fewer collectives there
COMM_MODELS = ("mlp", "gpt")
SCALING_SIZE = {"d_model": 128, "heads": 4, "seq": 64, "batch": 16, "vocab": 512}


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmark case: a model at a size, a mesh and a schedule kind."""

    model: str
    size: str  # preset name
    mesh: tuple[tuple[str, int], ...]
    schedule: str = "natural"  # or "auto"
    overrides: tuple[tuple[str, Any], ...] = ()
    prune: str | None = "cpsat"
    memory_limit: int | str = MEMORY_LIMIT
    objective: str = "time"  # the goal's objective: "time", "memory" or "comm"

    @property
    def mesh_dict(self) -> dict[str, int]:
        return dict(self.mesh)

    @property
    def devices(self) -> int:
        return math.prod(n for _, n in self.mesh)

    @property
    def mesh_str(self) -> str:
        return "x".join(str(n) for _, n in self.mesh)

    @property
    def label(self) -> str:
        schedule = schedule_label(self.schedule, self.objective)
        return f"{self.model} {self.size} {self.mesh_str} {schedule}"


def schedule_label(schedule: str, objective: str) -> str:
    return schedule if objective == "time" else f"{schedule}, {objective}"


def case(
    model: str,
    size: str,
    mesh: dict[str, int],
    schedule: str = "natural",
    prune: str | None = "cpsat",
    objective: str = "time",
    **overrides: Any,
) -> Case:
    if size != "tiny" and not overrides and model in REALISTIC and REALISTIC[model][0] == size:
        overrides = dict(REALISTIC[model][1])
    return Case(
        model,
        size,
        tuple(mesh.items()),
        schedule,
        tuple(sorted(overrides.items())),
        prune,
        objective=objective,
    )


def realistic(model: str, mesh: dict[str, int], schedule: str = "natural") -> Case:
    preset, overrides = REALISTIC[model]
    return case(model, preset, mesh, schedule, **overrides)


def full_cases() -> list[Case]:
    """Tiny models on the meshes XLA can compile here (<= 8 devices), natural and auto (and
    mlp, gpt on 2x4 with the comm objective); realistic sizes on 8x8 (natural and auto), 16x16 and 4x4x4 (natural only: auto on
    them would double the suite's time)."""
    out = []
    for model in MODELS:
        for mesh in (MESH_1D, MESH_2D_SMALL, MESH_3D_SMALL):
            out += [case(model, "tiny", mesh, s) for s in ("natural", "auto")]
    # gpt between the two: its `small` preset (12 layers, d_model 256), compiled on 2x4
    out += [case(model, "tiny", MESH_2D_SMALL, objective="comm") for model in COMM_MODELS]
    out += [
        case("gpt", "small", m, s) for m in (MESH_2D_SMALL, MESH_2D) for s in ("natural", "auto")
    ]
    for model in MODELS:
        out += [realistic(model, MESH_2D, s) for s in ("natural", "auto")]
        out += [realistic(model, MESH_2D_LARGE), realistic(model, MESH_3D)]
    return out


def quick_cases() -> list[Case]:
    out = []
    for model in MODELS:
        out += [case(model, "tiny", MESH_2D_SMALL, s) for s in ("natural", "auto")]
    out += [case(model, "tiny", MESH_2D_SMALL, objective="comm") for model in COMM_MODELS]
    out.append(realistic("gpt", MESH_2D))
    return out


def schedule_for(model: str, mesh: dict[str, int], kind: str) -> list:
    """The strategies of a case. `auto`: auto on every axis. `natural`, by mesh rank:

    - data axis: batch + zero(stage=3) (gns: batch on the edge inputs; moe on a 1-D mesh:
      expert too);
    - 2-D model axis: megatron (moe: expert + megatron);
    - 3-D: data: batch; fsdp: fsdp (gns: batch on edges + zero 3); tensor: as the model
      axis of 2-D.
    """
    axes = list(mesh)
    if kind == "auto":
        return [S.auto(a) for a in axes]
    if kind != "natural":
        raise ValueError(f"schedule kind must be 'natural' or 'auto', not {kind!r}")

    def batch(axis):
        return S.batch(axis, inputs=GNS_EDGE_INPUTS) if model == "gns" else S.batch(axis)

    def model_axis(axis):
        if model == "moe":
            return [S.expert(axis), S.megatron(axis)]
        return [S.megatron(axis)]

    data = axes[0]
    if len(axes) == 1:
        out = [batch(data), S.zero(data, 3)]
        return out + ([S.expert(data)] if model == "moe" else [])
    if len(axes) == 2:
        return [batch(data), S.zero(data, 3), *model_axis(axes[1])]
    fsdp, tensor = axes[1], axes[2]
    sharded = [batch(fsdp), S.zero(fsdp, 3)] if model == "gns" else [S.fsdp(fsdp)]
    return [batch(data), *sharded, *model_axis(tensor)]


def schedule_text(schedule: Sequence) -> str:
    """`data: batch+zero3 | model: megatron`."""
    by_axis: dict[str, list[str]] = {}
    for s in schedule:
        name = s.name + (str(s.stage) if s.name == "zero" else "")
        by_axis.setdefault(s.axis, []).append(name)
    return " | ".join(f"{a}: {'+'.join(names)}" for a, names in by_axis.items())


def mesh_text(mesh: dict[str, int]) -> str:
    """`2x4`."""
    return "x".join(str(n) for n in mesh.values())
