"""The package's layers: ir <- strategies <- solver <- dsl / cli / bench, no import upwards
(also none inside a function)."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "partir"

FORBIDDEN = {
    "ir": ("strategies", "solver", "dsl", "cli", "bench", "goal", "jax_api"),
    "strategies": ("solver", "dsl", "cli", "bench", "jax_api"),
    "solver": ("dsl", "cli", "bench"),
}


def imported_modules(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_import_upwards(layer):
    bad = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "partir" and len(parts) > 1 and parts[1] in FORBIDDEN[layer]:
                bad.append(f"{path.relative_to(PACKAGE.parent)} imports {module}")
    assert not bad, "\n".join(bad)
