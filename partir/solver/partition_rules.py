"""Partition-rule lists from a plan's input tilings: ordered `(glob, sharding)` pairs, as
hand-written Flax/T5X rules read them (the first that matches a path wins), and the helper
source that a written rules file carries (`Plan.rules_source`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from partir.ir.propagate import Sharding

RULES_HELPERS = '''def _match(pattern, parts):
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match(pattern[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _match(pattern[1:], parts[1:])


def spec_for(path, rules=RULES):
    """The spec of the first rule whose pattern matches `path` (P() if none does)."""
    parts = tuple(path.split("/"))
    for pattern, spec in rules:
        if _match(tuple(pattern.split("/")), parts):
            return spec
    return P()


def _key(k):
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k).strip("[].")


def tree_specs(tree, prefix, rules=RULES):
    """A pytree of PartitionSpecs like `tree`, its leaves named `prefix/<key path>`."""
    return jax.tree_util.tree_map_with_path(
        lambda kp, _: spec_for("/".join([prefix, *map(_key, kp)]), rules), tree
    )
'''


_INDEX = re.compile(r"^\d+$")


def _escape(element: str) -> str:
    """A path element as a glob that matches only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in element)


def _pattern(parts: Sequence[str], layers: bool) -> str:
    """`parts` as a glob; with `layers`, every index element becomes `*`."""
    return "/".join("*" if layers and _INDEX.match(e) else _escape(e) for e in parts)


def _shared_tails(paths: Sequence[str]) -> dict[str, str]:
    """{path: the parameter path tail it shares with other arguments' inputs}.

    `optimizer/opt_state/0/mu/blocks/0/w` ends with `blocks/0/w`, the tail of
    `model/blocks/0/w` under another argument: both map to `blocks/0/w`."""
    heads: dict[str, set[str]] = {}
    for p in paths:
        head, _, tail = p.partition("/")
        if tail:
            heads.setdefault(tail, set()).add(head)
    found: dict[str, str] = {}
    for p in paths:
        parts = p.split("/")
        for i in range(1, len(parts)):  # the longest suffix another argument names
            t = "/".join(parts[i:])
            if heads.get(t, set()) - {parts[0]}:
                found[p] = t
                break
    shared = set(found.values())
    for p in paths:
        tail = p.partition("/")[2]
        if p not in found and tail in shared:
            found[p] = tail
    for arg in dict.fromkeys(p.partition("/")[0] for p in paths):
        own = [p for p in paths if p.partition("/")[0] == arg]
        if not any(p in found for p in own):
            found.update(_mirrored_tails(own))
    return found


def _mirrored_tails(paths: Sequence[str]) -> dict[str, str]:
    """{path: its tail below the subtree it mirrors}, within one argument: a train state
    holding the parameters and the optimizer moments (`state/model/w`,
    `state/opt_state/0/mu/w`, `state/opt_state/0/nu/w`). The mirrors are the largest set of
    subtrees with the same leaf paths (two or more), not all under one parent: siblings
    alike (`linear_0`, `linear_1`; layers) are repeated modules, not an optimizer's copy."""
    below: dict[str, set[str]] = {}
    for p in paths:
        parts = p.split("/")
        for i in range(2, len(parts)):
            below.setdefault("/".join(parts[:i]), set()).add("/".join(parts[i:]))
    groups: dict[frozenset[str], list[str]] = {}
    for prefix, tails in below.items():
        if len(tails) >= 2:
            groups.setdefault(frozenset(tails), []).append(prefix)
    best: list[str] = []
    best_size = 0
    for leaves, prefixes in groups.items():
        parents = {q.rpartition("/")[0] for q in prefixes}
        if len(prefixes) >= 2 and len(parents) >= 2 and len(leaves) > best_size:
            best, best_size = prefixes, len(leaves)
    return {p: p[len(q) + 1 :] for q in best for p in paths if p.startswith(q + "/")}


def partition_rules(shardings: Mapping[str, Sharding]) -> list[tuple[str, Sharding]]:
    """An ordered rule list that gives every path its sharding under first-match-wins
    (see `Plan.to_rules`). Greedy in path order: the first path of each sharded group
    tries its patterns from the most general to the exact path, and takes the first
    whose still-unclaimed matches all want the same sharding; replicated paths are left
    to the final `**`."""
    from partir.ir.specs import glob_match

    paths = list(shardings)
    tails = _shared_tails(paths)
    by_leaf: dict[str, list[str]] = {}
    for p in paths:
        by_leaf.setdefault(p.rsplit("/", 1)[-1], []).append(p)
    open_ = dict.fromkeys(paths)  # paths no rule has claimed yet, in order
    rules: list[tuple[str, Sharding]] = []
    for path in paths:
        want = shardings[path]
        if path not in open_ or not any(want):
            continue
        parts = path.split("/")
        candidates = []
        if path in tails:
            t = tails[path].split("/")
            candidates += ["**/" + _pattern(t, True), "**/" + _pattern(t, False)]
        candidates += [_pattern(parts, True), _pattern(parts, False)]
        for pattern in dict.fromkeys(candidates):
            leaf = pattern.rsplit("/", 1)[-1]
            pool = paths if any(c in leaf for c in "*?[") else by_leaf.get(leaf, [])
            claimed = [q for q in pool if q in open_ and glob_match(pattern, q)]
            if path in claimed and all(shardings[q] == want for q in claimed):
                rules.append((pattern, want))
                for q in claimed:
                    del open_[q]
                break
    rules.append(("**", ()))
    return rules
