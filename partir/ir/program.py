"""Trace a JAX function into a flat `Program`: values, ops in program order, named inputs.

Nested calls (`jit`, `custom_jvp_call`, `custom_vjp_call`, `remat`) are inlined. Control
flow (`scan`, `while`, `cond`) keeps its body ops in the same flat list, tagged with how many
times they run, and joined to the outer values by `_link` ops whose rule says that the two
sides share one sharding (the carried state of a loop, its consts, its sliced inputs).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from partir.ir.jaxpr_walk import (
    BODY,
    COND,
    JaxprWalker,
    expand_high_primitives,
    inlined_jaxpr,
    open_jaxpr,
    scan_counts,
)
from partir.ir.messages import first_line

Path = str


@dataclasses.dataclass(frozen=True)
class Value:
    """One array in the program: its id, global shape and dtype."""

    id: int
    shape: tuple[int, ...]
    dtype: np.dtype
    itemsize: int

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclasses.dataclass
class Op:
    """One primitive application. `inputs` holds value ids, or None for a literal."""

    index: int
    primitive: str
    inputs: tuple[int | None, ...]
    outputs: tuple[int, ...]
    params: dict[str, Any]
    multiplicity: int = 1
    source: str = ""  # the user's frame, as JAX summarizes it: "path/model.py:12:8 (attn)"
    rule: Any = None  # a partir.ir.rules.Rule, set by Program.attach_rules
    scope: str = ""  # the named scopes around the op: "layers/3/attn"
    # the checkpoint region (with prevent_cse) the op runs in, numbered from 1; 0: none.
    # XLA computes nothing twice within a region, but recomputes what it needs in each
    region: int = 0

    def __repr__(self) -> str:
        return f"Op({self.index}, {self.primitive}, in={self.inputs}, out={self.outputs})"

    @property
    def location(self) -> str:
        """Where the op comes from, for messages: " at layers/3/attn (from model.py:12)"."""
        text = f" at {self.scope}" if self.scope else ""
        m = _SOURCE.match(self.source)
        if m:
            text += f" (from {os.path.basename(m['file'])}:{m['line']}"
            text += f" in {m['fn']})" if m["fn"] else ")"
        return text


_SOURCE = re.compile(r"(?P<file>.+?):(?P<line>\d+)(?::\d+)?(?: \((?P<fn>[^)]*)\))?$")


@dataclasses.dataclass
class Program:
    """A traced function: values, ops in program order, and named inputs and outputs."""

    values: list[Value]
    ops: list[Op]
    inputs: dict[Path, int]
    outputs: dict[Path, int]
    carried: dict[Path, Path]  # output path -> the input path it is the next version of
    in_tree: Any
    out_tree: Any
    jaxpr: Any  # the ClosedJaxpr it came from, for plan.jit
    arg_names: tuple[str, ...]
    eqn_outputs: dict[tuple, list[int]] = dataclasses.field(default_factory=dict)
    users: list[list[int]] = dataclasses.field(default_factory=list)
    producer: list[int | None] = dataclasses.field(default_factory=list)
    # per scan or while loop, (first op, last op): the ops that bind its inputs, its body
    # (nested loops inside), and the links that close it
    loops: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    ruled_ops: int = 0  # how many of `ops`, from the first, have their rule (attach_rules)

    def __post_init__(self) -> None:
        self.users = [[] for _ in self.values]
        self.producer = [None] * len(self.values)
        for op in self.ops:
            for v in op.inputs:
                if v is not None and op.index not in self.users[v]:
                    self.users[v].append(op.index)
            for v in op.outputs:
                self.producer[v] = op.index
        self.input_paths = {vid: path for path, vid in self.inputs.items()}

    def value(self, vid: int) -> Value:
        return self.values[vid]

    def primitives(self) -> dict[str, int]:
        """How many ops of each primitive the program holds."""
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.primitive] = counts.get(op.primitive, 0) + 1
        return dict(sorted(counts.items()))

    def __repr__(self) -> str:
        return (
            f"Program({len(self.inputs)} inputs, {len(self.outputs)} outputs, "
            f"{len(self.ops)} ops, {len(self.values)} values)"
        )


def path_str(prefix: str, keypath: Sequence[Any], *, quote: bool = False) -> Path:
    """Join a pytree key path with '/': dict keys, indices, attribute names.

    A dict key that holds '/' itself (Keras' `dense_1/kernel`) is kept as written, so a
    glob matches it as the user would write it; with `quote`, it is written as `'a/b'`
    and a key that is no string as `[1]`, to tell apart paths that would read alike."""
    parts = [prefix] if prefix else []
    for key in keypath:
        if isinstance(key, jax.tree_util.DictKey):
            k = key.key
            if quote and not isinstance(k, str):
                parts.append(f"[{k!r}]")
            elif quote and "/" in k:
                parts.append(repr(k))
            else:
                parts.append(str(k))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            parts.append(key.name)
        elif isinstance(key, jax.tree_util.FlattenedIndexKey):
            parts.append(str(key.key))
        else:
            parts.append(str(key).strip("[]."))
    return "/".join(parts)


def leaf_paths(prefix: str, keypaths: Sequence[Sequence[Any]]) -> list[Path]:
    """`path_str` of every leaf, made unique: paths that would read alike (`{"a/b": x}`
    beside `{"a": {"b": y}}`) are written with quoted keys, and any still alike get `#k`."""
    paths = [path_str(prefix, kp) for kp in keypaths]
    alike = {p for p, n in Counter(paths).items() if n > 1}
    if not alike:
        return paths
    paths = [
        path_str(prefix, kp, quote=True) if p in alike else p for p, kp in zip(paths, keypaths)
    ]
    seen: Counter[str] = Counter()
    out = []
    for p in paths:
        seen[p] += 1
        out.append(p if seen[p] == 1 else f"{p}#{seen[p]}")
    return out


def arg_names(fn: Callable, nargs: int) -> tuple[str, ...]:
    """The function's parameter names for its first `nargs` positional args."""
    try:
        params = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    names = list(params[:nargs])
    names += [f"arg{i}" for i in range(len(names), nargs)]
    return tuple(names)


def abstractify(x: Any) -> Any:
    """An array or ShapeDtypeStruct leaf as a ShapeDtypeStruct; other leaves unchanged."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype)
    return x


def _itemsize(dtype: Any) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        # A typed key array holds its key data: threefry keys are 2 x uint32.
        key_shape = getattr(getattr(dtype, "_impl", None), "key_shape", (2,))
        return int(np.prod(key_shape)) * 4
    return np.dtype(dtype).itemsize


class _Builder(JaxprWalker):
    """Walks a jaxpr, inlining calls and flattening control flow into one op list."""

    def __init__(self) -> None:
        self.values: list[Value] = []
        self.ops: list[Op] = []
        # equation key (its position in the nest of jaxprs) -> its output value ids
        self.eqn_outputs: dict[tuple, list[int]] = {}
        self.loops: list[tuple[int, int]] = []
        self.regions = 0  # checkpoint regions entered so far
        self.region = 0  # the one the ops now emitted run in
        self.computed: dict[tuple, list[int]] = {}  # an equation's CSE key -> its outputs
        self.made_of_literals: set[int] = set()  # values computed from literals alone

    def new_value(self, aval: Any) -> int:
        shape = tuple(int(d) for d in getattr(aval, "shape", ()))
        dtype = getattr(aval, "dtype", np.dtype("float32"))
        vid = len(self.values)
        try:
            itemsize = _itemsize(dtype)
        except Exception:  # an opaque dtype we cannot size: count one byte per element
            itemsize = 1
        self.values.append(Value(vid, shape, dtype, itemsize))
        return vid

    def add_op(
        self,
        primitive: str,
        inputs: Sequence[int | None],
        outputs: Sequence[int],
        params: dict[str, Any],
        multiplicity: int,
        source: str = "",
        scope: str = "",
    ) -> Op:
        op = Op(
            len(self.ops),
            primitive,
            tuple(inputs),
            tuple(outputs),
            params,
            multiplicity,
            source,
            scope=scope,
            region=self.region,
        )
        self.ops.append(op)
        return op

    def link(self, src: int, dst: int, kind: str, mult: int, offset: int = 0) -> None:
        """`dst` shares `src`'s sharding; with `offset`, src has `offset` extra leading dims."""
        self.add_op("_link", (src, dst), (), {"kind": kind, "offset": offset}, mult)

    def constant(self, x: Any) -> int:
        return self.new_value(jax.ShapeDtypeStruct(np.shape(x), x.dtype))

    def run(  # type: ignore[override]  # the walker's **context is always mult (and scope) here
        self,
        jaxpr: Any,
        consts: Sequence[Any],
        args: Sequence[int | None],
        prefix: tuple = (),
        *,
        mult: int,
        scope: str = "",
    ) -> list[int]:
        """Emit the ops of `jaxpr` with its invars bound to `args`; return the outvar ids.
        Each equation's outputs are recorded under its key (`ir/jaxpr_walk.py`). `scope` is
        the name stack of the equation that holds `jaxpr` (its own is relative)."""
        return super().run(jaxpr, consts, args, prefix, mult=mult, scope=scope)

    def literal(self, atom: Any) -> None:
        return None

    def result(self, vid: int | None, atom: Any) -> int:
        return self.new_value(atom.aval) if vid is None else vid  # a literal: a value of its own

    def equation(  # type: ignore[override]  # the walker's **context is always mult (and scope) here
        self, eqn: Any, ins: list[int | None], key: tuple, *, mult: int, scope: str = ""
    ) -> list[int]:
        scope = _join_scope(scope, eqn)
        outs = self._emit(eqn, ins, mult, key, scope)
        self.eqn_outputs[key] = outs
        return outs

    def _emit(
        self, eqn: Any, ins: list[int | None], mult: int, key: tuple, scope: str
    ) -> list[int]:
        name = eqn.primitive.name
        inlined = inlined_jaxpr(eqn)
        if inlined is not None:
            if not _prevents_cse(eqn):
                return self.run(*inlined, ins, key, mult=mult, scope=scope)
            outer, self.regions = self.region, self.regions + 1
            self.region = self.regions
            try:
                return self.run(*inlined, ins, key, mult=mult, scope=scope)
            finally:
                self.region = outer
        if name == "scan":
            return self.scan(eqn, ins, mult, key, scope)
        if name == "while":
            return self.while_loop(eqn, ins, mult, key, scope)
        if name == "cond":
            return self.cond(eqn, ins, mult, key, scope)
        # free values (made of literals alone: XLA makes one at each reader, in the sharding
        # it needs) are never merged
        literals_only = all(v is None or v in self.made_of_literals for v in ins)
        same = None if literals_only else _cse_key(eqn, ins, mult, self.region)
        if same is not None and same in self.computed:
            return list(self.computed[same])
        outs = [self.new_value(v.aval) for v in eqn.outvars]
        if literals_only:
            self.made_of_literals.update(outs)
        self.add_op(name, ins, outs, dict(eqn.params), mult, _source(eqn), scope)
        if same is not None:
            self.computed[same] = outs
        return outs

    def _bind_inputs(
        self,
        outer: Sequence[int | None],
        inner_avals: Sequence[Any],
        kind: str,
        mult: int,
        offset: int = 0,
    ) -> list[int]:
        bound = []
        for src, aval in zip(outer, inner_avals):
            dst = self.new_value(aval)
            if src is not None:
                self.link(src, dst, kind, mult, offset)
            bound.append(dst)
        return bound

    def scan(
        self, eqn: Any, ins: list[int | None], mult: int, key: tuple, scope: str = ""
    ) -> list[int]:
        p = eqn.params
        first = len(self.ops)
        jaxpr, consts = open_jaxpr(p["jaxpr"])
        nc, nk = scan_counts(p)
        inner = mult * int(p["length"])
        avals = [v.aval for v in jaxpr.invars]
        body_in = (
            self._bind_inputs(ins[:nc], avals[:nc], "const", inner)
            + self._bind_inputs(ins[nc : nc + nk], avals[nc : nc + nk], "carry", mult)
            + self._bind_inputs(ins[nc + nk :], avals[nc + nk :], "xs", inner, offset=1)
        )
        body_out = self.run(jaxpr, consts, body_in, key + (BODY,), mult=inner, scope=scope)
        for out, carry_in in zip(body_out[:nk], body_in[nc : nc + nk]):
            self.link(out, carry_in, "carry", inner)
        outs = [self.new_value(v.aval) for v in eqn.outvars]
        for out, res in zip(body_out[:nk], outs[:nk]):
            self.link(out, res, "carry", mult)
        for out, res in zip(body_out[nk:], outs[nk:]):
            self.link(res, out, "ys", inner, offset=1)
        self.loops.append((first, len(self.ops) - 1))
        return outs

    def while_loop(
        self, eqn: Any, ins: list[int | None], mult: int, key: tuple, scope: str = ""
    ) -> list[int]:
        p = eqn.params
        first = len(self.ops)
        cjaxpr, cconsts = open_jaxpr(p["cond_jaxpr"])
        bjaxpr, bconsts = open_jaxpr(p["body_jaxpr"])
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        carry = ins[nc + nb :]
        cavals = [v.aval for v in cjaxpr.invars]
        bavals = [v.aval for v in bjaxpr.invars]
        cond_in = self._bind_inputs(ins[:nc], cavals[:nc], "const", mult)
        body_consts = self._bind_inputs(ins[nc : nc + nb], bavals[:nb], "const", mult)
        body_carry = self._bind_inputs(carry, bavals[nb:], "carry", mult)
        self.run(cjaxpr, cconsts, cond_in + body_carry, key + (COND,), mult=mult, scope=scope)
        body_out = self.run(
            bjaxpr, bconsts, body_consts + body_carry, key + (BODY,), mult=mult, scope=scope
        )
        outs = [self.new_value(v.aval) for v in eqn.outvars]
        for out, carry_in, res in zip(body_out, body_carry, outs):
            self.link(out, carry_in, "carry", mult)
            self.link(out, res, "carry", mult)
        self.loops.append((first, len(self.ops) - 1))
        return outs

    def cond(
        self, eqn: Any, ins: list[int | None], mult: int, key: tuple, scope: str = ""
    ) -> list[int]:
        outs = [self.new_value(v.aval) for v in eqn.outvars]
        for b, branch in enumerate(eqn.params["branches"]):
            jaxpr, consts = open_jaxpr(branch)
            bound = self._bind_inputs(ins[1:], [v.aval for v in jaxpr.invars], "operand", mult)
            for out, res in zip(
                self.run(jaxpr, consts, bound, key + (b,), mult=mult, scope=scope), outs
            ):
                self.link(out, res, "branch", mult)
        return outs


def _source(eqn: Any) -> str:
    try:
        from jax._src import source_info_util

        return source_info_util.summarize(eqn.source_info)
    except Exception:  # internal API: a missing source line is not worth failing over
        return ""


_TRANSFORM = re.compile(r"[A-Za-z_][\w.]*\(|\)")


_NOT_MERGED = frozenset(("optimization_barrier", "random_seed", "random_bits", "random_wrap"))


def _cse_key(eqn: Any, ins: Sequence[int | None], mult: int, region: int) -> tuple | None:
    """What makes an equation the same computation as an earlier one, as XLA's CSE merges
    them (`jnp` writes `x - mean` twice in a layer norm; XLA computes it once): its
    primitive, operands (literals by value), parameters, multiplicity and checkpoint
    region. None for one that is never merged: effects, unhashable parameters."""
    if eqn.effects or eqn.primitive.name in _NOT_MERGED:
        return None
    operands: list[Any] = []
    for vid, atom in zip(ins, eqn.invars):
        if vid is not None:
            operands.append(vid)
            continue
        value = np.asarray(getattr(atom, "val", None))
        if value.dtype == object:
            return None
        operands.append((value.dtype.str, value.shape, value.tobytes()))
    try:
        params = tuple(sorted(eqn.params.items()))
        hash(params)
    except TypeError:
        return None
    return (eqn.primitive.name, tuple(operands), params, mult, region)


def _prevents_cse(eqn: Any) -> bool:
    """Whether `eqn` is a checkpoint region whose recompute XLA must not merge with the
    computation outside it (JAX puts an optimization barrier on its operands)."""
    if eqn.primitive.name not in ("checkpoint", "remat2"):
        return False
    flag = eqn.params.get("prevent_cse", True)
    return flag if isinstance(flag, bool) else any(flag)


def _join_scope(outer: str, eqn: Any) -> str:
    """`outer` and the equation's own name stack, with JAX's transform wrappers taken off:
    a backward-pass op under `transpose(jvp(layers/3))` belongs to `layers/3`."""
    try:
        own = str(eqn.source_info.name_stack)
    except Exception:  # internal API: a missing scope is not worth failing over
        own = ""
    parts = [p for p in _TRANSFORM.sub("", f"{outer}/{own}").split("/") if p]
    return "/".join(parts)


class TraceError(ValueError):
    """The function could not be traced on its arguments (its own error, or JAX's)."""


def trace(fn: Callable, args: Sequence[Any], *, names: Sequence[str] | None = None) -> Program:
    """Trace `fn(*args)` without allocating anything and flatten it into a `Program`.

    `args` may hold arrays or `jax.ShapeDtypeStruct`s. Inputs are named by the parameter
    name of `fn` and the pytree key path (`params/layers/3/mlp/w_in`); outputs by `out/...`.
    """
    args = tuple(args)
    abstract = jax.tree_util.tree_map(abstractify, args)
    try:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*abstract)
        closed = expand_high_primitives(closed)
    except Exception as e:  # the user's function (or its arguments) fails under JAX
        name = getattr(fn, "__qualname__", None) or repr(fn)
        raise TraceError(f"tracing {name} on the given arguments failed: {first_line(e)}") from e
    arg_names_ = tuple(names) if names is not None else arg_names(fn, len(args))
    in_paths = []
    for i, arg in enumerate(abstract):
        leaves, _ = jax.tree_util.tree_flatten_with_path(arg)
        in_paths += leaf_paths(arg_names_[i], [kp for kp, _ in leaves])
    in_tree = jax.tree_util.tree_structure(abstract)
    out_leaves, out_tree = jax.tree_util.tree_flatten_with_path(out_shape)
    out_paths = leaf_paths("out", [kp for kp, _ in out_leaves])

    b = _Builder()
    jaxpr = closed.jaxpr
    if len(jaxpr.invars) != len(in_paths):
        raise ValueError(
            f"traced {len(jaxpr.invars)} array inputs but the args hold {len(in_paths)} leaves"
        )
    in_ids = [b.new_value(v.aval) for v in jaxpr.invars]
    out_ids = b.run(jaxpr, closed.consts, in_ids, mult=1)
    inputs = dict(zip(in_paths, in_ids))
    outputs = dict(zip(out_paths, out_ids))
    carried = find_carried(inputs, outputs, b.values)
    for out_path, in_path in carried.items():
        b.link(outputs[out_path], inputs[in_path], "state", 1)
    return Program(
        values=b.values,
        ops=b.ops,
        inputs=inputs,
        outputs=outputs,
        carried=carried,
        in_tree=in_tree,
        out_tree=out_tree,
        jaxpr=closed,
        arg_names=arg_names_,
        eqn_outputs=b.eqn_outputs,
        loops=b.loops,
    )


def find_carried(inputs: dict[Path, int], outputs: dict[Path, int], values: list[Value]):
    """Link each output that is the next-step version of an input.

    An output `out/<k>/<tail>` matches input `<name>/<tail>` when the shapes and dtypes are
    equal and the output position `k` is the input's argument position, or when the tail
    is unique among the inputs; or `out/<tail>` matches `<name>/<tail>`. Train steps
    returning `(params, opt_state, metrics)`, a dict of new state, or the new version of
    their one state argument (`params -> params`) are covered.
    """
    by_tail: dict[str, list[Path]] = {}
    for path in inputs:
        head, _, tail = path.partition("/")
        by_tail.setdefault(tail, []).append(path)
    arg_order = list(dict.fromkeys(p.split("/", 1)[0] for p in inputs))
    carried: dict[Path, Path] = {}
    used: set[Path] = set()
    for out_path, out_vid in outputs.items():
        parts = out_path.split("/")
        if len(parts) < 2:
            continue
        candidates: list[Path] = []
        if len(parts) >= 3:
            if parts[1].isdigit() and int(parts[1]) < len(arg_order):
                candidates.append(arg_order[int(parts[1])] + "/" + "/".join(parts[2:]))
            candidates += by_tail.get("/".join(parts[2:]), [])
        # a step that returns its one state argument's new version: out/<tail>
        candidates += by_tail.get("/".join(parts[1:]), [])
        for cand in candidates:
            vin = inputs.get(cand)
            if vin is None or cand in used:
                continue
            a, b = values[vin], values[out_vid]
            if a.shape == b.shape and a.dtype == b.dtype:
                carried[out_path] = cand
                used.add(cand)
                break
    return carried
