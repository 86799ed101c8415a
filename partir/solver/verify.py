"""Hold a plan's predicted cost against what XLA compiles for it on fake CPU devices."""

from __future__ import annotations

import dataclasses
import itertools
import math

from partir.ir.cost import KINDS
from partir.ir.messages import fmt_bytes
from partir.ir.xla import (
    BufferPeak,
    CompiledStats,
    as_cpu_kinds,
    compile_with_buffer_peak,
    stats_of_compiled,
)

# Collective bytes per kind must agree within this ratio; argument bytes exactly.
COLLECTIVE_TOLERANCE = 0.05
# The row holding the estimate against the peak of XLA's buffer assignment.
PEAK_ROW = "peak memory (XLA buffer assignment)"


@dataclasses.dataclass
class VerifyRow:
    what: str
    predicted: int
    compiled: int
    ok: bool

    @property
    def ratio(self) -> float | None:
        return self.predicted / self.compiled if self.compiled else None


@dataclasses.dataclass
class VerifyReport:
    """Predicted against compiled, per collective kind (as XLA:CPU lowers them) and for
    memory. `ok` covers collectives and argument bytes. The peak-memory estimate is shown
    beside all that XLA allocates (arguments + outputs + temporaries - aliases), which
    bounds the true peak from above, and beside the peak of XLA's buffer assignment (the
    most bytes live at once over its schedule); both are reported, not held to a
    tolerance."""

    predicted: dict[str, int]
    compiled: dict[str, int]
    rows: list[VerifyRow]
    stats: CompiledStats
    ok: bool
    # XLA's buffer assignment at its peak (the largest live buffers, by jaxpr equation)
    buffer_peak: BufferPeak | None = None

    def row(self, what: str) -> VerifyRow | None:
        """The row named `what` (a collective kind, "argument memory", "memory (est.)",
        PEAK_ROW), or None."""
        return next((r for r in self.rows if r.what == what), None)

    def __str__(self) -> str:
        w = max([22] + [len(r.what) + 2 for r in self.rows])
        lines = [f"{'':<{w}}{'predicted':>14}{'XLA':>14}{'ratio':>8}"]
        for r in self.rows:
            ratio = f"{r.ratio:.3f}" if r.ratio is not None else ("1.000" if r.ok else "-")
            mark = "" if r.ok else "  MISMATCH"
            lines.append(
                f"{r.what:<{w}}{fmt_bytes(r.predicted):>14}{fmt_bytes(r.compiled):>14}"
                f"{ratio:>8}{mark}"
            )
        lines.append("ok" if self.ok else "mismatch beyond tolerance")
        return "\n".join(lines)


def close(a: float, b: float, tol: float = COLLECTIVE_TOLERANCE) -> bool:
    if a == b:
        return True
    return abs(a - b) <= tol * max(abs(a), abs(b))


def verify(goal, plan, *, mesh=None, compiler_options: dict | None = None) -> VerifyReport:
    """Compile `plan` for `goal` with XLA (abstract args: nothing is allocated) and compare
    its collectives and memory with the cost model's prediction. `compiler_options` go to
    this compile only (e.g. {"xla_backend_optimization_level": 0} compiles faster: the HLO,
    its buffer assignment and collectives stay the same, only machine code differs)."""
    step = plan.jit(mesh)
    compiled, peak = compile_with_buffer_peak(step.lower(*goal.args), compiler_options)
    stats = stats_of_compiled(compiled, peak)
    cost = plan.cost
    predicted = as_cpu_kinds(cost.bytes_by_kind())
    measured = as_cpu_kinds(stats.bytes_by_kind())
    rows = [
        VerifyRow(kind, predicted[kind], measured[kind], close(predicted[kind], measured[kind]))
        for kind in KINDS
        if predicted[kind] or measured[kind]
    ]
    rows.append(
        VerifyRow(
            "argument memory",
            cost.argument_bytes,
            stats.argument_bytes,
            cost.argument_bytes == stats.argument_bytes,
        )  # fmt: skip
    )
    rows.append(VerifyRow("memory (est.)", cost.peak_memory_bytes, stats.allocated_bytes, True))
    if stats.true_peak_bytes is not None:
        rows.append(VerifyRow(PEAK_ROW, cost.peak_memory_bytes, stats.true_peak_bytes, True))
    return VerifyReport(predicted, measured, rows, stats, all(r.ok for r in rows), peak)


def priced_comm_s(stats: CompiledStats, model) -> float:
    """Seconds per step of the collectives XLA compiled, priced by `model`'s alpha-beta
    terms (CostModel.collective_time): an estimate, the compiled collectives on the model's
    device. A replica group of n devices is priced on the mesh axes whose sizes multiply to
    n (the first such set in mesh order); a collective-permute on the slowest axis."""
    mesh = dict(model.mesh)
    total = 0.0
    for c in stats.collectives:
        axes = tuple(mesh) if c.kind == "collective-permute" else _axes_of(mesh, c.group_size)
        total += c.multiplicity * model.collective_time(c.kind, axes, c.bytes)
    return total


def _axes_of(mesh: dict[str, int], n: int) -> tuple[str, ...]:
    names = list(mesh)
    for k in range(1, len(names) + 1):
        for combo in itertools.combinations(names, k):
            if math.prod(mesh[a] for a in combo) == n:
                return combo
    return tuple(names)
