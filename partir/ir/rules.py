"""Sharding rules in factor form, one table from primitive name to rule builder.

As in Shardy's OpShardingRule, every operand and result dimension maps to factors; a
factor is shared by the dimensions that must be tiled alike. Kinds say what sharding a
factor costs:

- PASS: each device computes its tile; no communication.
- REDUCTION: the factor is summed over (a contracting dim); each device holds a partial
  result, so the partitioner adds an all-reduce (or a reduce-scatter) on the result.
- REPLICATE: the dim must be whole on every device; a sharded operand is all-gathered.
- PERMUTE: data moves between tiles (concatenate, pad, reverse, slice); partir gathers
  these too, so they cost like REPLICATE and do not propagate.

A dim maps to one factor, or to several (major first) where a reshape splits or merges
dims. Each rule is a small function that maps dims to factors with a `Builder`; the
elementwise primitives (`POINTWISE`) share one. A rule prints in Shardy's notation,
`([i, k], [k, j])->([i, j]) {i=4, j=8, k=16} reduction={k}`, and tests/data/rules.txt pins
one such line for every primitive of the table.

Keep `RULES` and `POINTWISE` alphabetical (tests/test_rules.py reads their order here).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

Shape = tuple[int, ...]
DimFactors = tuple[int, ...]  # the factors of one dim, major first
TensorFactors = tuple[DimFactors, ...]


class Kind(enum.Enum):
    PASS = "pass"
    REDUCTION = "reduction"
    REPLICATE = "need-replication"
    PERMUTE = "permutation"


@dataclasses.dataclass(frozen=True)
class Rule:
    """Per operand (None for a literal) and result: per dim, its factors."""

    operands: tuple[TensorFactors | None, ...]
    results: tuple[TensorFactors, ...]
    sizes: tuple[int, ...]
    kinds: tuple[Kind, ...]
    reduce_op: str = "sum"

    def __str__(self) -> str:
        names = _factor_names(len(self.sizes))

        def tensor(t: TensorFactors | None) -> str:
            if t is None:
                return "_"
            dims = ["".join(names[f] for f in d) or "1" for d in t]
            return "[" + ", ".join(dims) + "]"

        ops = ", ".join(tensor(t) for t in self.operands)
        res = ", ".join(tensor(t) for t in self.results)
        sizes = ", ".join(f"{names[i]}={s}" for i, s in enumerate(self.sizes))
        text = f"({ops})->({res}) {{{sizes}}}"
        for kind in (Kind.REDUCTION, Kind.REPLICATE, Kind.PERMUTE):
            fs = [names[i] for i, k in enumerate(self.kinds) if k is kind]
            if fs:
                text += f" {kind.value}={{{', '.join(fs)}}}"
        return text


def _factor_names(n: int) -> list[str]:
    letters = "ijklmnopqrstuvwxyzabcdefgh"
    return [letters[i] if i < len(letters) else f"f{i}" for i in range(n)]


class Builder:
    """Build a rule factor by factor; dims left unmapped get a REPLICATE factor each."""

    def __init__(self, ins: Sequence[Shape | None], outs: Sequence[Shape]) -> None:
        self.ins = list(ins)
        self.outs = list(outs)
        self.op_dims: list[list[list[int]] | None] = [
            None if s is None else [[] for _ in s] for s in ins
        ]
        self.res_dims: list[list[list[int]]] = [[[] for _ in s] for s in outs]
        self.sizes: list[int] = []
        self.kinds: list[Kind] = []

    def factor(
        self,
        size: int,
        kind: Kind = Kind.PASS,
        operands: dict[int, int] | None = None,
        results: dict[int, int] | None = None,
    ) -> int:
        """A factor of `size` on operand dims {operand: dim} and result dims {result: dim}."""
        f = len(self.sizes)
        self.sizes.append(int(size))
        self.kinds.append(kind)
        for i, d in (operands or {}).items():
            dims = self.op_dims[i]
            if dims is not None:
                dims[d].append(f)
        for i, d in (results or {}).items():
            self.res_dims[i][d].append(f)
        return f

    def build(self, reduce_op: str = "sum", unmapped: Kind = Kind.REPLICATE) -> Rule:
        """The rule; each dim no factor maps gets a factor of kind `unmapped` of its own."""
        for dims, shape in zip(self.op_dims, self.ins):
            if dims is not None and shape is not None:
                for d, fs in enumerate(dims):
                    if not fs:
                        fs.append(self.factor(shape[d], unmapped))
        for dims, shape in zip(self.res_dims, self.outs):
            for d, fs in enumerate(dims):
                if not fs:
                    fs.append(self.factor(shape[d], unmapped))
        return Rule(
            operands=tuple(None if d is None else tuple(tuple(x) for x in d) for d in self.op_dims),
            results=tuple(tuple(tuple(x) for x in d) for d in self.res_dims),
            sizes=tuple(self.sizes),
            kinds=tuple(self.kinds),
            reduce_op=reduce_op,
        )


def pointwise(ins: Sequence[Shape | None], outs: Sequence[Shape], params: Any = None) -> Rule:
    """Tensors of the result's rank share a factor per dim; a size-1 dim broadcast against
    a larger one, a scalar, or a literal keeps its dim whole."""
    shape = outs[0] if outs else next(s for s in ins if s is not None)
    b = Builder(ins, outs)
    for d, size in enumerate(shape):
        b.factor(
            size,
            operands={
                i: d
                for i, s in enumerate(ins)
                if s is not None and len(s) == len(shape) and s[d] == size
            },
            results={i: d for i, s in enumerate(outs) if len(s) == len(shape) and s[d] == size},
        )
    for i, s in enumerate(ins):  # an operand of another rank (a scalar) keeps its dims whole
        if s is not None and len(s) != len(shape) and b.op_dims[i] is not None:
            b.op_dims[i] = [[] for _ in s]
    return b.build()


def conservative(ins: Sequence[Shape | None], outs: Sequence[Shape], params: Any = None) -> Rule:
    """Every dim needs replication: the rule for primitives partir does not know."""
    return Builder(ins, outs).build()


def _dot_general(ins, outs, params) -> Rule:
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    lhs, rhs = ins
    b = Builder(ins, outs)
    lfree = [d for d in range(len(lhs)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(rhs)) if d not in rc and d not in rb]
    for r, (x, y) in enumerate(zip(lb, rb)):
        b.factor(lhs[x], operands={0: x, 1: y}, results={0: r})
    for i, d in enumerate(lfree):
        b.factor(lhs[d], operands={0: d}, results={0: len(lb) + i})
    for i, d in enumerate(rfree):
        b.factor(rhs[d], operands={1: d}, results={0: len(lb) + len(lfree) + i})
    for x, y in zip(lc, rc):
        b.factor(lhs[x], Kind.REDUCTION, operands={0: x, 1: y})
    return b.build()


def _transpose(ins, outs, params) -> Rule:
    b = Builder(ins, outs)
    for r, d in enumerate(params["permutation"]):
        b.factor(ins[0][d], operands={0: d}, results={0: r})
    return b.build()


def _broadcast_in_dim(ins, outs, params) -> Rule:
    b = Builder(ins, outs)
    dims = params["broadcast_dimensions"]
    for r, size in enumerate(outs[0]):
        if r in dims and ins[0][dims.index(r)] == size:
            b.factor(size, operands={0: dims.index(r)}, results={0: r})
        else:
            b.factor(size, results={0: r})
    return b.build()


def _reduce(kind: Kind, reduce_op: str) -> Callable[..., Rule]:
    def rule(ins, outs, params) -> Rule:
        axes = set(params["axes"])
        b = Builder(ins, outs)
        r = 0
        for d, size in enumerate(ins[0]):
            if d in axes:
                b.factor(size, kind, operands={0: d})
            else:
                b.factor(size, operands={0: d}, results={i: r for i in range(len(outs))})
                r += 1
        return b.build(reduce_op)

    return rule


def _along_axis(axis_param: str, kind: Kind = Kind.REPLICATE) -> Callable[..., Rule]:
    """Ops that act along one axis (cumsum, sort, argsort): that axis stays whole."""

    def rule(ins, outs, params) -> Rule:
        axis = params[axis_param]
        rank = len(outs[0])
        axis = axis % rank if rank else 0
        b = Builder(ins, outs)
        for d, size in enumerate(outs[0]):
            b.factor(
                size,
                kind if d == axis else Kind.PASS,
                operands={i: d for i, s in enumerate(ins) if s is not None and len(s) == rank},
                results={i: d for i, s in enumerate(outs) if len(s) == rank},
            )
        return b.build()

    return rule


def _argreduce(ins, outs, params) -> Rule:
    axes = set(params["axes"])
    b = Builder(ins, outs)
    r = 0
    for d, size in enumerate(ins[0]):
        if d in axes:
            continue
        b.factor(size, operands={0: d}, results={0: r})
        r += 1
    return b.build()


def _concatenate(ins, outs, params) -> Rule:
    dim = params["dimension"]
    b = Builder(ins, outs)
    for d, size in enumerate(outs[0]):
        if d != dim:
            b.factor(size, operands={i: d for i in range(len(ins))}, results={0: d})
    return b.build(unmapped=Kind.PERMUTE)


def _split(ins, outs, params) -> Rule:
    axis = params["axis"]
    b = Builder(ins, outs)
    for d, size in enumerate(ins[0]):
        if d != axis:
            b.factor(size, operands={0: d}, results={i: d for i in range(len(outs))})
    return b.build(unmapped=Kind.PERMUTE)


def _shard_map(ins, outs, params) -> Rule:
    """A dim that shard_map's in/out specs split is a factor of its own (partir.ir.
    constraints pins it to the spec's axes); the body sees the rest whole."""
    b = Builder(ins, outs)
    for specs, shapes, side in (
        (params["in_specs"], ins, "operands"),
        (params["out_specs"], outs, "results"),
    ):
        for i, (spec, shape) in enumerate(zip(specs, shapes)):
            for d, entry in enumerate(tuple(spec)[: len(shape or ())]):
                if entry is not None:
                    b.factor(shape[d], Kind.PASS, **{side: {i: d}})
    return b.build()


def _same_size_dims(ins, outs, params) -> Rule:
    """slice, pad, rev, dynamic_slice: dims that keep their size pass through.

    rev keeps sizes but moves data, so its reversed dims stay whole.
    """
    reversed_dims = set(params.get("dimensions", ())) if params else set()
    pads = params.get("padding_config") if params else None
    b = Builder(ins, outs)
    for d, size in enumerate(outs[0]):
        same = ins[0][d] == size and d not in reversed_dims
        if pads is not None and any(pads[d]):
            same = False
        if same:
            b.factor(size, operands={0: d}, results={0: d})
    return b.build(unmapped=Kind.PERMUTE)


def _dynamic_update_slice(ins, outs, params) -> Rule:
    """Dims the update covers whole pass through operand, update and result; a dim written
    at a dynamic offset stays whole (which device holds the window is known only at run
    time), on the operand, the result and the update alike."""
    operand, update = ins[0], ins[1]
    b = Builder(ins, outs)
    for d, size in enumerate(operand):
        if update is not None and update[d] == size:
            b.factor(size, operands={0: d, 1: d}, results={0: d})
    return b.build(unmapped=Kind.PERMUTE)


def _squeeze(ins, outs, params) -> Rule:
    dims = {d % len(ins[0]) for d in params["dimensions"]}
    b = Builder(ins, outs)
    r = 0
    for d, size in enumerate(ins[0]):
        if d not in dims:
            b.factor(size, operands={0: d}, results={0: r})
            r += 1
    return b.build()


def _reshape(ins, outs, params) -> Rule:
    """Group dims whose sizes multiply alike; a split or merge gets compound factors."""
    src, dst = ins[0], outs[0]
    b = Builder(ins, outs)
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == 1:
            i += 1
            continue
        if j < len(dst) and dst[j] == 1:
            j += 1
            continue
        if i >= len(src) or j >= len(dst):
            break
        gi, gj = [i], [j]
        pi, pj = src[i], dst[j]
        while pi != pj:
            if pi < pj:
                i += 1
                gi.append(i)
                pi *= src[i]
            else:
                j += 1
                gj.append(j)
                pj *= dst[j]
        i += 1
        j += 1
        gi = [d for d in gi if src[d] != 1]
        gj = [d for d in gj if dst[d] != 1]
        if len(gi) == 1:  # one dim split into several (or kept)
            for d in gj:
                b.factor(dst[d], operands={0: gi[0]}, results={0: d})
        elif len(gj) == 1:  # several dims merged into one
            for d in gi:
                b.factor(src[d], operands={0: d}, results={0: gj[0]})
        # many-to-many regroupings keep their dims whole (the Builder's default)
    return b.build()


def _expand_dims(ins, outs, params) -> Rule:
    return _reshape(ins, outs, params)


def _gather(ins, outs, params) -> Rule:
    """General gather. Index batch dims pass to the result, whole operand windows pass,
    and an indexed operand dim with slice size 1 (an embedding's vocabulary), collapsed or
    kept as an offset dim of size 1 (`x[i]` under vmap), is a reduction: each device looks
    up the rows it holds and a sum over devices completes the result, as XLA does."""
    operand, indices = ins
    dn = params["dimension_numbers"]
    slice_sizes = params["slice_sizes"]
    offset_dims = tuple(dn.offset_dims)
    collapsed = set(dn.collapsed_slice_dims)
    start_map = tuple(dn.start_index_map)
    operand_batching = tuple(getattr(dn, "operand_batching_dims", ()))
    indices_batching = tuple(getattr(dn, "start_indices_batching_dims", ()))
    b = Builder(ins, outs)
    out_rank = len(outs[0])
    batch_out = [d for d in range(out_rank) if d not in offset_dims]
    index_vector_dim = len(indices) - 1
    idx_batch = [d for d in range(len(indices)) if d != index_vector_dim]
    for od, idd in zip(batch_out, idx_batch):
        ops = {1: idd}
        if idd in indices_batching:
            ops[0] = operand_batching[indices_batching.index(idd)]
        b.factor(outs[0][od], operands=ops, results={0: od})
    window = [d for d in range(len(operand)) if d not in collapsed and d not in operand_batching]
    for od, d in zip(offset_dims, window):
        if slice_sizes[d] == operand[d]:  # a whole window: an index into it is clamped to 0
            b.factor(operand[d], operands={0: d}, results={0: od})
    looked_up = collapsed | {d for d in window if slice_sizes[d] < operand[d]}
    for d in sorted(looked_up):
        if slice_sizes[d] == 1 and d in start_map:
            b.factor(operand[d], Kind.REDUCTION, operands={0: d})
    return b.build()


def _scatter(add: bool) -> Callable[..., Rule]:
    def rule(ins, outs, params) -> Rule:
        """General scatter. Window dims pass; an operand dim indexed into passes between
        operand and result (each device applies the updates that land in its rows); for a
        scatter-add, the update scatter dims are a reduction (partial sums, then a sum)."""
        # a literal operand (a scalar update, as jnp.repeat emits) has no dims
        operand, indices, updates = (x if x is not None else () for x in ins[:3])
        dn = params["dimension_numbers"]
        window_dims = tuple(dn.update_window_dims)
        inserted = set(dn.inserted_window_dims)
        to_operand = tuple(dn.scatter_dims_to_operand_dims)
        op_batching = tuple(getattr(dn, "operand_batching_dims", ()))
        b = Builder(ins, outs)
        op_window = [d for d in range(len(operand)) if d not in inserted and d not in op_batching]
        for ud, d in zip(window_dims, op_window):
            if updates[ud] == operand[d] and d not in to_operand:
                b.factor(operand[d], operands={0: d, 2: ud}, results={0: d})
            else:
                b.factor(operand[d], operands={0: d}, results={0: d})
        idx_batching = tuple(getattr(dn, "scatter_indices_batching_dims", ()))
        scatter_dims = [d for d in range(len(updates)) if d not in window_dims]
        idx_dims = [d for d in range(len(indices)) if d != len(indices) - 1]
        for ud, idd in zip(scatter_dims, idx_dims):
            if idd in idx_batching:
                # a batch dim shared by operand, indices and updates (top_k's gradient):
                # XLA's partitioner (jaxlib 0.10) gathers it, so it is kept whole here too
                continue
            if add:
                b.factor(updates[ud], Kind.REDUCTION, operands={1: idd, 2: ud})
        for d in range(len(operand)):
            if d not in op_window and d not in op_batching:
                b.factor(operand[d], operands={0: d}, results={0: d})
        return b.build()

    return rule


def _conv(ins, outs, params) -> Rule:
    """conv_general_dilated: batch passes, input features contract, output features pass;
    spatial dims stay whole (no halo exchange is modelled). Grouped convs: features whole."""
    dn = params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    lhs, rhs = ins
    b = Builder(ins, outs)
    grouped = params.get("feature_group_count", 1) != 1 or params.get("batch_group_count", 1) != 1
    b.factor(lhs[lhs_spec[0]], operands={0: lhs_spec[0]}, results={0: out_spec[0]})
    if not grouped:
        b.factor(rhs[rhs_spec[0]], operands={1: rhs_spec[0]}, results={0: out_spec[1]})
        b.factor(lhs[lhs_spec[1]], Kind.REDUCTION, operands={0: lhs_spec[1], 1: rhs_spec[1]})
    return b.build()


def _window(ins, outs, params) -> Rule:
    """reduce_window_*, select_and_scatter_add: dims with a window or stride stay whole."""
    dims = params.get("window_dimensions")
    strides = params.get("window_strides", (1,) * len(dims))
    padding = params.get("padding", ((0, 0),) * len(dims))
    shape = outs[0]
    b = Builder(ins, outs)
    for d, size in enumerate(shape):
        if dims[d] == 1 and strides[d] == 1 and tuple(padding[d]) == (0, 0):
            b.factor(
                size,
                operands={
                    i: d for i, s in enumerate(ins) if s is not None and len(s) == len(shape)
                },
                results={0: d},
            )
    return b.build()


def _top_k(ins, outs, params) -> Rule:
    """top_k along `axis` (the last dim by default): that dim stays whole, and the results
    have k of it; the other dims pass."""
    rank = len(ins[0])
    axis = params.get("axis", -1) % rank
    b = Builder(ins, outs)
    for d, size in enumerate(ins[0]):
        if d != axis:
            b.factor(size, operands={0: d}, results={i: d for i in range(len(outs))})
    return b.build()


def _stack(ins, outs, params) -> Rule:
    """stack along a new `axis`: the operands' dims pass to the result's other dims; the
    new dim (one slot per operand) stays whole."""
    axis = params["axis"]
    b = Builder(ins, outs)
    for d, size in enumerate(ins[0]):
        r = d if d < axis else d + 1
        b.factor(size, operands={i: d for i in range(len(ins))}, results={0: r})
    return b.build(unmapped=Kind.PERMUTE)


def _unstack(ins, outs, params) -> Rule:
    """unstack along `axis` (jax >= 0.11, from iterating an array or random.split): the
    operand's other dims pass to every result; the unstacked dim stays whole."""
    axis = params["axis"]
    b = Builder(ins, outs)
    for d, size in enumerate(outs[0]):
        o = d if d < axis else d + 1
        b.factor(size, operands={0: o}, results={i: d for i in range(len(outs))})
    return b.build(unmapped=Kind.PERMUTE)


def _generate(ins, outs, params) -> Rule:
    """random_bits, random_split: keys [K...] -> [K..., shape...]. The key dims pass; the
    generated dims are the result's own, free to tile like an iota's (XLA generates the
    same bits in any sharding, locally with partitionable threefry)."""
    keys = ins[0]
    b = Builder(ins, outs)
    for d, size in enumerate(outs[0]):
        if d < len(keys):
            b.factor(size, operands={0: d}, results={0: d})
        else:
            b.factor(size, results={0: d})
    return b.build()


def _iota(ins, outs, params) -> Rule:
    """iota, empty (jnp.empty_like on jax >= 0.12): no operand, every result dim free."""
    b = Builder(ins, outs)
    for d, size in enumerate(outs[0]):
        b.factor(size, results={0: d})
    return b.build()


def _multi_pointwise(ins, outs, params) -> Rule:
    """Tuple ops (optimization_barrier): operand i passes to result i."""
    b = Builder(ins, outs)
    for i, s in enumerate(outs):
        if ins[i] is None:
            continue
        for d, size in enumerate(s):
            b.factor(size, operands={i: d}, results={i: d})
    return b.build()


def _random_wrap(ins, outs, params) -> Rule:
    """Key data [..., 2] <-> keys [...]: the leading dims pass, the key words stay whole."""
    b = Builder(ins, outs)
    for d, size in enumerate(outs[0]):
        b.factor(size, operands={0: d}, results={0: d})
    return b.build()


def _random_unwrap(ins, outs, params) -> Rule:
    b = Builder(ins, outs)
    for d, size in enumerate(ins[0]):
        b.factor(size, operands={0: d}, results={0: d})
    return b.build()


def _convert_like(ins, outs, params) -> Rule:
    """Dtype converts are pointwise; a bitcast that changes the width adds a last dim."""
    if ins[0] == outs[0]:
        return pointwise(ins, outs, params)
    b = Builder(ins, outs)
    for d in range(min(len(ins[0]), len(outs[0]))):
        if ins[0][d] == outs[0][d]:
            b.factor(outs[0][d], operands={0: d}, results={0: d})
    return b.build()


POINTWISE = [
    "abs",
    "acos",
    "acosh",
    "add",
    "add_any",
    "and",
    "asin",
    "asinh",
    "atan",
    "atan2",
    "atanh",
    "bessel_i0e",
    "bessel_i1e",
    "cbrt",
    "ceil",
    "clamp",
    "clz",
    "complex",
    "conj",
    "convert_element_type",
    "copy",
    "copy_p",
    "cos",
    "cosh",
    "digamma",
    "div",
    "eq",
    "erf",
    "erf_inv",
    "erfc",
    "exp",
    "exp2",
    "expm1",
    "floor",
    "ge",
    "gt",
    "igamma",
    "igammac",
    "imag",
    "integer_pow",
    "is_finite",
    "le",
    "lgamma",
    "log",
    "log1p",
    "log2",  # jax >= 0.12 (jnp.log2)
    "logistic",
    "lt",
    "max",
    "mesh_cast",
    "min",
    "mul",
    "name",
    "ne",
    "neg",
    "nextafter",
    "not",
    "one_minus_square",  # jax >= 0.11.2: 1 - x**2, tanh's derivative
    "or",
    "polygamma",
    "polynomial",  # jax >= 0.12: x and its coefficients (scalars or x's shape), by Horner
    "population_count",
    "pow",
    "pvary",
    "random_clone",
    "random_fold_in",
    "random_seed",
    "real",
    "reduce_precision",
    "rem",
    "reshard",
    "round",
    "rsqrt",
    "select_n",
    "sharding_constraint",
    "shift_left",
    "shift_right_arithmetic",
    "shift_right_logical",
    "sign",
    "sin",
    "sinh",
    "sqrt",
    "square",
    "stop_gradient",
    "sub",
    "tan",
    "tanh",
    "threefry2x32",
    "xor",
    "zeta",
]

RULES: dict[str, Callable[..., Rule]] = {
    "argmax": _argreduce,
    "argmin": _argreduce,
    "argsort": _along_axis("dimension"),
    "bitcast_convert_type": _convert_like,
    "broadcast_in_dim": _broadcast_in_dim,
    "concatenate": _concatenate,
    "conv_general_dilated": _conv,
    "cumlogsumexp": _along_axis("axis"),
    "cummax": _along_axis("axis"),
    "cummin": _along_axis("axis"),
    "cumprod": _along_axis("axis"),
    "cumsum": _along_axis("axis"),
    "dot_general": _dot_general,
    "dynamic_slice": _same_size_dims,
    "dynamic_update_slice": _dynamic_update_slice,
    "empty": _iota,
    "expand_dims": _expand_dims,
    "gather": _gather,
    "iota": _iota,
    "optimization_barrier": _multi_pointwise,
    "pad": _same_size_dims,
    "random_bits": _generate,
    "random_split": _generate,
    "random_unwrap": _random_unwrap,
    "random_wrap": _random_wrap,
    "reduce_and": _reduce(Kind.REDUCTION, "and"),
    "reduce_max": _reduce(Kind.REDUCTION, "max"),
    "reduce_min": _reduce(Kind.REDUCTION, "min"),
    "reduce_or": _reduce(Kind.REDUCTION, "or"),
    "reduce_prod": _reduce(Kind.REDUCTION, "prod"),
    "reduce_sum": _reduce(Kind.REDUCTION, "sum"),
    "reduce_window": _window,
    "reduce_window_max": _window,
    "reduce_window_min": _window,
    "reduce_window_sum": _window,
    "reshape": _reshape,
    "rev": _same_size_dims,
    "rng_bit_generator": conservative,
    "scatter": _scatter(add=False),
    "scatter-add": _scatter(add=True),
    "scatter-max": _scatter(add=False),
    "scatter-min": _scatter(add=False),
    "scatter-mul": _scatter(add=False),
    "scatter_add": _scatter(add=True),
    "select_and_gather_add": _window,
    "select_and_scatter_add": _window,
    "shard_map": _shard_map,
    "slice": _same_size_dims,
    "sort": _along_axis("dimension"),
    "split": _split,
    "squeeze": _squeeze,
    "stack": _stack,
    "top_k": _top_k,
    "transpose": _transpose,
    "unstack": _unstack,
}
for _name in POINTWISE:
    RULES.setdefault(_name, pointwise)

_warned: set[str] = set()


def rule_for(
    primitive: str,
    ins: Sequence[Shape | None],
    outs: Sequence[Shape],
    params: dict[str, Any],
    *,
    where: str = "",
    count: int = 1,
    warned: set[str] | None = None,
) -> Rule:
    """The factor rule of one op; unknown primitives get `conservative` and one warning.

    `where` (" at layers/3/attn (from model.py:12 in attn)") and `count` (the program's ops
    of this primitive) go into the warning; `warned` holds what was already said (one
    program's set; by default, one set for the process)."""
    warned = _warned if warned is None else warned
    builder = RULES.get(primitive)
    if builder is None:
        more = f" (here and in {count - 1} more ops)" if count > 1 else ""
        _warn_once(
            warned,
            primitive,
            f"primitive '{primitive}'{where} has no sharding rule; it is kept replicated{more}",
        )
        return conservative(ins, outs, params)
    try:
        rule = builder(ins, outs, params)
        _check(rule, ins, outs)
    except Exception as err:  # a rule that cannot read these params: stay safe, say so
        _warn_once(
            warned,
            f"{primitive}:{type(err).__name__}",
            f"sharding rule for '{primitive}'{where} failed ({err}); it is kept replicated",
        )
        return conservative(ins, outs, params)
    return rule


def _warn_once(warned: set[str], key: str, message: str) -> None:
    if key not in warned:
        warned.add(key)
        warnings.warn(message, UnknownPrimitiveWarning, stacklevel=3)


def _check(rule: Rule, ins: Sequence[Shape | None], outs: Sequence[Shape]) -> None:
    for tensors, shapes in ((rule.operands, ins), (rule.results, outs)):
        for t, shape in zip(tensors, shapes):
            if t is None or shape is None:
                continue
            for d, fs in enumerate(t):
                if math.prod(rule.sizes[f] for f in fs) != shape[d]:
                    raise ValueError(f"factors of dim {d} do not multiply to {shape[d]}")


class UnknownPrimitiveWarning(UserWarning):
    """A primitive without a sharding rule: partir keeps its operands replicated."""


def link_rule(src: Shape, dst: Shape, offset: int) -> Rule:
    """`_link` ops: dst dims share src dims (src may have `offset` extra leading dims)."""
    b = Builder([src, dst], [])
    for d in range(offset):
        b.factor(src[d], Kind.REPLICATE, operands={0: d})
    for d, size in enumerate(dst):
        b.factor(size, operands={0: d + offset, 1: d})
    return b.build()


__all__ = ["Kind", "Rule", "RULES", "rule_for", "pointwise", "conservative", "link_rule"]
