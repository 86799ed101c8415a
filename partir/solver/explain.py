"""Explain a plan: where its collectives come from, and what the search chose per axis."""

from __future__ import annotations

from collections import defaultdict

from partir.ir.groups import param_prefix
from partir.ir.messages import fmt_bytes, fmt_seconds


def _where(source: str) -> str:
    """`dot_general (op 12) at model.py:40:8 (block)` -> `model.py:40 (block)`."""
    if " at " not in source:
        return source.split(" (op")[0]
    loc = source.split(" at ", 1)[1]
    file_line, _, fn = loc.partition(" ")
    parts = file_line.split(":")
    return f"{parts[0].rsplit('/', 1)[-1]}:{parts[1] if len(parts) > 1 else ''} {fn}".strip()


def layer_of_ops(goal) -> list[str]:
    """A layer name per op: the layer (`layers/3`, `embed`, ...) of the nearest op at or
    before it, in program order, that reads a parameter or optimizer state directly.
    Forward and backward ops of a layer both read its weights, so they land in it."""
    prog = goal.program
    prefix = param_prefix(prog)
    tag_of_input = {}
    for path, vid in prog.inputs.items():
        parts = path.split("/")
        if "layers" in parts and parts.index("layers") + 1 < len(parts):
            i = parts.index("layers")
            tag_of_input[vid] = "/".join(parts[i : i + 2])
        elif prefix is not None and path.startswith(prefix + "/"):
            tag_of_input[vid] = path[len(prefix) + 1 :].split("/")[0]
    out, current = [], "(inputs)"
    for op in prog.ops:
        for v in op.inputs:
            if v in tag_of_input and op.primitive != "_link":
                current = tag_of_input[v]
                break
        out.append(current)
    return out


def per_layer(goal, plan) -> dict[str, tuple[float, float]]:
    """{layer: (compute seconds, communication seconds)} of the plan's cost."""
    model, prog = goal.cost_model, goal.program
    layers = layer_of_ops(goal)
    out: dict[str, list[float]] = {}
    for op, layer in zip(prog.ops, layers):
        c = model.op_cost(op.index, plan.state)
        row = out.setdefault(layer, [0.0, 0.0])
        row[0] += model.op_seconds(op.index, c)
        row[1] += op.multiplicity * sum(
            model.collective_time(k, a, b) for k, a, b, _ in c.collectives
        )
    return {k: (v[0], v[1]) for k, v in out.items()}


def explain(goal, plan, *, plot: str | None = None, top: int = 25) -> str:
    cost = plan.cost
    model = goal.cost_model
    layers = layer_of_ops(goal)
    rows: dict[tuple[str, str, tuple], list[float]] = defaultdict(lambda: [0, 0.0, 0])
    for c in cost.collectives:
        op_kind = c.source.split(" (op")[0]
        op_index = int(c.source.split("(op ")[1].split(")")[0]) if "(op " in c.source else 0
        key = (c.kind, f"{layers[op_index]}: {op_kind} at {_where(c.source)}", c.axes)
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
    lines += ["", "per layer (estimates):", f"{'layer':<22}{'compute':>12}{'comm':>12}"]
    for layer, (comp, comm) in per_layer(goal, plan).items():
        lines.append(f"{layer:<22}{fmt_seconds(comp):>12}{fmt_seconds(comm):>12}")
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
            ax.step(
                [offset + e for e, _, _ in curve],
                [r for _, _, r in curve],
                where="post",
                label=f"axis {a['axis']}",
            )
        offset += a["episodes"]
    ax.set_xlabel("episode")
    ax.set_ylabel("best reward (higher is faster)")
    ax.legend()
    path = f"{prefix}-search.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    written = [path]
    explored = plan.search.get("explored", [])
    if explored:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.scatter(
            [m / 2**30 for _, m in explored], [t for t, _ in explored], s=8, label="plans explored"
        )
        ax.scatter(
            [plan.cost.peak_memory_bytes / 2**30],
            [plan.cost.step_time_s],
            c="red",
            marker="*",
            s=120,
            label="chosen",
        )
        ax.set_xlabel("peak memory per device, GiB (estimate)")
        ax.set_ylabel("step time, s (estimate)")
        ax.set_yscale("log")
        ax.legend()
        path = f"{prefix}-explored.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return "wrote " + ", ".join(written)
