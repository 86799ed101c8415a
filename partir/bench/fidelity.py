"""Fidelity: the cost model's collective bytes and memory over XLA's, for every plan compiled."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from partir.bench.cases import mesh_text
from partir.bench.xla import ratio


def log_distance(r: float | None) -> float:
    return math.inf if r is None or r <= 0 else abs(math.log(r))


def _summary(entries: list[tuple[str, float | None]]) -> dict:
    defined = [r for _, r in entries if r is not None and r > 0]
    out: dict[str, Any] = {"plans": len(entries), "undefined": len(entries) - len(defined)}
    if defined:
        out["mean"] = sum(defined) / len(defined)
        out["geomean"] = math.exp(sum(math.log(r) for r in defined) / len(defined))
        out["within_5pct"] = sum(1 for r in defined if abs(r - 1) <= 0.05)
    if entries:
        name, r = max(entries, key=lambda e: log_distance(e[1]))
        out["worst"] = {"plan": name, "ratio": r}
    return out


def fidelity(case_results: Iterable[dict]) -> dict:
    """Predicted over XLA, per device, for every plan compiled (each plan once)."""
    rows, seen = [], set()
    for r in case_results:
        for who in ("searched", "expert", "same_schedule_expert"):
            x = r.get("xla", {}).get(who)
            if not x or "error" in x or x.get("cached"):
                continue
            name = who if who == "searched" else r[who]["name"]
            label = f"{r['model']} {r['size']} {mesh_text(r['mesh'])} {r['schedule']}: {name}"
            if who != "searched":
                label = f"{r['model']} {r['size']} {mesh_text(r['mesh'])}: {name}"
            if label in seen:
                continue
            seen.add(label)
            rows.append(
                {
                    "plan": label,
                    "collective_ratio": ratio(
                        x["predicted_collective_bytes"], x["collective_bytes"]
                    ),
                    "peak_memory_ratio": ratio(x["predicted_peak_bytes"], x["peak_bytes"]),
                    "argument_ratio": ratio(x["predicted_argument_bytes"], x["argument_bytes"]),
                    "predicted_collective_bytes": x["predicted_collective_bytes"],
                    "collective_bytes": x["collective_bytes"],
                    "predicted_peak_bytes": x["predicted_peak_bytes"],
                    "peak_bytes": x["peak_bytes"],
                    "ok": x["ok"],
                }
            )
    return {
        "collectives": _summary([(r["plan"], r["collective_ratio"]) for r in rows]),
        "peak_memory": _summary([(r["plan"], r["peak_memory_ratio"]) for r in rows]),
        "argument_memory": _summary([(r["plan"], r["argument_ratio"]) for r in rows]),
        "verify_ok": sum(1 for r in rows if r["ok"]),
        "rows": rows,
    }
