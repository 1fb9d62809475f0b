"""An OpenSpiel game as the organisation reads it: loading a game string, what a seat sees, text.

    game = load("repeated_game(stage_game=matrix_pd(),num_repetitions=5)")
    kind(game)                  # Kind.GENERAL_SUM
    seat_line(state, 0, True)   # 'seat 0 to move: legal 0 Cooperate, 1 Defect; view ...'

A seat's *view* is its information-state string where the game provides one (the game type's
`provides_information_state_string`), else its observation string; one line (runs of
whitespace become one space), so a view is one line of an observation and a teacher reads it
back exactly. A game that provides neither is refused: the seat would see nothing of its own.
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Iterator

import pyspiel

SIMULTANEOUS = pyspiel.PlayerId.SIMULTANEOUS


class Kind(enum.Enum):
    """How a game's returns make the collective reward (the environment's docstring)."""

    COMMON = "common payoff"  # every seat gets the same return: the collective reward is it
    ZERO_SUM = "zero-sum"  # returns sum to 0 (the collective reward is always 0)
    GENERAL_SUM = "general-sum"  # each seat its own return: the collective reward is the sum


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """OpenSpiel's C++ error handler writes every error to the process's stderr before raising
    it as `SpielError`; the caller reports the error in its own one line instead."""
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def load(game: str, where: str = "OpenSpielConfig.game") -> pyspiel.Game:
    """`pyspiel.load_game(game)` (a name with parameters, e.g. `tiny_hanabi(num_chance=3)`), or a
    one-line ValueError naming `where` and the string."""
    if not isinstance(game, str) or not game.strip():
        raise ValueError(f"{where}={game!r}: must be an OpenSpiel game string such as "
                         "'tiny_hanabi' or 'repeated_game(stage_game=matrix_pd(),"
                         "num_repetitions=5)'")
    name = game.strip().split("(", 1)[0]
    if name not in pyspiel.registered_names():
        raise ValueError(f"{where}={game!r}: OpenSpiel has no game {name!r} "
                         f"(pyspiel.registered_names() lists its "
                         f"{len(pyspiel.registered_names())} games)")
    try:
        with _quiet_stderr():
            loaded = pyspiel.load_game(game.strip())
    except pyspiel.SpielError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "refused"
        raise ValueError(f"{where}={game!r}: {first}") from None
    check_playable(loaded, f"{where}={game!r}")
    return loaded


def check_playable(game: pyspiel.Game, where: str) -> None:
    """Refuse (one line) what the adapter cannot play: mean-field games, and games that show a
    seat neither an information state nor an observation."""
    t = game.get_type()
    if t.dynamics not in (pyspiel.GameType.Dynamics.SEQUENTIAL,
                          pyspiel.GameType.Dynamics.SIMULTANEOUS):
        raise ValueError(f"{where}: {t.dynamics} games are not played by seats")
    if not (t.provides_information_state_string or t.provides_observation_string):
        raise ValueError(f"{where}: the game provides neither an information-state string nor "
                         "an observation string, so a seat would see nothing of its own")


def kind(game: pyspiel.Game) -> Kind:
    utility = game.get_type().utility
    if utility == pyspiel.GameType.Utility.IDENTICAL:
        return Kind.COMMON
    if utility == pyspiel.GameType.Utility.ZERO_SUM:
        return Kind.ZERO_SUM
    return Kind.GENERAL_SUM


def one_line(text: str) -> str:
    return " ".join(text.split())


def view(state: pyspiel.State, seat: int) -> str:
    """What `seat` sees (see the module docstring)."""
    if state.get_game().get_type().provides_information_state_string:
        return one_line(state.information_state_string(seat))
    return one_line(state.observation_string(seat))


def legal(state: pyspiel.State, seat: int) -> list[int]:
    """The actions `seat` may take now ([] when it is not to move)."""
    if state.is_terminal() or state.is_chance_node():
        return []
    if state.current_player() == SIMULTANEOUS:
        return list(state.legal_actions(seat))
    return list(state.legal_actions()) if state.current_player() == seat else []


def action_name(state: pyspiel.State, seat: int, action: int) -> str:
    return one_line(state.action_to_string(seat, action))


def legal_text(state: pyspiel.State, seat: int, actions: list[int]) -> str:
    """`0 Cooperate, 1 Defect`: each legal action's id and name."""
    return ", ".join(f"{a} {action_name(state, seat, a)}" for a in actions)


def seat_line(state: pyspiel.State, seat: int, to_move: bool) -> str:
    """One seat's line of an observation: `seat 1 to move: legal 0 p1a0, ...; view p1:d0 p0:a2`
    or `seat 1 waits; view ...`. The view comes last, so it runs to the end of the line."""
    if to_move:
        head = f"seat {seat} to move: legal {legal_text(state, seat, legal(state, seat))}"
    else:
        head = f"seat {seat} waits"
    return f"{head}; view {view(state, seat)}"


def number(x: float) -> str:
    return f"{x:g}"


def _matrix_game(game: pyspiel.Game) -> pyspiel.Game | None:
    """The one-shot two-seat simultaneous game whose payoffs a prompt can list: the game itself,
    or a repeated game's stage game; None for any other game."""
    if game.get_type().short_name == "repeated_game":
        stage = dict(game.get_parameters()["stage_game"])
        name = stage.pop("name")
        with _quiet_stderr():
            return _matrix_game(pyspiel.load_game(name, stage))
    t = game.get_type()
    if (game.num_players() == 2 and t.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS
            and t.chance_mode == pyspiel.GameType.ChanceMode.DETERMINISTIC
            and game.max_game_length() == 1):
        return game
    return None


def payoff_table(game: pyspiel.Game) -> str:
    """`Cooperate Cooperate 5 5; Cooperate Defect 0 10; ...` (seat 0's action, seat 1's, their
    returns) for a one-shot two-seat simultaneous game or a repeated game of one; "" else."""
    matrix = _matrix_game(game)
    if matrix is None:
        return ""
    start = matrix.new_initial_state()
    cells = []
    for a0 in start.legal_actions(0):
        for a1 in start.legal_actions(1):
            s = start.clone()
            s.apply_actions([a0, a1])
            r = s.returns()
            cells.append(f"{action_name(start, 0, a0)} {action_name(start, 1, a1)} "
                         f"{number(r[0])} {number(r[1])}")
    return "; ".join(cells)


def describe(game: pyspiel.Game, game_string: str) -> str:
    """The game as the task prompt states it: name, seats, how returns score, payoffs."""
    t = game.get_type()
    n = game.num_players()
    lo, hi = number(game.min_utility()), number(game.max_utility())
    k = kind(game)
    if k is Kind.COMMON:
        score = f"common payoff: every seat gets the same return, {lo} to {hi}; the team scores it"
    elif k is Kind.ZERO_SUM:
        score = f"zero-sum: each seat's return is {lo} to {hi} and they sum to 0"
    else:
        score = (f"general-sum: each seat gets its own return, {lo} to {hi}; the team scores "
                 "their sum")
    moves = "seats move together" if t.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS \
        else "seats move in turn"
    text = f"Game {game_string} ({t.long_name}): {n} seats, {moves}; {score}."
    table = payoff_table(game)
    if table:
        rounds = game.get_parameters().get("num_repetitions") \
            if t.short_name == "repeated_game" else None
        text += (f" Payoffs (seat 0 action, seat 1 action, returns): {table}."
                 + (f" Played {rounds} rounds." if rounds else ""))
    return text
