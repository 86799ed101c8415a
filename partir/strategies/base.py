"""Sub-strategies: small immutable values, each naming the mesh axis it acts on.

A schedule is a plain list of them; the order of first appearance of each axis is the
search order (batch first, then model, ...). Several strategies may share an axis
(`batch("batch")` then `zero("batch", stage=3)`).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Strategy:
    axis: str

    @property
    def name(self) -> str:
        return type(self).__name__.lower()


@dataclasses.dataclass(frozen=True)
class Batch(Strategy):
    """Tile the data inputs' batch dim on the axis; parameters stay replicated on it.
    `inputs`: globs of the data inputs (default: found from the program)."""

    inputs: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Zero(Strategy):
    """ZeRO: tile optimizer state (stage 1), and gradients (2), and parameters (3) on the
    axis, along a dim that the axis divides."""

    stage: int = 3

    def __post_init__(self) -> None:
        if self.stage not in (1, 2, 3):
            raise ValueError(f"zero stage must be 1, 2 or 3, not {self.stage!r}")


@dataclasses.dataclass(frozen=True)
class FSDP(Strategy):
    """Fully sharded data parallelism: batch + zero(stage=3) on one axis."""


@dataclasses.dataclass(frozen=True)
class Megatron(Strategy):
    """Tensor parallelism: only weights of matmul chains may be tiled on the axis; data
    inputs are not; the search finds which weights and dims."""


@dataclasses.dataclass(frozen=True)
class Expert(Strategy):
    """Expert parallelism: tile the experts dim of mixture-of-experts weights."""


@dataclasses.dataclass(frozen=True)
class Auto(Strategy):
    """The search may tile any input on the axis."""


@dataclasses.dataclass(frozen=True)
class Tile(Strategy):
    """Manual: tile the inputs matching `path` (a glob) along `dim` on the axis."""

    path: str = ""
    dim: int = 0


@dataclasses.dataclass(frozen=True)
class Replicate(Strategy):
    """Manual: keep the inputs matching `path` (a glob) whole on the axis."""

    path: str = ""


def conflict(strategies: list[Strategy]) -> str | None:
    """Why strategies that share one mesh axis contradict each other, or None."""
    megatron = next((s for s in strategies if isinstance(s, Megatron)), None)
    data = next((s for s in strategies if isinstance(s, Batch | FSDP)), None)
    if megatron is not None and data is not None:
        return (
            f"{data.name} tiles the data inputs on axis {megatron.axis!r} and megatron keeps "
            "them whole there; put data parallelism and megatron on different mesh axes"
        )
    return None


def batch(axis: str, inputs: tuple[str, ...] | list[str] | None = None) -> Batch:
    return Batch(axis, tuple(inputs) if inputs is not None else None)


def zero(axis: str, stage: int = 3) -> Zero:
    return Zero(axis, stage)


def fsdp(axis: str) -> FSDP:
    return FSDP(axis)


def megatron(axis: str) -> Megatron:
    return Megatron(axis)


def expert(axis: str) -> Expert:
    return Expert(axis)


def auto(axis: str) -> Auto:
    return Auto(axis)


def tile(path: str, dim: int, axis: str) -> Tile:
    return Tile(axis, path, dim)


def replicate(path: str, axis: str) -> Replicate:
    return Replicate(axis, path)


# name in a goal file -> (constructor, allowed keyword arguments)
CATALOG = {
    "batch": (batch, ("inputs",)),
    "zero": (zero, ("stage",)),
    "fsdp": (fsdp, ()),
    "megatron": (megatron, ()),
    "expert": (expert, ()),
    "auto": (auto, ()),
}
