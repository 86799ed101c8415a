"""The cost of a propagated state, per device: collectives, memory, FLOPs and a step time.

Each op runs with one sharding of its factors ("execution sharding"): taken from its
operands first, in order, then from its results for factors the operands leave whole; an
axis serves at most one factor. Operands that disagree are resharded (all-gather,
all-to-all, or a free local slice); a sharded reduction factor leaves a partial sum, an
all-reduce (one per factor, as XLA reduces each sharded dim on its own), or a reduce-scatter
where the result is itself tiled on that axis.

Step time is an estimate: compute as max(FLOPs / peak, bytes / HBM bandwidth) per op, plus
every collective on an alpha-beta ring model per mesh axis, with no overlap. Collectives
of one kind over the same axes that cannot depend on each other (the same number of
collectives on the longest chain before them) pay their latency once, as XLA's collective
combiners fuse them into one (the gradient all-reduces of data parallelism, the parameter
all-gathers of ZeRO-3); the combiners' size thresholds are not modelled. Memory is an
estimate too: live bytes in program order (arguments live throughout, unless donated); a
loop's constants are read in place, its stacked inputs and outputs are one buffer each for
the whole loop, and a resharded loop input is held until the loop ends. On a device whose
all-gather concatenates along the major-most dim only (`Device.gathers_major_most`, XLA:CPU),
a gather behind a longer dim leaves a copy in the default layout, and a layer stack whose
slices are gathered is copied once before its loop. `partir.verify` holds both against what
XLA compiles.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence, Set

import numpy as np

from partir.ir import liveness
from partir.ir.devices import Device
from partir.ir.groups import relayouts
from partir.ir.messages import fmt_bytes, fmt_seconds
from partir.ir.program import Program
from partir.ir.propagate import Axes, Propagator, Sharding, State, join_axes, split_axes
from partir.ir.resharding import local_size, reshard
from partir.ir.rules import Kind

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# how tables abbreviate the kinds
KIND_ABBREVIATIONS = {
    "all-reduce": "AR",
    "all-gather": "AG",
    "reduce-scatter": "RS",
    "all-to-all": "A2A",
    "collective-permute": "CP",
}
_NO_FLOPS = {
    "_link",
    "broadcast_in_dim",
    "reshape",
    "transpose",
    "squeeze",
    "expand_dims",
    "slice",
    "dynamic_slice",
    "dynamic_update_slice",
    "concatenate",
    "pad",
    "rev",
    "copy",
    "copy_p",
    "convert_element_type",
    "iota",
    "gather",
    "split",
    "sharding_constraint",
    "name",
    "optimization_barrier",
    "bitcast_convert_type",
    "stop_gradient",
    "stack",
    "unstack",
    "reshard",
    "mesh_cast",
    "random_wrap",
    "random_unwrap",
    "random_clone",
}


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective, per device. `bytes`: the whole array it reduces or produces, for one
    execution; `count`: executions per step (a loop body runs `count` times)."""

    kind: str
    axes: tuple[str, ...]
    bytes: int
    source: str = ""
    count: int = 1

    @property
    def total_bytes(self) -> int:
        return self.bytes * self.count


@dataclasses.dataclass
class Cost:
    """Per-device cost of a plan. Times and memory are estimates of the model above."""

    step_time_s: float
    compute_s: float
    comm_s: float
    argument_bytes: int
    peak_memory_bytes: int
    comm_bytes: int
    flops: float
    collectives: list[Collective]
    comm_s_by_kind: dict[str, float]
    memory_limit: int | None = None
    hbm_bytes: float = 0.0  # bytes the kernels read and write, fused values none

    @property
    def fits(self) -> bool:
        return self.memory_limit is None or self.peak_memory_bytes <= self.memory_limit

    def bytes_by_kind(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for c in self.collectives:
            out[c.kind] += c.total_bytes
        return out

    def count_by_kind(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for c in self.collectives:
            out[c.kind] += c.count
        return out

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["collectives"] = [dataclasses.asdict(c) for c in self.collectives]
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Cost:
        d = dict(d)
        d["collectives"] = [
            Collective(
                c["kind"], tuple(c["axes"]), c["bytes"], c.get("source", ""), c.get("count", 1)
            )
            for c in d["collectives"]
        ]
        return cls(**d)

    def __str__(self) -> str:
        lines = [
            f"step time  {fmt_seconds(self.step_time_s)} (estimate: compute "
            f"{fmt_seconds(self.compute_s)}, communication {fmt_seconds(self.comm_s)})",
            f"memory     {fmt_bytes(self.peak_memory_bytes)} peak per device (estimate), "
            f"arguments {fmt_bytes(self.argument_bytes)}"
            + (f", limit {fmt_bytes(self.memory_limit)}" if self.memory_limit else ""),
        ]
        counts, sizes = self.count_by_kind(), self.bytes_by_kind()
        for kind in KINDS:
            if counts[kind]:
                lines.append(
                    f"{kind:<19}{counts[kind]:>6} x, {fmt_bytes(sizes[kind]):>10} per device, "
                    f"{fmt_seconds(self.comm_s_by_kind.get(kind, 0.0))}"
                )
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class OpCost:
    flops: float
    bytes: float
    # (kind, axes, bytes, reuse key): an operand resharded the same way twice is one
    # collective, since XLA computes it once and keeps it (the key is (value, src, dst))
    collectives: tuple[tuple[str, Axes, int, tuple | None], ...]
    # a result left as a partial sum: (kind, axes) of its reduction and the bytes of the
    # unreduced buffer, which lives until the (combined) reduction runs
    partial: tuple[str, Axes, int] | None = None


class CostModel:
    """Costs states of one program on one mesh and device; per-op costs are memoised, so
    costing a state that differs from the last in a few values is cheap."""

    def __init__(
        self,
        propagator: Propagator,
        device: Device,
        *,
        memory_limit: int | None = None,
        donate: bool = False,
    ) -> None:
        self.prop = propagator
        self.program: Program = propagator.program
        self.mesh = propagator.mesh
        self.device = device
        self.memory_limit = memory_limit
        self.bandwidth = device.axis_bandwidths(self.mesh)
        self._templates: dict[tuple, OpCost] = {}  # (op kind, shardings) -> its cost
        self._ways: dict[Sharding, int] = {}  # see _ways_of
        self._operands = propagator.operands
        prog = self.program
        keeps_barriers = device.schedules_breadth_first and not device.merges_recompute()
        self.liveness = liveness.analyse(
            prog,
            self._operands,
            donate=donate,
            breadth_first=device.schedules_breadth_first,
            checkpoint_barriers=keeps_barriers,
            library_reductions=device.library_reductions_from is not None,
            convs_need_layout=device.convs_need_layout,
            cheap_f32_math=device.cheap_f32_math,
        )
        self.free = self.liveness.free
        # what each op's results wait for, for the chains XLA's combiners look at: its
        # operands, and in a checkpoint region whose barrier XLA keeps, all the region's
        # operands
        self._waits_for: list[Sequence[int]] = list(self._operands)
        region_operands = self.liveness.barriers
        for i, op in enumerate(prog.ops):
            if op.region in region_operands:
                both = [*self._operands[i], *region_operands[op.region]]
                self._waits_for[i] = tuple(dict.fromkeys(both))
        self._stored = self.liveness.stored.tolist()
        # where the device scatters whole: the stored values, no outputs, that only kernels
        # taking a slice of their operands in read (see _unreduced)
        self._slices_fused: set[int] = set()
        if device.scatters_whole:
            outputs = set(prog.outputs.values())
            self._slices_fused = {
                v
                for v, rs in enumerate(self.liveness.readers)
                if rs
                and self._stored[v]
                and v not in outputs
                and all(prog.ops[r].primitive in liveness.FUSES_INPUTS for r in rs)
            }
        self._live_ops = self.liveness.live_ops.tolist()
        self.is_input = np.zeros(len(prog.values), dtype=bool)
        self.is_input[list(prog.inputs.values())] = True
        # what each value holds in memory, unsharded: nothing for a value that is no buffer
        self.global_bytes = np.array([v.nbytes for v in prog.values], dtype=np.float64)
        self.global_bytes[~self.liveness.stored] = 0.0
        self.global_bytes[list(self.liveness.in_place)] = 0.0
        # buffers only where the reductions that read them are library calls (Device docs):
        # f32 values of at least `library_reductions_from` elements per device
        read = [v for v in self.liveness.library_read if prog.values[v].dtype == np.float32]
        self.global_bytes[[v for v in self.liveness.library_read if v not in read]] = 0.0
        self._library_read = np.array(read, dtype=np.int64)
        self._itemsize = [v.itemsize for v in prog.values]
        self._kinds = self._op_kinds()  # see op_cost
        # links from a carried output to its input: the step returns the state resharded
        # to how it came in, and that buffer is an output (live to the end)
        self._state_links = {
            i
            for i, op in enumerate(prog.ops)
            if op.primitive == "_link" and op.params.get("kind") == "state"
        }
        # where the device gathers along the major-most dim only (Device docs): per loop slice
        # of a layer stack, the stack, and per stack the span its copy lives over
        self._stack_of: dict[int, int] = {}
        self._stack_span: dict[int, tuple[int, int]] = {}
        if device.gathers_major_most:
            self._stack_of, self._stack_span = _loop_slices(prog, self.liveness)
        # a loop input resharded where the loop binds it is held until the loop ends
        self._loop_end = {
            i: last
            for i, (_, last) in liveness.loop_extents(prog).items()
            if prog.ops[i].params["kind"] != "ys"
        }
        self._schedules: dict[tuple, tuple[liveness.Liveness, list]] = {}  # see _scheduled

    # -- memory -----------------------------------------------------------------------

    def local_bytes(self, state: State) -> np.ndarray:
        lb = self.global_bytes.copy()
        if state.shardings:
            ways = self._ways
            vids = np.fromiter(state.shardings, dtype=np.int64, count=len(state.shardings))
            lb[vids] /= np.fromiter(
                (ways.get(s) or self._ways_of(s) for s in state.shardings.values()),
                dtype=np.float64,
                count=len(vids),
            )
        if self._library_read.size and self.device.library_reductions_from:
            f32_bytes = 4 * self.device.library_reductions_from
            small = lb[self._library_read] < f32_bytes
            lb[self._library_read[small]] = 0.0
        return lb

    def _ways_of(self, s: Sharding) -> int:
        """How many pieces sharding `s` cuts a value into (memoised)."""
        n = self._ways[s] = math.prod(self.prop.size(axes) for axes in s)
        return n

    # -- per-op costs -----------------------------------------------------------------
    def _drop_trivial(self, c: OpCost) -> OpCost:
        """Collectives over mesh axes of size 1 move nothing: XLA emits none."""
        kept = []
        for kind, axes, nbytes, reuse in c.collectives:
            axes = tuple(a for a in axes if self.mesh[a] > 1)
            if axes:
                kept.append((kind, axes, nbytes, reuse))
        partial = c.partial
        if partial is not None:
            axes = tuple(a for a in partial[1] if self.mesh[a] > 1)
            partial = (partial[0], axes, partial[2]) if axes else None
        if len(kept) == len(c.collectives) and partial == c.partial:
            return c
        return OpCost(c.flops, c.bytes, tuple(kept), partial)

    def op_cost(self, i: int, state: State) -> OpCost:
        """How op `i` runs in `state`. Ops of one kind (rule, dtypes, which tensors are one
        value and which are free; an op of each repeated layer) with the same shardings
        cost the same: computed once, its reuse keys rebound to op `i`'s values."""
        vids = self.prop.vids[i]
        key = (self._kinds[i], tuple(map(state.shardings.get, vids)))
        template = self._templates.get(key)
        if template is None:
            op = self.program.ops[i]
            full = [s or ((),) * len(self.prop.shapes[v]) for v, s in zip(vids, key[1])]
            c = self._drop_trivial(self._op_cost(op, full))
            template = self._templates[key] = OpCost(
                c.flops,
                c.bytes,
                tuple(
                    (k, axes, n, None if r is None else (vids.index(r[0]),) + r[1:])
                    for k, axes, n, r in c.collectives
                ),
                c.partial,
            )
        if not template.collectives or not _moves_operands(template):
            return template
        return OpCost(
            template.flops,
            template.bytes,
            tuple(
                (k, axes, n, None if r is None else (vids[r[0]],) + r[1:])
                for k, axes, n, r in template.collectives
            ),
            template.partial,
        )

    def op_seconds(self, i: int, c: OpCost) -> float:
        """Op `i`'s compute time at cost `c`, all its repeats: FLOPs or HBM traffic, whichever
        takes longer; a fused op reads its stored operands once per kernel it runs in."""
        dev = self.device
        nbytes = c.bytes * self.liveness.kernels.get(i, 1)
        return self.program.ops[i].multiplicity * max(
            c.flops / dev.flops, nbytes / dev.hbm_bandwidth
        )

    def slices_an_input_to_reduce(self, i: int, state: State) -> bool:
        """Whether op `i` leaves a partial sum along a factor that one of its operands, an
        input of the program, is not cut along (that input is sliced locally). XLA may
        gather the other operands instead, as its propagation through the neighbouring ops
        decides; `partir.verify`'s exclusions name these."""
        if self.op_cost(i, state).partial is None:
            return False
        vids = self.prop.vids[i]
        shardings = [state.shardings.get(v) or ((),) * len(self.prop.shapes[v]) for v in vids]
        tensors = self.prop.tensors(i)
        n_in = sum(1 for v in self.program.ops[i].inputs if v is not None)
        return bool(
            self._reductions_uncut(self.program.ops[i].rule, tensors[:n_in], shardings[:n_in])
        )

    def _op_kinds(self) -> list[int]:
        """Per op, what its cost depends on besides the shardings: its propagation kind,
        primitive, and per tensor the item size, whether it is free and whether it is a
        buffer, numbered (a small int hashes faster in the template keys)."""
        sizes = [
            (v.itemsize, k in self.free, self._stored[k]) for k, v in enumerate(self.program.values)
        ]
        size = sizes.__getitem__
        number: dict[tuple, int] = {}
        return [
            number.setdefault((kind, op.primitive, tuple(map(size, vids))), len(number))
            for op, kind, vids in zip(self.program.ops, self.prop.kinds, self.prop.vids)
        ]

    def execution_shardings(self, i: int, state: State) -> dict[int, Sharding]:
        """The shardings op `i`'s operands are resharded to before it runs, by value id;
        operands it uses as they are sharded are absent."""
        return {r[0]: r[2] for *_, r in self.op_cost(i, state).collectives if r is not None}

    def _op_cost(self, op, shardings: list[Sharding]) -> OpCost:
        """How the op runs: if some execution sharding keeps every operand as it is, the
        cheapest of those (a sharded contraction then ends in an all-reduce or a
        reduce-scatter), as XLA's SPMD partitioner chooses; otherwise the one that moves the
        fewest bytes (plan.jit pins the operands to it). Producing the result as it is
        sharded and resharding operands to match, which XLA does left to itself, moved 2.4x
        the bytes on MaxText's plan for a Llama (all-to-alls of weights)."""
        tensors = self.prop.tensors(op.index)
        if op.primitive == "_link":
            return self._link_cost(op, tensors, shardings)
        n = len(shardings)
        n_in = sum(1 for v in op.inputs if v is not None)
        keeps: OpCost | None = None
        keeps_order: list[int] = []
        cands: list[OpCost] = []
        for first in range(n):
            order = [first] + [t for t in range(n) if t != first]
            cand = self._run_with(op, tensors, shardings, order)
            if not cand.collectives:
                return cand
            if not _moves_operands(cand) and (keeps is None or _weight(cand) < _weight(keeps)):
                keeps, keeps_order = cand, order
            # on a tie, the result as it is sharded first (XLA's own choice)
            cands.insert(0 if first == n_in else len(cands), cand)
        if keeps is not None and keeps.partial is not None:
            uncut = self._reductions_uncut(op.rule, tensors[:n_in], shardings[:n_in])
            if uncut:
                # an input sliced along a contraction to leave a partial sum: XLA gathers
                # the other operands instead where that moves fewer bytes
                gathered = self._run_with(op, tensors, shardings, keeps_order, skip=uncut)
                if _choice(gathered) < (False, _weight(keeps)):
                    return gathered
        return keeps or min(cands, key=_choice, default=OpCost(0.0, 0.0, ()))

    def _idle_axes(self, shardings: Sequence[Sharding], scatter: Sequence[str]) -> Axes | None:
        """The mesh axes no tensor of the op is sharded on, where their devices are a multiple
        of the scatter axes' (XLA's partitioner computes a reduce-scattered result on a part
        of them), or None."""
        used = {a for sh in shardings for axes in sh for a in axes}
        idle = tuple(a for a in self.mesh if a not in used and self.mesh[a] > 1)
        want = math.prod(self.mesh[a] for a in scatter)
        if not idle or math.prod(self.mesh[a] for a in idle) % want:
            return None
        return idle

    def _run_with(
        self, op, tensors, shardings: list[Sharding], order: list[int], skip: Set[int] = frozenset()
    ) -> OpCost:
        """How the op runs when the tensors in `order` claim the factors they are sharded
        on, except the reduction factors in `skip` (operands are gathered along those)."""
        rule = op.rule
        prop = self.prop
        mesh = self.mesh
        n_in = sum(1 for v in op.inputs if v is not None)
        # execution sharding: tensors in `order` claim factors; an axis serves one factor
        fa: dict[int, Axes] = {}
        used: set[str] = set()
        for t in order:
            dims, s = tensors[t][1], shardings[t]
            for d, fs in enumerate(dims):
                if not s[d]:
                    continue
                for f, axes in split_axes(s[d], fs, rule.sizes, mesh):
                    kind = rule.kinds[f]
                    if f in fa or used & set(axes):
                        continue
                    if kind is Kind.PASS or (kind is Kind.REDUCTION and f not in skip and t < n_in):
                        fa[f] = axes
                        used |= set(axes)
        colls: list[tuple[str, Axes, int, tuple | None]] = []
        nbytes = 0.0  # HBM traffic: buffers read and written (fused and free values are none)
        by_factor = [axes for f, axes in fa.items() if rule.kinds[f] is Kind.REDUCTION]
        partial = [a for axes in by_factor for a in axes]
        unreduced = None
        split = 1  # devices that share the op's work (idle axes, see below)
        stored, free = self._stored, self.free
        for t, ((v, dims), s) in enumerate(zip(tensors, shardings)):
            shape = prop.shapes[v]
            item = self.program.values[v].itemsize
            want = tuple(join_axes(fs, fa, rule.sizes, mesh) for fs in dims)
            if t < n_in:
                if v not in free:
                    reuse = (v, s, want)
                    colls += [c + (reuse,) for c in reshard(shape, item, s, want, mesh)]
                if stored[v] or v not in free and s != want:
                    nbytes += local_size(shape, want, mesh) * item
            else:
                cur = want
                scatter = [a for a in partial if any(a in axes for axes in s)]
                idle = (
                    self._idle_axes(shardings, scatter)
                    if scatter and op.primitive in ("dot_general", "conv_general_dilated")
                    else None
                )
                if idle:
                    # XLA's dot and convolution partitioner computes each shard of the
                    # result on a part of the idle devices (1/n of the FLOPs each),
                    # all-reduces it over the reduction's axes and permutes it into place
                    cur = tuple(
                        c + tuple(a for a in axes if a in scatter and a not in c)
                        for c, axes in zip(cur, s)
                    )
                    size = local_size(shape, cur, mesh) * item
                    unreduced = ("all-reduce", tuple(partial), size)
                    colls += [("all-reduce", axes, size, None) for axes in by_factor]
                    colls.append(("collective-permute", idle, size, None))
                    split = math.prod(mesh[a] for a in scatter)
                elif partial:
                    # scatter first, then all-reduce the scattered shard over the rest
                    reduce = [a for a in partial if a not in scatter]
                    size = local_size(shape, cur, mesh) * item
                    unreduced = (
                        "reduce-scatter" if scatter else "all-reduce",
                        tuple(scatter or reduce),
                        size,
                    )
                    if scatter:
                        colls.append(("reduce-scatter", tuple(scatter), size, None))
                        cur = tuple(
                            c + tuple(a for a in axes if a in scatter and a not in c)
                            for c, axes in zip(cur, s)
                        )
                    size = local_size(shape, cur, mesh) * item
                    for axes in by_factor:  # XLA reduces each sharded factor on its own
                        rest = tuple(a for a in axes if a in reduce)
                        if rest:
                            colls.append(("all-reduce", rest, size, None))
                # a factor the op is cut along that the result dim cannot show (the minor
                # factor of a merged dim, its major one whole) is gathered to make the result
                lost = tuple(
                    a
                    for fs in dims
                    for f in fs
                    if f in fa
                    for a in fa[f]
                    if not any(a in axes for axes in want)
                )
                if lost and v not in free:
                    colls.append(("all-gather", lost, local_size(shape, cur, mesh) * item, None))
                colls += [c + (None,) for c in reshard(shape, item, cur, s, mesh)]
                if stored[v]:
                    nbytes += local_size(shape, want, mesh) * item
        flops = 0.0
        if all(v in free for v in op.outputs):
            pass  # computed inside its readers' kernels, at their sharding: counted there
        elif op.primitive not in _NO_FLOPS:
            local = [
                rule.sizes[f] // (prop.size(fa[f]) if f in fa else 1)
                for f in range(len(rule.sizes))
            ]
            if op.primitive == "dot_general":
                flops = 2.0 * math.prod(local) / split
            elif op.primitive == "conv_general_dilated":
                flops = _conv_flops(op, local) / split
            else:
                flops = float(
                    max(
                        (
                            local_size(
                                prop.shapes[v],
                                tuple(join_axes(fs, fa, rule.sizes, mesh) for fs in dims),
                                mesh,
                            )
                            for v, dims in tensors
                        ),
                        default=0,
                    )
                )
        return OpCost(flops, nbytes, tuple(colls), unreduced)

    def _reductions_uncut(self, rule, operands, shardings: list[Sharding]) -> set[int]:
        """The reduction factors that some operand has but is not cut along (by mesh axes
        of size > 1), among the operands that are the program's inputs (their shardings are
        fixed; XLA may re-cut a value the program computes)."""
        mesh = self.mesh
        uncut: set[int] = set()
        for (v, dims), s in zip(operands, shardings):
            if not self.is_input[v]:
                continue
            for d, fs in enumerate(dims):
                on = (
                    {
                        f
                        for f, axes in split_axes(s[d], fs, rule.sizes, mesh)
                        if any(mesh[a] > 1 for a in axes)
                    }
                    if s[d]
                    else set()
                )
                uncut.update(f for f in fs if rule.kinds[f] is Kind.REDUCTION and f not in on)
        return uncut

    def _link_cost(self, op, tensors, shardings) -> OpCost:
        (src, sdims), (dst, ddims) = tensors
        s_src, s_dst = shardings
        rule = op.rule
        fa: dict[int, Axes] = {}
        for d, fs in enumerate(ddims):
            for f, axes in split_axes(s_dst[d], fs, rule.sizes, self.mesh):
                fa[f] = axes
        want = tuple(join_axes(fs, fa, rule.sizes, self.mesh) for fs in sdims)
        item = self.program.values[src].itemsize
        moves = reshard(self.prop.shapes[src], item, s_src, want, self.mesh)
        return OpCost(0.0, 0.0, tuple(c + ((src, s_src, want),) for c in moves))

    # -- totals -----------------------------------------------------------------------
    def collective_time(self, kind: str, axes: Axes, nbytes: float) -> float:
        """Ring alpha-beta time of one collective of `nbytes` over `axes`."""
        n = math.prod(self.mesh[a] for a in axes)
        if n <= 1:
            return 0.0
        bw = min(self.bandwidth[a] for a in axes)
        if kind == "all-reduce":
            return 2 * (n - 1) / n * nbytes / bw + self.collective_latency(kind, axes)
        if kind == "collective-permute":
            return nbytes / bw + self.collective_latency(kind, axes)
        return (n - 1) / n * nbytes / bw + self.collective_latency(kind, axes)

    def collective_latency(self, kind: str, axes: Axes) -> float:
        """The alpha part of collective_time: what combining two collectives saves."""
        n = math.prod(self.mesh[a] for a in axes)
        if n <= 1:
            return 0.0
        steps = (
            2 * (n - 1) if kind == "all-reduce" else 1 if kind == "collective-permute" else n - 1
        )
        return steps * self.device.latency

    def _gathers_transposed(self, v: int, src: Sharding, want: Sharding) -> bool:
        """Whether resharding value `v` from `src` to `want` all-gathers a dim behind a longer
        one, on a device that gathers along the major-most dim only (Device docs)."""
        if not self.device.gathers_major_most:
            return False
        gathered = [d for d, (s, w) in enumerate(zip(src, want)) if set(s) - set(w)]
        if not gathered:
            return False
        shape = self.prop.shapes[v]
        return any(shape[d] // self.prop.size(src[d]) > 1 for d in range(gathered[0]))

    def cost(self, state: State, *, detail: bool = True) -> Cost:
        """The cost of `state`; `detail=False` skips the per-collective sources."""
        compute, comm, flops, hbm, by_kind, colls, comm_bytes, lb, extra, lv = self._walk(
            state, detail
        )
        return Cost(
            step_time_s=compute + comm,
            compute_s=compute,
            comm_s=comm,
            argument_bytes=int(lb[self.is_input].sum()),
            peak_memory_bytes=liveness.peak(lb, lv, extra)[1],
            comm_bytes=int(comm_bytes),
            flops=flops,
            collectives=colls,
            comm_s_by_kind=by_kind,
            memory_limit=self.memory_limit,
            hbm_bytes=hbm,
        )

    def peak_buffers(self, state: State, top: int = 5) -> list[tuple[int, str]]:
        """The `top` largest buffers live at the peak of `state`, as (bytes, what it is and
        where the program makes it), largest first."""
        *_, lb, extra, lv = self._walk(state, False)
        at, _ = liveness.peak(lb, lv, extra)
        prog = self.program
        found = []
        for v in liveness.live_at(lb, lv, at)[:top]:
            i = prog.producer[v]
            what = prog.input_paths.get(v) or (
                f"{prog.ops[i].primitive}{prog.ops[i].location}" if i is not None else f"value {v}"
            )
            found.append((int(lb[v]), f"{what} {prog.values[v].shape}"))
        for start, stop, nbytes in extra:
            if start <= at <= stop and nbytes > 0:
                found.append((int(nbytes), "a resharded operand or an unreduced partial sum"))
        return sorted(found, key=lambda f: -f[0])[:top]

    def _walk(self, state: State, detail: bool):
        """One pass over the ops: (compute s, comm s, flops, HBM bytes, comm s by kind, collectives,
        comm bytes, local bytes per value, extra buffers as (start, end, bytes), the liveness
        with the readers of partial sums waiting for their reduction)."""
        dev = self.device
        compute = comm = flops_total = hbm = 0.0
        by_kind = dict.fromkeys(KINDS, 0.0)
        colls: list[Collective] = []
        comm_bytes = 0
        reused: set[tuple] = set()
        depth = [0] * len(self.program.values)  # collectives on the longest chain before
        depth_of = depth.__getitem__
        combined: set[tuple] = set()  # (kind, axes, depth, multiplicity) seen
        deepest = 0
        # reductions of partial sums on the longest chain before: XLA combines those that do
        # not depend on each other, whatever else the chains between them gather
        reduced = [0] * len(self.program.values)
        reduced_of = reduced.__getitem__
        most_reduced = 0
        # op_cost inlined where the op's template needs no rebinding (most ops)
        kinds, all_vids, templates = self._kinds, self.prop.vids, self._templates
        sharding_of = state.shardings.get
        live_ops = self._live_ops
        buffers: dict[tuple, list] = {}  # reshard key -> [the ops it is live over, bytes]
        partials: list[tuple[int, tuple, float, int]] = []  # (op, group, bytes, value)
        returned: list[tuple[tuple, int]] = []  # (reshard key, output) of carried state
        transposed: dict[tuple, float] = {}  # reshard key -> bytes of its gathered layout
        stack_of, copied = self._stack_of, set()  # layer stacks whose slices are gathered
        loop_end = self._loop_end
        kernels_of = self.liveness.kernels.get
        for i, (op, waits) in enumerate(zip(self.program.ops, self._waits_for)):
            if not live_ops[i]:
                continue
            c = templates.get((kinds[i], tuple(map(sharding_of, all_vids[i]))))
            if c is None or (c.collectives and _moves_operands(c)):
                c = self.op_cost(i, state)
            m = op.multiplicity
            if c.flops or c.bytes:
                nbytes = c.bytes * kernels_of(i, 1)
                compute += m * max(c.flops / dev.flops, nbytes / dev.hbm_bandwidth)
                flops_total += m * c.flops
                hbm += m * nbytes
            level = max(map(depth_of, waits)) if deepest and waits else 0
            after = False  # the op's results wait for a collective (its own or a reused one)
            for kind, axes, nbytes, reuse in c.collectives:
                after = True
                if reuse is not None:
                    if kind == "all-gather" and reuse[0] in stack_of:
                        copied.add(stack_of[reuse[0]])
                    buf = buffers.get(reuse)
                    if buf is None:
                        v, src, want = reuse
                        size = local_size(self.prop.shapes[v], want, self.mesh)
                        buf = buffers[reuse] = [[], size * self._itemsize[v]]
                        if i in self._state_links:
                            returned.append((reuse, v))
                        if kind == "all-gather" and self._gathers_transposed(v, src, want):
                            # the gathered buffer, until XLA has copied it into the
                            # default layout (the copy is the buffer that lives on)
                            transposed[reuse] = buf[1]
                    buf[0].append(i)
                    if i in loop_end:
                        buf[0].append(loop_end[i])
                    # one collective per checkpoint region: XLA recomputes it in each. One
                    # buffer all the same, from its first use to its last: high where the
                    # recompute's gather is issued late; XLA:CPU issues them early, and they
                    # stay live across the regions
                    if (kind, reuse, op.region) in reused:
                        continue
                    reused.add((kind, reuse, op.region))
                t = m * self.collective_time(kind, axes, nbytes)
                group = (kind, axes, level, m)
                if group in combined:  # independent of the first of its group: XLA fuses them
                    t -= m * self.collective_latency(kind, axes)
                combined.add(group)
                comm += t
                by_kind[kind] += t
                comm_bytes += m * nbytes
                if detail:
                    colls.append(Collective(kind, axes, int(nbytes), _source(op), m))
            rlevel = max(map(reduced_of, waits)) if most_reduced and waits else 0
            if c.partial is not None and op.outputs:
                kind, axes, nbytes = c.partial
                partials.append((i, (kind, axes, rlevel, m), nbytes, op.outputs[0]))
                most_reduced = max(most_reduced, rlevel + 1)
                for v in op.outputs:
                    reduced[v] = rlevel + 1
            elif rlevel:
                for v in op.outputs:
                    reduced[v] = rlevel
            if after or level:
                deepest = max(deepest, level + after)
                for v in op.outputs:
                    depth[v] = level + after
        lb = self.local_bytes(state)
        lv, ready = self._scheduled(partials)
        position, end = lv.position, lv.end
        spans = {
            key: [int(position[ops].min()), int(position[ops].max()), b]
            for key, (ops, b) in buffers.items()
        }
        if self.device.schedules_breadth_first:
            # the collective is ready once its operand exists, and runs then: a weight is
            # gathered with the arguments, however late its reader; a computed value that
            # every reader reads resharded is freed once the last reshard of it has run
            resharded: dict[int, set[int]] = {}
            first: dict[int, int] = {}
            for key, (ops, _) in buffers.items():
                v, span = key[0], spans[key]
                if self.is_input[v]:
                    span[0] = 0
                elif self._stored[v]:
                    span[0] = min(span[0], int(lv.birth[v]))
                    resharded.setdefault(v, set()).update(ops)
                    first[v] = max(first.get(v, 0), span[0])
            kept = {v for _, v in returned}  # outputs: freed once resharded, below
            for v, ops in resharded.items():
                if v not in kept and lv.death[v] > first[v] and set(lv.readers[v]) <= ops:
                    spans[(v, "freed")] = [first[v] + 1, int(lv.death[v]), -lb[v]]
        for reuse, v in returned:  # the resharded state replaces its output to the end
            start = spans[reuse][0]
            spans[reuse][1] = end
            if start < end:  # the output as computed is freed once resharded
                spans[(reuse, "freed")] = [start + 1, end, -lb[v]]
        extra = [tuple(b) for b in spans.values()]
        extra += [(spans[key][0], spans[key][0], b) for key, b in transposed.items()]
        for s in copied:
            first, last = position[list(self._stack_span[s])]
            extra.append((min(first, last), max(first, last), lb[s]))
        extra += self._unreduced(partials, ready, lv, lb)
        for i, u in lv.layout_copies:  # made as soon as the operand is, read by the conv
            start = lv.birth[u] if self._stored[u] else position[i]
            nbytes = local_size(self.prop.shapes[u], state.shardings.get(u, ()), self.mesh)
            extra.append((int(start), int(position[i]), nbytes * self._itemsize[u]))
        return compute, comm, flops_total, hbm, by_kind, colls, comm_bytes, lb, extra, lv

    def _scheduled(self, partials) -> tuple[liveness.Liveness, dict[tuple, int]]:
        """The liveness of a state whose partial sums are `partials` ((op, group, bytes,
        value)), and the position each group's combined reduction runs at: on a device whose
        schedule follows the dependences, the reduction is one instruction that waits for the
        whole group and that the readers of its results wait for (memoised per grouping)."""
        if self.liveness.graph is None:  # program order: nothing moves
            return self.liveness, {}
        members: dict[tuple, list[int]] = {}
        for _, group, _, v in partials:
            members.setdefault(group, []).append(v)
        key = tuple(tuple(vs) for vs in members.values())
        found = self._schedules.get(key)
        if found is None:
            if len(self._schedules) > 256:
                self._schedules.clear()
            found = self._schedules[key] = liveness.rescheduled(
                self.program, self._operands, self.liveness, list(members.values())
            )
        lv, places = found
        return lv, {group: at for group, at in zip(members, places) if at is not None}

    def _unreduced(
        self, partials, ready: dict[tuple, int], lv: liveness.Liveness, lb: np.ndarray
    ) -> list[tuple[int, int, float]]:
        """Buffers of partial sums: each lives until the reduction of its group runs (XLA's
        combiners fuse reductions that do not depend on each other into one: at `ready`, else
        after the last of them is ready), and its reduced result only from then on. Where
        the device scatters whole (Device docs), a reduce-scatter's result is whole at the
        reduction, and stays whole while it lives where all its readers fuse the slice in."""
        position = lv.position
        ready = dict(ready)
        placed = set(ready)
        for i, group, _, _ in partials:
            if group not in placed:
                ready[group] = max(ready.get(group, 0), int(position[i]))
        extra = []
        whole = self.device.scatters_whole
        for i, group, nbytes, v in partials:
            at, until = int(position[i]), ready[group]
            extra.append((at, until, nbytes))
            if whole and group[0] == "reduce-scatter":
                if v in self._slices_fused:
                    # every reader takes the slice in: the whole result is the buffer
                    extra.append((until, max(until, int(lv.death[v])), nbytes - lb[v]))
                else:
                    extra.append((until, until, nbytes))
            if until > at and self._stored[v]:
                extra.append((at, until - 1, -lb[v]))
        return extra


def _loop_slices(
    prog: Program, lv: liveness.Liveness
) -> tuple[dict[int, int], dict[int, tuple[int, int]]]:
    """({slice: stack}, {stack: (first op, last op)}): the values a loop body reads as one
    layer of a stacked input (the slice, and its converts and transposes there), and per stack
    the ops from the first loop that slices it to the end of the last."""
    stack_of: dict[int, int] = {}
    span: dict[int, tuple[int, int]] = {}
    extent = liveness.loop_extents(prog)
    for i, op in enumerate(prog.ops):
        if op.primitive != "_link" or op.params["kind"] != "xs" or not lv.live_ops[i]:
            continue
        stack, piece = op.inputs
        if stack is None or piece is None:
            continue
        for w in [piece, *(w for w, _ in relayouts(prog, piece))]:
            stack_of.setdefault(w, stack)
        start, end = span.get(stack, (i, i))
        span[stack] = (min(start, i), max(end, extent[i][1]))
    return stack_of, span


def _moves_operands(c: OpCost) -> bool:
    return any(reuse is not None for *_, reuse in c.collectives)


def _choice(c: OpCost) -> tuple[bool, float]:
    """How an execution that reshards operands is chosen: without all-to-alls first (XLA's
    partitioner realises many of them as an all-gather and a slice), then by bytes moved."""
    return (any(k == "all-to-all" for k, *_ in c.collectives), _weight(c))


def _weight(c: OpCost) -> float:
    """Bytes moved, an all-reduce counted twice (a ring all-reduce moves its data twice)."""
    return sum(b * (2 if k == "all-reduce" else 1) for k, _, b, _ in c.collectives)


def _source(op) -> str:
    where = f" at {op.source}" if op.source else ""
    if op.primitive == "_link":
        return f"{op.params['kind']} link (op {op.index})"
    return f"{op.primitive} (op {op.index}){where}"


def _conv_flops(op, local: list[int]) -> float:
    """A convolution's multiply-adds: per output element, one per kernel element of an
    input-feature group (2 * out * in_features/groups * kernel window). The rule's factors
    name batch, features and contraction; spatial dims are whole factors of their own, so
    the product of all factors would count input, kernel and output windows together."""
    rule, dn = op.rule, op.params["dimension_numbers"]
    out_factors = [f for fs in rule.results[0] for f in fs]
    rhs_dims = rule.operands[1]
    kernel = [f for d, fs in enumerate(rhs_dims) if d != dn.rhs_spec[0] for f in fs]
    return 2.0 * math.prod(local[f] for f in out_factors) * math.prod(local[f] for f in kernel)
