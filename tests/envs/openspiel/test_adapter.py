"""The OpenSpiel adapter: fixed move sequences give exactly OpenSpiel's returns (sequential,
simultaneous, chance), seats, every bad move a tool error, in-process and over ORS."""

import pyspiel
import pytest

from avalon.envs.base import Split
from avalon.envs.openspiel import OpenSpiel, OpenSpielConfig
from avalon.org import GroupSpec, OrgConfig, PromptStyle, RolloutDriver, RolloutSpec
from avalon.org.config import Permissions
from avalon.org.env import EndReason, ToolError
from avalon.org.peers import PeerTeam
from avalon.org.policy import Playbook, ScriptedPolicy, Step
from tests.envs.helpers import BYTES, MODES, Direct, environment

GAMES = {g: OpenSpiel(OpenSpielConfig(game=g, n_train=8, n_heldout=2, measure_games=()))
         for g in ("kuhn_poker", "tiny_hanabi", "matrix_pd",
                   "repeated_game(stage_game=matrix_pd(),num_repetitions=3)",
                   "coop_box_pushing(horizon=3)")}


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


def replay(game_string: str, record: dict) -> list[float]:
    """OpenSpiel itself, playing the session's chance draws and moves in their order."""
    state = pyspiel.load_game(game_string).new_initial_state()
    chance, moves = list(record["chance"]), list(record["moves"])
    while not state.is_terminal():
        if state.is_chance_node():
            state.apply_action(chance.pop(0))
        elif state.current_player() == pyspiel.PlayerId.SIMULTANEOUS:
            n = state.get_game().num_players()
            joint, moves = moves[:n], moves[n:]
            assert len({m["round"] for m in joint}) == 1
            state.apply_actions([next(m["action"] for m in joint if m["seat"] == p)
                                 for p in range(n)])
        else:
            move = moves.pop(0)
            assert move["seat"] == state.current_player()
            state.apply_action(move["action"])
    assert not chance and not moves
    return list(state.returns())


def seated(env, task_id, seed=0, budget=2):
    """A session driven by hand with the CEO and its hires briefed, as the organisation does."""
    d = Direct(env, task_id, seed, budget=budget)
    d.session.brief("ceo", 0, "CEO", "")
    for k in range(1, budget + 1):
        d.session.brief(f"a{k}", k, "Player", "")
    return d


def play(d, moves):
    """Each (agent, action) in order; the last outcome."""
    out = None
    for agent, action in moves:
        out = d.call("act", agent=agent, action=action)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_sequential_chance_game_returns_are_openspiels(mode, seed):
    with environment(GAMES["kuhn_poker"], mode) as env:
        d = seated(env, env.task_ids(Split.TRAIN)[0], seed)
        view = d.call("observe", agent="a1").text
        assert view.startswith("seat 0 to move: legal 0 Pass, 1 Bet; view ")
        out = play(d, [("a1", 0), ("a2", 1), ("a1", 1)])  # pass, bet, call
        assert out.terminal
        record = d.end().record
        returns = replay("kuhn_poker", record)
        assert [(r.label, r.value) for r in out.rewards] == [
            ("seat0", returns[0]), ("seat1", returns[1])]
        assert abs(returns[0]) == 2 and record["returns"] == returns


def test_chance_deals_follow_the_task_and_session_seed():
    env = GAMES["tiny_hanabi"]
    deals = {}
    for t in env.task_ids(Split.TRAIN)[:4]:
        for seed in range(4):
            d = seated(env, t, seed)
            deals[t, seed] = d.session.chance
            assert seated(env, t, seed).session.chance == deals[t, seed]  # reproducible
    assert len({tuple(v) for v in deals.values()}) == 4  # every deal of 2 x 2 cards


def test_common_payoff_is_one_reward_event(mode):
    with environment(GAMES["tiny_hanabi"], mode) as env:
        for t in env.task_ids(Split.TRAIN)[:4]:
            d = seated(env, t)
            out = play(d, [("a1", 2), ("a2", 0)])
            returns = replay("tiny_hanabi", d.end().record)
            assert returns[0] == returns[1]
            assert [(r.label, r.value) for r in out.rewards] == [("common", returns[0])]
            assert out.text.endswith(f"game over; returns {returns[0]:g} {returns[1]:g}")


@pytest.mark.parametrize("joint", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_simultaneous_game_returns_are_openspiels(mode, joint):
    with environment(GAMES["matrix_pd"], mode) as env:
        d = seated(env, env.task_ids(Split.TRAIN)[0])
        first = d.call("act", agent="a1", action=joint[0])
        assert not first.terminal and first.text.endswith("waiting for seat 1")
        out = d.call("act", agent="a2", action=joint[1])
        reference = pyspiel.load_game("matrix_pd").new_initial_state()
        reference.apply_actions(list(joint))
        assert out.terminal and [r.value for r in out.rewards] == reference.returns()


def test_repeated_simultaneous_game_sums_every_round():
    env = GAMES["repeated_game(stage_game=matrix_pd(),num_repetitions=3)"]
    d = seated(env, env.task_ids(Split.TRAIN)[0])
    out = None
    for a1, a2 in ((0, 0), (0, 1), (1, 1)):  # (C, C), (C, D), (D, D)
        d.call("act", agent="a1", action=a1)
        out = d.call("act", agent="a2", action=a2)
    assert out.terminal and [r.value for r in out.rewards] == [5 + 0 + 1, 5 + 10 + 1]
    assert replay(env.config.game, d.end().record) == [6.0, 16.0]


def test_simultaneous_game_with_chance_after_every_joint_move():
    env = GAMES["coop_box_pushing(horizon=3)"]
    d = seated(env, env.task_ids(Split.TRAIN)[0], seed=3)
    out = None
    for a1, a2 in ((2, 2), (0, 3), (2, 2)):  # forward, forward; left, stay; forward, forward
        d.call("act", agent="a1", action=a1)
        out = d.call("act", agent="a2", action=a2)
    record = d.end().record
    assert out.terminal and len(record["chance"]) > 3  # chance resolved every joint move
    returns = replay(env.config.game, record)
    assert [(r.label, r.value) for r in out.rewards] == [("common", returns[0])]


def test_bad_moves_are_tool_errors(mode):
    with environment(GAMES["kuhn_poker"], mode) as env:
        t = env.task_ids(Split.TRAIN)[0]
        d = Direct(env, t, budget=2)
        d.session.brief("ceo", 0, "CEO", "")
        d.session.brief("a1", 1, "Player", "")
        with pytest.raises(ToolError, match="seat 1 waits for its hire a2"):
            d.call("act", agent="a1", action=0)
        assert "seat 1 waits for its hire a2" in d.call("observe", agent="a1").text
        d.session.brief("a2", 2, "Player", "")
        with pytest.raises(ToolError, match="none of your seats is to move"):
            d.call("act", agent="a2", action=0)
        with pytest.raises(ToolError, match="you do not play seat 0; yours: 1"):
            d.call("act", agent="a2", action=0, seat=0)
        with pytest.raises(ToolError, match="you play no seat"):
            d.call("act", agent="ceo", action=0)
        with pytest.raises(ToolError, match="action 7 is not legal for seat 0; legal 0 Pass, "
                                            "1 Bet"):
            d.call("act", agent="a1", action=7)
        with pytest.raises(ToolError, match="action -1 is not legal"):
            d.call("act", agent="a1", action=-1)
        with pytest.raises(ToolError, match="deal"):  # the server names it its own way
            d.call("deal", agent="a1")
        play(d, [("a1", 1), ("a2", 0)])  # bet, fold: over
        with pytest.raises(ToolError, match="the game is over"):
            d.call("act", agent="a1", action=0)
        assert d.call("observe", agent="a2").text.startswith("game over; returns ")
        assert d.end().metrics["moves"] == 2  # refused moves are not moves


def test_seat_needed_when_several_of_yours_move_together():
    d = seated(GAMES["matrix_pd"], GAMES["matrix_pd"].task_ids(Split.TRAIN)[0], budget=0)
    text = d.call("observe", agent="ceo").text
    assert text.splitlines()[0].startswith("seat 0 to move") and \
        text.splitlines()[1].startswith("seat 1 to move")
    with pytest.raises(ToolError, match="seats 0 1 are to move: give seat"):
        d.call("act", agent="ceo", action=0)
    d.call("act", agent="ceo", action=0, seat=1)
    with pytest.raises(ToolError, match="seat 1 already chose this joint move"):
        d.call("act", agent="ceo", action=1, seat=1)
    out = d.call("act", agent="ceo", action=1)  # only seat 0 is left to move
    assert out.terminal and [r.value for r in out.rewards] == [10.0, 0.0]


@pytest.mark.parametrize("budget,brief,ceo_seats", [
    (0, "Seats: you play seats 0 1.", 2),
    (1, "Seats: hire a1 plays seat 0; you play seat 1.", 1),
    (2, "Seats: hire a1 plays seat 0; hire a2 plays seat 1.", 0),
    (3, "Seats: hire a1 plays seat 0; hire a2 plays seat 1.", 0)])
def test_seats_follow_the_budget(budget, brief, ceo_seats):
    env = GAMES["kuhn_poker"]
    d = Direct(env, env.task_ids(Split.TRAIN)[0], budget=budget)
    assert d.session.brief("ceo", 0, "CEO", "") == brief
    hires = [d.session.brief(f"a{k}", k, "Player", "") for k in range(1, budget + 1)]
    assert hires == ["You play seat 0.", "You play seat 1.", "You play no seat."][:budget]
    assert d.end().metrics["ceo_seats"] == ceo_seats


def test_unfinished_game_scores_the_minimum_utility():
    env = GAMES["kuhn_poker"]
    d = seated(env, env.task_ids(Split.TRAIN)[0])
    d.call("act", agent="a1", action=1)
    out = d.end(EndReason.WALL_CLOCK)
    assert [(r.label, r.value) for r in out.rewards] == [("unfinished", -4.0)]  # -2 each
    assert out.metrics["finished"] == 0 and out.metrics["success"] == 0
    assert out.record["returns"] is None and out.metrics["return/seat0"] == -2


# ----- through the organisation: scripted model outputs, bad ones included -----

ORG = OrgConfig.scaled(4096, prompt_style=PromptStyle.COMPACT, max_turns=10)


def do(*calls):
    return Step("", tuple(calls))


def test_organisation_plays_to_the_end_through_bad_calls():
    env = GAMES["tiny_hanabi"]
    steps = {
        "ceo": [do(("hire", {"title": "P", "role": "seat 0", "tools": ["observe", "act"]}),
                   ("hire", {"title": "P", "role": "seat 1", "tools": ["observe", "act"]}))],
        "a1": [do(("act", {"action": 9})),  # illegal id
               do(("act", {"action": "two"})),  # wrong type: the call is refused
               do(("act", {"action": 1, "seat": 1})),  # not its seat
               do(("act", {"action": 1}))],
        "a2": [do(("observe", {})), do(("observe", {})), do(("observe", {})),
               do(("observe", {})), do(("act", {"action": 1}))],
    }
    result = RolloutDriver(ScriptedPolicy(BYTES, Playbook(steps, default=do(("observe", {})))),
                           BYTES, ORG).run([GroupSpec(0, (RolloutSpec(
                               env.session(env.task_ids(Split.TRAIN)[0], 0), 2, 0),))])
    events = result.logs[0][0].events
    errors = [e["result"] for e in events if e["kind"] == "tool_call" and e["error"]]
    assert any("action 9 is not legal" in r for r in errors)
    assert any("argument 'action' must be integer" in r for r in errors)
    assert any("you do not play seat 1" in r for r in errors)
    end = events[-1]
    assert end["kind"] == "end" and end["reason"] == "env_terminal"
    returns = replay("tiny_hanabi", end["env_record"])
    rollout = result.groups[0].rollouts[0]
    assert [(ev.agent, ev.value) for ev in rollout.rewards] == [("a2", returns[0])]


def test_no_ceo_team_plays_seats_in_brief_order():
    env = GAMES["matrix_pd"]
    steps = {"p1": [do(("act", {"action": 0}))], "p2": [do(("act", {"action": 1}))]}
    result = RolloutDriver(ScriptedPolicy(BYTES, Playbook(steps, default=do(("observe", {})))),
                           BYTES, ORG).run([GroupSpec(0, (RolloutSpec(
                               env.session(env.task_ids(Split.TRAIN)[0], 0), 0, 0,
                               peers=PeerTeam(n=2)),))])
    end = result.logs[0][0].events[-1]
    assert end["env_record"]["seats"] == {"0": "p1", "1": "p2"}
    assert [(ev.agent, ev.value) for ev in result.groups[0].rollouts[0].rewards] in (
        [("p2", 0.0), ("p2", 10.0)], [("p1", 0.0), ("p1", 10.0)])


class Recorder(Playbook):
    """A Playbook that keeps the tools each agent was offered."""

    def __init__(self, steps, **kw):
        super().__init__(steps, **kw)
        self.tools = {}

    def __call__(self, view):
        self.tools[view.key.agent] = set(view.tools)
        return super().__call__(view)


def test_no_talk_leaves_only_hiring_and_the_game():
    env = GAMES["tiny_hanabi"]
    steps = {"ceo": [do(("hire", {"title": "P", "role": "r", "tools": ["observe", "write_file"]})),
                     do(("hire", {"title": "P", "role": "r", "tools": ["observe", "act"]}),
                        ("dm", {"to": "a1", "text": "my card"}))],
             "a1": [do(("post", {"channel": "general", "text": "hi"}))]}
    script = Recorder(steps, default=do(("observe", {})))
    org = OrgConfig.scaled(4096, prompt_style=PromptStyle.COMPACT, max_turns=3,
                           permissions=Permissions(talk=False))
    result = RolloutDriver(ScriptedPolicy(BYTES, script), BYTES, org).run([GroupSpec(0, (
        RolloutSpec(env.session(env.task_ids(Split.TRAIN)[0], 0), 2, 0),))])
    events = result.logs[0][0].events
    errors = [e["result"] for e in events if e["kind"] == "tool_call" and e["error"]]
    assert "cannot grant 'write_file'; grantable: observe, act" in errors
    assert "dm is not one of your tools" in errors and "post is not one of your tools" in errors
    assert script.tools["ceo"] == {"hire", "fire", "roster", "final_message", "observe", "act"}
    assert script.tools["a1"] == {"roster", "observe", "act"}


def test_no_talk_peers_have_no_channel():
    env = GAMES["matrix_pd"]
    script = Recorder({}, default=do(("act", {"action": 0})))
    org = OrgConfig.scaled(4096, prompt_style=PromptStyle.COMPACT, max_turns=3,
                           permissions=Permissions(talk=False))
    RolloutDriver(ScriptedPolicy(BYTES, script), BYTES, org).run([GroupSpec(0, (RolloutSpec(
        env.session(env.task_ids(Split.TRAIN)[0], 0), 0, 0, peers=PeerTeam(n=2)),))])
    assert script.tools["p1"] == script.tools["p2"] == {"roster", "observe", "act"}
