"""What XLA produced, per device: its collectives and memory figures, and the kinds
XLA:CPU emits in place of a TPU/GPU build's."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

_log = logging.getLogger(__name__)

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

# What XLA:CPU emits instead of what a TPU/GPU build emits. This is the ONE place that knowledge
# lives; tests and `partir verify` fold predicted kinds through it with `as_cpu_kinds`.
#
# reduce-scatter -> all-reduce: XLA:CPU has no pass that turns "all-reduce followed by a
# dynamic-slice of this device's shard" into a reduce-scatter (TPU/GPU builds run
# ReduceScatterCreator). So a plan whose gradients partir predicts as reduce-scatters (ZeRO /
# FSDP style) comes out of XLA:CPU as all-reduce + slice (checked on jaxlib 0.10:
# "XLA:CPU does not turn all-reduce + dynamic-slice into reduce-scatter"). By partir's byte
# convention a reduce-scatter is counted by its operand, which is exactly the all-reduce's
# operand, so the bytes carry over unchanged. An explicit `lax.psum_scatter` does still appear as
# `reduce-scatter` on CPU, so fold BOTH the predicted and the measured side before comparing.
CPU_LOWERING: dict[str, str] = {"reduce-scatter": "all-reduce"}

# Not a kind change, so not folded by `as_cpu_kinds`, but it changes bytes: XLA:CPU converts
# bf16 operands to f32 around EVERY collective (all-reduce, all-gather, reduce-scatter,
# all-to-all, collective-permute; checked with jax 0.10.2, shard_map and jit programs), so the
# CPU HLO moves twice the bytes a TPU/GPU build would for bf16 data. f16 and integer types are
# not promoted. The parser reports what the HLO says; a comparison with bf16 predictions must
# scale them by this factor.
CPU_PROMOTED_TYPES: dict[str, str] = {"bf16": "f32"}


def as_cpu_kinds(bytes_by_kind: dict[str, int]) -> dict[str, int]:
    """Fold per-kind figures into the kinds XLA:CPU emits (see :data:`CPU_LOWERING`).

    Every kind of :data:`KINDS` is present in the result (0 if none); kinds outside KINDS are
    carried through unchanged. Folding is idempotent, so it may be applied to measured figures.
    """
    out: dict[str, int] = dict.fromkeys(KINDS, 0)
    for kind, value in bytes_by_kind.items():
        target = CPU_LOWERING.get(kind, kind)
        out[target] = out.get(target, 0) + value
    return out


@dataclass(frozen=True)
class HloCollective:
    kind: str  # one of KINDS
    bytes: int  # per-device bytes of ONE execution (module docstring)
    group_size: int  # devices per replica group; collective-permute: number of pairs
    multiplicity: int  # executions per step (product of known trip counts of enclosing loops)
    name: str  # HLO instruction name
    computation: str  # HLO computation that holds it


@dataclass(frozen=True)
class CompiledStats:
    collectives: list[HloCollective]
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    peak_bytes: int
    flops: float | None
    notes: tuple[str, ...] = field(default=())  # e.g. while loops with unknown trip counts
    # The peak of XLA's buffer assignment (BufferPeak.bytes); None when it could not be read.
    true_peak_bytes: int | None = None
    # `flops` with every while body counted once per iteration (XLA's cost analysis counts it
    # once): flops + the extra iterations' flops as hlo_flops counts them. None if no flops.
    step_flops: float | None = None
    # XLA's cost analysis "bytes accessed": what its kernels (fusions, dots, copies, collectives)
    # read and write, a while body counted once; None if the backend gives none.
    bytes_accessed: float | None = None
    # the same with every while body counted once per iteration (as step_flops)
    step_bytes_accessed: float | None = None

    @property
    def allocated_bytes(self) -> int:
        """Everything XLA allocates per device: arguments, outputs and temporaries, less the
        outputs that alias (donated) arguments. XLA:CPU's ``peak_memory_in_bytes`` counts
        only arguments and outputs (checked on jaxlib 0.10.2: a gpt train step reported
        157 MiB peak beside 1,284 MiB of temporaries), so this is the figure a peak-memory
        estimate is held to."""
        return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes

    def bytes_by_kind(self) -> dict[str, int]:
        """Sum of ``bytes * multiplicity`` per kind; every kind of KINDS present."""
        out = dict.fromkeys(KINDS, 0)
        for c in self.collectives:
            out[c.kind] = out.get(c.kind, 0) + c.bytes * c.multiplicity
        return out

    def count_by_kind(self) -> dict[str, int]:
        """Sum of ``multiplicity`` per kind; every kind of KINDS present."""
        out = dict.fromkeys(KINDS, 0)
        for c in self.collectives:
            out[c.kind] = out.get(c.kind, 0) + c.multiplicity
        return out
