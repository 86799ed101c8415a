"""Goal-file syntax: the Lark parser, a Transformer to plain records, readable syntax errors."""

from __future__ import annotations

import builtins
import dataclasses
import functools
from typing import Any, ClassVar

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from partir.dsl.errors import GoalError, Pos, Source
from partir.ir.messages import one_of

STATEMENTS = (
    "program",
    "inputs",
    "mesh",
    "device",
    "memory",
    "objective",
    "axis",
    "tile",
    "replicate",
    "search",
    "prune",
    "constraints",
)


# ------------------------------------------------------------------------------ records
# What the Transformer makes of a parse tree: values keep the place they were written.


@dataclasses.dataclass(frozen=True)
class Word:
    """A bare name: an axis, strategy, field, keyword argument, `true`/`false`/`none`."""

    text: str
    pos: Pos


@dataclasses.dataclass(frozen=True)
class Str:
    """A quoted string, unescaped (`\\"` and `\\\\`; other escapes stay as written)."""

    text: str
    pos: Pos


@dataclasses.dataclass(frozen=True)
class Num:
    """A number token with its unit, read later by `partir.ir.units.read`."""

    text: str
    pos: Pos


@dataclasses.dataclass(frozen=True)
class ListValue:
    items: tuple[Word | Str | Num, ...]
    pos: Pos


Value = Word | Str | Num | ListValue


@dataclasses.dataclass(frozen=True)
class Arg:
    name: Word | None  # None: positional
    value: Value

    @property
    def pos(self) -> Pos:
        return self.name.pos if self.name is not None else self.value.pos


@dataclasses.dataclass(frozen=True)
class Call:
    args: tuple[Arg, ...]
    pos: Pos


@dataclasses.dataclass(frozen=True)
class Field:
    """One line of a device block: `hbm 32GiB`, `link model 100G/s`."""

    name: Word
    axis: Word | None
    value: Num


@dataclasses.dataclass(frozen=True)
class MeshOver:
    """`over 64` after a mesh's axes: the device count whose factorizations are tried."""

    devices: Num
    pos: Pos


@dataclasses.dataclass(frozen=True)
class Strategy:
    name: Word
    call: Call | None


# One record per statement kind, with where it starts (`pos`) and its keyword.


@dataclasses.dataclass(frozen=True)
class ProgramStatement:
    pos: Pos
    target: Str  # "module:function"
    keyword: ClassVar[str] = "program"


@dataclasses.dataclass(frozen=True)
class InputsStatement:
    pos: Pos
    target: Str
    call: Call | None
    keyword: ClassVar[str] = "inputs"


@dataclasses.dataclass(frozen=True)
class MeshStatement:
    pos: Pos
    axes: tuple[tuple[Word, Num | Word], ...]  # (name, size or `?`)
    over: MeshOver | None
    keyword: ClassVar[str] = "mesh"


@dataclasses.dataclass(frozen=True)
class DeviceStatement:
    pos: Pos
    name: Str | None  # a catalog device, or None: a device of its own
    fields: tuple[Field, ...]
    keyword: ClassVar[str] = "device"


@dataclasses.dataclass(frozen=True)
class MemoryStatement:
    pos: Pos
    limit: Num
    keyword: ClassVar[str] = "memory"


@dataclasses.dataclass(frozen=True)
class ObjectiveStatement:
    pos: Pos
    name: Word
    keyword: ClassVar[str] = "objective"


@dataclasses.dataclass(frozen=True)
class AxisStatement:
    pos: Pos
    axis: Word
    strategies: tuple[Strategy, ...]
    keyword: ClassVar[str] = "axis"


@dataclasses.dataclass(frozen=True)
class TileStatement:
    pos: Pos
    path: Str
    dim: Num
    axis: Word
    keyword: ClassVar[str] = "tile"


@dataclasses.dataclass(frozen=True)
class ReplicateStatement:
    pos: Pos
    path: Str
    axis: Word
    keyword: ClassVar[str] = "replicate"


@dataclasses.dataclass(frozen=True)
class SearchStatement:
    pos: Pos
    method: Word
    call: Call | None
    keyword: ClassVar[str] = "search"


@dataclasses.dataclass(frozen=True)
class PruneStatement:
    pos: Pos
    name: Word
    keyword: ClassVar[str] = "prune"


@dataclasses.dataclass(frozen=True)
class ConstraintsStatement:
    pos: Pos
    mode: Word
    keyword: ClassVar[str] = "constraints"


Statement = (
    ProgramStatement
    | InputsStatement
    | MeshStatement
    | DeviceStatement
    | MemoryStatement
    | ObjectiveStatement
    | AxisStatement
    | TileStatement
    | ReplicateStatement
    | SearchStatement
    | PruneStatement
    | ConstraintsStatement
)


class _ToRecords(Transformer):
    """Parse tree -> a list of `Statement`s holding `Word`/`Str`/`Num`/... records."""

    def NAME(self, tok: Token) -> Word:
        return Word(str(tok), Pos.of(tok))

    def NUMBER(self, tok: Token) -> Num:
        return Num(str(tok), Pos.of(tok))

    def OPEN_SIZE(self, tok: Token) -> Word:
        return Word("?", Pos.of(tok))

    def STRING(self, tok: Token) -> Str:
        body = str(tok)[1:-1]
        out, i = [], 0
        while i < len(body):
            if body[i] == "\\" and i + 1 < len(body) and body[i + 1] in '"\\':
                out.append(body[i + 1])
                i += 2
            else:
                out.append(body[i])
                i += 1
        return Str("".join(out), Pos.of(tok))

    def start(self, statements: list[Statement]) -> list[Statement]:
        return list(statements)

    def scalar(self, children: list) -> Value:
        return children[0]

    @v_args(meta=True)
    def list(self, meta: Any, items: list) -> ListValue:
        return ListValue(tuple(x for x in items if x is not None), Pos.of(meta))

    def kwarg(self, children: builtins.list) -> Arg:
        return Arg(children[0], children[1])

    def posarg(self, children: builtins.list) -> Arg:
        return Arg(None, children[0])

    @v_args(meta=True)
    def call(self, meta: Any, args: builtins.list) -> Call:
        return Call(tuple(a for a in args if a is not None), Pos.of(meta))

    def mesh_axis(self, children: builtins.list) -> tuple[Word, Num | Word]:
        return children[0], children[1]

    @v_args(meta=True)
    def mesh_over(self, meta: Any, children: builtins.list) -> MeshOver:
        return MeshOver(children[0], Pos.of(meta))

    def device_field(self, children: builtins.list) -> Field:
        return Field(*children)

    def device_block(self, fields: builtins.list) -> tuple[Field, ...]:
        return tuple(fields)

    def strategy(self, children: builtins.list) -> Strategy:
        return Strategy(*children)

    # statements: one record each, its parts by name

    @v_args(meta=True)
    def program(self, meta: Any, c: builtins.list) -> ProgramStatement:
        return ProgramStatement(Pos.of(meta), c[0])

    @v_args(meta=True)
    def inputs(self, meta: Any, c: builtins.list) -> InputsStatement:
        return InputsStatement(Pos.of(meta), c[0], c[1])

    @v_args(meta=True)
    def mesh(self, meta: Any, c: builtins.list) -> MeshStatement:
        over = c[-1] if isinstance(c[-1], MeshOver | None) else None
        axes = c[:-1] if c[-1] is over else c
        return MeshStatement(Pos.of(meta), tuple(axes), over)

    @v_args(meta=True)
    def device(self, meta: Any, c: builtins.list) -> DeviceStatement:
        name = c[0] if isinstance(c[0], Str) else None
        fields = next((x for x in c if isinstance(x, tuple)), ())
        return DeviceStatement(Pos.of(meta), name, fields)

    @v_args(meta=True)
    def memory(self, meta: Any, c: builtins.list) -> MemoryStatement:
        return MemoryStatement(Pos.of(meta), c[0])

    @v_args(meta=True)
    def objective(self, meta: Any, c: builtins.list) -> ObjectiveStatement:
        return ObjectiveStatement(Pos.of(meta), c[0])

    @v_args(meta=True)
    def axis_block(self, meta: Any, c: builtins.list) -> AxisStatement:
        return AxisStatement(Pos.of(meta), c[0], tuple(c[1:]))

    @v_args(meta=True)
    def tile(self, meta: Any, c: builtins.list) -> TileStatement:
        return TileStatement(Pos.of(meta), *c)

    @v_args(meta=True)
    def replicate(self, meta: Any, c: builtins.list) -> ReplicateStatement:
        return ReplicateStatement(Pos.of(meta), *c)

    @v_args(meta=True)
    def search(self, meta: Any, c: builtins.list) -> SearchStatement:
        return SearchStatement(Pos.of(meta), c[0], c[1])

    @v_args(meta=True)
    def prune(self, meta: Any, c: builtins.list) -> PruneStatement:
        return PruneStatement(Pos.of(meta), c[0])

    @v_args(meta=True)
    def constraints(self, meta: Any, c: builtins.list) -> ConstraintsStatement:
        return ConstraintsStatement(Pos.of(meta), c[0])


# ------------------------------------------------------------------------------ parser


class _NamesEverywhere:
    """A no-op post-lexer whose `always_accept` lets NAME be lexed in every parser state.

    So a word like `axisbatch` or `programs` is one NAME (and an error) instead of the
    keyword `axis` followed by `batch`, and `unknown statement 'programs'` can be said.
    In a state that takes both a keyword and a NAME, lark types the exact keyword as the
    keyword; in a state that takes only NAME, `mesh` or `on` are plain names.
    """

    always_accept = ("NAME",)

    def process(self, stream: Any) -> Any:
        return stream


@functools.cache
def _lark() -> Lark:
    return Lark.open(
        "partir.lark",
        rel_to=__file__,
        parser="lalr",
        propagate_positions=True,
        maybe_placeholders=True,
        postlex=_NamesEverywhere(),
    )


def parse_statements(text: str, filename: str = "<text>") -> list[Statement]:
    """The statements of a goal file, in order; a syntax error raises `GoalError`."""
    source = Source(filename, text)
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as e:
        raise syntax_error(e, source) from None
    return _ToRecords().transform(tree)


# ------------------------------------------------------------------------------ errors

# Each statement's shape, written token by token. An error met while parsing a prefix of
# one of these (in the same parser state) gets the usage line as a hint, via match_examples.
_CALL_HINT = 'arguments are written name=value, separated by commas: f(a=1, b="x")'
_USAGE = {
    _CALL_HINT: [
        'inputs "m:f" ( k = 1 , j = [ 1 , 2 ] , )',
        "axis a { s ( k = 1 , j = [ 1 , 2 ] , ) }",
        "search mcts ( k = 1 , j = [ 1 , 2 ] , )",
    ],
    'program is written: program "module:function"': ['program "m:f"'],
    'inputs is written: inputs "module:function"(name=value, ...)': [
        'inputs "m:f" ( k = 1 , j = [ 1 , 2 ] )'
    ],
    "mesh is written: mesh NAME=SIZE, NAME=SIZE": ["mesh a = 8 , b = 8"],
    'device is written: device "tpu-v4", or a block: device { hbm 32GiB  flops 275T  '
    "hbm_bandwidth 1.2T/s  link AXIS 50G/s }": [
        'device "d" { hbm 1 link a 1 }',
        "device { hbm 1 }",
    ],
    "memory is written: memory <= 32GiB": ["memory <= 1"],
    "objective is written: objective time (or memory, or comm)": ["objective time"],
    "an axis block is written: axis NAME { strategy  strategy(name=value) ... }": [
        "axis a { s s ( k = 1 , j = [ 1 , 2 ] ) }"
    ],
    'tile is written: tile "PATH" dim N on AXIS': ['tile "p" dim 0 on a'],
    'replicate is written: replicate "PATH" on AXIS': ['replicate "p" on a'],
    "search is written: search mcts(seconds=60, seed=0)": ["search mcts ( k = 1 , j = [ 1 , 2 ] )"],
    "prune is written: prune cpsat (or prune none)": ["prune cpsat"],
    "constraints is written: constraints honour (or constraints ignore)": ["constraints ignore"],
}


@functools.cache
def _usage_examples() -> dict[str, list[str]]:
    """{hint: malformed snippets}: every incomplete prefix of each usage, then a bad char."""
    examples: dict[str, list[str]] = {}
    for hint, forms in _USAGE.items():
        for form in forms:
            words = form.split()
            for k in range(1, len(words) + 1):
                prefix = " ".join(words[:k])
                if hint == _CALL_HINT and ("(" not in prefix or ")" in prefix):
                    continue  # the call hint is for the inside of a call
                try:
                    _lark().parse(prefix)
                    continue  # a complete statement: an error after it is not about it
                except UnexpectedInput:
                    # parser states count the stack: as the first statement and after one
                    examples.setdefault(hint, []).extend([f"{prefix} @", f"prune none {prefix} @"])
    return examples


@functools.cache
def _example_error(snippet: str) -> UnexpectedInput | None:
    try:
        _lark().parse(snippet)
    except UnexpectedInput as e:
        return e
    return None


def _raise_cached(snippet: str) -> None:
    err = _example_error(snippet)
    if err is not None:
        raise err


def _usage_hint(e: UnexpectedInput) -> str | None:
    if getattr(e, "state", None) is None:
        return None
    try:
        # _raise_cached raises the example's error and returns no tree: match_examples only
        # needs the parse function to raise (its stub asks for one that returns a Tree)
        return e.match_examples(_raise_cached, _usage_examples())  # type: ignore[arg-type]
    except Exception:  # a hint is a nicety; never let it hide the real error
        return None


@functools.cache
def _terminal_words() -> dict[str, str]:
    words = {
        "NAME": "a name",
        "STRING": 'a "string"',
        "NUMBER": "a number",
        "$END": "the end of the file",
    }
    for t in _lark().terminals:
        if t.name not in words and t.pattern.type == "str":
            words[t.name] = f"'{t.pattern.value}'"
    return words


def _expected(e: UnexpectedInput) -> set[str]:
    """The terminals the parser would have taken where `e` happened (lark's public
    `InteractiveParser.accepts()` when the error carries a parser, else what it lists)."""
    parser = getattr(e, "interactive_parser", None)
    if parser is not None:
        return {t for t in parser.accepts() if t.isupper()}
    return set(getattr(e, "expected", None) or getattr(e, "allowed", None) or ())


def _expected_words(expected: set[str]) -> str:
    words = _terminal_words()
    keywords = {k.upper() for k in STATEMENTS}
    listed = [words.get(t, t) for t in sorted(expected - keywords - {"$END"})]
    listed.sort(key=lambda w: (w.startswith("a "), w))  # punctuation first, then kinds
    if expected & keywords:
        listed.append("a statement")
    elif "$END" in expected:
        listed.append(words["$END"])
    if len(listed) > 5:
        listed = listed[:4] + ["..."]
    return one_of(listed)


def _describe(tok: Token) -> str:
    if tok.type == "$END":
        return "end of file"
    if tok.type == "NAME":
        return f"name '{tok}'"
    if tok.type == "STRING":
        return f"string {tok}"
    if tok.type == "NUMBER":
        return f"number '{tok}'"
    return f"'{tok}'"


def _open_brace(e: UnexpectedInput) -> Token | None:
    stack = getattr(getattr(e, "state", None), "value_stack", None) or []
    braces = [v for v in stack if isinstance(v, Token) and v.type == "LBRACE"]
    return braces[-1] if braces else None


def _trailing_mesh_comma(e: UnexpectedInput) -> Token | None:
    """The ',' that ends a mesh statement, when the error is what follows it: the end of
    the file, a statement keyword, or a name on a later line (`mesh a=4, b=2,` then
    `axis a { ... }` reads `axis` as the next mesh axis and fails at `a`)."""
    if not isinstance(e, UnexpectedToken):
        return None
    stack = list(getattr(getattr(e, "state", None), "value_stack", None) or [])
    tokens = [v for v in stack if isinstance(v, Token)]
    if not any(t.type == "MESH" for t in tokens):
        return None
    if tokens and tokens[-1].type == "COMMA" and e.token.type != "NAME":
        return tokens[-1]  # `mesh a=4,` at the end of the file, or before a string
    if len(tokens) >= 2 and tokens[-2].type == "COMMA" and tokens[-1].type == "NAME":
        name = tokens[-1]
        if str(name) in STATEMENTS or name.line != tokens[-2].line:
            return tokens[-2]
    return None


def syntax_error(e: UnexpectedInput, source: Source) -> GoalError:
    """A lark error as a GoalError with a message in words."""
    expected = _expected(e)
    pos = Pos.of(e)
    comma = _trailing_mesh_comma(e)
    if comma is not None:
        return source.error(
            Pos.of(comma), "a ',' after the last mesh axis; remove it, or add an axis after it"
        )
    brace = _open_brace(e) if "RBRACE" in expected else None
    if isinstance(e, UnexpectedCharacters):
        if e.char == '"':
            return source.error(pos, "unterminated string: close it with '\"' on the same line")
        message = f"unexpected character {e.char!r}; expected {_expected_words(expected)}"
    elif isinstance(e, UnexpectedToken) and e.token.type == "$END":
        end_line = getattr(e.token, "end_line", None)
        end_col = getattr(e.token, "end_column", None)
        pos = Pos(end_line, end_col) if end_line and end_col else Pos.of(e.token)
        message = f"unexpected end of file; expected {_expected_words(expected)}"
        if brace is not None:
            return source.error(pos, f"{message} to close the block opened at line {brace.line}")
    elif isinstance(e, UnexpectedToken):
        if e.token.type == "NAME" and expected & {k.upper() for k in STATEMENTS}:
            return source.error(pos, _unknown_statement(e.token, expected, source))
        message = f"unexpected {_describe(e.token)}; expected {_expected_words(expected)}"
        if brace is not None and e.token.type != "NAME":
            return source.error(
                pos, f"{message} (is the block opened at line {brace.line} closed?)"
            )
    else:  # UnexpectedEOF and friends (not raised by the LALR parser, but be safe)
        message = "unexpected end of file"
    hint = _usage_hint(e)
    if hint is not None:
        message += f" ({hint})"
    return source.error(pos, message)


def _unknown_statement(tok: Token, expected: set[str], source: Source) -> str:
    from partir.ir.messages import did_you_mean

    rest = source.line_text(tok.line)[tok.end_column - 1 :] if tok.line and tok.end_column else ""
    if "COMMA" in expected and rest.lstrip().startswith("="):
        return f"expected ',' before mesh axis '{tok}'"
    from partir.ir.units import UNITS

    hint = did_you_mean(str(tok), STATEMENTS)
    if str(tok) in UNITS:
        hint = f"; a unit goes right after its number, with no space: 32{tok}"
    elif not hint:
        hint = f"; a statement starts with one of: {', '.join(STATEMENTS)}"
    return f"unknown statement '{tok}'{hint}"
