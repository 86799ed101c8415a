"""Hold a plan's predicted cost against what XLA compiles for it on fake CPU devices."""

from __future__ import annotations

import dataclasses
import itertools
import math

from partir.ir.cost import KINDS
from partir.ir.groups import find_groups
from partir.ir.messages import fmt_bytes
from partir.ir.propagate import join_axes, split_axes
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


def unclaimed(plan) -> str | None:
    """Why the cost model does not claim to match XLA's collectives on `plan`, or None when
    it does (docs/testing.md lists these):

    - moving a mesh axis from one dim of a value to another (an all-to-all in the model):
      XLA:CPU realises it as an all-to-all, collective-permutes, an all-gather and a slice,
      or avoids it by running a reader another way, depending on the neighbouring ops;
    - concatenating, slicing, splitting or padding along a dim cut by a mesh axis: the model
      gathers the dim or takes a local slice, XLA shifts the pieces between devices with
      collective-permutes or all-to-alls (a halo exchange);
    - a reshape whose one side is cut on a factor of a merged dim that the other side cannot
      show (the minor factor, its major one whole): the model gathers it, XLA re-lays the
      elements with all-to-alls and collective-permutes where it can;
    - a contraction that leaves a partial sum by slicing one of the program's inputs
      along the contracted dim (a replicated weight against an activation cut along its
      features): XLA all-reduces the partial sum or gathers the activation, possibly
      further up its producers, as its propagation through the neighbouring ops decides;
    - a parameter and its optimizer moments cut in more than one way (the replicated
      parameter of ZeRO-1 with its moments cut one way is claimed): the update re-cuts
      them onto each other, and XLA places and shares those collectives its own way;
    - a dim re-cut from some mesh axes onto others (a bias on x added to an activation on y):
      the model gathers and slices, or sends each tile with a collective-permute where
      both sides have as many tiles; XLA mixes all-gathers and collective-permutes and
      shares them between readers in its own way;
    - an op's result gathered for its readers (computed cut, needed whole): XLA may
      gather a smaller value further up the chain that produces it instead;
    - a reduce-scatter over two devices: XLA:CPU lowers some as an all-reduce of part of
      the operand and collective-permutes (the same bytes in all, of other kinds);
    - a scatter-add (an embedding's gradient) with its indices cut, or a gather (a lookup)
      with its table and its indices cut, or cut indices the model re-cuts: XLA weighs the
      ways to partition these (sum partial results, gather the indices and updates,
      re-cut the table) by its own estimate, the model takes one."""
    mesh, prog, model = plan.goal.mesh, plan.goal.program, plan.goal.cost_model
    for c in plan.cost.collectives:
        if c.kind == "all-to-all":
            return f"moves a mesh axis between dims ({c.source})"
        if c.kind == "reduce-scatter" and math.prod(mesh[a] for a in c.axes) == 2:
            return f"reduce-scatter over two devices ({c.source})"
    for group in find_groups(prog):
        cuts = {_cutting(plan.value_sharding(v), mesh) for v in group.params + group.moments}
        if len({c for c in cuts if any(c)}) > 1:
            return f"{group.name} and its optimizer moments are cut in different ways"
    for op in prog.ops:
        if op.primitive == "scatter-add" and _cut(plan, op.inputs[1]):
            return f"scatter-add with its indices cut (op {op.index})"
        if op.primitive == "gather" and _cut(plan, op.inputs[1]):
            moved = model.execution_shardings(op.index, plan.state)
            if op.inputs[1] in moved or _cut(plan, op.inputs[0]):
                return f"gather with its table and indices cut (op {op.index})"
        for v, want in model.execution_shardings(op.index, plan.state).items():
            if _recut(plan.value_sharding(v), want, mesh):
                return f"{op.primitive} re-cuts an operand onto other axes (op {op.index})"
        colls = model.op_cost(op.index, plan.state).collectives
        if any(kind == "all-gather" and reuse is None for kind, _, _, reuse in colls):
            return f"{op.primitive} result gathered for its readers (op {op.index})"
        if model.slices_an_input_to_reduce(op.index, plan.state):
            return f"{op.primitive} slices an input to leave a partial sum (op {op.index})"
        if op.primitive == "reshape" and _cut_on_a_hidden_factor(plan, op):
            return f"reshape cut on a minor factor of a merged dim (op {op.index})"
        dims = _dims_moved(op, prog.values)
        for v in (*op.inputs, *op.outputs) if dims else ():
            if v is None:
                continue
            sharding = plan.value_sharding(v)
            if any(mesh[a] > 1 for d in dims if d < len(sharding) for a in sharding[d]):
                return f"{op.primitive} along a dim cut by a mesh axis (op {op.index})"
    return None


def _cutting(sharding, mesh) -> tuple:
    return tuple(tuple(a for a in axes if mesh[a] > 1) for axes in sharding)


def _recut(src, dst, mesh) -> bool:
    """Whether some dim of `src` loses mesh axes and gains others in `dst`."""
    for s, t in zip(src, dst):
        s = {a for a in s if mesh[a] > 1}
        t = {a for a in t if mesh[a] > 1}
        if s - t and t - s:
            return True
    return False


def _cut(plan, v: int | None) -> bool:
    """Whether value `v` is cut by a mesh axis of size > 1."""
    mesh = plan.goal.mesh
    return v is not None and any(mesh[a] > 1 for axes in plan.value_sharding(v) for a in axes)


def _cut_on_a_hidden_factor(plan, op) -> bool:
    """Whether a tensor of `op` is cut along a factor that another of its tensors has but
    cannot show in its own dims (a minor factor of a merged dim whose major one is whole)."""
    rule, mesh = op.rule, plan.goal.mesh
    tensors = [
        (v, d)
        for v, d in zip((*op.inputs, *op.outputs), (*rule.operands, *rule.results))
        if v is not None and d is not None
    ]
    for v, dims in tensors:
        sharding = plan.value_sharding(v)
        fa = {
            f: axes
            for d, fs in enumerate(dims)
            if sharding[d]
            for f, axes in split_axes(sharding[d], fs, rule.sizes, mesh)
        }
        for _, other in tensors:
            shown = {a for fs in other for a in join_axes(fs, fa, rule.sizes, mesh)}
            if any(
                mesh[a] > 1 and a not in shown for fs in other for f in fs for a in fa.get(f, ())
            ):
                return True
    return False


def _dims_moved(op, values) -> tuple[int, ...]:
    """The dims along which a concatenate, slice, split or pad op moves elements."""
    p = op.params
    if op.primitive == "concatenate":
        return (p["dimension"],)
    if op.primitive == "split":
        return (p["axis"],)
    if op.primitive == "slice":
        shape = values[op.inputs[0]].shape
        strides = p["strides"] or (1,) * len(shape)
        return tuple(
            d
            for d, n in enumerate(shape)
            if (p["start_indices"][d], p["limit_indices"][d], strides[d]) != (0, n, 1)
        )
    if op.primitive == "pad":
        return tuple(d for d, cfg in enumerate(p["padding_config"]) if any(cfg))
    return ()


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
        )
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
