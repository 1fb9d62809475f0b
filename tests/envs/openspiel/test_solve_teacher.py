"""Reference values of OpenSpiel's small games against the literature, the teacher that plays
them through the organisation, the vocabulary the toy reads them with, and bad game strings."""

import re

import pytest

from avalon.envs.base import Split
from avalon.envs.openspiel import GameTeacherConfig, OpenSpiel, OpenSpielConfig, solve
from avalon.envs.openspiel import game as games
from avalon.org import GroupSpec, OrgConfig, PromptStyle, RolloutDriver, RolloutSpec
from avalon.org.config import Permissions
from tests.envs.helpers import word_chat


def test_tiny_hanabi_optimum_and_the_no_cooperation_equilibrium():
    # OpenSpiel's tiny_hanabi.h: "Optimal score in this game is 10 (perfect cooperation).
    # There is also a no-cooperation equilibrium scoring 8".
    game = games.load("tiny_hanabi")
    best = solve.team_optimum(game)
    assert best.value == 10.0 and best.joint_policies == 3 ** 8  # 2 + 6 views of 3 actions
    tree = solve.GameTree(game)
    assert tree.policy_value(best.policy) == 10.0
    assert tree.policy_value({key: [(1, 1.0)] for key in tree.views}) == 8.0
    assert tree.policy_value({}) == pytest.approx(67 / 18)  # uniform: the mean of the table


def test_team_optimum_of_the_dilemmas_is_the_co_operative_cell():
    for name, value in (("matrix_pd", 10), ("matrix_sh", 4), ("matrix_cd", 6), ("matrix_bos", 5),
                        ("matrix_coordination", 1),
                        ("repeated_game(stage_game=matrix_pd(),num_repetitions=3)", 30)):
        assert solve.team_optimum(games.load(name)).value == value, name


def test_pure_equilibria_of_the_matrix_games():
    def eq(name):
        return solve.pure_equilibria(games.load(name))
    assert eq("matrix_pd") == [(("Defect", "Defect"), (1.0, 1.0))]
    assert eq("matrix_sh") == [(("Stag", "Stag"), (2.0, 2.0)), (("Hare", "Hare"), (1.0, 1.0))]
    assert eq("matrix_bos") == [(("Bach", "Bach"), (3.0, 2.0)),
                                (("Stravinsky", "Stravinsky"), (2.0, 3.0))]
    assert eq("matrix_cd") == [(("Dare", "Chicken"), (4.0, 1.0)), (("Chicken", "Dare"), (1.0, 4.0))]
    assert eq("tiny_hanabi") == []


def test_cfr_on_kuhn_poker_approaches_the_game_value():
    # Kuhn poker's value for the first seat is -1/18 (Kuhn 1950). CFR's average policy after
    # 1000 iterations: exploitability below 0.01, value within it.
    out = solve.cfr_policy(games.load("kuhn_poker"), iterations=1000)
    assert out.exploitability < 0.01
    assert abs(out.value - (-1 / 18)) < 0.01
    assert len(out.policy) == 12  # Kuhn's 12 information states
    assert solve.cfr_policy(games.load("tiny_hanabi")) is None  # not zero-sum


def test_searches_refuse_games_too_large():
    assert solve.team_optimum(games.load("tiny_bridge_2p")) is None
    assert solve.teacher_source(games.load("tiny_bridge_2p")).policy == {}


ORG = OrgConfig.scaled(1024, prompt_style=PromptStyle.MINIMAL, max_new_tokens=64,
                       summary_cap=64, compaction_ratio=0.8, max_turns=12,
                       max_result_tokens=160, max_obs_tokens=320)


def _teacher_run(env, budgets, noise=0.0, talk=True):
    chat = word_chat(env)
    ids = env.task_ids(Split.TRAIN)
    org = OrgConfig(**{**ORG.__dict__, "permissions": Permissions(talk=talk)})
    groups = [GroupSpec(i, (RolloutSpec(env.session(ids[i % len(ids)], i), b, i),))
              for i, b in enumerate(budgets)]
    policy = env.teacher(chat, GameTeacherConfig(noise=noise))
    result = RolloutDriver(policy, chat, org).run(groups)
    assert policy.cut_turns == 0  # every teacher turn fits the toy's 64-token turns
    return chat, result


@pytest.mark.parametrize("talk", [True, False])
def test_teacher_reaches_the_optimum_at_every_budget(talk):
    env = OpenSpiel(OpenSpielConfig(game="tiny_hanabi", n_train=8, n_heldout=2))
    _, result = _teacher_run(env, [0, 1, 2, 3] * 3, talk=talk)
    for g in result.groups:
        assert sum(ev.value for ev in g.rollouts[0].rewards) == 10.0
    seats = [r.metrics["env/ceo_seats"] for g in result.groups for r in g.rollouts]
    assert seats[:4] == [2, 1, 0, 0]


def test_teacher_plays_every_game_kind_to_its_end():
    for game in ("matrix_pd", "kuhn_poker", "repeated_game(stage_game=matrix_sh(),"
                 "num_repetitions=2)"):
        env = OpenSpiel(OpenSpielConfig(game=game, n_train=4, n_heldout=1))
        _, result = _teacher_run(env, [0, 1, 2, 2])
        for g in result.groups:
            assert g.rollouts[0].metrics["env/finished"] == 1.0, game
    pd = OpenSpiel(OpenSpielConfig(game="matrix_pd", n_train=4, n_heldout=1))
    _, result = _teacher_run(pd, [2, 2])
    assert all(sum(ev.value for ev in g.rollouts[0].rewards) == 10.0 for g in result.groups)


@pytest.mark.parametrize("game", ["tiny_hanabi", "kuhn_poker",
                                  "repeated_game(stage_game=matrix_pd(),num_repetitions=5)"])
def test_every_word_the_toy_reads_is_in_the_vocabulary(game):
    env = OpenSpiel(OpenSpielConfig(game=game, n_train=8, n_heldout=2))
    for talk in (True, False):
        chat, result = _teacher_run(env, [0, 1, 2, 2, 1, 0], noise=0.5, talk=talk)
        known = set(chat.tok.words)
        seen = set()
        for logs in result.logs:
            for e in logs[0].events:
                for key in ("text", "result", "brief", "prompt"):
                    if isinstance(e.get(key), str):
                        seen |= set(re.findall(r"[A-Za-z0-9_]{2,}", e[key]))
        assert seen and seen <= known, sorted(seen - known)


def test_bad_game_strings_are_one_line_errors(capfd):
    for bad, msg in (("tiny_hanabx", "OpenSpiel has no game 'tiny_hanabx'"),
                     ("tiny_hanabi(foo=1)", "Unknown parameter 'foo'"),
                     ("tiny_hanabi(num_players=x)", "Wrong type for parameter num_players"),
                     ("repeated_game(stage_game=matrix_pd()", "Missing closing bracket"),
                     ("", "must be an OpenSpiel game string"),
                     ("mfg_crowd_modelling", "are not played by seats")):
        with pytest.raises(ValueError, match=re.escape(msg)) as e:
            OpenSpiel(OpenSpielConfig(game=bad or " "))
        assert "\n" not in str(e.value)
    assert capfd.readouterr().err == ""  # OpenSpiel's own echo of its errors is silenced
    with pytest.raises(ValueError, match="OpenSpielConfig.wait_s=0"):
        OpenSpielConfig(wait_s=0)


def test_parameters_in_the_game_string_reach_the_game():
    env = OpenSpiel(OpenSpielConfig(game="tiny_hanabi(num_chance=3,num_actions=2,payoff="
                                    + ";".join(["1"] * 36) + ")", n_train=2, n_heldout=1))
    assert env.game.get_parameters()["num_chance"] == 3
    assert env.optimum(env.task_ids(Split.HELDOUT)[0], 300.0, 2) == 1.0
