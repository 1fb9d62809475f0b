"""The social dilemmas as a measurement: co-operation counted from end records, played by
scripted organisations and no-CEO teams, and `experiments.dilemmas.run` on tiny checkpoints."""

import csv

import jax
import pytest

from avalon import model as M
from avalon.checkpoint.avalon_format import save_avalon
from avalon.envs.openspiel.dilemmas import count, stage_name
from avalon.org import OrgConfig, PromptStyle
from avalon.org.policy import Playbook, ScriptedPolicy, Step
from experiments.dilemmas import run
from tests.envs.helpers import BYTES


def move(seat, name, rnd=0):
    return {"seat": seat, "agent": f"a{seat + 1}", "action": 0, "name": name, "round": rnd}


def test_counts_per_decision_and_per_joint_move():
    records = [{"moves": [move(0, "Cooperate"), move(1, "Defect")], "returns": [0.0, 10.0]},
               {"moves": [move(0, "Cooperate"), move(1, "Cooperate")], "returns": [5.0, 5.0]},
               {"moves": [move(0, "Defect")], "returns": None}]  # unfinished
    c = count("matrix_pd", records)
    assert (c.cooperate, c.decisions, c.mutual, c.coordinated, c.joint_moves) == (3, 5, 1, 1, 2)
    assert (c.finished, c.rollouts, c.returns) == (2, 3, (2.5, 7.5))
    lo, hi = c.rates()["cooperation"].interval
    assert lo < 0.6 < hi


def test_bach_or_stravinsky_counts_concession():
    # Seat 0 prefers Bach, seat 1 Stravinsky: co-operating is choosing the other's favourite.
    c = count("matrix_bos", [{"moves": [move(0, "Stravinsky"), move(1, "Stravinsky")],
                              "returns": [2.0, 3.0]},
                             {"moves": [move(0, "Bach"), move(1, "Bach")], "returns": [3.0, 2.0]}])
    assert (c.cooperate, c.decisions, c.coordinated, c.mutual) == (2, 4, 2, 0)


def test_repeated_games_count_every_round_by_the_stage_game():
    game = "repeated_game(stage_game=matrix_sh(),num_repetitions=2)"
    assert stage_name(game) == "matrix_sh"
    c = count(game, [{"moves": [move(0, "Stag", 0), move(1, "Stag", 0), move(0, "Hare", 1),
                                move(1, "Stag", 1)], "returns": [2.0, 2.0]}])
    assert (c.cooperate, c.decisions, c.mutual, c.joint_moves) == (3, 4, 1, 2)
    with pytest.raises(ValueError, match="not one of the social dilemmas"):
        count("tiny_hanabi", [])


def do(*calls):
    return Step("", tuple(calls))


ORG = OrgConfig.scaled(4096, prompt_style=PromptStyle.COMPACT, max_turns=6)
HIRES = do(*[("hire", {"title": "P", "role": f"seat {s}", "tools": ["observe", "act"]})
             for s in (0, 1)])


@pytest.mark.parametrize("team", ["org", "peers"])
def test_scripted_teams_are_counted(team):
    envs = run.environments(["matrix_pd", "matrix_cd"])
    first, second = ("a1", "a2") if team == "org" else ("p1", "p2")
    steps = {"ceo": [HIRES], first: [do(("act", {"action": 0}))],  # Cooperate / Dare
             second: [do(("act", {"action": 1}))]}  # Defect / Chicken
    policy = ScriptedPolicy(BYTES, Playbook(steps, default=do(("observe", {}))))
    records = run.play(policy, BYTES, ORG, envs, 3, team, seed=0)
    rows = run.rows_of("x", "/x", envs, records)
    pd, cd = rows
    assert (pd["cooperation_k"], pd["cooperation_n"], pd["mutual_k"]) == (3, 6, 0)
    assert (cd["cooperation_k"], cd["cooperation_n"], cd["finished_k"]) == (3, 6, 3)
    assert (pd["return_seat0"], pd["return_seat1"]) == (0.0, 10.0)
    assert (cd["return_seat0"], cd["return_seat1"]) == (4.0, 1.0)  # Dare against Chicken


def test_the_table_gives_returns_only_over_finished_games(tmp_path):
    """A game no run finished has no mean return: its cell reads `-`, not `nan nan`."""
    envs = run.environments(["matrix_pd", "matrix_cd"])
    steps = {"ceo": [HIRES], "a1": [do(("act", {"action": 0}))]}  # seat 1 never moves
    policy = ScriptedPolicy(BYTES, Playbook(steps, default=do(("observe", {}))))
    rows = run.rows_of("x", "/x", envs, run.play(policy, BYTES, ORG, envs, 2, "org", seed=0))
    run.write_markdown(tmp_path / "d.md", rows)
    lines = [ln for ln in (tmp_path / "d.md").read_text().splitlines() if ln.startswith("| matrix")]
    assert [ln.rsplit("|", 2)[1].strip() for ln in lines] == ["-", "-"]
    assert "nan" not in (tmp_path / "d.md").read_text()


def test_game_lists_and_bad_arguments(tmp_path):
    assert run.split_games("matrix_pd,repeated_game(stage_game=matrix_sh(),num_repetitions=2)"
                           ) == ["matrix_pd", "repeated_game(stage_game=matrix_sh(),"
                                 "num_repetitions=2)"]
    assert run.split_games("matrix_pd; matrix_sh") == ["matrix_pd", "matrix_sh"]
    with pytest.raises(ValueError, match="'tiny_hanabi' is not a social dilemma"):
        run.main(["--checkpoints=x", "--games=tiny_hanabi", f"--out={tmp_path}"])
    with pytest.raises(ValueError, match="neither an avalon params checkpoint"):
        run.main([f"--checkpoints={tmp_path}", "--games=matrix_pd", f"--out={tmp_path}"])


@pytest.mark.slow
@pytest.mark.ci
def test_smoke_on_a_tiny_checkpoint(tmp_path):
    envs = run.environments(["matrix_pd", "matrix_bos"])
    vocab = run.tokenizer("word", envs, "", False).vocab_size
    cfg = M.presets.get("tiny", vocab_size=64 * (vocab // 64 + 1), max_context=1024)
    save_avalon(tmp_path / "ckpt", cfg, M.init_params(jax.random.key(0), cfg))
    out = tmp_path / "out"
    rows = run.main([f"--checkpoints={tmp_path / 'ckpt'}", "--runs=2",
                     "--games=matrix_pd,matrix_bos", f"--out={out}", "--tokenizer=word",
                     "--org=flags", "--window=1024", "--max_turns=2", "--no_talk"])
    assert [(r["game"], r["runs"]) for r in rows] == [("matrix_pd", 2), ("matrix_bos", 2)]
    with open(out / "dilemmas.csv") as f:
        assert len(list(csv.DictReader(f))) == 2
    assert (out / "dilemmas.md").read_text().count("\n| matrix_") == 2
    assert len(list((out / "logs" / "ckpt").glob("*.jsonl"))) == 4
