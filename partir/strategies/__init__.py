"""Sub-strategies a schedule is made of, one module each: what `batch`, `zero`, `fsdp`,
`megatron`, `expert`, `auto` and the manual `tile` / `replicate` mean on their mesh axis
(`base.py` says what they share; `compile.py` composes one axis's strategies)."""

from partir.strategies.auto import Auto, auto
from partir.strategies.base import Strategy
from partir.strategies.batch import Batch, batch
from partir.strategies.expert import Expert, expert
from partir.strategies.fsdp import FSDP, fsdp
from partir.strategies.manual import Replicate, Tile, replicate, tile
from partir.strategies.megatron import Megatron, megatron
from partir.strategies.zero import Zero, zero

CATALOG: dict[str, type[Strategy]] = {
    cls.__name__.lower(): cls for cls in (Batch, Zero, FSDP, Megatron, Expert, Auto)
}
"""The strategies a goal file's axis block may name, by name (`tile` and `replicate` are
statements of their own)."""

__all__ = [
    "CATALOG",
    "FSDP",
    "Auto",
    "Batch",
    "Expert",
    "Megatron",
    "Replicate",
    "Strategy",
    "Tile",
    "Zero",
    "auto",
    "batch",
    "expert",
    "fsdp",
    "megatron",
    "replicate",
    "tile",
    "zero",
]
