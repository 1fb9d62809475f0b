"""Any OpenSpiel game as an environment: each seat (player) an agent of the organisation.

    env = OpenSpiel(OpenSpielConfig(game="tiny_hanabi"))
    env = OpenSpiel(OpenSpielConfig(game="repeated_game(stage_game=matrix_pd(),num_repetitions=5)"))

Seats. A game of N seats is played by agents. With a CEO and hire budget b, the first
m = min(b, N) hires (a1 .. am, in hire order) play seats 0 .. m-1 and the CEO plays the rest:
the CEO's brief says which, each hire's brief names its seat. A budget of 0 is one agent
playing every seat (and seeing every seat's view: a centralised player). Without a CEO (the
no-CEO teams of `avalon/org/peers.py`: roles fixed by the team), the agents play seats 0, 1, ...
in the order they are briefed (p1 seat 0, p2 seat 1, ...). The game starts when every seat has
its agent; until then its tools say which hire is awaited, so nobody sees a private view before
the seats are dealt. A seat whose hire never comes (or is fired) leaves the game unfinished.

Tools (both grantable): `observe()` shows, for each seat the caller plays, whether it is to
move, its legal actions (id and name) and its *view* (`game.py`: the information-state string,
or the observation string where the game has none); `act(action, seat?)` plays one legal action
id for one of the caller's seats (`seat` may be left out when exactly one of them is to move).
An illegal action, a seat that is not the caller's or not to move, a move before the start or
after the end: each a tool error naming what is wrong, never an exception. Moves as OpenSpiel
defines them: chance nodes are drawn by the environment from `chance_outcomes()` with the
session's generator (seeded by the task's deal seed and the session seed, so a group with
common random numbers meets the same deal); at a simultaneous node each seat submits its
action and the joint action is applied when every seat has. `observe` when none of the caller's
seats is to move costs `wait_s` on the derived clock (its next turn comes after the others have
had time to play); a move or a look with a seat to move costs `move_s`.

Rewards. When an `act` ends the game, the returns (`state.returns()`) are reward events on that
call: a common-payoff game (`Utility.IDENTICAL`) gives one event, the common return (label
`common`), so the collective reward is the game's payoff; any other game one event per seat
(label `seat<p>`), so the collective reward is the sum of the returns and each seat's return is
logged (metrics `return/seat<p>`). A zero-sum game's collective reward is therefore 0: such games
are for evaluation. A game not finished when the episode ends scores every seat the game's
minimum utility (one `unfinished` event at the end): stalling never beats playing. `success`
is the collective reward scaled to [0, 1] by the game's utility range.

Tasks. Task i is a deal seed; held-out seeds never equal a training one. A game without chance
has the same content in every task (the held-out split then differs only in sampling). The end
record (`env_record` of the `end` event) holds the seats' agents, every move (seat, agent,
action id and name, the joint-move round) and the returns: what `dilemmas.py` counts.

Talk is the organisation's to allow: `Permissions(talk=False)` (`avalon/org/config.py`) takes
every tool that carries text between agents, so the seats meet only in the game, as OpenSpiel
defines it; with talk, the organisation's channels are cheap talk. With a CEO that plays a seat
beside hires (b < N), a later hire's title could still carry a signal; with b >= N the CEO
plays no seat and sees no private view.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re

import numpy as np
import pyspiel

from avalon.envs.openspiel import game as games
from avalon.envs.openspiel import solve
from avalon.envs.openspiel.teacher import (
    TEACHER_WORDS,
    GameTeacherConfig,
    game_teacher,
)
from avalon.envs.table import TableEnv
from avalon.envs.teacher import Baselines, TeacherPolicy
from avalon.org.env import (
    CallContext,
    EndContext,
    EnvReward,
    FinalOutcome,
    Param,
    ParamType,
    Task,
    ToolError,
    ToolOutcome,
    ToolSpec,
)
from avalon.org.workspace import Workspace
from avalon.tokenizer.chat import ChatFormat
from avalon.validation import FieldChecks

OBSERVE = ToolSpec("observe", "your seats: to move or not, legal actions, what each sees",
                   concurrent=True)
ACT = ToolSpec("act", "play a legal action id for one of your seats", (
    Param("action", ParamType.INTEGER, "a legal action id from observe"),
    Param("seat", ParamType.INTEGER, "your seat (needed when several of yours are to move)",
          required=False)))
# The social dilemmas of the co-operation measurement (`dilemmas.py`): their words join every
# OpenSpiel environment's vocabulary, so a word-tokenizer checkpoint can be measured on them.
DILEMMA_GAMES = ("matrix_pd", "matrix_sh", "matrix_bos", "matrix_cd",
                 "repeated_game(stage_game=matrix_pd(),num_repetitions=5)")
_WORD = re.compile(r"[A-Za-z0-9_]{2,}")
# The session's own phrases (observe/act results, briefs, errors), for the vocabulary.
_PHRASES = (
    "Seats hire plays seat you play seats You no the game has not started waits for its hire "
    "game over returns plays waiting for none of your seats is to move are give one of them "
    "you do not yours not it already chose this joint move action legal for the game is over "
    "observe shows each view and legal actions act with an action id plays it")


@dataclasses.dataclass(frozen=True)
class OpenSpielConfig:
    game: str = "tiny_hanabi"  # any string pyspiel.load_game accepts, parameters included
    clock_s: float = 300.0
    move_s: float = 2.0  # declared cost of an act, and of an observe with a seat to move
    wait_s: float = 10.0  # declared cost of an observe with none of the caller's seats to move
    n_train: int = 512
    n_heldout: int = 64
    seed: int = 0
    # The vocabulary: views and action names of the first `vocab_histories` histories (breadth
    # first) and of `vocab_playouts` random playouts, and the words of `measure_games`.
    vocab_histories: int = 5000
    vocab_playouts: int = 64
    measure_games: tuple[str, ...] = DILEMMA_GAMES
    teacher_noise: float = 0.0  # `teacher()`'s default: chance a move is uniform (teacher.py)

    def __post_init__(self):
        check = FieldChecks("OpenSpielConfig")
        for name in ("clock_s", "move_s", "wait_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                check.fail(name, value, "must be a number > 0")
        for name in ("n_train", "n_heldout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                check.fail(name, value, "must be an int >= 1")
        for name in ("vocab_histories", "vocab_playouts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                check.fail(name, value, "must be an int >= 0")
        if not isinstance(self.game, str) or not self.game.strip():
            check.fail("game", self.game, "must be an OpenSpiel game string")
        if isinstance(self.teacher_noise, bool) or not isinstance(
                self.teacher_noise, (int, float)) or not 0 <= self.teacher_noise <= 1:
            check.fail("teacher_noise", self.teacher_noise, "must be in [0, 1]")


def _final_rewards(game: pyspiel.Game, returns: list[float]) -> tuple[EnvReward, ...]:
    if games.kind(game) is games.Kind.COMMON:
        return (EnvReward(float(returns[0]), "common"),)
    return tuple(EnvReward(float(r), f"seat{p}") for p, r in enumerate(returns))


class OpenSpielSession:
    """One game (see the module docstring)."""

    def __init__(self, task_id: str, game: pyspiel.Game, game_string: str, deal: int, seed: int,
                 clock_s: float, config: OpenSpielConfig, prompt: str):
        self.game, self.game_string, self.config = game, game_string, config
        self.n = game.num_players()
        self.state = game.new_initial_state()
        self.rng = np.random.default_rng([deal, seed])
        self.budget = 0
        self.holder: dict[int, str] = {}  # seat -> the agent that plays it
        self.awaited: dict[str, int] = {}  # hire id -> the seat it will play
        self.ceo_briefed = False
        self.submitted: dict[int, int] = {}  # at a simultaneous node: seat -> action
        self.round = 0  # joint moves applied so far (simultaneous nodes)
        self.moves: list[dict] = []
        self.chance: list[int] = []
        self._task = Task(task_id=task_id, prompt=prompt, tools=(OBSERVE, ACT),
                          wall_clock_s=clock_s)
        self._play_chance()

    @property
    def task(self) -> Task:
        return self._task

    # ----- seats -----

    def on_start(self, budget: int, workspace: Workspace) -> None:
        self.budget = budget

    def brief(self, agent: str, index: int, title: str, role: str) -> str:
        if agent == "ceo":
            self.ceo_briefed = True
            m = min(self.budget, self.n)
            self.awaited = {f"a{k + 1}": k for k in range(m)}
            mine = list(range(m, self.n))
            for s in mine:
                self.holder[s] = "ceo"
            parts = [f"hire a{k + 1} plays seat {k}" for k in range(m)]
            if mine:
                parts.append(f"you play seat{'s' if len(mine) > 1 else ''} "
                             + " ".join(map(str, mine)))
            return "Seats: " + "; ".join(parts) + "."
        seat = self.awaited.pop(agent, None)
        if seat is None and not self.ceo_briefed:  # no CEO: seats in brief order
            free = [s for s in range(self.n) if s not in self.holder]
            seat = free[0] if free else None
        if seat is None:
            return "You play no seat."
        self.holder[seat] = agent
        return f"You play seat {seat}."

    @property
    def started(self) -> bool:
        return len(self.holder) == self.n

    def _seats(self, agent: str) -> list[int]:
        return [s for s in range(self.n) if self.holder.get(s) == agent]

    def _to_move(self, seat: int) -> bool:
        if self.state.current_player() == games.SIMULTANEOUS and seat in self.submitted:
            return False
        return bool(games.legal(self.state, seat))

    def _not_started(self) -> str:
        waiting = sorted((s, a) for a, s in self.awaited.items())
        if not waiting:
            return "the game has not started: seats " + " ".join(
                str(s) for s in range(self.n) if s not in self.holder) + " have no player"
        return "the game has not started: " + "; ".join(
            f"seat {s} waits for its hire {a}" for s, a in waiting)

    # ----- the game -----

    def _play_chance(self) -> None:
        while self.state.is_chance_node():
            outcomes = self.state.chance_outcomes()
            p = np.array([q for _, q in outcomes], np.float64)
            a = int(outcomes[int(self.rng.choice(len(outcomes), p=p / p.sum()))][0])
            self.chance.append(a)
            self.state.apply_action(a)

    def _returns_text(self) -> str:
        return "game over; returns " + " ".join(games.number(r) for r in self.state.returns())

    def _view_lines(self, agent: str) -> tuple[list[str], bool]:
        """The caller's seat lines and whether one of its seats is to move."""
        seats = self._seats(agent)
        if not seats:
            movers = [s for s in range(self.n) if self._to_move(s)]
            return [f"you play no seat; seat{'s' if len(movers) > 1 else ''} "
                    + " ".join(map(str, movers)) + " to move"], False
        moving = [self._to_move(s) for s in seats]
        return [games.seat_line(self.state, s, m) for s, m in zip(seats, moving)], any(moving)

    def _observe(self, agent: str) -> ToolOutcome:
        if self.state.is_terminal():
            return ToolOutcome(self._returns_text(), duration_s=self.config.move_s)
        if not self.started:
            return ToolOutcome(self._not_started(), duration_s=self.config.wait_s)
        lines, moving = self._view_lines(agent)
        return ToolOutcome("\n".join(lines),
                           duration_s=self.config.move_s if moving else self.config.wait_s)

    def _seat_for(self, agent: str, args: dict) -> int:
        seats = self._seats(agent)
        if not seats:
            raise ToolError("you play no seat")
        if "seat" in args:
            seat = args["seat"]
            if seat not in seats:
                raise ToolError(f"you do not play seat {seat}; yours: "
                                + " ".join(map(str, seats)))
            if seat in self.submitted:
                raise ToolError(f"seat {seat} already chose this joint move")
            if not self._to_move(seat):
                raise ToolError(f"seat {seat} is not to move")
            return seat
        moving = [s for s in seats if self._to_move(s)]
        if len(moving) == 1:
            return moving[0]
        if not moving:
            raise ToolError("none of your seats is to move")
        raise ToolError("seats " + " ".join(map(str, moving)) + " are to move: give seat")

    def _act(self, agent: str, args: dict) -> ToolOutcome:
        if self.state.is_terminal():
            raise ToolError("the game is over")
        if not self.started:
            raise ToolError(self._not_started())
        seat = self._seat_for(agent, args)
        action = args["action"]
        legal = games.legal(self.state, seat)
        if action not in legal:
            raise ToolError(f"action {action} is not legal for seat {seat}; legal "
                            + games.legal_text(self.state, seat, legal))
        name = games.action_name(self.state, seat, action)
        self.moves.append({"seat": seat, "agent": agent, "action": int(action), "name": name,
                           "round": self.round})
        head = f"seat {seat} plays {name}"
        if self.state.current_player() == games.SIMULTANEOUS:
            self.submitted[seat] = int(action)
            waiting = [s for s in range(self.n)
                       if s not in self.submitted and games.legal(self.state, s)]
            if waiting:
                return ToolOutcome(f"{head}; waiting for seat{'s' if len(waiting) > 1 else ''} "
                                   + " ".join(map(str, waiting)), duration_s=self.config.move_s)
            joint = [self.submitted.get(s, 0) for s in range(self.n)]
            self.submitted = {}
            self.round += 1
            self.state.apply_actions(joint)
        else:
            self.state.apply_action(int(action))
        self._play_chance()
        if self.state.is_terminal():
            return ToolOutcome(f"{head}; {self._returns_text()}",
                               _final_rewards(self.game, self.state.returns()), terminal=True,
                               duration_s=self.config.move_s)
        lines, _ = self._view_lines(agent)
        return ToolOutcome("\n".join([head] + lines), duration_s=self.config.move_s)

    def call(self, tool: str, args: dict, ctx: CallContext) -> ToolOutcome:
        if tool == "observe":
            return self._observe(ctx.agent)
        if tool == "act":
            return self._act(ctx.agent, args)
        raise ToolError(f"unknown tool {tool!r}")

    def on_end(self, ctx: EndContext) -> FinalOutcome:
        finished = self.state.is_terminal()
        returns = [float(r) for r in self.state.returns()] if finished else \
            [float(self.game.min_utility())] * self.n
        value = solve.collective(self.game, returns)
        lo, hi = _collective_range(self.game)
        rewards = () if finished else (EnvReward(value, "unfinished"),)
        metrics = {"finished": float(finished), "moves": float(len(self.moves)),
                   "ceo_seats": float(len(self._seats("ceo"))),
                   "success": float(np.clip((value - lo) / (hi - lo), 0, 1)) if hi > lo else
                   float(finished)}
        metrics.update({f"return/seat{p}": r for p, r in enumerate(returns)})
        return FinalOutcome(rewards=rewards, metrics=metrics, record={
            "game": self.game_string, "seats": {str(s): a for s, a in self.holder.items()},
            "moves": list(self.moves), "chance": list(self.chance),
            "returns": returns if finished else None})


def _collective_range(game: pyspiel.Game) -> tuple[float, float]:
    lo, hi = float(game.min_utility()), float(game.max_utility())
    if games.kind(game) is games.Kind.COMMON:
        return lo, hi
    return lo * game.num_players(), hi * game.num_players()


@functools.lru_cache(maxsize=16)
def _teacher_source(game_string: str) -> solve.TeacherSource:
    return solve.teacher_source(games.load(game_string))


@functools.lru_cache(maxsize=16)
def _team_optimum(game_string: str) -> solve.TeamOptimum | None:
    return solve.team_optimum(games.load(game_string))


def _deal(rng: np.random.Generator, config: OpenSpielConfig) -> int:
    """A task: the seed of its deal (every task plays the config's game)."""
    return int(rng.integers(2 ** 31))


def _deal_signature(deal: int) -> int:
    """A task's content signature: its deal seed (held-out seeds differ from training ones)."""
    return deal


class OpenSpiel(TableEnv[OpenSpielConfig, int, OpenSpielSession]):
    """An OpenSpiel game as an environment (see the module docstring). Sessions use their seed
    (with the task's deal seed) for chance. Task ids are `openspiel-<split>-<i>` whatever the
    game; the environment's name carries the game's."""

    def __init__(self, config: OpenSpielConfig = OpenSpielConfig()):
        self.game = games.load(config.game)
        for g in config.measure_games:
            games.load(g, "OpenSpielConfig.measure_games")
        self.name = "openspiel_" + self.game.get_type().short_name
        self.prompt = (games.describe(self.game, config.game) + " observe shows each of your "
                       "seats' view and legal actions; act with an action id plays it.")
        super().__init__(config, _deal, _deal_signature, prefix="openspiel")

    def _open(self, task_id: str, spec: int, seed: int, clock_s: float,
              config: OpenSpielConfig) -> OpenSpielSession:
        return OpenSpielSession(task_id, self.game, config.game, spec, seed, clock_s, config,
                                self.prompt)

    def teacher(self, chat: ChatFormat,
                config: GameTeacherConfig | None = None) -> TeacherPolicy:
        """The scripted organisation (`teacher.py`) playing `solve.teacher_source`'s policy
        (by default with `OpenSpielConfig.teacher_noise`)."""
        config = config or GameTeacherConfig(noise=self.config.teacher_noise)
        return game_teacher(chat, _teacher_source(self.config.game).policy, config)

    def baselines(self, chat: ChatFormat) -> Baselines:
        """chance: every seat uniform; single, org_silent and org: the teacher without noise
        (it never talks, so the silent organisation is the teacher itself)."""
        uniform, exact = GameTeacherConfig(noise=1.0), GameTeacherConfig()
        return Baselines(chance=lambda: self.teacher(chat, uniform),
                         single=lambda: self.teacher(chat, exact),
                         org_silent=lambda: self.teacher(chat, exact),
                         org=lambda: self.teacher(chat, exact))

    def optimum(self, task_id: str, clock_s: float, budget: int) -> float | None:
        """The team optimum of the collective reward in expectation over the deal (the same for
        every task), where the search fits; 0 for a zero-sum game."""
        if games.kind(self.game) is games.Kind.ZERO_SUM:
            return 0.0
        best = _team_optimum(self.config.game)
        return None if best is None else best.value

    def vocabulary(self) -> tuple[str, ...]:
        words = _WORD.findall(self.prompt + " " + _PHRASES)
        words += game_words(self.game, self.config)
        for g in self.config.measure_games:
            measured = games.load(g, "OpenSpielConfig.measure_games")
            words += _WORD.findall(games.describe(measured, g))
            words += game_words(measured, self.config)
        words += list(TEACHER_WORDS)
        return tuple(dict.fromkeys(words))


def game_words(game: pyspiel.Game, config: OpenSpielConfig) -> list[str]:
    """The words of a game's views, action names and numbers (see `OpenSpielConfig`)."""
    texts: list[str] = []
    n = game.num_players()

    def note(state: pyspiel.State) -> None:
        if state.is_terminal():
            texts.extend(games.number(r) for r in state.returns())
            return
        if state.is_chance_node():
            return
        for p in range(n):
            texts.append(games.view(state, p))
            texts.extend(games.action_name(state, p, a) for a in games.legal(state, p))

    def children(state: pyspiel.State) -> list[pyspiel.State]:
        if state.is_terminal():
            return []
        if state.is_chance_node():
            return [state.child(a) for a, _ in state.chance_outcomes()]
        if state.current_player() == games.SIMULTANEOUS:
            out = []
            legal = [games.legal(state, p) or [0] for p in range(n)]
            for joint in _first_joints(legal, 64):
                child = state.clone()
                child.apply_actions(list(joint))
                out.append(child)
            return out
        return [state.child(a) for a in state.legal_actions()]

    frontier, seen = [game.new_initial_state()], 0
    while frontier and seen < config.vocab_histories:
        state = frontier.pop(0)
        seen += 1
        note(state)
        frontier.extend(children(state))
    rng = np.random.default_rng([config.seed, 0x0515])
    for _ in range(config.vocab_playouts):
        state = game.new_initial_state()
        for _ in range(10_000):
            note(state)
            nxt = children(state)
            if not nxt:
                break
            state = nxt[int(rng.integers(len(nxt)))]
    bound = max(abs(game.min_utility()), abs(game.max_utility()))
    numbers = [str(i) for i in range(max(n, game.num_distinct_actions(),
                                         int(bound) + 1 if bound <= 200 else 0))]
    return [w for t in texts for w in _WORD.findall(t)] + [w for w in numbers if len(w) >= 2]


def _first_joints(legal: list[list[int]], limit: int) -> list[tuple[int, ...]]:
    """Up to `limit` joint actions of a simultaneous node, in product order."""
    return list(itertools.islice(itertools.product(*legal), limit))
