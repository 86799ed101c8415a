"""A generic Monte Carlo Tree Search over a state graph with a terminal reward.

The search knows nothing of JAX or of sharding: it sees states, actions and a reward through
`Environment`, and returns the best terminal state it met. Four pieces, kept apart:

- `Environment`: the problem (legal actions, transitions, terminal test, reward, state key).
- `SearchNode`: a plain record of one state in the tree (visit count, value sum, children).
- `uct_value` (or any function of the same shape): the selection rule, a parameter.
- `search`: the loop (select, expand, roll out, back up) with its budget and one RNG.

Helpers used by the loop and by hand-built tests: `select_child` and `backup`.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

State = Any  # Whatever the environment uses; the search only passes it back.
Action = Hashable  # An element of `Environment.actions(state)`.
Key = Hashable  # Transposition key: equal keys mean the same state.
StopReason = Literal["exhausted", "converged", "episodes", "seconds", "interrupted"]
ChildSelection = Callable[["SearchNode", "SearchNode", float], float]
Progress = Callable[[int, float, float], None]  # (episode, seconds, best reward)

PROGRESS_INTERVAL = 0.1  # Seconds between two `progress` calls that report no improvement.


class Environment(Protocol):
    """The problem the search explores.

    The state graph must be acyclic (no state reachable from itself) and every path must reach
    a terminal state, unless `search(max_depth=...)` cuts it.
    """

    def actions(self, state: State) -> Sequence[Action]:
        """Legal actions at a non-terminal state, never empty, in a deterministic order."""
        ...

    def step(self, state: State, action: Action) -> State:
        """The state after `action` (one of `actions(state)`)."""
        ...

    def is_terminal(self, state: State) -> bool:
        """Whether `state` ends an episode."""
        ...

    def reward(self, state: State) -> float:
        """Higher is better, roughly in [0, 1]; called on terminal states, and by the greedy
        rollout on any state."""
        ...

    def key(self, state: State) -> Key:
        """Transposition key: states with equal keys are the same state."""
        ...


class SearchNode:
    """One state of the search tree: a plain record.

    `actions` is None until the node is first expanded; `children` holds `(action, node)` for
    the first `len(children)` of `actions`, in action order. Nodes are shared between parents
    (the tree is a DAG through the transposition table), so `visits` and `total` count every
    episode that passed through the node, by whichever path.
    """

    __slots__ = (
        "state",
        "key",
        "depth",
        "terminal",
        "actions",
        "children",
        "visits",
        "total",
        "exhausted",
    )

    def __init__(
        self,
        state: State = None,
        key: Key = None,
        *,
        depth: int = 0,
        terminal: bool = False,
        actions: tuple[Action, ...] | None = None,
        children: list[tuple[Action, SearchNode]] | None = None,
        visits: int = 0,
        total: float = 0.0,
        exhausted: bool = False,
    ):
        self.state = state
        self.key = key
        self.depth = depth  # Depth on the first path that reached the state.
        self.terminal = terminal  # Terminal for the environment, or cut by `max_depth`.
        self.actions = actions
        self.children = [] if children is None else children
        self.visits = visits
        self.total = total  # Sum of the rewards backed up through this node.
        self.exhausted = exhausted  # Terminal, or fully expanded with every child exhausted.

    def fully_expanded(self) -> bool:
        return self.actions is not None and len(self.children) == len(self.actions)

    def __repr__(self) -> str:
        return (
            f"SearchNode(key={self.key!r}, visits={self.visits}, total={self.total:g}, "
            f"children={len(self.children)}, exhausted={self.exhausted})"
        )


def uct_value(parent: SearchNode, child: SearchNode, c: float) -> float:
    """UCT: `child.total / child.visits + c * sqrt(ln(parent.visits) / child.visits)`.

    An unvisited child scores +inf, so it is chosen first (ties go to the first in action
    order, see `select_child`).
    """
    if child.visits == 0:
        return math.inf
    mean = child.total / child.visits
    return mean + c * math.sqrt(math.log(max(parent.visits, 1)) / child.visits)


def select_child(
    node: SearchNode, c: float, child_selection: ChildSelection = uct_value
) -> tuple[Action, SearchNode] | None:
    """The `(action, child)` of `node` with the highest `child_selection(node, child, c)`
    among children that are not exhausted; the first in action order on ties; None if every
    child is exhausted."""
    best: tuple[Action, SearchNode] | None = None
    best_value = -math.inf
    for action, child in node.children:
        if child.exhausted:
            continue
        value = child_selection(node, child, c)
        if best is None or value > best_value:
            best, best_value = (action, child), value
    return best


def backup(path: Sequence[SearchNode], value: float) -> None:
    """Add one visit and `value` to every node of `path` (root first), the path the episode
    took; then mark exhausted the nodes, from the leaf up, whose subtrees have nothing left."""
    for node in path:
        node.visits += 1
        node.total += value
    for node in reversed(path):
        if not node.exhausted:
            node.exhausted = node.fully_expanded() and all(c.exhausted for _, c in node.children)
            if not node.exhausted:
                break  # An ancestor is exhausted only if this node is.


@dataclass
class SearchResult:
    """What `search` found, and how long it took.

    `best_state` is None and `best_reward` -inf only if the search was interrupted before it
    met any terminal state. `curve` has one `(episode, seconds, best reward)` entry each time
    the best improved; `episodes_to_best` and `seconds_to_best` are its last entry.
    """

    best_state: Any
    best_reward: float
    episodes: int
    seconds: float
    curve: list[tuple[int, float, float]]
    stop_reason: StopReason
    nodes: int  # Transposition table size: distinct states in the tree.
    episodes_to_best: int
    seconds_to_best: float


class _Run:
    """The mutable state of one search: table, reward cache, RNG, best so far."""

    def __init__(
        self,
        env: Environment,
        rng: random.Random,
        *,
        uct_c: float,
        rollout: str,
        greedy_epsilon: float,
        max_depth: int | None,
        child_selection: ChildSelection,
    ):
        self.env = env
        self.rng = rng
        self.uct_c = uct_c
        self.greedy = rollout == "greedy"
        self.greedy_epsilon = greedy_epsilon
        self.max_depth = max_depth
        self.child_selection = child_selection
        self.table: dict[Key, SearchNode] = {}
        self.rewards: dict[Key, float] = {}
        self.start = time.perf_counter()
        self.episode = 0  # Episodes begun.
        self.best_state: State = None
        self.best_reward = -math.inf
        self.curve: list[tuple[int, float, float]] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def is_leaf(self, state: State, depth: int) -> bool:
        return (self.max_depth is not None and depth >= self.max_depth) or bool(
            self.env.is_terminal(state)
        )

    def reward(self, state: State, key: Key | None = None) -> float:
        """`env.reward(state)`, computed once per key."""
        if key is None:
            key = self.env.key(state)
        r = self.rewards.get(key)
        if r is None:
            r = float(self.env.reward(state))
            if not math.isfinite(r):
                raise ValueError(
                    f"env.reward returned {r} for the state with key {key!r}; rewards must be "
                    "finite (give infeasible states a low finite reward such as 0.0)"
                )
            self.rewards[key] = r
        return r

    def offer(self, state: State, r: float) -> None:
        """The final choice: the terminal state with the highest reward, the earliest met on
        ties (a strict `>`)."""
        if r > self.best_reward:
            self.best_state, self.best_reward = state, r
            self.curve.append((self.episode, self.elapsed(), r))

    def node(self, state: State, key: Key, depth: int) -> SearchNode:
        node = SearchNode(state, key, depth=depth, terminal=self.is_leaf(state, depth))
        self.table[key] = node
        return node

    def legal(self, state: State, key: Key | None = None) -> tuple[Action, ...]:
        actions = tuple(self.env.actions(state))
        if not actions:
            key = self.env.key(state) if key is None else key
            raise ValueError(
                f"env.actions returned no actions for the non-terminal state with key {key!r}; "
                "env.is_terminal should be true there"
            )
        return actions

    def descend(self, root: SearchNode) -> list[SearchNode] | None:
        """Select down the tree and expand one new node: the path, root first, ending at the
        new node; None if the root turns out to be exhausted.

        At a node with unexpanded actions the next action in order is expanded; an action that
        leads to a state already in the table links to that node and the expansion goes on
        with the next action. At a fully expanded node, `child_selection` picks among the
        children that are not exhausted; a node with none left is marked exhausted and the
        descent backs up one step.
        """
        path = [root]
        while path:
            node = path[-1]
            if node.actions is None:
                node.actions = self.legal(node.state, node.key)
            while len(node.children) < len(node.actions):
                action = node.actions[len(node.children)]
                state = self.env.step(node.state, action)
                key = self.env.key(state)
                child = self.table.get(key)
                if child is None:
                    child = self.node(state, key, node.depth + 1)
                    node.children.append((action, child))
                    path.append(child)
                    return path
                self.check_acyclic(path, child)
                node.children.append((action, child))
            chosen = select_child(node, self.uct_c, self.child_selection)
            if chosen is None:
                node.exhausted = True
                path.pop()
                continue
            self.check_acyclic(path, chosen[1])
            path.append(chosen[1])
        return None

    @staticmethod
    def check_acyclic(path: list[SearchNode], child: SearchNode) -> None:
        if any(n is child for n in path):
            raise ValueError(
                f"the state with key {child.key!r} is reachable from itself; the search needs "
                "an acyclic state graph (make the state record the decisions taken)"
            )

    def roll_out(self, state: State, depth: int) -> float:
        """Play from a non-terminal `state` to a leaf; offer every leaf met; its reward."""
        env, rng = self.env, self.rng
        while True:
            actions = self.legal(state)
            if self.greedy and rng.random() >= self.greedy_epsilon:
                state, r, leaf = self.greedy_step(state, actions, depth + 1)
            else:
                state = env.step(state, actions[rng.randrange(len(actions))])
                leaf = self.is_leaf(state, depth + 1)
                r = self.reward(state) if leaf else 0.0
                if leaf:
                    self.offer(state, r)
            depth += 1
            if leaf:
                return r

    def greedy_step(
        self, state: State, actions: tuple[Action, ...], depth: int
    ) -> tuple[State, float, bool]:
        """The successor with the highest reward (uniform among ties), its reward, and whether
        it is a leaf; every leaf successor is offered as a candidate."""
        best: list[tuple[State, bool]] = []
        best_r = -math.inf
        for action in actions:
            nxt = self.env.step(state, action)
            r = self.reward(nxt)
            leaf = self.is_leaf(nxt, depth)
            if leaf:
                self.offer(nxt, r)
            if not best or r > best_r:
                best, best_r = [(nxt, leaf)], r
            elif r == best_r:
                best.append((nxt, leaf))
        nxt, leaf = best[self.rng.randrange(len(best))] if len(best) > 1 else best[0]
        return nxt, best_r, leaf

    def run_episode(self, root: SearchNode) -> bool:
        """One episode; False if the root was found exhausted and nothing ran."""
        path = self.descend(root)
        if path is None:
            return False
        leaf = path[-1]
        if leaf.terminal:
            value = self.reward(leaf.state, leaf.key)
            self.offer(leaf.state, value)
            leaf.exhausted = True
        else:
            value = self.roll_out(leaf.state, leaf.depth)
        backup(path, value)
        return True


def search(
    env: Environment,
    root: State,
    *,
    episodes: int | None = None,
    seconds: float | None = None,
    patience: int | None = 200,
    uct_c: float = 1.4,
    seed: int = 0,
    rollout: Literal["random", "greedy"] = "random",
    greedy_epsilon: float = 0.1,
    max_depth: int | None = None,
    progress: Progress | None = None,
    child_selection: ChildSelection = uct_value,
) -> SearchResult:
    """Monte Carlo Tree Search from `root` for the terminal state of highest `env.reward`.

    This is the search of Automap (Schaarschmidt et al., "Automap: Towards Ergonomic Automated
    Parallelism for ML Models", arXiv 2112.02958) and PartIR (Alabed et al., "Automatic
    Discovery of Composite SPMD Partitioning Strategies in PartIR", arXiv 2210.06352), written
    for any `Environment`. Each episode:

    1. Selection: from the root, at a fully expanded node go to the child maximising
       `child_selection(parent, child, uct_c)`, by default UCT (Kocsis & Szepesvári 2006)::

           Q(child) / N(child) + uct_c * sqrt(ln N(parent) / N(child))

       where N counts the episodes through a node and Q sums their rewards; ties go to the
       first child in action order. Exhausted children (subtrees with nothing left) are
       skipped.
    2. Expansion: at the first node with an unexpanded action, the next action in order makes
       one new node. States are kept in a transposition table keyed by `env.key`, so an action
       that reaches a known state links to its node instead (the tree is a DAG; counts live on
       nodes) and the next action is tried.
    3. Rollout: from the new node to a terminal state. "random" picks uniform actions with the
       seeded RNG; "greedy" steps to the successor of highest `env.reward` (uniform among ties)
       and, with probability `greedy_epsilon`, to a uniform one. Rewards are cached by key.
    4. Backup: the rollout's terminal reward is added along the path the episode took.

    Every terminal state met, in the tree or in a rollout (greedy: every terminal successor it
    scores), is a candidate. The final choice is the candidate of highest reward, the earliest
    met on ties. Rewards should be normalised by the caller to roughly [0, 1], the scale the
    default `uct_c` suits.

    Budget. The search stops when the tree is exhausted (every state reachable from the root
    expanded and every leaf terminal), whatever the budget. Beyond that: with `episodes` it
    runs that many episodes; otherwise it stops after `patience` episodes without a strict
    improvement of the best (None: never). `seconds` caps the wall time in every mode; it is
    checked between episodes. On KeyboardInterrupt (from the environment, `progress` or the
    user) it returns the best so far. The search is deterministic for a `seed` apart from
    where `seconds` cuts it.

    Args:
      env: the problem; see `Environment`.
      root: the start state. If terminal, it is the answer and no episode runs.
      episodes: number of episodes to run.
      seconds: wall-time cap, in seconds.
      patience: episodes without improvement before stopping when `episodes` is not given.
      uct_c: exploration constant passed to `child_selection`.
      seed: seed of the one `random.Random` used for rollouts and greedy ties.
      rollout: "random" or "greedy".
      greedy_epsilon: probability of a uniform action at each greedy rollout step.
      max_depth: states this many actions below the root count as terminal (depth is taken
        on the first path that reaches a state, so it should not depend on the path).
      progress: called as `progress(episode, seconds, best_reward)` after an episode that
        improved the best, otherwise at most every `PROGRESS_INTERVAL` seconds, and once at
        the end.
      child_selection: the selection rule, `f(parent, child, c) -> float`, highest chosen.

    Returns:
      A `SearchResult`. `episodes` counts episodes begun (an interrupted one included);
      `stop_reason` is the first that held of "exhausted", "episodes", "converged",
      "seconds" (or "interrupted").
    """
    if episodes is not None and episodes < 0:
        raise ValueError(f"episodes={episodes!r} must be >= 0 or None")
    if seconds is not None and seconds < 0:
        raise ValueError(f"seconds={seconds!r} must be >= 0 or None")
    if patience is not None and patience < 1:
        raise ValueError(f"patience={patience!r} must be >= 1, or None to never converge")
    if rollout not in ("random", "greedy"):
        raise ValueError(f"rollout={rollout!r} must be 'random' or 'greedy'")
    if not 0.0 <= greedy_epsilon <= 1.0:
        raise ValueError(f"greedy_epsilon={greedy_epsilon!r} must lie in [0, 1]")
    if max_depth is not None and max_depth < 0:
        raise ValueError(f"max_depth={max_depth!r} must be >= 0 or None")

    run = _Run(
        env,
        random.Random(seed),
        uct_c=uct_c,
        rollout=rollout,
        greedy_epsilon=greedy_epsilon,
        max_depth=max_depth,
        child_selection=child_selection,
    )
    stop: StopReason
    last_report = -math.inf
    try:
        node = run.node(root, env.key(root), 0)
        if node.terminal:
            run.offer(root, run.reward(root, node.key))
            node.exhausted = True
        while True:
            if node.exhausted:
                stop = "exhausted"
                break
            if episodes is not None and run.episode >= episodes:
                stop = "episodes"
                break
            if (
                episodes is None
                and patience is not None
                and run.curve
                and run.episode - run.curve[-1][0] >= patience
            ):
                stop = "converged"
                break
            if seconds is not None and run.elapsed() >= seconds:
                stop = "seconds"
                break
            improvements = len(run.curve)
            run.episode += 1
            if not run.run_episode(node):
                run.episode -= 1
                continue  # The root is now marked exhausted.
            if progress is not None:
                now = run.elapsed()
                if len(run.curve) > improvements or now - last_report >= PROGRESS_INTERVAL:
                    last_report = now
                    progress(run.episode, now, run.best_reward)
    except KeyboardInterrupt:
        stop = "interrupted"

    seconds_used = run.elapsed()
    if progress is not None:
        try:
            progress(run.episode, seconds_used, run.best_reward)
        except KeyboardInterrupt:  # Ctrl-C during the last report: the result still stands
            stop = "interrupted"
    episode_to_best, seconds_to_best = run.curve[-1][:2] if run.curve else (0, 0.0)
    return SearchResult(
        best_state=run.best_state,
        best_reward=run.best_reward,
        episodes=run.episode,
        seconds=seconds_used,
        curve=run.curve,
        stop_reason=stop,
        nodes=len(run.table),
        episodes_to_best=episode_to_best,
        seconds_to_best=seconds_to_best,
    )
