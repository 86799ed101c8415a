"""The true peak per device, from XLA's buffer assignment and live ranges."""

from __future__ import annotations

import logging
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from partir.ir.xla.hlo import _INSTR_RE

_log = logging.getLogger(__name__)

# Per-compile options that make XLA write its buffer assignment and live ranges as text.
_DUMP_OPTIONS = {"xla_dump_hlo_as_text": True}
_ALLOCATION_RE = re.compile(r"^allocation (\d+): size (\d+)")
_VALUE_RE = re.compile(
    r"^\s*value: <\d+ ([^\s{>]+)(\{[\d,]*\})?(?: \(phi\))?(?: @\d+)?> "
    r"\(size=(\d+),offset=(\d+)\)"
)
_RANGE_RE = re.compile(r"^\s*([^\s{]+)(\{[\d,]*\}):(\d+)-(\d+)\s*$")
_MAX_RE = re.compile(r"HloLiveRange \(max (\d+)\)")


@dataclass(frozen=True)
class LiveBuffer:
    name: str  # HLO value: instruction name and tuple index, e.g. ``dot.3{}``
    bytes: int
    op_name: str = ""  # the jaxpr equation it came from (HLO metadata), when known


@dataclass(frozen=True)
class BufferPeak:
    """The most bytes one device holds at once, as XLA's buffer assignment places them.

    The maximum, over the final schedule, of the bytes of the values live at that point (live
    ranges include both ends). Values that XLA put in the same slot (same allocation and
    offset: a while loop's carry, an in-place update, a donated argument and the output that
    reuses it) are counted once, at their largest. Entry parameters are live throughout unless
    donated; outputs from their definition to the end. XLA's own printed peak sizes tuple
    elements as 8-byte pointers and leaves out loop-carried (phi) values; here every value is
    counted at its own size. Scratch that a fusion keeps inside itself (XLA:CPU fuses chains
    of matmuls and tanh into one library call) is no buffer and is not counted.
    """

    bytes: int
    position: int  # index in the schedule where the peak is first reached
    schedule_length: int
    largest: tuple[LiveBuffer, ...]  # the largest slots live at the peak (one value each)


def peak_from_buffer_assignment(
    assignment: str, live_ranges: str, hlo: str = "", top: int = 8
) -> BufferPeak:
    """The peak of XLA's ``*-buffer-assignment.txt`` and ``*-live-range.txt`` dumps.

    ``hlo``, the optimized module's text, if given names the jaxpr equation of each of the
    ``top`` largest values live at the peak (from the ``op_name`` metadata).
    """
    slots: dict[str, tuple[int, int, int]] = {}  # value -> (allocation, offset, size)
    alloc = -1
    for line in assignment.splitlines():
        am = _ALLOCATION_RE.match(line)
        if am:
            alloc = int(am.group(1))
            continue
        vm = _VALUE_RE.match(line)
        if vm:
            name = vm.group(1) + (vm.group(2) or "{}")
            slots[name] = (alloc, int(vm.group(4)), int(vm.group(3)))
    mm = _MAX_RE.search(live_ranges)
    section = live_ranges.split("BufferLiveRange:", 1)[-1].split("Live ranges at", 1)[0]
    ranges: list[tuple[str, int, int]] = []
    for line in section.splitlines():
        rm = _RANGE_RE.match(line)
        if rm and rm.group(1) + rm.group(2) in slots:
            ranges.append((rm.group(1) + rm.group(2), int(rm.group(3)), int(rm.group(4))))
    length = int(mm.group(1)) if mm else max((e for _, _, e in ranges), default=-1) + 1
    starts: dict[int, list[str]] = {}
    ends: dict[int, list[str]] = {}
    for name, s, e in ranges:
        starts.setdefault(s, []).append(name)
        ends.setdefault(e, []).append(name)
    live: dict[tuple[int, int], Counter[int]] = {}
    live_names: set[str] = set()
    total, best, best_at = 0, 0, 0
    best_names: frozenset[str] = frozenset()
    for t in sorted(set(starts) | set(ends)):
        for name in starts.get(t, ()):
            a, o, size = slots[name]
            sizes = live.setdefault((a, o), Counter())
            before = max(sizes) if sizes else 0
            sizes[size] += 1
            total += max(sizes) - before
            live_names.add(name)
        if total > best:
            best, best_at, best_names = total, t, frozenset(live_names)
        for name in ends.get(t, ()):
            a, o, size = slots[name]
            sizes = live[(a, o)]
            before = max(sizes)
            sizes[size] -= 1
            if not sizes[size]:
                del sizes[size]
            total -= before - (max(sizes) if sizes else 0)
            live_names.discard(name)
    start = {name: s for name, s, _ in ranges}
    holder: dict[tuple[int, int], str] = {}  # per slot, its largest (then latest) value
    for n in best_names:
        key = slots[n][:2]
        if key not in holder or (slots[n][2], start[n]) > (
            slots[holder[key]][2],
            start[holder[key]],
        ):
            holder[key] = n
    chosen = sorted(holder.values(), key=lambda n: (-slots[n][2], n))[:top]
    ops = _op_names(hlo, {n.split("{", 1)[0] for n in chosen}) if hlo else {}
    largest = tuple(LiveBuffer(n, slots[n][2], ops.get(n.split("{", 1)[0], "")) for n in chosen)
    return BufferPeak(best, best_at, length, largest)


def _op_names(hlo: str, wanted: set[str]) -> dict[str, str]:
    """``op_name`` metadata of the named instructions (parameters: their ``sharding`` origin
    is not recorded, so they get the parameter's name)."""
    out: dict[str, str] = {}
    for line in hlo.splitlines():
        im = _INSTR_RE.match(line)
        if not im or im.group(2) not in wanted:
            continue
        om = re.search(r'op_name="([^"]*)"', line)
        out[im.group(2)] = om.group(1) if om else im.group(2)
    return out


def read_buffer_peak(dump_dir: str | Path) -> BufferPeak | None:
    """The :class:`BufferPeak` of the one module XLA dumped in ``dump_dir``, or None."""
    d = Path(dump_dir)
    found = sorted(d.glob("*after_optimizations-buffer-assignment.txt"))
    if len(found) != 1:
        _log.debug("expected one buffer assignment in %s, found %d", d, len(found))
        return None
    assignment = found[0]
    stem = assignment.name[: -len("-buffer-assignment.txt")]
    live = d / f"{stem}-live-range.txt"
    hlo = d / f"{stem}.txt"
    if not live.exists():
        _log.debug("no live ranges beside %s", assignment)
        return None
    return peak_from_buffer_assignment(
        assignment.read_text(), live.read_text(), hlo.read_text() if hlo.exists() else ""
    )


def compile_with_buffer_peak(lowered, compiler_options: dict | None = None):
    """Compile a ``jax.stages.Lowered`` and read the peak of its buffer assignment.

    Returns ``(compiled, peak)``; ``peak`` is a :class:`BufferPeak`, or None when XLA wrote no
    buffer assignment (e.g. the executable came from JAX's persistent compilation cache). The
    dump options are passed for this compile only and written to a temporary directory that
    is removed afterwards. A ``Compiled`` holds no buffer assignment: pass the ``Lowered``.
    """
    with tempfile.TemporaryDirectory(prefix="partir-xla-") as tmp:
        options = {**(compiler_options or {}), **_DUMP_OPTIONS, "xla_dump_to": tmp}
        compiled = lowered.compile(compiler_options=options)
        try:
            peak = read_buffer_peak(tmp)
        except (OSError, ValueError) as e:  # pragma: no cover - depends on XLA's dump format
            _log.debug("could not read the buffer assignment: %s", e)
            peak = None
    return compiled, peak


def true_peak_bytes(lowered) -> int | None:
    """Per-device peak bytes of XLA's buffer assignment for a ``jax.stages.Lowered`` (it is
    compiled here), or None when unavailable. See :class:`BufferPeak`."""
    peak = compile_with_buffer_peak(lowered)[1]
    return None if peak is None else peak.bytes
