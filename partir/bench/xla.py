"""XLA: what XLA compiles for a plan, beside the cost model's prediction (per device)."""

from __future__ import annotations

import time

from partir.ir.xla import as_cpu_kinds
from partir.solver.verify import priced_comm_s, verify


def xla_figures(goal, plan) -> dict:
    """What XLA compiles for `plan`, beside the cost model's prediction (per device)."""
    t0 = time.perf_counter()
    report = verify(goal, plan)
    predicted = as_cpu_kinds(plan.cost.bytes_by_kind())
    compiled = report.compiled
    return {
        "collective_bytes": int(sum(compiled.values())),
        "collective_bytes_by_kind": {k: int(v) for k, v in compiled.items() if v},
        "collective_count": sum(c.multiplicity for c in report.stats.collectives),
        # estimate: the compiled collectives priced by the cost model's alpha-beta terms
        "priced_comm_s": priced_comm_s(report.stats, goal.cost_model),
        # arguments + outputs + temporaries - aliases: XLA:CPU's own peak_memory_in_bytes
        # counts only arguments and outputs (see CompiledStats.allocated_bytes).
        "peak_bytes": int(report.stats.allocated_bytes),
        "reported_peak_bytes": int(report.stats.peak_bytes),
        "argument_bytes": int(report.stats.argument_bytes),
        "predicted_collective_bytes": int(sum(predicted.values())),
        "predicted_collective_bytes_by_kind": {k: int(v) for k, v in predicted.items() if v},
        "predicted_peak_bytes": int(plan.cost.peak_memory_bytes),
        "predicted_argument_bytes": int(plan.cost.argument_bytes),
        "ok": bool(report.ok),
        "compile_seconds": time.perf_counter() - t0,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, with 0 / 0 = 1 and x / 0 = None (undefined)."""
    if a is None or b is None:
        return None
    if b == 0:
        return 1.0 if a == 0 else None
    return a / b
