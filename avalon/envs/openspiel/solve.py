"""Reference values and teacher policies of small OpenSpiel games, computed exactly.

- `team_optimum(game)`: the best expected *collective reward* (the common payoff; for a
  general-sum game the sum of returns) over joint deterministic policies of the seats' views,
  by exhaustive search. In a game of one payoff the expected value is multilinear in the
  seats' per-view action probabilities, so a deterministic joint policy attains the optimum:
  for a common-payoff game whose views are information states (perfect recall) this is the
  game's optimum. Tiny Hanabi: 10, the value OpenSpiel's `tiny_hanabi.h` states for the game
  of Foerster et al. 2018 (Bayesian Action Decoder), whose no-co-operation equilibrium scores
  8. Refused (None) when the game has more than `max_policies` joint policies.
- `cfr_policy(game)`: OpenSpiel's CFR (`open_spiel.python.algorithms.cfr`) average policy of a
  small two-seat zero-sum sequential game, its value for seat 0 and exploitability (Kuhn poker:
  the game value is -1/18 for the first seat, Kuhn 1950).
- `pure_equilibria(game)`: the pure Nash equilibria of a one-shot two-seat matrix game, by
  checking every cell's best responses (the Prisoner's Dilemma: only (Defect, Defect)).

A policy is a `TablePolicy`: (seat, view) -> [(action, probability)], the views as
`game.view` writes them, so a teacher that reads a view off an observation finds its row.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pyspiel

from avalon.envs.openspiel.game import SIMULTANEOUS, Kind, kind, legal, view

TablePolicy = dict[tuple[int, str], list[tuple[int, float]]]
MAX_TREE_NODES = 20_000
MAX_POLICIES = 200_000
# CFR's Python solver walks the whole tree every iteration: Kuhn poker (58 histories) takes
# ~2 s for 1000 iterations on one core; Leduc (~9,500) took 78 s for 300, too slow to build a
# teacher at start-up, so it plays uniformly.
MAX_CFR_NODES = 2_000


class TooLarge(Exception):
    """The game tree has more nodes than a search takes (a caller falls back)."""


def collective(game: pyspiel.Game, returns: list[float]) -> float:
    """The collective reward of a finished game's returns (see the environment)."""
    return float(returns[0]) if kind(game) is Kind.COMMON else float(sum(returns))


@dataclasses.dataclass
class _Node:
    """One history of the game tree: chance (`outcomes`), a decision (`movers`: the seats with
    their view indices; `children` keyed by the joint action) or terminal (`value`)."""

    value: float = 0.0
    outcomes: list[tuple[float, _Node]] | None = None
    movers: list[tuple[int, int]] | None = None
    children: dict[tuple[int, ...], _Node] | None = None


class GameTree:
    """The whole tree of a small game with its seats' views indexed (`views[i]` = (seat, view)
    and `actions[i]` its legal actions); TooLarge past `max_nodes`."""

    def __init__(self, game: pyspiel.Game, max_nodes: int = MAX_TREE_NODES):
        self.game, self.max_nodes = game, max_nodes
        self.views: list[tuple[int, str]] = []
        self.actions: list[list[int]] = []
        self._index: dict[tuple[int, str], int] = {}
        self.nodes = 0
        self.root = self._build(game.new_initial_state())

    def _view_index(self, state: pyspiel.State, seat: int) -> int:
        key = (seat, view(state, seat))
        acts = legal(state, seat)
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.views)
            self.views.append(key)
            self.actions.append(acts)
        elif self.actions[i] != acts:
            raise TooLarge(f"view {key} has different legal actions in two histories")
        return i

    def _build(self, state: pyspiel.State) -> _Node:
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise TooLarge(f"more than {self.max_nodes} histories")
        if state.is_terminal():
            return _Node(value=collective(self.game, state.returns()))
        if state.is_chance_node():
            return _Node(outcomes=[(p, self._build(state.child(a)))
                                   for a, p in state.chance_outcomes()])
        if state.current_player() == SIMULTANEOUS:
            seats = [p for p in range(self.game.num_players()) if legal(state, p)]
        else:
            seats = [state.current_player()]
        movers = [(p, self._view_index(state, p)) for p in seats]
        children = {}
        for joint in itertools.product(*(self.actions[i] for _, i in movers)):
            child = state.clone()
            if state.current_player() == SIMULTANEOUS:
                full = [0] * self.game.num_players()
                for (p, _), a in zip(movers, joint):
                    full[p] = a
                child.apply_actions(full)
            else:
                child.apply_action(joint[0])
            children[joint] = self._build(child)
        return _Node(movers=movers, children=children)

    def value(self, choice: tuple[int, ...] | list[int]) -> float:
        """Expected collective reward of the joint pure policy `choice[i]` at view i."""
        def walk(node: _Node) -> float:
            if node.outcomes is not None:
                return sum(p * walk(c) for p, c in node.outcomes)
            if node.children is None:
                return node.value
            return walk(node.children[tuple(choice[i] for _, i in node.movers)])
        return walk(self.root)

    def policy_value(self, policy: TablePolicy) -> float:
        """Expected collective reward of a (mixed) table policy; a view it lacks plays
        uniformly."""
        def probs(i: int) -> list[tuple[int, float]]:
            row = policy.get(self.views[i])
            acts = self.actions[i]
            return row if row else [(a, 1 / len(acts)) for a in acts]

        def walk(node: _Node) -> float:
            if node.outcomes is not None:
                return sum(p * walk(c) for p, c in node.outcomes)
            if node.children is None:
                return node.value
            total = 0.0
            for combo in itertools.product(*(probs(i) for _, i in node.movers)):
                weight = math.prod(q for _, q in combo)
                if weight:
                    total += weight * walk(node.children[tuple(a for a, _ in combo)])
            return total
        return walk(self.root)


@dataclasses.dataclass(frozen=True)
class TeamOptimum:
    value: float  # expected collective reward of the best joint pure policy
    policy: TablePolicy  # one best joint policy (probability 1 per view)
    joint_policies: int  # how many were searched


def count_policies(tree: GameTree) -> int:
    return math.prod(len(a) for a in tree.actions)


def team_optimum(game: pyspiel.Game, max_policies: int = MAX_POLICIES,
                 max_nodes: int = MAX_TREE_NODES) -> TeamOptimum | None:
    """See the module docstring; None when the tree or the policy space is too large."""
    try:
        tree = GameTree(game, max_nodes)
    except TooLarge:
        return None
    n = count_policies(tree)
    if n > max_policies:
        return None
    best, best_choice = -math.inf, None
    for choice in itertools.product(*tree.actions):
        v = tree.value(choice)
        if v > best + 1e-12:
            best, best_choice = v, choice
    policy = {tree.views[i]: [(a, 1.0)] for i, a in enumerate(best_choice)}
    return TeamOptimum(value=float(best), policy=policy, joint_policies=n)


@dataclasses.dataclass(frozen=True)
class CfrResult:
    policy: TablePolicy
    value: float  # seat 0's expected return when both seats play the average policy
    exploitability: float  # OpenSpiel's NashConv / 2 of the average policy
    iterations: int


def cfr_policy(game: pyspiel.Game, iterations: int = 1000,
               max_nodes: int = MAX_CFR_NODES) -> CfrResult | None:
    """OpenSpiel's CFR on a small two-seat zero-sum sequential game with information states
    (None for any other game, or a tree over `max_nodes`)."""
    t = game.get_type()
    if (kind(game) is not Kind.ZERO_SUM or game.num_players() != 2
            or t.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL
            or not t.provides_information_state_string):
        return None
    try:
        GameTree(game, max_nodes)  # only its size matters here
    except TooLarge:
        return None
    from open_spiel.python.algorithms import cfr, expected_game_score, exploitability

    solver = cfr.CFRSolver(game)
    for _ in range(iterations):
        solver.evaluate_and_update_policy()
    average = solver.average_policy()
    table: TablePolicy = {}

    def walk(state: pyspiel.State) -> None:
        if state.is_terminal():
            return
        if state.is_chance_node():
            for a, _ in state.chance_outcomes():
                walk(state.child(a))
            return
        seat = state.current_player()
        key = (seat, view(state, seat))
        if key not in table:
            table[key] = [(int(a), float(p)) for a, p in
                          average.action_probabilities(state).items()]
        for a in state.legal_actions():
            walk(state.child(a))

    walk(game.new_initial_state())
    value = expected_game_score.policy_value(game.new_initial_state(), [average, average])[0]
    return CfrResult(policy=table, value=float(value),
                     exploitability=float(exploitability.exploitability(game, average)),
                     iterations=iterations)


def pure_equilibria(game: pyspiel.Game) -> list[tuple[tuple[str, str], tuple[float, float]]]:
    """((seat 0's action, seat 1's), (returns)) of every pure Nash equilibrium of a one-shot
    two-seat simultaneous game without chance; [] for any other game."""
    t = game.get_type()
    if not (game.num_players() == 2 and t.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS
            and t.chance_mode == pyspiel.GameType.ChanceMode.DETERMINISTIC
            and game.max_game_length() == 1):
        return []
    start = game.new_initial_state()
    rows, cols = start.legal_actions(0), start.legal_actions(1)
    pay = np.zeros((len(rows), len(cols), 2))
    for i, a0 in enumerate(rows):
        for j, a1 in enumerate(cols):
            s = start.clone()
            s.apply_actions([a0, a1])
            pay[i, j] = s.returns()
    out = []
    for i, a0 in enumerate(rows):
        for j, a1 in enumerate(cols):
            if pay[i, j, 0] >= pay[:, j, 0].max() and pay[i, j, 1] >= pay[i, :, 1].max():
                out.append(((start.action_to_string(0, a0), start.action_to_string(1, a1)),
                            (float(pay[i, j, 0]), float(pay[i, j, 1]))))
    return out


@dataclasses.dataclass(frozen=True)
class TeacherSource:
    """The policy a game's teacher plays and where it comes from (stated in its traces' runs)."""

    policy: TablePolicy  # empty: uniform over the legal actions everywhere
    source: str


def teacher_source(game: pyspiel.Game) -> TeacherSource:
    """The best policy these searches give: the team optimum (common-payoff and general-sum
    games: the collective reward's optimum), else CFR (two-seat zero-sum), else uniform."""
    if kind(game) is not Kind.ZERO_SUM:
        best = team_optimum(game)
        if best is not None:
            return TeacherSource(best.policy, f"team optimum {best.value:g} (exhaustive search "
                                 f"over {best.joint_policies} joint pure policies)")
    else:
        eq = cfr_policy(game)
        if eq is not None:
            return TeacherSource(eq.policy, f"CFR average policy after {eq.iterations} "
                                 f"iterations (seat 0 value {eq.value:.4f}, exploitability "
                                 f"{eq.exploitability:.4f})")
    return TeacherSource({}, "uniform over the legal actions (no search fits this game)")
