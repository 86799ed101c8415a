"""Explain a plan: where its collectives come from, and what the search chose per axis."""

from __future__ import annotations

from collections import defaultdict

from partir.ir.cost import fmt_bytes, fmt_seconds


def _where(source: str) -> str:
    """`dot_general (op 12) at model.py:40:8 (block)` -> `model.py:40 (block)`."""
    if " at " not in source:
        return source.split(" (op")[0]
    loc = source.split(" at ", 1)[1]
    file_line, _, fn = loc.partition(" ")
    parts = file_line.split(":")
    return f"{parts[0].rsplit('/', 1)[-1]}:{parts[1] if len(parts) > 1 else ''} {fn}".strip()


def explain(goal, plan, *, plot: str | None = None, top: int = 25) -> str:
    cost = plan.cost
    model = goal.cost_model
    rows: dict[tuple[str, str, tuple], list[float]] = defaultdict(lambda: [0, 0.0, 0])
    for c in cost.collectives:
        op_kind = c.source.split(" (op")[0]
        key = (c.kind, f"{op_kind} at {_where(c.source)}", c.axes)
        r = rows[key]
        r[0] += c.total_bytes
        r[1] += c.count * model.collective_time(c.kind, c.axes, c.bytes)
        r[2] += c.count
    lines = [str(cost), "", f"where the collectives come from (top {top} by time):"]
    lines.append(f"{'kind':<19}{'axes':<16}{'count':>6}{'bytes':>12}{'time':>12}  source")
    for (kind, where, axes), (nbytes, t, n) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(
            f"{kind:<19}{','.join(axes):<16}{n:>6}{fmt_bytes(nbytes):>12}{fmt_seconds(t):>12}  "
            f"{where}"
        )
    axes = plan.search.get("axes", [])
    if axes:
        lines += ["", "decisions, axis by axis (schedule order):"]
        for a in axes:
            chosen = ", ".join(a["chosen"]) or "nothing beyond its required decisions"
            lines.append(
                f"  {a['axis']}: {a['actions_after']} actions after analysis (of "
                f"{a['actions_before']}), {a['episodes']} episodes; chose {chosen}"
            )
    if plot:
        lines.append(_plot(plan, plot))
    return "\n".join(lines)


def _plot(plan, prefix: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plots need matplotlib: pip install 'partir[plot]'"
    fig, ax = plt.subplots(figsize=(6, 4))
    offset = 0
    for a in plan.search.get("axes", []):
        curve = a["curve"]
        if curve:
            ax.step([offset + e for e, _, _ in curve], [r for _, _, r in curve], where="post",
                    label=f"axis {a['axis']}")  # fmt: skip
        offset += a["episodes"]
    ax.set_xlabel("episode")
    ax.set_ylabel("best reward (higher is faster)")
    ax.legend()
    path = f"{prefix}-search.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return f"wrote {path}"
