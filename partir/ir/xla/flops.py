"""FLOPs and bytes accessed per step from HLO text: XLA's cost analysis counts a while body
once."""

from __future__ import annotations

import logging
import re

from partir.ir.xla.hlo import (
    _ARRAY_RE,
    _NAME,
    _Instr,
    _multiplicities,
    _parse_module,
    arrays,
    shape_bytes,
)

_log = logging.getLogger(__name__)

# HloCostAnalysis counts these elementwise opcodes as transcendentals, not flops.
_TRANSCENDENTAL = frozenset(
    "exponential exponential-minus-one log log-plus-one logistic power sqrt cbrt rsqrt tanh "
    "sine cosine tan atan2 erf".split()
)
# ... and these as one flop per element of the result.
_ELEMENTWISE = frozenset(
    "add subtract multiply divide maximum minimum negate abs sign compare select clamp and or "
    "xor not convert floor ceil round-nearest-afz round-nearest-even remainder is-finite "
    "shift-left shift-right-arithmetic shift-right-logical".split()
)


def _elements(shape: str) -> int:
    return sum(n for _, n in arrays(shape))


def _dims(shape: str) -> list[int]:
    m = _ARRAY_RE.search(shape)
    if not m:
        return []
    return [int(d.strip().lstrip("<=")) for d in m.group(2).split(",") if d.strip()]


def _instr_flops(ins: _Instr, shapes: dict[str, str]) -> float:
    """Flops of one instruction as XLA's HloCostAnalysis counts them (dots: 2 per
    multiply-add; elementwise arithmetic and reductions: 1 per element; convolutions,
    transcendentals and data movement: 0 here)."""
    op = ins.opcode
    if op == "dot":
        lhs = ins.operands[0][0] or shapes.get(ins.operands[0][1], "")
        dims = _dims(lhs)
        cm = re.search(r"lhs_contracting_dims=\{([\d,\s]*)\}", ins.attrs)
        contracted = 1
        for i in (int(x) for x in cm.group(1).split(",") if x.strip()) if cm else ():
            contracted *= dims[i] if i < len(dims) else 1
        return 2.0 * _elements(ins.shape) * contracted
    if op in _ELEMENTWISE:
        return float(_elements(ins.shape))
    if op == "reduce":
        n = len(ins.operands) // 2 or 1
        src = sum(_elements(s or shapes.get(nm, "")) for s, nm in ins.operands[:n])
        return float(max(src - _elements(ins.shape), 0))
    return 0.0


def hlo_flops(text: str) -> tuple[float, float]:
    """``(once, per_step)``: the flops of an HLO module's instructions (see
    :func:`_instr_flops`) with every computation counted once, and weighted by how many times
    it runs per step (the known trip counts of the ``while`` loops around it). Reducer
    computations (``to_apply`` of reduce, scatter, all-reduce) are covered by their caller."""
    comps, _ = _parse_module(text)
    mults, _, _ = _multiplicities(comps)
    reducers = _callees(comps, "to_apply")
    once = per_step = 0.0
    for comp in comps:
        if comp.name in reducers:
            continue
        shapes = {ins.name: ins.shape for ins in comp.instrs}
        f = sum(_instr_flops(ins, shapes) for ins in comp.instrs)
        once += f
        per_step += f * mults.get(comp.name, 1)
    return once, per_step


# instructions that move no bytes of their own (views, tuples, control flow around bodies)
_NO_ACCESS = frozenset(
    "parameter constant get-tuple-element tuple bitcast while call conditional after-all "
    "partition-id replica-id".split()
)


def _callees(comps, key: str) -> set[str]:
    """The computations named by `key=` (to_apply, calls) of instructions other than call."""
    out: set[str] = set()
    for comp in comps:
        for ins in comp.instrs:
            if ins.opcode != "call":
                m = re.search(rf"(?:^|[\s,]){key}=" + _NAME, ins.attrs)
                if m:
                    out.add(m.group(1))
    return out


def hlo_bytes_accessed(text: str) -> tuple[float, float]:
    """``(once, per_step)``: the bytes the kernels of an HLO module read and write (each
    instruction outside a fused computation: its operands and its result), with every
    computation counted once, and weighted by its executions per step. ``once`` matches
    HloCostAnalysis's "bytes accessed" to within a few bytes on XLA:CPU (checked on jaxlib
    0.10.2), which counts each operand whole."""
    comps, _ = _parse_module(text)
    mults, _, _ = _multiplicities(comps)
    inside = _callees(comps, "to_apply") | _callees(comps, "calls")
    by_name = {c.name: c for c in comps}
    once = per_step = 0.0
    for comp in comps:
        if comp.name in inside:
            continue
        shapes = {ins.name: ins.shape for ins in comp.instrs}
        b = 0.0
        for ins in comp.instrs:
            if ins.opcode in _NO_ACCESS or ins.opcode.endswith("-done"):
                continue
            read = [shape_bytes(sh or shapes.get(name, "")) for sh, name in ins.operands]
            written = shape_bytes(ins.shape)
            if ins.opcode == "fusion":
                m = re.search(r"calls=" + _NAME, ins.attrs)
                read, written = _fused_access(by_name.get(m.group(1)) if m else None, read, written)
            b += written + sum(read)
        once += b
        per_step += b * mults.get(comp.name, 1)
    return once, per_step


_SLICES = frozenset(("dynamic-slice", "slice"))


def _fused_access(fused, read: list[int], written: int) -> tuple[list[int], int]:
    """A fusion's bytes read per operand and bytes written: an operand the fused computation
    only slices is read as its slices; a root dynamic-update-slice of an operand writes in
    place (its update), and that operand is not read."""
    if fused is None or not fused.instrs:
        return read, written
    params: dict[str, int] = {}
    users: dict[str, list[_Instr]] = {}
    for ins in fused.instrs:
        if ins.opcode == "parameter" and ins.operands and ins.operands[0][1].isdigit():
            params[ins.name] = int(ins.operands[0][1])
            users[ins.name] = []
        for _, name in ins.operands:
            if name in users:
                users[name].append(ins)
    shapes = {ins.name: ins.shape for ins in fused.instrs}
    out = list(read)
    for name, k in params.items():
        us = users[name]
        if (
            us
            and k < len(out)
            and all(u.opcode in _SLICES and u.operands[0][1] == name for u in us)
        ):
            out[k] = sum(shape_bytes(u.shape) for u in us)
    root = fused.instrs[-1]
    if root.opcode == "dynamic-update-slice" and len(root.operands) > 1:
        buf, update = root.operands[0][1], root.operands[1]
        if buf in params and params[buf] < len(out):
            out[params[buf]] = 0
            written = shape_bytes(update[0] or shapes.get(update[1], ""))
    return out, written
