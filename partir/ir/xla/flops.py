"""FLOPs per step from HLO text: XLA's cost analysis counts a while body once."""

from __future__ import annotations

import logging
import re

from partir.ir.xla.hlo import _ARRAY_RE, _NAME, _Instr, _multiplicities, _parse_module, arrays

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
    reducers: set[str] = set()
    for comp in comps:
        for ins in comp.instrs:
            if ins.opcode != "call":
                rm = re.search(r"(?:^|[\s,])to_apply=" + _NAME, ins.attrs)
                if rm:
                    reducers.add(rm.group(1))
    once = per_step = 0.0
    for comp in comps:
        if comp.name in reducers:
            continue
        shapes = {ins.name: ins.shape for ins in comp.instrs}
        f = sum(_instr_flops(ins, shapes) for ins in comp.instrs)
        once += f
        per_step += f * mults.get(comp.name, 1)
    return once, per_step
