"""Sub-strategies a schedule is made of: `batch`, `zero`, `fsdp`, `megatron`, `expert`,
`auto`, and manual `tile` / `replicate`."""

from partir.strategies.base import (
    CATALOG as CATALOG,
    FSDP as FSDP,
    Auto as Auto,
    Batch as Batch,
    Expert as Expert,
    Megatron as Megatron,
    Replicate as Replicate,
    Strategy as Strategy,
    Tile as Tile,
    Zero as Zero,
    auto as auto,
    batch as batch,
    expert as expert,
    fsdp as fsdp,
    megatron as megatron,
    replicate as replicate,
    tile as tile,
    zero as zero,
)
