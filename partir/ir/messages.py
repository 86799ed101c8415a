"""Helpers shared by every message partir writes: near-miss names, lists of choices, an
exception's first line, byte counts and durations, and where a file stops being UTF-8."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def one_of(words: Iterable[str], conj: str = "or") -> str:
    """`a`, `a or b`, `a, b or c`."""
    words = list(words)
    if len(words) <= 1:
        return "".join(words)
    return f"{', '.join(words[:-1])} {conj} {words[-1]}"


def first_line(e: BaseException) -> str:
    """`KeyError: 'tokens'`: an exception's type and the first line of its message."""
    try:
        text = str(e).strip()
    except Exception:  # a user's exception whose __str__ itself fails
        text = "(its message cannot be shown: str() of it raised)"
    first = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def fmt_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


@dataclasses.dataclass(frozen=True)
class BadByte:
    """The first byte that is not UTF-8: a message, its 1-based line and column, and the
    line as far as it can be shown."""

    message: str
    line: int
    column: int
    shown: str


def first_bad_byte(data: bytes, e: UnicodeDecodeError) -> BadByte:
    """The place of `e` in `data` (a byte-order mark is not counted)."""
    start = e.start - (3 if data.startswith(b"\xef\xbb\xbf") else 0)
    body = data[3:] if start != e.start else data
    before = body[:start].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    line = before.count(b"\n") + 1
    head = before.rsplit(b"\n", 1)[-1].decode("utf-8", "replace")
    end = body.find(b"\n", start)
    rest = body[start : end if end >= 0 else len(body)].split(b"\r", 1)[0]
    message = f"the file is not UTF-8 text (byte 0x{body[start]:02x}: {e.reason}); save it as UTF-8"
    return BadByte(message, line, len(head) + 1, head + rest.decode("utf-8", "replace"))
