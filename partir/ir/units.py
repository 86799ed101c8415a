"""Numbers with units, as goal files and the Python API write them: `8`, `1e-6`, `32GiB`, `275T`, `50G/s`, `2us`.

A number's kind comes from its unit: a plain number, a count (`K M G T`, powers of 1000),
a size in bytes (`B`, `KiB MiB GiB TiB`, `KB MB GB TB`), a rate (a count or size unit
followed by `/s`, in bytes per second: `50G/s` = `50GB/s` = 50e9), or a time (`s ms us ns`).
A plain number is read in the base unit of whatever asks for it (bytes, bytes/s, seconds).
"""

from __future__ import annotations

import dataclasses
import math
import re

from partir.ir.messages import did_you_mean

COUNT = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
SIZE = {
    "B": 1,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}
TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
RATE = {f"{u}/s": f for u, f in [("", 1), *COUNT.items(), *SIZE.items()]}
UNITS = [*COUNT, *SIZE, *TIME, *RATE]

_SPLIT = re.compile(r"([+-]?(?:[0-9][0-9_]*(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)(.*)")


class UnitError(ValueError):
    """A number that cannot be read; `offset` is where in its text the problem starts."""

    def __init__(self, message: str, offset: int = 0) -> None:
        super().__init__(message)
        self.offset = offset


@dataclasses.dataclass(frozen=True)
class Quantity:
    """A number from a goal file: its text, value in base units, and kind."""

    text: str
    value: int | float
    kind: str  # "number", "count", "size", "rate" or "time"
    is_int: bool  # written as an integer and scaled by an integer factor

    def describe(self) -> str:
        return {
            "number": "a plain number",
            "count": "a count",
            "size": "a size",
            "rate": "a rate",
            "time": "a time",
        }[self.kind]


def read(text: str) -> Quantity:
    """Read a number with its unit; raises UnitError for an unknown unit or an unusable value."""
    m = _SPLIT.fullmatch(text)
    if m is None:  # the grammar's NUMBER and _SPLIT agree; this is a safety net
        raise UnitError(f"cannot read {text!r} as a number")
    digits, unit = m.group(1).replace("_", ""), m.group(2)
    if "__" in m.group(1) or m.group(1).endswith("_") or "_." in m.group(1):
        raise UnitError(f"cannot read {text!r} as a number")
    if len(digits) > 300:
        raise UnitError(f"the number {text!r} is too large")
    is_int = not any(c in digits for c in ".eE")
    number: int | float = int(digits) if is_int else float(digits)
    if not math.isfinite(number) or abs(number) > 1e300:
        raise UnitError(f"the number {text!r} is too large")
    if unit == "":
        return Quantity(text, number, "number", is_int)
    for kind, table in (("count", COUNT), ("size", SIZE), ("rate", RATE), ("time", TIME)):
        if unit in table:
            factor = table[unit]
            value = number * factor
            if not math.isfinite(value) or abs(value) > 1e300:
                raise UnitError(f"the number {text!r} is too large")
            exact = is_int and isinstance(factor, int)
            if kind == "size" and (factor > 1 or float(value).is_integer()):
                # a fraction of a KiB or more is rounded to whole bytes; a fraction of a
                # byte ('1.5B') is left as it is, for what asks for a size to refuse
                value = round(value)
                exact = True
            return Quantity(text, value, kind, exact)
    same_letters = [u for u in UNITS if u.lower() == unit.lower()]  # 32gb: units have case
    hint = (
        (f"; did you mean '{same_letters[0]}'?" if same_letters else "")
        or did_you_mean(unit, UNITS)
        or (
            "; sizes are written like 32GiB or 500MB, rates like 50G/s, counts like 275T, "
            "times like 2us"
        )
    )
    raise UnitError(f"unknown unit {unit!r} in {text!r}{hint}", len(m.group(1)))
