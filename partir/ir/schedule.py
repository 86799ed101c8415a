"""The order XLA:CPU runs a program's kernels in: breadth first over their data dependences.

XLA:CPU's default scheduler (its concurrency-optimised one) runs each instruction as soon as
the instructions it reads have run, first ready first run. Against program order that runs
the copies of the arguments first, the updates of an optimizer as soon as their gradients
are reduced, and, where XLA merged a checkpoint region's recompute with the forward pass
(jaxlib 0.10), the recompute beside the forward pass (its results then live to the
backward). A checkpoint region whose optimization barrier XLA keeps (jaxlib 0.12) runs no
kernel before all the region's operands exist (its cotangents among them), so its
recompute runs in the backward pass. A combined reduction of partial sums is one
instruction that waits for all of them; the readers of its results wait for it.

The graph is the program's after fusion: a fused op is part of the kernel that reads it,
a value made of constants alone is made by no kernel, and a loop is one kernel of its
outer computation that keeps its own order inside.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

import numpy as np

from partir.ir.program import Program


class KernelGraph:
    """The kernels of one program and what each waits for."""

    def __init__(
        self,
        program: Program,
        operands: Sequence[Sequence[int]],
        live_ops: np.ndarray,
        unmade: set[int],
        barriers: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        """`unmade`: the values no kernel makes (free ones, and those fused into their
        readers); a kernel that reads one waits for what that value is made of. `barriers`:
        per checkpoint region whose optimization barrier XLA keeps, its operands
        (`checkpoint_operands`); each kernel of the region waits for all of them."""
        ops = program.ops
        end = len(ops)
        self.end = end
        node = np.arange(end, dtype=np.int64)  # per op: its kernel (itself, or its loop's first op)
        self.last_of: dict[int, int] = {}  # loop kernel -> its last op
        for first, last in sorted(program.loops, key=lambda r: (r[0], -r[1])):
            if node[first] == first and first not in self.last_of:  # an outermost loop
                node[first : last + 1] = first
                self.last_of[first] = last
        self.node = node
        self.maker: dict[int, int] = {}  # value -> the kernel that makes it
        carriers: dict[int, tuple[int, ...]] = {}  # value -> the kernel-made values it needs
        self.waits_on: dict[int, set[int]] = {}  # kernel -> the kernel-made values it reads
        region_operands = barriers or {}
        barrier: dict[int, set[int]] = {}  # region -> the kernel-made values of its operands
        for i in range(end):
            if not live_ops[i]:
                continue
            n = int(node[i])
            op = ops[i]
            needs: set[int] = set()
            for v in operands[i]:
                needs.update(carriers.get(v, ()))
            if op.region in region_operands:
                if op.region not in barrier:  # its operands are all made by now
                    barrier[op.region] = set()
                    for v in region_operands[op.region]:
                        barrier[op.region].update(carriers.get(v, ()))
                needs |= barrier[op.region]
            made = op.outputs if op.primitive != "_link" else operands[i]
            if op.outputs and op.outputs[0] in unmade and n == i:
                for v in made:
                    carriers[v] = tuple(needs)  # read where its readers run
                continue
            self.waits_on.setdefault(n, set()).update(needs)
            for v in made:
                if v not in carriers:
                    carriers[v] = (v,)
                    self.maker[v] = n
        self._order = self._breadth_first({})

    def positions(
        self, reductions: Sequence[Sequence[int]] = ()
    ) -> tuple[np.ndarray, list[int | None]]:
        """(per op, its position; per reduction, the position it runs at, None for one this
        graph has no place for). `reductions`: groups of values reduced together by one
        collective, which waits for all of them and which their readers wait for. A group
        made inside a loop is reduced there (None)."""
        reduced_by: dict[int, int] = {}
        places: list[int | None] = []
        for g, values in enumerate(reductions):
            makers = [self.maker.get(v) for v in values]
            if any(m is None or m in self.last_of for m in makers):
                places.append(None)
                continue
            places.append(self.end + g)
            for v in values:
                reduced_by[v] = self.end + g
        order = self._breadth_first(reduced_by) if reduced_by else self._order
        position = np.zeros(self.end, dtype=np.int64)
        at_of: dict[int, int] = {}
        at = 0
        for n in order:
            at_of[n] = at
            if n >= self.end:  # a reduction: one instruction
                at += 1
                continue
            last = self.last_of.get(n, n)
            position[n : last + 1] = np.arange(at, at + last - n + 1)
            at += last - n + 1
        return position, [None if p is None else at_of[p] for p in places]

    def _breadth_first(self, reduced_by: dict[int, int]) -> list[int]:
        """The kernels (and reductions, numbered from `end`) in the order the scheduler runs
        them: first ready, first run; ties in program order."""
        deps: dict[int, set[int]] = {}
        for n, vs in self.waits_on.items():
            deps[n] = {reduced_by.get(v, self.maker[v]) for v in vs} - {n}
        for v, r in reduced_by.items():
            deps.setdefault(r, set()).add(self.maker[v])
        users: dict[int, list[int]] = {n: [] for n in deps}
        for n in sorted(deps):
            for d in sorted(deps[n]):
                users[d].append(n)
        waiting = {n: len(d) for n, d in deps.items()}
        ready = collections.deque(n for n in sorted(deps) if not waiting[n])
        order: list[int] = []
        while ready:
            n = ready.popleft()
            order.append(n)
            for u in users[n]:
                waiting[u] -= 1
                if not waiting[u]:
                    ready.append(u)
        if len(order) < len(deps):  # a cycle would be a bug in the graph: keep program order
            return sorted(deps)
        return order


def checkpoint_operands(
    program: Program, operands: Sequence[Sequence[int]], live_ops: np.ndarray
) -> dict[int, list[int]]:
    """Per checkpoint region outside loops (a loop keeps its own order), the values its
    live ops (and those of regions nested in it: a region's ops are contiguous) read that
    are made before it: what JAX's optimization barrier on the region's operands waits for."""
    in_loop = np.zeros(len(program.ops), dtype=bool)
    for first, last in program.loops:
        in_loop[first : last + 1] = True
    spans: dict[int, tuple[int, int]] = {}
    for i, op in enumerate(program.ops):
        if op.region and live_ops[i] and not in_loop[i]:
            first, _ = spans.get(op.region, (i, i))
            spans[op.region] = (first, i)
    found: dict[int, list[int]] = {}
    for region, (first, last) in spans.items():
        made_before = {
            v
            for j in range(first, last + 1)
            if live_ops[j]
            for v in operands[j]
            if (p := program.producer[v]) is None or p < first
        }
        found[region] = sorted(made_before)
    return found
