"""The CP-SAT model of memory pruning, from plain numbers, solved here or in a subprocess.

One Boolean per action and one for "left whole" per group, exactly one true per group, and
the sum of the chosen sizes within the budget. `feasible` answers a list of queries (none,
or one literal assumed true) on that model. In a process that has imported TensorFlow,
OR-tools' native code can crash (both link their own protobuf); the model is then solved in
a fresh Python that imports only OR-tools, and the answers come back as JSON.

This module imports nothing from partir, so that the subprocess stays small:
`python cpsat.py` reads {"groups", "budget", "queries"} on stdin and writes the answers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

# (the size when left whole, [the size when tiled by each of its actions]), in KiB
Group = tuple[int, Sequence[int]]
Query = tuple[str, int] | None  # None, ("action", i) or ("whole", k) assumed true

TIME_LIMIT_S = 5.0


def feasible(
    groups: Sequence[Group], budget: int, queries: Sequence[Query], *, isolate: bool | None = None
) -> list[bool]:
    """For each query, whether some assignment meets the budget with it; UNKNOWN (the time
    limit) counts as feasible, so pruning never drops a feasible action. `isolate`: solve
    in a subprocess (default: when TensorFlow is imported in this process)."""
    if isolate is None:
        isolate = "tensorflow" in sys.modules
    if not isolate:
        return _solve(groups, budget, queries)
    request = json.dumps(
        {
            "groups": [[w, list(t)] for w, t in groups],
            "budget": budget,
            "queries": [list(q) if q else None for q in queries],
        }
    )
    done = subprocess.run(
        [sys.executable, "-P", __file__],  # -P: this folder is not put on sys.path
        input=request,
        capture_output=True,
        text=True,
        timeout=60 + TIME_LIMIT_S * (len(queries) + 1),
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"the CP-SAT subprocess failed (exit status {done.returncode}): "
            f"{done.stderr.strip()[-500:]}"
        )
    return [bool(x) for x in json.loads(done.stdout)]


def _solve(groups: Sequence[Group], budget: int, queries: Sequence[Query]) -> list[bool]:
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    actions: list[cp_model.IntVar] = []
    wholes, terms = [], []
    for k, (size, tiled) in enumerate(groups):
        whole = m.new_bool_var(f"whole{k}")
        chosen = [m.new_bool_var(f"a{len(actions) + i}") for i in range(len(tiled))]
        m.add_exactly_one([whole, *chosen])
        terms.append(size * whole)
        terms += [t * c for t, c in zip(tiled, chosen)]
        wholes.append(whole)
        actions += chosen
    m.add(sum(terms) <= budget)
    out = []
    for query in queries:
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = TIME_LIMIT_S
        solver.parameters.num_workers = 1
        # OR-tools would install its own SIGINT handler and restore the default one after
        # the solve: Ctrl-C would then kill the process instead of raising KeyboardInterrupt
        solver.parameters.catch_sigint_signal = False
        m.clear_assumptions()
        if query is not None:
            kind, i = query
            m.add_assumptions([(actions if kind == "action" else wholes)[i]])
        out.append(solver.solve(m) != cp_model.INFEASIBLE)
    m.clear_assumptions()
    return out


if __name__ == "__main__":
    request = json.load(sys.stdin)
    queries = [tuple(q) if q else None for q in request["queries"]]
    groups = [(w, t) for w, t in request["groups"]]
    json.dump(_solve(groups, request["budget"], queries), sys.stdout)
