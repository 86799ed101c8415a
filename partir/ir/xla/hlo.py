"""Reading optimized HLO text: its computations, instructions and collectives, and how many
times each computation runs per step."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field

from partir.ir.xla.stats import HloCollective

_log = logging.getLogger(__name__)


def optimized_hlo_text(compiled) -> str:
    """The post-optimization HLO of a ``jax.stages.Compiled``, with operand shapes printed.

    ``compiled.as_text()`` prints operands without shapes; the runtime executable's HLO modules
    printed with ``print_operand_shape`` have them (see JAX_NOTES). Falls back to ``as_text()``
    (which :func:`collectives_from_hlo` also handles, by looking operand names up).
    """
    try:
        from jaxlib import _hlo  # type: ignore[attr-defined]  # private module, no stubs

        opts = _hlo.HloPrintOptions()
        opts.print_operand_shape = True
        opts.print_metadata = False
        modules = compiled.runtime_executable().hlo_modules()
        return "\n".join(m.to_string(opts) for m in modules)
    except Exception as e:  # pragma: no cover - depends on jaxlib internals
        _log.debug("falling back to compiled.as_text(): %s", e)
        return compiled.as_text()


_COMMENT_RE = re.compile(r"/\*.*?\*/")
_ARRAY_RE = re.compile(r"(?<![\w.%-])(pred|token|opaque|[a-z]+\d+[a-z0-9]*)\[([^\]]*)\]")
_BITS_RE = re.compile(r"^(?:bf|f|s|u|c)(\d+)")
_HEADER_RE = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s*\(")
_INSTR_RE = re.compile(r"^\s*(ROOT\s+)?%?([^\s=]+)\s*=\s*(.*)$")
_OPCODE_RE = re.compile(r"\s*([a-z][a-z0-9-]*)\(")
_TRIP_RE = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)"?')
_NAME = r"%?([\w.\-]+)"
_HEADER_INT_RE = {k: re.compile(rf"\b{k}=(\d+)") for k in ("num_partitions", "replica_count")}

_CLOSE = {"(": ")", "[": "]", "{": "}"}

_OPCODE_KIND = {
    "all-reduce": "all-reduce",
    "all-reduce-start": "all-reduce",
    "all-gather": "all-gather",
    "all-gather-start": "all-gather",
    "reduce-scatter": "reduce-scatter",
    "reduce-scatter-start": "reduce-scatter",
    "all-to-all": "all-to-all",
    "all-to-all-start": "all-to-all",
    "ragged-all-to-all": "all-to-all",
    "collective-permute": "collective-permute",
    "collective-permute-start": "collective-permute",
}


def _element_bits(dtype: str) -> int:
    if dtype == "pred":
        return 8
    if dtype in ("token", "opaque"):
        return 0
    m = _BITS_RE.match(dtype)
    return int(m.group(1)) if m else 0


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape string; tuples are summed, layouts and memory spaces ignored.

    ``f32[4,4]{1,0}`` -> 64, ``f32[]`` -> 4, ``(f32[2], bf16[3])`` -> 14, ``s4[3]`` -> 2,
    dynamic dims ``f32[<=8]`` count at their bound.
    """
    return sum(math.ceil(n * _element_bits(dtype) / 8) for dtype, n in arrays(shape))


def arrays(shape: str) -> list[tuple[str, int]]:
    """(dtype, element count) of each array in an HLO shape string (a tuple has several);
    dynamic dims ``<=8`` count at their bound."""
    out = []
    for dtype, dims in _ARRAY_RE.findall(_COMMENT_RE.sub("", shape)):
        n = 1
        for d in dims.split(","):
            d = d.strip().lstrip("<=").strip()
            if d:
                n *= int(d) if d.isdigit() else 0
        out.append((dtype, n))
    return out


def _match_close(s: str, i: int) -> int:
    """Index just past the bracket that closes the one at ``s[i]``."""
    stack = []
    for j in range(i, len(s)):
        c = s[j]
        if c in _CLOSE:
            stack.append(_CLOSE[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return j + 1
    return len(s)


def _split_top(s: str) -> list[str]:
    """Split at commas outside any brackets."""
    parts, depth, start = [], 0, 0
    for j, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(s[start:j].strip())
            start = j + 1
    tail = s[start:].strip()
    if tail:
        parts.append(tail)
    return parts


def _tuple_elements(shape: str) -> list[str] | None:
    shape = shape.strip()
    if not shape.startswith("("):
        return None
    return _split_top(shape[1 : _match_close(shape, 0) - 1])


@dataclass
class _Instr:
    name: str
    shape: str
    opcode: str
    operands: list[tuple[str | None, str]]  # (shape or None, name)
    attrs: str


@dataclass
class _Computation:
    name: str
    is_entry: bool
    instrs: list[_Instr] = field(default_factory=list)


def _parse_operands(s: str) -> list[tuple[str | None, str]]:
    out: list[tuple[str | None, str]] = []
    for piece in _split_top(s):
        if piece.startswith("("):
            end = _match_close(piece, 0)
            out.append((piece[:end], piece[end:].strip().lstrip("%")))
        elif re.match(r"^[a-z][a-z0-9]*\[", piece):
            shape, _, name = piece.partition(" ")
            out.append((shape, name.strip().lstrip("%")))
        else:
            out.append((None, piece.lstrip("%")))
    return out


def _parse_instr(line: str) -> _Instr | None:
    m = _INSTR_RE.match(line)
    if not m:
        return None
    name, rest = m.group(2), m.group(3).strip()
    if rest.startswith("("):
        end = _match_close(rest, 0)
    else:
        sp = rest.find(" ")
        end = len(rest) if sp < 0 else sp
    shape, rest = rest[:end], rest[end:]
    om = _OPCODE_RE.match(rest)
    if not om:
        return None
    open_at = om.end() - 1
    close_at = _match_close(rest, open_at)
    operands = _parse_operands(rest[open_at + 1 : close_at - 1])
    attrs = rest[close_at:].lstrip(", ").strip()
    return _Instr(name, shape, om.group(1), operands, attrs)


def _parse_module(text: str) -> tuple[list[_Computation], dict[str, int]]:
    text = _COMMENT_RE.sub("", text)
    comps: list[_Computation] = []
    header: dict[str, int] = {}
    cur: _Computation | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("HloModule"):
            for k, r in _HEADER_INT_RE.items():
                hm = r.search(line)
                if hm:
                    header[k] = int(hm.group(1))
            continue
        if cur is None:
            if not line[0].isspace() and line.rstrip().endswith("{"):
                hm = _HEADER_RE.match(line)
                if hm:
                    cur = _Computation(hm.group(2), bool(hm.group(1)))
                    comps.append(cur)
            continue
        if line.startswith("}"):  # also `}, execution_thread="..."`
            cur = None
            continue
        ins = _parse_instr(line)
        if ins is not None:
            cur.instrs.append(ins)
    return comps, header


def _attr_value(attrs: str, key: str) -> str | None:
    """The raw text of ``key=VALUE`` (balanced brackets), or None."""
    m = re.search(rf"(?:^|[\s,]){re.escape(key)}=", attrs)
    if not m:
        return None
    i = m.end()
    if i < len(attrs) and attrs[i] in _CLOSE:
        return attrs[i : _match_close(attrs, i)]
    j = i
    while j < len(attrs) and attrs[j] not in ", ":
        j += 1
    return attrs[i:j]


def _group_size(attrs: str, header: dict[str, int]) -> int:
    """Devices per replica group, from any of the three replica_groups spellings."""
    m = re.search(r"(?:^|[\s,])replica_groups=", attrs)
    if m is None:
        return _all_devices_group(attrs, header)
    v = attrs[m.end() :]
    if v.startswith("{"):  # explicit list {{0,1,2,3},{4,5,6,7}}
        body = v[1 : _match_close(v, 0) - 1].strip()
        groups = re.findall(r"\{([^{}]*)\}", body)
        sizes = [len([x for x in g.split(",") if x.strip()]) for g in groups]
        return max(sizes) if sizes and max(sizes) > 0 else _all_devices_group(attrs, header)
    im = re.match(r"\[\s*(\d+)\s*,\s*(\d+)\s*\]\s*<=", v)  # iota [num_groups,group_size]<=[..]
    if im:
        return int(im.group(2))
    if v.startswith("mesh["):  # mesh['a'=2,'b'=4] [, device_ids=(...)] {'b'} / {'a':(2)2}
        end = _match_close(v, 4)
        axes = {a: int(n) for a, n in re.findall(r"'?([\w.\-]+)'?\s*=\s*(\d+)", v[5 : end - 1])}
        rest = v[end:]
        dm = re.match(r"\s*,\s*device_ids=", rest)
        if dm:
            k = dm.end()
            rest = rest[_match_close(rest, k) if k < len(rest) and rest[k] == "(" else k :]
        rest = rest.lstrip()
        if not rest.startswith("{"):
            return math.prod(axes.values()) if axes else 0
        sel = rest[1 : _match_close(rest, 0) - 1]
        size = 1
        for a, _pre, sub in re.findall(r"'?([\w.\-]+)'?(?:\s*:\s*\((\d+)\)\s*(\d+))?", sel):
            size *= int(sub) if sub else axes.get(a, 1)
        return size
    return 0


def _all_devices_group(attrs: str, header: dict[str, int]) -> int:
    """Group size for empty/missing replica_groups: every participant of the collective mode."""
    partitions = header.get("num_partitions", 1)
    replicas = header.get("replica_count", 1)
    if "use_global_device_ids=true" in attrs:
        return partitions * replicas
    if re.search(r"(?:^|[\s,])channel_id=", attrs):
        return partitions
    return replicas


def _multiplicities(
    comps: list[_Computation],
) -> tuple[dict[str, int], set[str], list[str]]:
    """Executions per step of each computation, computations hidden behind async -starts, notes."""
    callers: dict[str, list[tuple[str, int]]] = {c.name: [] for c in comps}
    hidden: set[str] = set()
    notes: list[str] = []

    def edge(caller: str, callee: str, factor: int) -> None:
        callers.setdefault(callee, []).append((caller, factor))

    for comp in comps:
        for ins in comp.instrs:
            op, a = ins.opcode, ins.attrs
            if op.endswith("-done") or op.endswith("-update"):
                continue
            if op == "while":
                tm = _TRIP_RE.search(a)
                if tm:
                    n = int(tm.group(1))
                else:
                    n = 1
                    notes.append(
                        f"while {ins.name} in {comp.name}: unknown trip count, counted as 1"
                    )
                bm = re.search(r"(?:^|[\s,])body=" + _NAME, a)
                cm = re.search(r"(?:^|[\s,])condition=" + _NAME, a)
                if bm:
                    edge(comp.name, bm.group(1), n)
                if cm:
                    edge(comp.name, cm.group(1), n + 1 if tm else 1)
                continue
            for key in ("to_apply", "calls", "true_computation", "false_computation"):
                if key == "to_apply" and op != "call":
                    continue  # reducers / comparators: no collectives inside
                km = re.search(rf"(?:^|[\s,]){key}=" + _NAME, a)
                if km:
                    edge(comp.name, km.group(1), 1)
                    if key == "calls" and op in _OPCODE_KIND:
                        hidden.add(km.group(1))  # sugared async wrapper: counted at the -start
            for key in ("branch_computations", "called_computations"):
                v = _attr_value(a, key)
                if v:
                    for callee in re.findall(_NAME, v.strip("{}")):
                        edge(comp.name, callee, 1)

    entries = [c.name for c in comps if c.is_entry]
    memo: dict[str, int] = {}

    def mult(name: str, stack: frozenset[str]) -> int:
        if name in memo:
            return memo[name]
        if name in entries:
            memo[name] = 1
            return 1
        total = 0
        for caller, factor in callers.get(name, []):
            if caller in stack:
                continue
            total += mult(caller, stack | {name}) * factor
        memo[name] = total
        return total

    out: dict[str, int] = {}
    for c in comps:
        m = mult(c.name, frozenset()) if entries else 1
        if m == 0:  # not reachable through edges we follow: assume it runs once
            m = 1
        out[c.name] = m
    return out, hidden, notes


def _operand_bytes(ins: _Instr, shapes: dict[str, str]) -> int | None:
    total = 0
    for shape, name in ins.operands:
        if shape is None:
            shape = shapes.get(name)
        if shape is None:
            return None
        total += shape_bytes(shape)
    return total


def _collective_bytes(ins: _Instr, kind: str, shapes: dict[str, str], group: int) -> int:
    op = ins.opcode
    is_start = op.endswith("-start")
    elems = _tuple_elements(ins.shape) if is_start else None
    if kind == "all-gather":
        if is_start and elems is not None and len(elems) >= 2:
            return shape_bytes(elems[1])  # (operand(s), result(s))
        return shape_bytes(ins.shape)
    if "slice_sizes=" in ins.attrs or op == "ragged-all-to-all":
        # in-place collective-permute (input, output, indices...) and ragged-all-to-all
        # (input, output, offsets, sizes...): the data moved is the first operand.
        ins = _Instr(ins.name, ins.shape, op, ins.operands[:1], ins.attrs)
    b = _operand_bytes(ins, shapes)
    if b is not None:
        return b
    # Operand shapes neither printed nor defined in the same computation: use the result.
    if is_start and elems:
        return shape_bytes(elems[0])
    if kind == "reduce-scatter":
        return shape_bytes(ins.shape) * max(group, 1)
    return shape_bytes(ins.shape)


def _parse_collectives(text: str) -> tuple[list[HloCollective], list[str]]:
    comps, header = _parse_module(text)
    mults, hidden, notes = _multiplicities(comps)
    out: list[HloCollective] = []
    for comp in comps:
        if comp.name in hidden:
            continue
        shapes = {ins.name: ins.shape for ins in comp.instrs}
        for ins in comp.instrs:
            kind = _OPCODE_KIND.get(ins.opcode)
            if kind is None:
                continue
            if kind == "collective-permute":
                v = _attr_value(ins.attrs, "source_target_pairs")
                group = len(re.findall(r"\{\s*\d+\s*,\s*\d+\s*\}", v)) if v else 0
            else:
                group = _group_size(ins.attrs, header)
            out.append(
                HloCollective(
                    kind=kind,
                    bytes=_collective_bytes(ins, kind, shapes, group),
                    group_size=group,
                    multiplicity=mults.get(comp.name, 1),
                    name=ins.name,
                    computation=comp.name,
                )
            )
    for n in notes:
        _log.info(n)
    return out, notes


def collectives_from_hlo(text: str) -> list[HloCollective]:
    """Every collective in an HLO module's text, in program order (computation by computation).

    Async ``-start``/``-done`` pairs give one record (at the -start) of the synchronous kind.
    """
    return _parse_collectives(text)[0]


def computation_multiplicities(text: str) -> dict[str, int]:
    """Executions per step of every computation of an HLO module (ENTRY = 1)."""
    return _multiplicities(_parse_module(text)[0])[0]
