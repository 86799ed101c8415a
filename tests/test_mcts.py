"""partir.solver.mcts: selection and backup on hand-built trees, search on toy environments."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partir.solver import mcts
from partir.solver.mcts import SearchNode, backup, search, select_child, uct_value

# --- toy environments -------------------------------------------------------------------------


class Bits:
    """Choose a bit string of length `n`, one bit per step; `f(bits)` scores any prefix."""

    def __init__(self, n, f):
        self.n, self.f = n, f
        self.reward_calls = []  # (state, reward, terminal) for every env.reward call

    def actions(self, state):
        return (0, 1)

    def step(self, state, action):
        return (*state, action)

    def is_terminal(self, state):
        return len(state) == self.n

    def reward(self, state):
        r = self.f(state)
        self.reward_calls.append((state, r, self.is_terminal(state)))
        return r

    def key(self, state):
        return state


def trap(n):
    """Deceptive: all ones scores 1.0, otherwise 0.9 * (fraction of zeros), so every local
    step towards the optimum looks worse."""
    return Bits(n, lambda s: 1.0 if len(s) == n and all(s) else 0.9 * s.count(0) / n)


def onemax(n):
    """Fraction of ones: greedy finds the optimum in one rollout."""
    return Bits(n, lambda s: sum(s) / n)


def noisy(n):
    """A fixed pseudo-random reward per state (random.Random hashes str seeds with SHA-512)."""
    import random

    return Bits(n, lambda s: random.Random(repr(s)).random())


class Knapsack:
    """Add items in any order while they fit, or stop; the same set reached by two orders is one
    state. Reward: value packed / total value."""

    def __init__(self, items, capacity):
        self.items, self.capacity = items, capacity
        self.total = sum(v for _, v in items)

    def weight(self, chosen):
        return sum(self.items[i][0] for i in chosen)

    def actions(self, state):
        chosen, _ = state
        w = self.weight(chosen)
        adds = [
            ("add", i)
            for i in range(len(self.items))
            if i not in chosen and w + self.items[i][0] <= self.capacity
        ]
        return [*adds, ("stop",)]

    def step(self, state, action):
        chosen, _ = state
        if action == ("stop",):
            return (chosen, True)
        return (chosen | {action[1]}, False)

    def is_terminal(self, state):
        return state[1]

    def reward(self, state):
        return sum(self.items[i][1] for i in state[0]) / self.total

    def key(self, state):
        return (tuple(sorted(state[0])), state[1])


ITEMS = [(3, 4), (4, 5), (2, 3), (5, 8), (1, 1)]
ROOT_SACK = (frozenset(), False)


def reachable(env, root):
    """Every state key reachable from `root`, and the best terminal reward."""
    seen, stack, best = {env.key(root)}, [root], -math.inf
    while stack:
        s = stack.pop()
        if env.is_terminal(s):
            best = max(best, env.reward(s))
            continue
        for a in env.actions(s):
            t = env.step(s, a)
            if env.key(t) not in seen:
                seen.add(env.key(t))
                stack.append(t)
    return seen, best


def brute_knapsack(items, capacity):
    from itertools import combinations

    best = 0
    for k in range(len(items) + 1):
        for combo in combinations(items, k):
            if sum(w for w, _ in combo) <= capacity:
                best = max(best, sum(v for _, v in combo))
    return best / sum(v for _, v in items)


# --- selection and backup on hand-built trees ---------------------------------------------------


def hand_tree():
    """A parent with 10 visits and three children: a (5, 3.0), b (2, 0.8), c (3, 2.4)."""
    a = SearchNode("a", "a", visits=5, total=3.0)
    b = SearchNode("b", "b", visits=2, total=0.8)
    c = SearchNode("c", "c", visits=3, total=2.4)
    parent = SearchNode(
        "p", "p", actions=("a", "b", "c"), children=[("a", a), ("b", b), ("c", c)], visits=10
    )
    return parent, a, b, c


def test_uct_value_formula():
    parent, a, b, c = hand_tree()
    assert uct_value(parent, a, 1.4) == pytest.approx(0.6 + 1.4 * math.sqrt(math.log(10) / 5))
    assert uct_value(parent, b, 0.0) == pytest.approx(0.4)
    assert uct_value(parent, SearchNode(), 1.4) == math.inf


@pytest.mark.parametrize(
    "c, chosen",
    [
        (0.0, "c"),  # best mean: 0.8 > 0.6 > 0.4
        (1.4, "c"),  # a 1.550, b 1.902, c 2.027
        (3.0, "b"),  # a 2.636, b 3.619, c 3.428: the least visited wins
    ],
)
def test_select_child_pins_uct_choice(c, chosen):
    parent, *_ = hand_tree()
    action, child = select_child(parent, c)
    assert action == chosen and child.key == chosen


def test_select_child_prefers_unvisited_first_in_action_order():
    parent, *_ = hand_tree()
    parent.children += [("d", SearchNode("d", "d")), ("e", SearchNode("e", "e"))]
    assert select_child(parent, 1.4)[0] == "d"


def test_select_child_ties_go_to_first_action():
    x, y = SearchNode(visits=2, total=1.0), SearchNode(visits=2, total=1.0)
    parent = SearchNode(children=[("x", x), ("y", y)], visits=4)
    assert select_child(parent, 1.4)[0] == "x"


def test_select_child_skips_exhausted():
    parent, a, b, c = hand_tree()
    c.exhausted = True
    assert select_child(parent, 0.0)[0] == "a"
    a.exhausted = b.exhausted = True
    assert select_child(parent, 0.0) is None


def test_select_child_uses_the_given_rule():
    parent, *_ = hand_tree()
    fewest_visits = lambda p, ch, c: -ch.visits  # noqa: E731
    assert select_child(parent, 1.4, fewest_visits)[0] == "b"


def test_backup_updates_the_path_only():
    leaf = SearchNode("l", "l", terminal=True, exhausted=True)
    other = SearchNode("o", "o", visits=1, total=0.2)
    mid = SearchNode("m", "m", actions=("l",), children=[("l", leaf)], visits=1, total=0.3)
    root = SearchNode(
        "r", "r", actions=("m", "o"), children=[("m", mid), ("o", other)], visits=2, total=0.5
    )
    backup([root, mid, leaf], 0.7)
    assert (root.visits, root.total) == (3, pytest.approx(1.2))
    assert (mid.visits, mid.total) == (2, pytest.approx(1.0))
    assert (leaf.visits, leaf.total) == (1, pytest.approx(0.7))
    assert (other.visits, other.total) == (1, 0.2)
    # mid's only child is exhausted, so mid is; root still has `other` to explore.
    assert mid.exhausted and not root.exhausted


def test_backup_on_a_shared_node_follows_the_path_taken():
    shared = SearchNode("s", "s", visits=2, total=1.0)
    p1 = SearchNode("p1", "p1", actions=("s",), children=[("s", shared)], visits=1, total=0.5)
    p2 = SearchNode("p2", "p2", actions=("s",), children=[("s", shared)], visits=1, total=0.5)
    backup([p1, shared], 1.0)
    assert (shared.visits, p1.visits, p2.visits) == (3, 2, 1)


# --- search on toy environments ---------------------------------------------------------------


def test_trap_is_solved_and_exhausted():
    env = trap(6)
    res = search(env, ())
    assert res.stop_reason == "exhausted"
    assert res.best_state == (1,) * 6 and res.best_reward == 1.0
    assert res.nodes == 2**7 - 1  # every prefix, once
    assert res.episodes == res.nodes - 1  # one new node per episode, no transpositions
    assert res.curve[-1] == (res.episodes_to_best, res.seconds_to_best, 1.0)


def test_knapsack_finds_the_optimum_and_counts_states_once():
    env = Knapsack(ITEMS, capacity=9)
    res = search(env, ROOT_SACK)
    keys, best = reachable(env, ROOT_SACK)
    assert res.stop_reason == "exhausted"
    assert res.best_reward == pytest.approx(brute_knapsack(ITEMS, 9)) == pytest.approx(best)
    assert res.nodes == len(keys)


class TwoMoves:
    """Take a and b in either order, then the game ends: four states, two paths to {a, b}."""

    def actions(self, state):
        return [m for m in "ab" if m not in state]

    def step(self, state, action):
        return state | {action}

    def is_terminal(self, state):
        return len(state) == 2

    def reward(self, state):
        return 1.0

    def key(self, state):
        return tuple(sorted(state))


def test_transposition_shares_one_node():
    res = search(TwoMoves(), frozenset())
    assert res.nodes == 4  # {}, {a}, {b}, {a, b}: a tree would have two {a, b} nodes
    assert res.stop_reason == "exhausted"
    assert res.best_state == frozenset("ab")


def test_same_seed_same_result():
    def run(seed, rollout):
        res = search(noisy(14), (), episodes=300, seed=seed, rollout=rollout)
        return res.best_state, res.best_reward, [(e, r) for e, _, r in res.curve], res.nodes

    for rollout in ("random", "greedy"):
        assert run(3, rollout) == run(3, rollout)
    assert run(3, "random") != run(4, "random")


def test_episode_budget():
    res = search(noisy(30), (), episodes=10)
    assert (res.episodes, res.stop_reason, res.nodes) == (10, "episodes", 11)
    assert search(noisy(30), (), episodes=0).stop_reason == "episodes"


def test_seconds_budget():
    t0 = time.perf_counter()
    res = search(noisy(40), (), seconds=0.2, patience=None)
    wall = time.perf_counter() - t0
    assert res.stop_reason == "seconds"
    # stops within an episode or so of the budget; the slack is for a loaded 2-core machine
    assert 0.2 <= res.seconds < 1.2 and wall < 1.3
    assert res.episodes > 0


def test_patience_converges():
    res = search(noisy(30), (), patience=25)
    assert res.stop_reason == "converged"
    assert res.episodes - res.episodes_to_best == 25


def test_patience_is_ignored_with_an_episode_budget():
    res = search(noisy(30), (), episodes=100, patience=5)
    assert (res.episodes, res.stop_reason) == (100, "episodes")


def test_greedy_rollout_beats_random_on_onemax():
    greedy = search(onemax(16), (), episodes=5, rollout="greedy", greedy_epsilon=0.0)
    rand = search(onemax(16), (), episodes=5, rollout="random")
    assert greedy.best_reward == 1.0 > rand.best_reward


def test_greedy_caches_rewards_by_key():
    env = noisy(10)
    search(env, (), episodes=200, rollout="greedy")
    states = [s for s, _, _ in env.reward_calls]
    assert len(states) == len(set(states)) > 0


class InterruptAt(Bits):
    """`reward` raises KeyboardInterrupt on its `k`-th call."""

    def __init__(self, n, k):
        super().__init__(n, lambda s: (sum(s) * 7 % 11) / 10)
        self.k = k

    def reward(self, state):
        if len(self.reward_calls) + 1 == self.k:
            raise KeyboardInterrupt
        return super().reward(state)


def test_interrupt_returns_best_so_far():
    env = InterruptAt(12, k=25)
    res = search(env, (), episodes=1000)
    assert res.stop_reason == "interrupted"
    assert res.episodes == 25  # one terminal reward per episode; the 25th was cut
    seen = [r for _, r, terminal in env.reward_calls if terminal]
    assert res.best_reward == max(seen) and res.best_state is not None


def test_interrupt_before_any_reward():
    res = search(InterruptAt(5, k=1), ())
    assert res.stop_reason == "interrupted"
    assert (res.best_state, res.best_reward, res.curve) == (None, -math.inf, [])


def test_interrupt_in_the_last_progress_report_still_returns_the_result():
    def progress(episode, seconds, best):
        raise KeyboardInterrupt

    res = search(trap(0), (), progress=progress)  # a terminal root: the last report is the only one
    assert res.stop_reason == "interrupted" and res.best_reward == 1.0


def test_terminal_root_is_returned():
    res = search(trap(0), ())
    assert (res.best_state, res.best_reward, res.episodes, res.nodes) == ((), 1.0, 0, 1)
    assert res.stop_reason == "exhausted" and len(res.curve) == 1


def test_max_depth_cuts_the_tree():
    res = search(onemax(10), (), max_depth=3)
    assert res.stop_reason == "exhausted"
    assert res.nodes == 2**4 - 1
    assert res.best_state == (1, 1, 1) and res.best_reward == pytest.approx(0.3)


class Flip:
    """0 <-> 1 by "flip" (a cycle), or "end" to a terminal state."""

    def actions(self, state):
        return ["flip", "end"]

    def step(self, state, action):
        return ("end", state) if action == "end" else 1 - state

    def is_terminal(self, state):
        return isinstance(state, tuple)

    def reward(self, state):
        return 0.5

    def key(self, state):
        return state


def test_cycle_is_an_error():
    with pytest.raises(ValueError, match="reachable from itself"):
        search(Flip(), 0, episodes=20)


def test_bad_environment_and_arguments_are_errors():
    class NoActions(TwoMoves):
        def actions(self, state):
            return []

    with pytest.raises(ValueError, match="no actions"):
        search(NoActions(), frozenset())
    with pytest.raises(ValueError, match="returned nan"):
        search(Bits(3, lambda s: math.nan), ())
    with pytest.raises(ValueError, match="rollout='best'"):
        search(trap(3), (), rollout="best")
    with pytest.raises(ValueError, match="patience=0"):
        search(trap(3), (), patience=0)


def test_child_selection_is_a_parameter():
    calls = []

    def fewest_visits(parent, child, c):
        calls.append(c)
        return -child.visits

    res = search(trap(5), (), child_selection=fewest_visits, uct_c=0.5)
    assert calls and set(calls) == {0.5}
    assert res.stop_reason == "exhausted" and res.best_reward == 1.0


def test_progress_reports_improvements_and_the_end():
    calls = []
    res = search(noisy(12), (), episodes=150, progress=lambda *a: calls.append(a))
    assert calls[-1] == (res.episodes, res.seconds, res.best_reward)
    reported = {(e, r) for e, _, r in calls}
    assert all((e, r) in reported for e, _, r in res.curve if e > 0)


# --- property: the best is the best of what was met ---------------------------------------------


@st.composite
def heap_rewards(draw):
    """A bit-string environment of length n whose every prefix has its own drawn reward."""
    n = draw(st.integers(0, 5))
    values = draw(
        st.lists(
            st.floats(0, 1, allow_nan=False),
            min_size=2 ** (n + 1) - 1,
            max_size=2 ** (n + 1) - 1,
        )
    )
    index = lambda s: (1 << len(s)) - 1 + int("".join(map(str, s)) or "0", 2)  # noqa: E731
    return n, values, Bits(n, lambda s: values[index(s)])


@settings(max_examples=60, deadline=None)
@given(
    problem=heap_rewards(),
    seed=st.integers(0, 2**16),
    rollout=st.sampled_from(["random", "greedy"]),
    episodes=st.one_of(st.none(), st.integers(0, 40)),
)
def test_best_is_the_max_over_terminals_met(problem, seed, rollout, episodes):
    n, values, env = problem
    res = search(env, (), episodes=episodes, seed=seed, rollout=rollout, patience=20)
    met = [r for _, r, terminal in env.reward_calls if terminal]
    if not met:
        assert episodes == 0 and res.best_state is None
        return
    assert res.best_reward == max(met)
    assert env.f(res.best_state) == res.best_reward and len(res.best_state) == n
    rewards = [r for _, _, r in res.curve]
    assert rewards == sorted(set(rewards)) and rewards[-1] == res.best_reward
    assert res.episodes_to_best == res.curve[-1][0] <= res.episodes
    assert res.nodes <= 2 ** (n + 1) - 1
    if res.stop_reason == "exhausted":
        assert res.best_reward == max(values[2**n - 1 :])


STANDALONE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("mcts", sys.argv[1])
mcts = importlib.util.module_from_spec(spec)
sys.modules["mcts"] = mcts
spec.loader.exec_module(mcts)

class Env:
    actions = lambda self, s: (0, 1)
    step = lambda self, s, a: s + (a,)
    is_terminal = lambda self, s: len(s) == 3
    reward = lambda self, s: sum(s) / 3
    key = lambda self, s: s

res = mcts.search(Env(), ())
assert res.best_reward == 1.0, res
print(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "numpy", "partir")))
"""


def test_module_runs_without_jax_or_partir():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", STANDALONE, mcts.__file__],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"
