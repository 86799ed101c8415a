"""Program analysis the strategies build on: groups of inputs that share a sharding, the
dims an axis divides, the matmul operands, the gathered tables, and the action space made
of them.

Inputs that must share a sharding form one group, and tiling a group along one dim is one
action: a parameter with its optimizer moments (same path tail, same shape), and the same
weight in every repeated layer (the path with layer indices as `*`, same shape; a scanned
layer stack is one input already). Data inputs (those that are not carried state) are
grouped the same way.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from partir.ir.program import Program
from partir.ir.propagate import Decision, Propagator, State, attach_rules
from partir.ir.rules import Kind, Rule


@dataclasses.dataclass(frozen=True)
class Group:
    """Inputs tiled together: `params` (parameters) and `moments` (optimizer state), or
    `data` inputs. `name` is the shared path pattern."""

    name: str
    shape: tuple[int, ...]
    params: tuple[int, ...] = ()
    moments: tuple[int, ...] = ()
    data: tuple[int, ...] = ()

    @property
    def members(self) -> tuple[int, ...]:
        return self.params + self.moments + self.data


@dataclasses.dataclass(frozen=True)
class Action:
    """Tile `values` along `dim` on the axis being searched."""

    group: str
    dim: int
    values: tuple[int, ...]

    def decisions(self, axis: str, priority: int) -> list[Decision]:
        return [Decision(priority, v, self.dim, axis) for v in self.values]

    def __str__(self) -> str:
        return f"{self.group} dim {self.dim}"


_INDEX = re.compile(r"(?<=/)\d+(?=/|$)")


def layer_pattern(tail: str) -> str:
    """`layers/3/attn/q` -> `layers/*/attn/q`: repeated layers share one pattern."""
    return _INDEX.sub("*", "/" + tail)[1:]


def param_prefix(prog) -> str | None:
    """The path prefix of the parameters among the carried inputs: `params` when an
    argument is so named, else the argument (or its first field) whose path tails the
    other carried inputs end with most often (`model` beside `optimizer/opt_state/0/mu/
    blocks/0/w`), else the first carried argument. None when nothing is carried."""
    carried_paths = set(prog.carried.values())
    carried = [p for p in prog.inputs if p in carried_paths]
    if not carried:
        return None
    heads = [p.split("/", 1)[0] for p in carried]
    if "params" in heads:
        return "params"
    best, best_score = None, 0
    for depth in (1, 2):
        prefixes = dict.fromkeys("/".join(p.split("/")[:depth]) for p in carried)
        for prefix in prefixes:
            under = [p for p in carried if p.startswith(prefix + "/")]
            tails = {p[len(prefix) + 1 :] for p in under}
            score = sum(
                any("/".join(q.split("/")[i:]) in tails for i in range(1, q.count("/") + 1))
                for q in carried
                if not q.startswith(prefix + "/")
            )
            if score > best_score:
                best, best_score = prefix, score
        if best is not None:  # whole arguments first; fields only when none scores
            break
    return best if best is not None else heads[0]


def find_groups(prog: Program) -> list[Group]:
    """Group the program's inputs (see the module docstring), in input order."""
    carried = set(prog.carried.values())
    prefix = param_prefix(prog)
    is_param = lambda path: prefix is not None and path.startswith(prefix + "/")  # noqa: E731
    param_tails = {}
    for path, vid in prog.inputs.items():
        if path in carried and is_param(path):
            assert prefix is not None  # is_param holds only under a prefix
            param_tails[path[len(prefix) + 1 :]] = vid
    keyed: dict[tuple, dict[str, list[int]]] = {}
    names: dict[tuple, str] = {}
    for path, vid in prog.inputs.items():
        shape = prog.values[vid].shape
        if path not in carried:
            role, tail = "data", path
        elif is_param(path):
            assert prefix is not None  # is_param holds only under a prefix
            role, tail = "params", path[len(prefix) + 1 :]
        else:
            role = "moments"
            parts = path.split("/")[1:]
            tail = "/".join(parts)
            # opt_state/0/mu/layers/3/w -> the longest suffix that names a parameter
            for i in range(len(parts)):
                if "/".join(parts[i:]) in param_tails:
                    tail = "/".join(parts[i:])
                    break
        key = (role == "data", layer_pattern(tail), shape)
        names.setdefault(key, layer_pattern(tail))
        keyed.setdefault(key, {"params": [], "moments": [], "data": []})[role].append(vid)
    return [
        Group(names[k], k[2], tuple(m["params"]), tuple(m["moments"]), tuple(m["data"]))
        for k, m in keyed.items()
    ]


def dims_that_divide(shape: tuple[int, ...], n: int) -> list[int]:
    return [d for d, s in enumerate(shape) if s % n == 0 and s >= n and n > 1]


def largest_dividing_dim(shape: tuple[int, ...], n: int, exclude=()) -> int | None:
    """ZeRO's default: the largest dim that `n` divides, outside `exclude` (first on ties)."""
    dims = [d for d in dims_that_divide(shape, n) if d not in exclude]
    return max(dims, key=lambda d: (shape[d], -d)) if dims else None


def useful_actions(
    prop: Propagator, root: State, actions: list[Action], axis: str, priority: int
) -> list[Action]:
    """Drop actions that cannot apply at `root`, change nothing, or reach the same
    propagated state as an earlier action."""
    seen = {hash(root)}
    out = []
    for a in actions:
        state, rejected = prop.apply_all(root, a.decisions(axis, priority))
        if rejected or state == root or hash(state) in seen:
            continue
        seen.add(hash(state))
        out.append(a)
    return out


def matmul_operands(prog: Program) -> set[int]:
    """Inputs that reach a dot_general or conv through dtype converts and reshapes."""
    through = {"convert_element_type", "reshape", "transpose", "copy", "_link"}
    out: set[int] = set()
    for vid in prog.inputs.values():
        frontier, seen = [vid], {vid}
        while frontier:
            v = frontier.pop()
            for i in prog.users[v]:
                op = prog.ops[i]
                if op.primitive in ("dot_general", "conv_general_dilated"):
                    out.add(vid)
                    frontier = []
                    break
                if op.primitive in through:
                    nxt = op.inputs[1:] if op.primitive == "_link" else op.outputs
                    for w in nxt:
                        if w is not None and w not in seen:  # a link's ends are never None
                            seen.add(w)
                            frontier.append(w)
    return out


def _same_dim(rule: Rule, src: int, dim: int, dst: int) -> int | None:
    """The dim of `rule`'s tensor `dst` that `dim` of tensor `src` maps to, tiled alike: the
    dst dim whose major factor is src dim's only factor (tensors count operands first,
    then results), or None."""
    tensors = rule.operands + rule.results
    src_factors = tensors[src]
    factors = src_factors[dim] if src_factors is not None else ()
    if len(factors) != 1 or rule.kinds[factors[0]] is not Kind.PASS:
        return None
    return next((d for d, fs in enumerate(tensors[dst] or ()) if fs[:1] == factors), None)


_RELAYOUTS = frozenset(("convert_element_type", "copy", "transpose"))


def state_layouts(prog: Program) -> set[int]:
    """The carried state's inputs (parameters, optimizer state) and their layout copies
    (`relayouts`)."""
    out: set[int] = set()
    for path in prog.carried.values():
        vid = prog.inputs[path]
        out.add(vid)
        out.update(w for w, _ in relayouts(prog, vid))
    return out


def relayouts(prog: Program, vid: int) -> list[tuple[int, tuple[int | None, ...]]]:
    """The values that are `vid` laid out anew, with the dim of each that every dim of
    `vid` becomes (None: none): through dtype converts, copies and transposes, and into
    loop bodies that scan over it (xs) or read it whole (const). A scanned layer stack's
    slice, transposed and cast to bf16, is the parameter: XLA gives it the parameter's
    sharding, whatever the activations it meets ask."""
    attach_rules(prog)
    out: list[tuple[int, tuple[int | None, ...]]] = []
    start: tuple[int | None, ...] = tuple(range(len(prog.values[vid].shape)))
    frontier = [(vid, start)]
    seen = {vid}
    while frontier:
        v, dims = frontier.pop()
        for i in prog.users[v]:
            op = prog.ops[i]
            if op.primitive in _RELAYOUTS and op.inputs[0] == v:
                targets = [(len(op.inputs) + k, w) for k, w in enumerate(op.outputs)]
            elif (
                op.primitive == "_link"
                and op.inputs[0] == v
                and op.params["kind"] in ("xs", "const")
                and op.inputs[1] is not None
            ):
                targets = [(1, op.inputs[1])]
            else:
                continue
            for t, w in targets:
                if w in seen:
                    continue
                seen.add(w)
                mapped = tuple(None if d is None else _same_dim(op.rule, 0, d, t) for d in dims)
                out.append((w, mapped))
                frontier.append((w, mapped))
    return out


ROUTERS = frozenset(("top_k", "argmax", "argmin", "argsort"))  # what picks experts by score


def routed(prog: Program, op: Any) -> bool:
    """Whether gather `op`'s indices come from a router: a `top_k` / `argmax` of scores
    (`w_in[top_k(logits)[1]]`), not from the data (token ids)."""
    frontier, seen = [op.inputs[1]], {op.inputs[1]}
    while frontier:
        v = frontier.pop()
        i = prog.producer[v] if v is not None else None
        if i is None:
            continue
        producer = prog.ops[i]
        if producer.primitive in ROUTERS:
            return True
        for w in producer.inputs:
            if w is not None and w not in seen:
                seen.add(w)
                frontier.append(w)
    return False


def gathered_tables(prog: Program, *, by_router: bool = False) -> dict[int, int]:
    """{input: its looked-up dim}: inputs whose value, through dtype converts, copies,
    reshapes, transposes and loop links, is a gather's operand indexed on a dim that the
    gather's rule makes a reduction (an embedding's vocabulary: each device looks up the
    rows it holds and an all-reduce completes the result). With `by_router`, only gathers
    whose indices a router chose (`routed`): experts' weights dispatched by index."""
    through = {"convert_element_type", "reshape", "transpose", "copy", "_link"}
    attach_rules(prog)
    out: dict[int, int] = {}
    for vid in prog.inputs.values():
        for d0 in range(len(prog.values[vid].shape)):
            frontier, seen = [(vid, d0)], {vid}
            while frontier and vid not in out:
                v, d = frontier.pop()
                for i in prog.users[v]:
                    op = prog.ops[i]
                    if op.primitive == "gather" and op.inputs[0] == v:
                        fs = op.rule.operands[0][d]
                        if by_router and not routed(prog, op):
                            continue
                        if len(fs) == 1 and op.rule.kinds[fs[0]] is Kind.REDUCTION:
                            out[vid] = d0
                            break
                        continue
                    if op.primitive not in through:
                        continue
                    src = op.inputs.index(v)
                    if op.primitive == "_link":
                        if src != 0:
                            continue
                        link_dst = op.inputs[1]
                        assert link_dst is not None  # a link joins two values
                        nxt = [(1, link_dst)]
                    else:
                        nxt = [(len(op.inputs) + k, w) for k, w in enumerate(op.outputs)]
                    for t, w in nxt:
                        e = _same_dim(op.rule, src, d, t)
                        if e is not None and w not in seen:
                            seen.add(w)
                            frontier.append((w, e))
    return out


def expert_dims(prog: Program) -> dict[int, int]:
    """{input: its experts dim}, found by structure: an input whose dim is a batch dim of a
    dot_general it reaches through dtype converts and copies (a scanned layer stack reaches
    it through the loop, one dim further in), as `einsum("ecd,edf->ecf", x, w)` does; or
    the dim a router's choice indexes (`w[top_k(logits)[1]]`, see `routed`)."""
    through = {"convert_element_type", "copy"}
    out: dict[int, int] = gathered_tables(prog, by_router=True)
    for vid in prog.inputs.values():
        frontier, seen = [(vid, 0)], {vid}
        while frontier and vid not in out:
            v, shift = frontier.pop()
            for i in prog.users[v]:
                op = prog.ops[i]
                if op.primitive == "dot_general":
                    (_, _), (lb, rb) = op.params["dimension_numbers"]
                    batch = [d for k, d in ((0, lb), (1, rb)) if op.inputs[k] == v for d in d]
                    if batch:
                        out[vid] = batch[0] + shift
                        break
                    continue
                if op.primitive in through:
                    nxt = [(w, shift) for w in op.outputs]
                elif op.primitive == "_link" and op.inputs[0] == v and op.params["kind"] == "xs":
                    link_dst = op.inputs[1]
                    assert link_dst is not None  # a link joins two values
                    nxt = [(link_dst, shift + op.params["offset"])]
                else:
                    continue
                for w, s in nxt:
                    if w not in seen:
                        seen.add(w)
                        frontier.append((w, s))
    return out
