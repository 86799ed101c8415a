"""Propagate tiling decisions through the factor rules, forward and backward, to a fixpoint.

A sharding gives each dim of a value a tuple of mesh axes (major first); an axis is used
at most once per value and the axes' sizes must divide the dim. Propagation only ever
adds axes: a value that already holds a sharding keeps it (earlier decisions win), and a
later demand that conflicts with it stays where it is, to be paid for by a resharding
collective in the cost model.

States are immutable and hash, so a search can key a transposition table on them;
`Propagator.apply` copies a state and propagates from the one value it changed.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence

from partir.ir.program import Program
from partir.ir.rules import Kind, Rule, link_rule, rule_for

Axes = tuple[str, ...]
Sharding = tuple[Axes, ...]


@dataclasses.dataclass(frozen=True)
class Decision:
    """Tile `value` along `dim` on mesh `axis`. Lower `priority` is applied first;
    `position` orders several axes on one dim (0 is the major one)."""

    priority: int
    value: int
    dim: int
    axis: str
    position: int = 0

    def sort_key(self) -> tuple:
        return (self.priority, self.value, self.dim, self.position, self.axis)


class State:
    """Shardings of every value (absent = replicated), immutable and hashable."""

    __slots__ = ("shardings", "frozen", "_key")

    def __init__(self, shardings: dict[int, Sharding], frozen: frozenset[int], key: int) -> None:
        self.shardings = shardings
        self.frozen = frozen
        self._key = key

    def __hash__(self) -> int:
        return self._key

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, State)
            and self._key == other._key
            and self.shardings == other.shardings
        )

    def get(self, vid: int, rank: int) -> Sharding:
        return self.shardings.get(vid) or ((),) * rank

    def __len__(self) -> int:
        return len(self.shardings)


def _entry_hash(vid: int, sharding: Sharding) -> int:
    return hash((vid, sharding))


def _rekey(key: int, vid: int, old: Sharding, new: Sharding) -> int:
    """The state key is the XOR of its entries' hashes, kept up to date entry by entry."""
    if any(old):
        key ^= _entry_hash(vid, old)
    if any(new):
        key ^= _entry_hash(vid, new)
    return key


def attach_rules(program: Program) -> None:
    """Give every op of `program` its factor rule (once). A primitive without a rule warns
    once per program, naming where it first occurs and how many ops it has."""
    if program.ruled_ops == len(program.ops):  # called by every analysis: a no-op after one
        return
    vals = program.values
    counts = Counter(op.primitive for op in program.ops if op.rule is None)
    warned: set[str] = set()
    same: dict[tuple, Rule] = {}  # repeated layers repeat their ops: one rule per signature
    key: tuple | None
    for op in program.ops:
        if op.rule is not None:
            continue
        if op.primitive == "_link":
            src, dst = op.inputs
            assert src is not None and dst is not None  # a link joins two values
            key = ("_link", vals[src].shape, vals[dst].shape, op.params["offset"])
            if key not in same:
                same[key] = link_rule(*key[1:])
            op.rule = same[key]
            continue
        ins = [None if v is None else vals[v].shape for v in op.inputs]
        outs = [vals[v].shape for v in op.outputs]
        key = _signature(op.primitive, ins, outs, op.params)
        if key is not None and key in same:
            op.rule = same[key]
            continue
        op.rule = rule_for(
            op.primitive,
            ins,
            outs,
            op.params,
            where=op.location,
            count=counts[op.primitive],
            warned=warned,
        )
        if key is not None:
            same[key] = op.rule
    program.ruled_ops = len(program.ops)


def _signature(primitive: str, ins: list, outs: list, params: dict) -> tuple | None:
    """What an op's rule depends on, or None when its params cannot be compared."""
    try:
        key = (primitive, tuple(ins), tuple(outs), tuple(sorted(params.items())))
        hash(key)
    except TypeError:
        return None
    return key


class Propagator:
    """Applies decisions to states of one program on one mesh. `seed` decisions (the
    user's own sharding constraints) hold in every state, `empty()` included: they are
    applied before anything else, so they win every conflict. `blocked` values never take
    the axes it names for them (the goal's `replicate` statements): a decision that would
    is rejected, and propagation leaves those axes out."""

    def __init__(
        self,
        program: Program,
        mesh: Mapping[str, int],
        seed: Iterable[Decision] = (),
        blocked: Mapping[int, Iterable[str]] | None = None,
        unseeded: Iterable[int] = (),
    ) -> None:
        attach_rules(program)
        self.program = program
        self.mesh = dict(mesh)
        self.seed = list(seed)
        self.unseeded = frozenset(unseeded)
        self.blocked = {v: frozenset(axes) for v, axes in (blocked or {}).items() if axes}
        self._empty: dict[frozenset[int], State] = {}
        self.shapes = [v.shape for v in program.values]
        # per op: its tensors' value ids (operands, then results), and what its propagation
        # depends on besides their shardings: the rule and which tensors are one value,
        # numbered (a small int hashes faster in the template keys)
        self.vids: list[tuple[int, ...]] = []
        self.operands: list[tuple[int, ...]] = []  # per op, the value ids it reads
        self.kinds: list[int] = []
        number: dict[tuple, int] = {}
        self.ops_of: list[list[int]] = [[] for _ in program.values]
        ops_of = self.ops_of
        for i, op in enumerate(program.ops):
            ins = tuple(v for v in op.inputs if v is not None)  # a literal operand is None
            vids = ins + op.outputs
            self.operands.append(ins)
            self.vids.append(vids)
            if len(set(vids)) == len(vids):
                kind = number.setdefault((id(op.rule), None), len(number))
                for v in vids:
                    ops_of[v].append(i)
            else:  # which tensors are one value
                kind = number.setdefault((id(op.rule), tuple(map(vids.index, vids))), len(number))
                for v in dict.fromkeys(vids):
                    ops_of[v].append(i)
            self.kinds.append(kind)
        # ops with a blocked tensor: their template keys name the blocked axes too
        self._blocked_ops = {i for v in self.blocked for i in ops_of[v]}
        # axes a later search step decides: propagation keeps them out of the unseeded values
        # (see hold_back); the ops that touch those values key their templates on them
        self.held_back: frozenset[str] = frozenset()
        self._unseeded_ops = {i for v in self.unseeded for i in ops_of[v]}
        # (op kind, shardings, frozen tensors) -> updates by tensor position (see _updates)
        self._templates: dict[tuple, tuple] = {}

    def tensors(self, i: int) -> list[tuple[int, tuple[tuple[int, ...], ...]]]:
        """Op `i`'s tensors as (value id, per-dim factors), operands first."""
        op = self.program.ops[i]
        rule: Rule = op.rule
        # a literal operand (None) has no factors (None)
        ts = [(v, f) for v, f in zip(op.inputs, rule.operands) if v is not None and f is not None]
        return ts + list(zip(op.outputs, rule.results))

    # -- states ---------------------------------------------------------------------
    def empty(self, frozen: Iterable[int] = ()) -> State:
        """The state with no decision but the seed; `frozen` values never change. The seed
        does not reach the `unseeded` values (the state's parameters and their layout
        copies): they stay open to the decisions, which meet the seed where they reach it."""
        frozen = frozenset(frozen)
        state = self._empty.get(frozen)
        if state is None:
            state = State({}, frozen, 0)
            if self.seed:
                held = State({}, frozen | self.unseeded, 0)
                seeded = self.apply_all(held, self.seed)[0]
                state = State(seeded.shardings, frozen, hash(seeded))
            self._empty[frozen] = state
        return state

    def seeded(self, frozen: Iterable[int], decisions: Sequence[Decision]) -> tuple[State, list]:
        """`apply_all` of input decisions (data at the lowest priority, state after) with
        the seed applied together with the state's decisions, so that each value takes the
        sharding of the nearer of the two: the input shardings and the user's constraints
        are both the user's, and XLA propagates from both. A weight stack then keeps its
        own sharding up to the loop that reads it, not the one an activation constraint
        implies through the matmul (MaxText's plan: its activations are constrained on
        other axes than its weights; seed first, the model priced all-to-alls of every
        weight that XLA never makes, 2.4x its collective bytes). Where that leaves a
        constraint unmet, the seed goes first, as in `empty`: constraints always hold."""
        priorities = sorted({d.priority for d in decisions})
        if self.seed and priorities:
            with_state = priorities[1] if len(priorities) > 1 else priorities[0]
            seed = [dataclasses.replace(d, priority=with_state) for d in self.seed]
            bare = State({}, frozenset(frozen), 0)
            state, rejected = self.apply_all(bare, seed + list(decisions))
            if not any(d in rejected for d in seed):
                return state, rejected
        return self.apply_all(self.empty(frozen=frozen), decisions)

    def hold_back(self, axes: Iterable[str]) -> None:
        """Keep `axes` out of what propagation gives the unseeded values (the state's
        parameters) until called again: a search step holds back the axes of the steps
        after it, so that the user's constraints, met on the way, do not decide a
        parameter's sharding on an axis the search has yet to choose for. (MaxText's
        Mixtral constrains its activations on `tensor`: an `expert` decision on an MoE
        weight carried that `tensor` into the weight's model dim, and megatron had no
        action left on it; XLA allocated 1.17x MaxText's own plan, 0.81x held back.)"""
        self.held_back = frozenset(axes) if self.seed else frozenset()

    def sharding(self, state: State, vid: int) -> Sharding:
        return state.get(vid, len(self.shapes[vid]))

    def size(self, axes: Axes) -> int:
        return math.prod(self.mesh[a] for a in axes)

    def can_apply(self, state: State, d: Decision) -> bool:
        """Whether `d` adds an axis the value lacks, along a dim it divides."""
        return self.can_tile(state, d.value, d.dim, d.axis)

    def can_tile(self, state: State, vid: int, dim: int, axis: str) -> bool:
        """Whether `axis` can be added to dim `dim` of value `vid`: the value lacks it, no
        replicate statement blocks it, and the dim's size divides."""
        shape = self.shapes[vid]
        if not 0 <= dim < len(shape) or axis not in self.mesh or self.blocks(vid, axis):
            return False
        s = self.sharding(state, vid)
        if any(axis in axes for axes in s):
            return False
        return shape[dim] % self.size(s[dim] + (axis,)) == 0

    def blocks(self, vid: int, axis: str) -> bool:
        """Whether a replicate statement keeps value `vid` whole on `axis`."""
        return axis in self.blocked.get(vid, ())

    def apply(self, state: State, d: Decision) -> State | None:
        """The state with `d` applied and propagated; None if `d` cannot apply."""
        if not self.can_apply(state, d):
            return None
        return self._apply_group(state, [d])[0]

    def apply_all(self, state: State, decisions: Iterable[Decision]) -> tuple[State, list]:
        """Apply decisions priority by priority; return the state and the decisions that
        could not apply (they conflict with earlier ones).

        The decisions of one priority are set together and propagate together, breadth
        first, so a value takes the sharding of the nearest decision whatever order the
        decisions came in; a tie goes to the lower (value, dim, axis)."""
        rejected: list[Decision] = []
        groups: dict[int, list[Decision]] = {}
        for d in sorted(set(decisions), key=Decision.sort_key):
            groups.setdefault(d.priority, []).append(d)
        for prio in sorted(groups):
            state, bad = self._apply_group(state, groups[prio])
            rejected += bad
        return state, rejected

    def _apply_group(self, state: State, group: list[Decision]) -> tuple[State, list]:
        shardings = dict(state.shardings)
        key = state._key
        changed, rejected = [], []
        for d in group:
            tmp = State(shardings, state.frozen, key)
            if not self.can_apply(tmp, d):
                if not self._already(tmp, d):
                    rejected.append(d)
                continue
            old = self.sharding(tmp, d.value)
            new = tuple(axes + (d.axis,) if i == d.dim else axes for i, axes in enumerate(old))
            key = self._set(shardings, key, d.value, old, new)
            changed.append(d.value)
        key = self._fixpoint(shardings, key, state.frozen, changed)
        return State(shardings, state.frozen, key), rejected

    def _already(self, state: State, d: Decision) -> bool:
        s = self.sharding(state, d.value)
        return 0 <= d.dim < len(s) and d.axis in s[d.dim]

    # -- propagation ----------------------------------------------------------------
    def _set(self, shardings, key, vid, old, new) -> int:
        if any(new):
            shardings[vid] = new
        else:
            shardings.pop(vid, None)
        return _rekey(key, vid, old, new)

    def _fixpoint(self, shardings, key, frozen, changed: list[int]) -> int:
        pending: deque[int] = deque()
        queued = set()
        for v in changed:
            for i in self.ops_of[v]:
                if i not in queued:
                    queued.add(i)
                    pending.append(i)
        while pending:
            i = pending.popleft()
            queued.discard(i)
            for v, old, new in self._propagate_op(i, shardings, frozen):
                key = _rekey(key, v, old, new)
                for j in self.ops_of[v]:
                    if j not in queued:
                        queued.add(j)
                        pending.append(j)
        return key

    def _propagate_op(self, i: int, shardings, frozen) -> tuple:
        """The (value, old, new) updates op `i` makes, applied to `shardings`. They depend
        only on the op's kind and its tensors' shardings, so ops of one kind (an op of each
        repeated layer) share them: computed once, by tensor position, rebound to op `i`."""
        vids = self.vids[i]
        current = tuple(map(shardings.get, vids))
        held: tuple | None = tuple(v in frozen for v in vids) if frozen else None
        if i in self._blocked_ops:
            held = (held, tuple(map(self.blocked.get, vids)))
        if self.held_back and i in self._unseeded_ops:
            held = (held, self.held_back)
        key = (self.kinds[i], current, held)
        template = self._templates.get(key)
        if template is None:
            updates = tuple(self._propagate_op_uncached(i, shardings, frozen))
            self._templates[key] = tuple((vids.index(v), old, new) for v, old, new in updates)
            return updates
        if not template:
            return template
        updates = tuple((vids[t], old, new) for t, old, new in template)
        for v, _, new in updates:
            shardings[v] = new
        return updates

    def _propagate_op_uncached(self, i: int, shardings, frozen):
        tensors = self.tensors(i)
        rule = self.program.ops[i].rule
        sizes = rule.sizes
        moves = tuple(k in (Kind.PASS, Kind.REDUCTION) for k in rule.kinds)
        mesh = self.mesh
        factor_axes: dict[int, Axes] = {}
        source: dict[int, tuple[int, int]] = {}  # factor -> (-size, position) of its source
        conflicts: set[int] = set()
        for t, (v, dims) in enumerate(tensors):
            s = shardings.get(v)
            if s is None:
                continue
            for d, fs in enumerate(dims):
                if not s[d]:
                    continue
                for f, axes in split_axes(s[d], fs, sizes, mesh):
                    if not moves[f]:
                        continue
                    cur = factor_axes.get(f)
                    if cur is None or (len(axes) > len(cur) and axes[: len(cur)] == cur):
                        factor_axes[f] = axes
                        source[f] = (-math.prod(self.shapes[v]), t)
                    elif cur == axes:
                        source[f] = min(source[f], (-math.prod(self.shapes[v]), t))
                    elif cur[: len(axes)] != axes:
                        conflicts.add(f)
        for f in conflicts:
            factor_axes.pop(f, None)
        if not factor_axes:
            return []
        # where factors claim one axis in a tensor, the factor from the largest source
        # tensor takes it (then the earlier tensor): resharding the smaller tensor is the
        # cheaper fix, and it is Shardy's choice
        rank = {f: (source[f], f) for f in factor_axes}
        last = ((0, len(tensors)), len(sizes))
        updates = []
        for v, dims in tensors:
            if v in frozen:
                continue
            old = shardings.get(v) or ((),) * len(dims)
            new = list(old)
            shape = self.shapes[v]
            blocked = self.blocked.get(v, frozenset())
            later = self.held_back if v in self.unseeded else ()
            order: list[int] = list(range(len(dims)))
            if len(rank) > 1:
                order.sort(key=lambda d: min((rank.get(f, last) for f in dims[d]), default=last))
            for d in order:
                fs = dims[d]
                target = join_axes(fs, factor_axes, sizes, mesh)
                cur = new[d]
                if len(target) <= len(cur) or target[: len(cur)] != cur:
                    continue
                used = {a for axes in new for a in axes} | blocked
                extra = target[len(cur) :]
                if later:
                    extra = extra[: next((k for k, a in enumerate(extra) if a in later), None)]
                for k in range(len(extra), 0, -1):
                    cand = cur + extra[:k]
                    if any(a in used for a in extra[:k]):
                        continue
                    if shape[d] % math.prod(mesh[a] for a in cand) == 0:
                        new[d] = cand
                        break
            new_t = tuple(new)
            if new_t != old:
                shardings[v] = new_t  # visible at once, should v appear twice in this op
                updates.append((v, old, new_t))
        return updates


def split_axes(axes: Axes, factors: tuple[int, ...], sizes, mesh) -> list[tuple[int, Axes]]:
    """Which axes of a dim land on which of its factors (major first).

    An axis goes to the current factor while its size divides what is left of it; the
    next factor is reached only once the current one is fully tiled.
    """
    if len(factors) == 1:
        return [(factors[0], axes)]
    out: list[tuple[int, Axes]] = []
    k = 0
    left = sizes[factors[0]]
    cur: list[str] = []
    for a in axes:
        n = mesh[a]
        while left == 1 and k + 1 < len(factors):
            if cur:
                out.append((factors[k], tuple(cur)))
            k += 1
            left = sizes[factors[k]]
            cur = []
        if left % n:
            break
        cur.append(a)
        left //= n
    if cur:
        out.append((factors[k], tuple(cur)))
    return out


def join_axes(factors: tuple[int, ...], factor_axes: dict[int, Axes], sizes, mesh) -> Axes:
    """The axes a dim gets from its factors: a minor factor counts only after every more
    major factor is fully tiled (otherwise the tiles would not be contiguous)."""
    if len(factors) == 1:
        return factor_axes.get(factors[0], ())
    out: Axes = ()
    for f in factors:
        axes = factor_axes.get(f, ())
        if not axes:
            if sizes[f] == 1:
                continue
            break
        out += axes
        if math.prod(mesh[a] for a in axes) != sizes[f]:
            break
    return out
