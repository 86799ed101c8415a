"""Pruning: the searches again with CP-SAT pruning off, and both at a tight memory limit."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from partir.bench.cases import Case
from partir.bench.experts import Traces
from partir.bench.one_case import run_case
from partir.bench.xla import ratio
from partir.goal import parse_bytes
from partir.ir.messages import fmt_bytes

TIGHT_MODELS = ("mlp", "gpt", "moe")  # cheap searches: also run at a tight memory limit
TIGHT_SLACK = 1.05  # tight limit = this times the searched plan's peak at the default limit


def _prune_side(r: dict) -> dict:
    if "searched" not in r:
        return {"error": r.get("error")}
    s = r["searched"]
    return {
        k: s[k]
        for k in (
            "step_time_s",
            "peak_memory_bytes",
            "seconds",
            "episodes",
            "episodes_to_best",
            "seconds_to_best",
            "actions_after",
            "pruned",
            "fits",
        )
    }


def _prune_row(c: Case, on: dict, off: dict) -> dict:
    row: dict[str, Any] = {
        "model": c.model,
        "size": c.size,
        "mesh": c.mesh_dict,
        "schedule": c.schedule,
        "memory_limit_bytes": parse_bytes(c.memory_limit),
        "cpsat": _prune_side(on),
        "none": _prune_side(off),
    }
    a, b = row["cpsat"], row["none"]
    if "error" not in a and "error" not in b:
        row["step_time_ratio"] = ratio(b["step_time_s"], a["step_time_s"])
        row["seconds_ratio"] = ratio(b["seconds"], a["seconds"])
        row["episodes_to_best_ratio"] = ratio(b["episodes_to_best"], a["episodes_to_best"])
    # CP-SAT said no plan fits, yet the unpruned search found one that does
    row["false_infeasible"] = bool(
        "error" in a and "Infeasible" in str(a["error"]) and "error" not in b and b["fits"]
    )
    return row


def run_pruning(
    cases: Iterable[Case],
    results: dict[Case, dict],
    programs: Traces,
    progress: Callable[[str], None] | None = None,
    tight: Iterable[str] = TIGHT_MODELS,
) -> list[dict]:
    """The same searches with CP-SAT pruning off, beside the pruned ones in `results`; for
    the models in `tight`, both again at a limit just above the plan found (where pruning
    has something to remove)."""
    rows = []
    tight = set(tight)
    for c in cases:
        on = results.get(c)
        if on is None or "searched" not in on:
            continue
        if progress:
            progress(f"pruning off: {c.label}")
        off = run_case(dataclasses.replace(c, prune=None), programs, xla=False, experts="none")
        rows.append(_prune_row(c, on, off))
        if c.model in tight:
            limit = int(on["searched"]["peak_memory_bytes"] * TIGHT_SLACK)
            ct = dataclasses.replace(c, memory_limit=limit)
            if progress:
                progress(f"pruning on / off at a tight limit ({fmt_bytes(limit)}): {c.label}")
            on_t = run_case(ct, programs, xla=False, experts="none")
            off_t = run_case(
                dataclasses.replace(ct, prune=None), programs, xla=False, experts="none"
            )
            rows.append(_prune_row(ct, on_t, off_t))
    return rows
