"""Which values XLA keeps in memory, and from when to when: the static half of the memory model.

XLA never stores every value of a program. What it does, and what this module models:

- Free values: constants broadcast from scalars, iotas, `empty` (lowered as zeros), and layout
  or pointwise ops of only those (a causal mask, the `finfo.min` fill beside it, `zeros_like`).
  XLA fuses them into their readers and never materialises them; any device makes them in any
  sharding.
- Dead code: a value no op reads and the program does not return, and the ops that only feed
  such values. XLA removes them.
- Fusion: a pointwise or layout op whose result is read only by pointwise, layout or
  reduction ops runs inside their kernels (XLA's loop and input fusions): where its readers
  all run in one kernel always, in several only if it is cheap to compute again in each (not
  a transcendental or a division by a computed value, which XLA keeps in a buffer: a division
  by a constant is a multiplication; on GPUs f32 `exp`, division and square roots are
  cheap). Its result is no buffer; its operands are read where the last fused kernel runs,
  and by every kernel it runs in (`Liveness.kernels`: each reads them from memory). Matmul
  and convolution operands are materialised (as
  XLA:CPU's library calls need).
- Loops: a loop's stacked inputs and constants live until the body's last use of them; its
  stacked outputs (a scan's residuals) live from the iteration that first writes them.
- Order: ops run in program order, or, on a device that schedules breadth first (XLA:CPU),
  in the order of `partir.ir.schedule.KernelGraph`; positions below are places in that order.

The state-dependent half (resharded operands, partial sums waiting for their combined
reduction) is added by `CostModel.cost` as extra intervals; `peak` takes both.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence

import numpy as np

from partir.ir.program import Program
from partir.ir.rules import POINTWISE
from partir.ir.schedule import KernelGraph, checkpoint_operands

LAYOUT = frozenset(
    (
        "broadcast_in_dim",
        "reshape",
        "squeeze",
        "expand_dims",
        "transpose",
        "rev",
        "slice",
        "iota",
        "convert_element_type",
        "copy",
        "copy_p",
        "empty",
    )
)
_NOT_FUSED = frozenset(("sharding_constraint", "reshard", "mesh_cast", "optimization_barrier"))
# ops whose one result XLA computes inside its reader's kernel
FUSIBLE = (frozenset(POINTWISE) | LAYOUT) - _NOT_FUSED
# ops that take fused producers as their inputs (loop and input fusion)
FUSES_INPUTS = FUSIBLE | frozenset(
    (
        "reduce_sum",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "reduce_and",
        "reduce_or",
        "argmax",
        "argmin",
    )
)
REDUCTIONS = FUSES_INPUTS - FUSIBLE
# pointwise ops XLA does not duplicate into several readers (transcendentals, division)
EXPENSIVE = frozenset(
    (
        "exp",
        "exp2",
        "expm1",
        "log",
        "log1p",
        "log2",
        "logistic",
        "tanh",
        "div",
        "rem",
        "pow",
        "sqrt",
        "rsqrt",
        "cbrt",
        "erf",
        "erfc",
        "erf_inv",
        "sin",
        "cos",
        "tan",
        "atan2",
        "lgamma",
        "digamma",
        "integer_pow",
    )
)
# pointwise ops XLA's GPU compiler calls cheap on f32 and f16 and duplicates into each reader
# (GpuInstructionFusion::IsExpensive); see `Device.cheap_f32_math`
CHEAP_F32_MATH = frozenset(("div", "sqrt", "rsqrt", "exp"))
# link kinds whose outer value the loop body reads on every iteration
MAX_KERNELS = 8  # a fused op runs in at most this many kernels
_F32_F16 = frozenset((np.dtype(np.float32), np.dtype(np.float16)))
_READ_IN_BODY = frozenset(("const", "xs", "operand"))


def free_values(program: Program) -> set[int]:
    """Values any device can make in any sharding without communication or memory: constants
    broadcast from scalars, iotas, and layout or pointwise ops of only those; inside a loop, the
    constants and sliced inputs bound to free values outside (XLA sinks such loop-invariant
    constants into the body and fuses them there, as JAX's scan hoists them out)."""
    free: set[int] = set()
    vals = program.values
    for op in program.ops:
        if op.primitive == "_link":
            src, dst = op.inputs
            if src in free and dst is not None and op.params["kind"] in ("const", "xs"):
                free.add(dst)
            continue
        if op.primitive not in FUSIBLE or not op.outputs:
            continue
        ins = [v for v in op.inputs if v is not None]
        if op.primitive == "iota":
            free.update(op.outputs)
        elif op.primitive == "broadcast_in_dim":
            if all(vals[v].rank == 0 or v in free for v in ins):
                free.update(op.outputs)
        elif all(v in free for v in ins):  # literals only, or free values only
            free.update(op.outputs)
    return free


@dataclasses.dataclass
class Liveness:
    """Per value: whether it is a buffer and its live range in op positions; per op: whether
    it runs, and the position of the kernel it runs in (its own, or its fused reader's).
    A value read in place is a buffer its readers read, but it is another value's buffer."""

    stored: np.ndarray  # bool per value
    birth: np.ndarray  # int per value
    death: np.ndarray  # int per value
    live_ops: np.ndarray  # bool per op
    position: np.ndarray  # int per op
    free: set[int]
    fused: set[int]
    in_place: set[int]
    loop_extent: dict[int, tuple[int, int]]  # see loop_extents, in positions
    end: int
    readers: list[list[int]]  # per value, the live ops that read it
    layout_copies: list[tuple[int, int]]  # (convolution, operand) it reads a copy of
    donated: set  # the paths of the inputs whose buffers the outputs may reuse
    fused_ops: list[int]  # the ops fused into their readers, latest first
    graph: KernelGraph | None  # the device's schedule (None: program order)
    # values that read a broadcast, fused into reductions on their own: a buffer where the
    # reductions run as library kernels (see `library_read`), with the readers that compute
    # them again then (XLA:CPU duplicates the producer into each kernel that takes it in)
    library_read: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    # per checkpoint region whose optimization barrier XLA keeps, the values it waits for
    # (`schedule.checkpoint_operands`); empty where the barrier is dropped
    barriers: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    # per fused op, the kernels it runs in: each reads the op's stored operands again
    kernels: dict[int, int] = dataclasses.field(default_factory=dict)


def analyse(
    program: Program,
    operands: Sequence[Sequence[int]],
    *,
    donate: bool,
    breadth_first: bool = False,
    checkpoint_barriers: bool = False,
    library_reductions: bool = False,
    convs_need_layout: bool = False,
    cheap_f32_math: bool = False,
) -> Liveness:
    """The liveness of `program`'s values; `operands`: per op, the value ids it reads. With
    `breadth_first`, the kernels run in the order of XLA:CPU's schedule (`KernelGraph`);
    else in program order; with `checkpoint_barriers` too, a checkpoint region's kernels
    wait for all its operands, which are buffers (XLA keeps the barrier on them). With
    `library_reductions`, a pointwise op that reads a broadcast of a computed value and is
    fused into a reduction is in `library_read` (`x - mean` before a variance: a buffer
    where the reduction is a library call, see `Device.library_reductions_from`; the cost
    model decides by its size). With `convs_need_layout`, a convolution that reads an
    operand in another layout than its own reads a copy (`layout_copies`), and the operand
    lives only as long as its other readers need it. With `cheap_f32_math`, f32 and f16
    ops of `CHEAP_F32_MATH` are fused into several readers too (XLA:GPU's rule)."""
    ops, values = program.ops, program.values
    n, end = len(values), len(ops)
    free = free_values(program)
    is_output = np.zeros(n, dtype=bool)
    is_output[list(program.outputs.values())] = True
    is_input = np.zeros(n, dtype=bool)
    is_input[list(program.inputs.values())] = True

    # dead code, backwards from the outputs (loop links keep both their sides)
    live = is_output.copy()
    live_ops = np.zeros(end, dtype=bool)
    for i in range(end - 1, -1, -1):
        op = ops[i]
        if op.primitive == "_link" or any(live[v] for v in op.outputs):
            live_ops[i] = True
            live[list(operands[i])] = True

    readers: list[list[int]] = [[] for _ in values]
    for i, ins in enumerate(operands):
        if live_ops[i]:
            for v in dict.fromkeys(ins):
                readers[v].append(i)

    # fusion, backwards: an op whose one result is fused runs where its reader runs; the
    # operands of a kept optimization barrier are buffers of their own
    barriers = checkpoint_operands(program, operands, live_ops) if checkpoint_barriers else {}
    barred = set().union(*barriers.values())
    fused: set[int] = set()
    fused_ops: list[int] = []  # latest first
    library_read: dict[int, list[int]] = {}  # see Liveness
    into_reduction = np.zeros(end, dtype=bool)  # the op runs in a reduction's kernel
    kernel_sets: dict[int, frozenset[int]] = {}  # per fused op, the kernels it runs in
    for i in range(end - 1, -1, -1):
        op = ops[i]
        if op.primitive in REDUCTIONS:
            into_reduction[i] = True
        if len(op.outputs) != 1 or op.primitive not in FUSIBLE:
            continue
        (v,) = op.outputs
        rs = readers[v]
        if v in free or v in barred or is_output[v] or not rs:
            continue
        if not all(
            ops[r].primitive in FUSES_INPUTS and ops[r].multiplicity == op.multiplicity for r in rs
        ):
            continue
        reach: set[int] = set()
        for r in rs:
            reach |= kernel_sets.get(r, {r})
        if len(reach) > MAX_KERNELS:
            continue  # XLA stores it rather than compute it again in every later kernel
        if len(reach) > 1 and op.primitive in EXPENSIVE and not _divides_by_a_constant(program, op):
            # computed again in each of several kernels: XLA keeps it a buffer instead
            cheap = op.primitive in CHEAP_F32_MATH and values[v].dtype in _F32_F16
            if not (cheap_f32_math and cheap):
                continue
        reduced = any(into_reduction[r] for r in rs)
        if reduced and library_reductions and _reads_a_broadcast(program, op, free):
            library_read[v] = [r for r in rs if not into_reduction[r]]
            continue
        fused.add(v)
        fused_ops.append(i)
        kernel_sets[i] = frozenset(reach)
        into_reduction[i] = reduced
    graph = (
        KernelGraph(program, operands, live_ops, fused | free, barriers) if breadth_first else None
    )
    position = graph.positions()[0] if graph else np.arange(end, dtype=np.int64)

    stored = live.copy()
    stored[list(free | fused)] = False
    stored |= is_input

    lv = Liveness(
        stored,
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        live_ops,
        position,
        free,
        fused,
        _read_in_place(program),
        {},
        end,
        readers,
        _layout_copies(program, live_ops) if convs_need_layout else [],
        set(program.carried.values()) if donate else set(),
        fused_ops,
        graph,
        library_read,
        barriers,
        {i: len(k) for i, k in kernel_sets.items()},
    )
    _place_fused(program, lv, position)
    return _with_ranges(program, operands, lv, position)


def rescheduled(
    program: Program,
    operands: Sequence[Sequence[int]],
    lv: Liveness,
    reductions: Sequence[Sequence[int]],
) -> tuple[Liveness, list[int | None]]:
    """`lv` rescheduled around the combined reductions of partial sums (groups of values,
    see `KernelGraph.positions`), and the position of each; `lv` itself (positions None)
    where its device keeps program order."""
    if lv.graph is None:
        return lv, [None] * len(reductions)
    position, places = lv.graph.positions(reductions)
    _place_fused(program, lv, position)
    # the reductions take places of their own: the schedule may outgrow the op count
    last = max([int(position.max(initial=0)), *(p for p in places if p is not None)])
    if last >= lv.end:
        lv = dataclasses.replace(lv, end=last + 1)
    return _with_ranges(program, operands, lv, position), places


def _place_fused(program: Program, lv: Liveness, position: np.ndarray) -> None:
    """A fused op runs where the last of its readers does (readers first: latest op first)."""
    for i in lv.fused_ops:
        position[i] = max(position[r] for r in lv.readers[program.ops[i].outputs[0]])


def _with_ranges(
    program: Program, operands: Sequence[Sequence[int]], lv: Liveness, position: np.ndarray
) -> Liveness:
    """`lv` with its ops at `position` and each value's live range from there."""
    end = lv.end
    birth, death = _ranges(program, operands, lv.live_ops, position, end)
    for i, u in lv.layout_copies:  # the convolution reads the copy, not `u`
        others = [position[r] for r in lv.readers[u] if r != i]
        death[u] = max([birth[u], *others])
    for v, again in lv.library_read.items():  # a buffer until its last reduction, its
        # operands (it is computed again, or not a buffer) until its last reader
        death[v] = max([birth[v], *(position[r] for r in lv.readers[v] if r not in again)])
        _read_until(program, operands, lv, v, max(position[r] for r in lv.readers[v]), death)
    for path, v in program.inputs.items():
        birth[v] = 0
        if path not in lv.donated:
            death[v] = end
    death[list(program.outputs.values())] = end
    extent = {
        i: (int(position[f]), int(position[la])) for i, (f, la) in loop_extents(program).items()
    }
    _extend_over_loops(program, extent, birth, death)
    birth = np.maximum(birth, 0)
    death = np.maximum(death, birth)
    return dataclasses.replace(lv, birth=birth, death=death, position=position, loop_extent=extent)


def _read_until(
    program: Program,
    operands: Sequence[Sequence[int]],
    lv: Liveness,
    v: int,
    at: int,
    death: np.ndarray,
) -> None:
    """The buffers `v` is computed from (through fused values) live until `at` at least."""
    i = program.producer[v]
    for u in operands[i] if i is not None else ():
        if u in lv.fused:
            _read_until(program, operands, lv, u, at, death)
        elif lv.stored[u]:
            death[u] = max(death[u], at)


def _in_conv_layout(spec: Sequence[int], kernel: bool) -> bool:
    """Whether an operand whose dims a convolution names by `spec` (lhs: batch, feature,
    spatial...; rhs: out, in, spatial...) is in the order XLA:CPU's convolutions read, major
    to minor: batch, spatial, feature for activations; spatial, in, out for kernels."""
    spatial = list(spec[2:])
    order = [*spatial, spec[1], spec[0]] if kernel else [spec[0], *spatial, spec[1]]
    return order == sorted(order)


def _layout_copies(prog: Program, live_ops: np.ndarray) -> list[tuple[int, int]]:
    """(convolution, operand) pairs where the operand's dims are not in the order the
    device's convolution reads them (the kernel-gradient convolution of a backward pass reads
    the activations with batch and feature swapped), so XLA copies it into that layout first.
    An operand made by a copy of its own (a transposed or reversed kernel) is made in that
    layout."""
    pairs = []
    for i, op in enumerate(prog.ops):
        if op.primitive != "conv_general_dilated" or not live_ops[i]:
            continue
        dn = op.params["dimension_numbers"]
        for u, spec, kernel in (
            (op.inputs[0], dn.lhs_spec, False),
            (op.inputs[1], dn.rhs_spec, True),
        ):
            if u is None:
                continue
            made = prog.producer[u]
            if not _in_conv_layout(spec, kernel) and (
                made is None or prog.ops[made].primitive not in ("transpose", "rev")
            ):
                pairs.append((i, u))
    return pairs


def _divides_by_a_constant(program: Program, op) -> bool:
    """Whether `op` divides by a constant (a literal, or layout ops of literals): XLA's
    algebraic simplifier makes it a multiplication by the inverse, no expensive op."""
    if op.primitive != "div":
        return False
    v = op.inputs[1]
    while v is not None:
        i = program.producer[v]
        if i is None or program.ops[i].primitive not in LAYOUT or len(program.ops[i].inputs) != 1:
            return False
        (v,) = program.ops[i].inputs
    return True


def _reads_a_broadcast(program: Program, op, free: set[int]) -> bool:
    """Whether `op` reads a computed value broadcast to a larger shape (not a constant's), by
    a `broadcast_in_dim` or by its own size-1 dims (`x - mean` with `keepdims`)."""
    for v in op.inputs:
        if v is None or v in free:
            continue
        i = program.producer[v]
        if i is not None and program.ops[i].primitive == "broadcast_in_dim":
            return True
        if i is not None and op.outputs:  # broadcast by the op itself: size-1 dims
            shape, out = program.values[v].shape, program.values[op.outputs[0]].shape
            if len(shape) == len(out) and any(a == 1 < b for a, b in zip(shape, out)):
                return True
    return False


def _read_in_place(program: Program) -> set[int]:
    """The inner sides of links whose body reads the outer buffer itself: a loop's constants
    and a branch's operands (XLA passes them into the body or branch as they are)."""
    return {
        op.inputs[1]
        for op in program.ops
        if op.primitive == "_link"
        and op.params["kind"] in ("const", "operand")
        and op.inputs[1] is not None
    }


def _ranges(program, operands, live_ops, position, end) -> tuple[np.ndarray, np.ndarray]:
    """Each value from the kernel that makes it (values only read: from their first reader)
    to its last reader, in kernel positions."""
    n = len(program.values)
    ops = [i for i in range(len(program.ops)) if live_ops[i]]
    reads = [operands[i] for i in ops]
    made = [program.ops[i].outputs for i in ops]
    pos = position[ops] if ops else np.zeros(0, dtype=np.int64)
    read_v = np.fromiter(itertools.chain.from_iterable(reads), np.int64)
    read_at = np.repeat(pos, np.fromiter(map(len, reads), np.int64, count=len(ops)))
    made_v = np.fromiter(itertools.chain.from_iterable(made), np.int64)
    made_at = np.repeat(pos, np.fromiter(map(len, made), np.int64, count=len(ops)))
    birth = np.full(n, end + 1, dtype=np.int64)
    np.minimum.at(birth, read_v, read_at)
    np.minimum.at(birth, made_v, made_at)
    birth[birth > end] = -1
    death = np.full(n, -1, dtype=np.int64)
    np.maximum.at(death, read_v, read_at)
    np.maximum.at(death, made_v, made_at)
    return birth, death


def _extend_over_loops(
    program: Program, extent: dict[int, tuple[int, int]], birth: np.ndarray, death: np.ndarray
) -> None:
    """A loop's constants and stacked inputs live until the loop ends (its body reads them on
    every iteration), a branch's operands while the branch reads them; a loop's stacked
    outputs from the loop's start (every iteration writes one slice of the one buffer).
    Inner loops first (their links come later)."""
    for i in range(len(program.ops) - 1, -1, -1):
        op = program.ops[i]
        if op.primitive != "_link":
            continue
        src, dst = op.inputs
        kind = op.params["kind"]
        first, last = extent.get(i, (-1, -1))  # (every ys link has its loop)
        if kind in _READ_IN_BODY:
            death[src] = max(death[src], death[dst], last)
        elif kind == "ys" and birth[dst] >= 0:  # src: the stacked result, dst: one iteration's
            birth[src] = min(birth[src], first) if birth[src] >= 0 else first


def loop_extents(program: Program) -> dict[int, tuple[int, int]]:
    """{link op: (first op, last op) of its loop}, for the links that bind a loop's
    constants and stacked inputs and those that collect its stacked outputs."""
    extent: dict[int, tuple[int, int]] = {}
    for first, last in sorted(program.loops):  # outer loops first: inner ones overwrite
        for i in range(first, last + 1):
            op = program.ops[i]
            if op.primitive == "_link" and op.params["kind"] in ("const", "xs", "ys"):
                extent[i] = (first, last)
    return extent


def peak(
    nbytes: np.ndarray, lv: Liveness, extra: Iterable[tuple[int, int, float]] = ()
) -> tuple[int, int]:
    """(position, bytes) of the largest total of live buffers: `nbytes` per value (zero for
    values that are no buffer), plus `extra` (start, end, bytes) intervals, ends inclusive."""
    diff = np.zeros(lv.end + 2)
    np.add.at(diff, lv.birth, nbytes)
    np.add.at(diff, lv.death + 1, -nbytes)
    for start, stop, b in extra:
        diff[start] += b
        diff[stop + 1] -= b
    live = np.cumsum(diff)
    at = int(live.argmax())
    return at, int(live[at])


def live_at(nbytes: np.ndarray, lv: Liveness, at: int) -> list[int]:
    """The values whose buffers are live at position `at`, largest first."""
    ids = np.nonzero((lv.birth <= at) & (lv.death >= at) & (nbytes > 0))[0]
    return [int(v) for v in ids[np.argsort(-nbytes[ids], kind="stable")]]
