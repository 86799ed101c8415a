"""Compile a sharded jitted function and read back what XLA produced, per device.

Two halves:

* :func:`compile_stats` lowers ``jax.jit(fn, in_shardings=..., out_shardings=...)`` from
  abstract arguments (``jax.ShapeDtypeStruct``; nothing is allocated), compiles it and returns
  a :class:`CompiledStats` with the collectives XLA emitted and the per-device memory figures.
* :func:`collectives_from_hlo` parses post-optimization HLO text (as printed by
  :func:`optimized_hlo_text`) into :class:`HloCollective` records. It is a plain text parser so
  it can be unit-tested on hand-written snippets and works without a compiled executable.

Byte convention (the same as partir's ``Collective.bytes``): the per-device size of the whole
array that the collective reduces or produces, for ONE execution:

* ``all-reduce``: its operand(s) (a tuple all-reduce counts the sum of its elements);
* ``all-gather``: its result;
* ``reduce-scatter`` and ``all-to-all``: their operand(s);
* ``collective-permute``: its operand.

Async pairs (``all-gather-start``/``all-gather-done``, ``all-reduce-start``,
``collective-permute-start``, ``reduce-scatter-start``, ``all-to-all-start``) are counted once,
at the ``-start``, with the semantics of their synchronous kind. In this XLA an
``all-gather-start`` has the tuple shape ``(operand, result)`` (or ``((operands), (results))``),
a ``collective-permute-start`` ``(operand, result, u32[], u32[])`` and a generic async
``reduce-scatter-start`` ``((operands), result)``; the result is therefore taken from element 1
of the tuple, and operand sizes from the printed operands.

Memory: XLA:CPU's ``memory_analysis().peak_memory_in_bytes`` is arguments plus outputs only.
The true peak comes from XLA's buffer assignment: :func:`compile_with_buffer_peak` compiles a
``jax.stages.Lowered`` with per-compile dump options, and :func:`peak_from_buffer_assignment`
reads the dumped assignment and live ranges (see :class:`BufferPeak`).

``multiplicity`` is how many times the collective runs per step: the product of the known trip
counts of the ``while`` loops around it (summed over call sites if a computation had several;
XLA's optimized HLO normally gives each computation one caller). A loop without a
``known_trip_count`` counts as 1; such loops are reported in ``CompiledStats.notes`` and logged.
"""

from partir.ir.xla.buffers import (
    BufferPeak,
    LiveBuffer,
    compile_with_buffer_peak,
    peak_from_buffer_assignment,
    read_buffer_peak,
    true_peak_bytes,
)
from partir.ir.xla.compiling import compile_stats, stats_of_compiled
from partir.ir.xla.flops import hlo_bytes_accessed, hlo_flops
from partir.ir.xla.hlo import (
    collectives_from_hlo,
    computation_multiplicities,
    optimized_hlo_text,
    shape_bytes,
)
from partir.ir.xla.stats import (
    CPU_LOWERING,
    CPU_PROMOTED_TYPES,
    KINDS,
    CompiledStats,
    HloCollective,
    as_cpu_kinds,
)

__all__ = [
    "CPU_LOWERING",
    "CPU_PROMOTED_TYPES",
    "KINDS",
    "BufferPeak",
    "CompiledStats",
    "HloCollective",
    "LiveBuffer",
    "as_cpu_kinds",
    "collectives_from_hlo",
    "compile_stats",
    "compile_with_buffer_peak",
    "hlo_bytes_accessed",
    "hlo_flops",
    "computation_multiplicities",
    "optimized_hlo_text",
    "peak_from_buffer_assignment",
    "read_buffer_peak",
    "shape_bytes",
    "stats_of_compiled",
    "true_peak_bytes",
]
