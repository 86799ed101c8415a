"""Goal-file errors, written as `FILE:LINE:COL: error: MESSAGE`, the line, and a caret."""

from __future__ import annotations

import dataclasses
from typing import Any

from partir.ir.messages import first_bad_byte
from partir.ir.specs import PlanError


@dataclasses.dataclass(frozen=True)
class Pos:
    """A place in a goal file: line and column, both 1-based."""

    line: int = 1
    column: int = 1

    @classmethod
    def of(cls, item: Any) -> Pos:
        """The start of a lark Token or a tree's `meta` (with propagate_positions)."""
        line = getattr(item, "line", None)
        column = getattr(item, "column", None)
        if not isinstance(line, int) or not isinstance(column, int) or line < 1 or column < 1:
            return cls()
        return cls(line, column)

    def shifted(self, columns: int) -> Pos:
        return Pos(self.line, self.column + columns)


class GoalError(ValueError):
    """An error in a goal file. `str()` is the whole report:

    gpt.partir:10:5: error: unknown strategy 'megatorn'; did you mean 'megatron'?
        megatorn
        ^
    """

    def __init__(
        self,
        message: str,
        filename: str = "<text>",
        line: int = 1,
        column: int = 1,
        source_line: str = "",
    ) -> None:
        self.message = message
        self.filename = filename
        self.line = line
        self.column = column
        self.source_line = source_line
        super().__init__(message, filename, line, column, source_line)

    def __str__(self) -> str:
        lead = "".join(c if c == "\t" else " " for c in self.source_line[: self.column - 1])
        return (
            f"{self.filename}:{self.line}:{self.column}: error: {self.message}\n"
            f"{self.source_line}\n{lead}^"
        )


class StatementPlanError(GoalError, PlanError):
    """A goal file's strategy that cannot apply to the program on the goal's mesh, reported
    at its statement: a GoalError to the user, and a PlanError to whatever tries several
    meshes (the mesh search records it for the one shape and goes on)."""

    @classmethod
    def of(cls, e: GoalError) -> StatementPlanError:
        return cls(e.message, e.filename, e.line, e.column, e.source_line)


@dataclasses.dataclass(frozen=True)
class Source:
    """A goal file's name and text, to turn a message and a `Pos` into a `GoalError`."""

    filename: str
    text: str

    def line_text(self, line: int) -> str:
        lines = self.text.split("\n")
        return lines[line - 1].rstrip("\r") if 1 <= line <= len(lines) else ""

    def error(self, pos: Pos, message: str) -> GoalError:
        text = self.line_text(pos.line)
        column = max(1, min(pos.column, len(text) + 1))
        return GoalError(message, self.filename, pos.line, column, text)

    def note(self, pos: Pos, message: str) -> str:
        return f"{self.filename}:{pos.line}:{pos.column}: note: {message}"


def not_utf8(filename: str, data: bytes, e: UnicodeDecodeError) -> GoalError:
    """A file that is not UTF-8, reported at the line and column of the first bad byte."""
    bad = first_bad_byte(data, e)
    return GoalError(bad.message, filename, bad.line, bad.column, bad.shown)
