"""Where a text file that is not UTF-8 goes wrong: shared by goal files and plan files."""

from __future__ import annotations

import dataclasses


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
