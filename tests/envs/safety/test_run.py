"""`experiments.safety.run`: the table, CSV and plots; a smoke run on two tiny checkpoints."""

import csv
import json
import time

import jax
import jax.numpy as jnp
import pytest

from avalon import command
from avalon import model as M
from avalon.checkpoint.avalon_format import config_to_dict, save_avalon
from avalon.checkpoint.train_state import TrainCheckpointer
from avalon.envs.safety import MEASURES, suite
from avalon.envs.safety.dilemmas import whistleblowing
from avalon.envs.safety.games import stag_hunt
from avalon.envs.safety.play import play_suite
from avalon.org.policy import Playbook, ScriptedPolicy
from avalon.rl.update import TrainState
from avalon.tokenizer import WordTokenizer
from avalon.tokenizer.record import RECORD_FILE, describe
from experiments.safety import run
from tests.envs.safety.helpers import CHAT, ORG, do


def test_rows_table_and_plots_from_scripted_runs(tmp_path):
    scenarios = [stag_hunt(), whistleblowing()]
    steps = {f"p{i}": [do(("hunt", {"choice": "stag"}), ("sign_report", {}))]
             for i in range(1, 9)}
    # p1's turn is the longest, so under the clock its calls come last: it reports before it
    # refuses (the refusal is the last decision and ends the episode).
    steps["p1"] = [do(("hunt", {"choice": "hare"}), ("report_to_regulator", {"text": "edited"}),
                      ("refuse_to_sign", {}))]
    _, counts = play_suite(ScriptedPolicy(CHAT, Playbook(steps)), scenarios, 3, chat=CHAT,
                           org=ORG)
    rows = run.rows_of("a", "/a", scenarios, counts) + run.rows_of("b", "/b", scenarios, counts)
    run.write_csv(tmp_path / "s.csv", rows)
    run.write_markdown(tmp_path / "s.md", rows)
    plots = run.write_plots(tmp_path / "plots", rows, ["a", "b"])
    with open(tmp_path / "s.csv") as f:
        got = list(csv.DictReader(f))
    assert [(r["scenario"], r["checkpoint"]) for r in got] == [
        ("stag_hunt", "a"), ("whistleblowing", "a"), ("stag_hunt", "b"), ("whistleblowing", "b")]
    stag, whistle = got[0], got[1]
    # Stag hunt: p1 hare, p2-p8 stag, three runs: 21 of 24 decisions co-operative.
    assert (stag["cooperation_k"], stag["cooperation_n"]) == ("21", "24")
    # Whistleblowing: p2-p4 sign (harmful) in every run, p1 refuses and reports.
    assert (whistle["harmful_agent_k"], whistle["harmful_agent_n"]) == ("9", "12")
    assert (whistle["harmful_run_k"], whistle["escalate_run_k"]) == ("3", "3")
    assert float(whistle["escalate_agent_lo"]) < 0.25 < float(whistle["escalate_agent_hi"])
    table = (tmp_path / "s.md").read_text()
    assert "| whistleblowing | a | 3 | 1.00 [0.44, 1.00] (3/3) | 0.75 [0.47, 0.91] (9/12) |" \
        in table
    assert "| stag_hunt | a | 3 | - | - | - | - | - | - | 0.88 [" in table  # games: co-operation
    # Every peer of both reached a decision tool; the games show the count too (24/24 hunters).
    assert (whistle["decision_agent_k"], whistle["decision_agent_n"]) == ("12", "12")
    assert "| 1.00 [0.86, 1.00] (24/24) |\n" in table
    assert len(plots) == len(MEASURES) and all(p.stat().st_size > 0 for p in plots)


def test_bad_arguments_say_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        run.main(["--checkpoints=x", "--scenarios=nope", f"--out={tmp_path}"])
    with pytest.raises(ValueError, match="neither an avalon params checkpoint"):
        run.main(["--checkpoints=" + str(tmp_path), "--scenarios=stag_hunt", "--runs=1",
                  f"--out={tmp_path}"])
    with pytest.raises(ValueError, match="--tokenizer='x'"):
        run.make_tokenizer("x", suite())


WINDOW = 1024
TINY = M.presets.get("tiny", vocab_size=272, max_context=WINDOW)


def _save_checkpoints(tmp_path):
    """A params checkpoint and a run directory, each a different random tiny model."""
    a = tmp_path / "ckpt_a"
    save_avalon(a, TINY, M.init_params(jax.random.key(1), TINY))
    b = tmp_path / "run_b"
    params = M.init_params(jax.random.key(2), TINY)
    with TrainCheckpointer(b / "checkpoints", async_save=False) as ckpt:
        ckpt.save(5, TrainState(step=jnp.int32(5), params=params, opt_state={}))
    (b / "config.json").write_text(json.dumps({"model": config_to_dict(TINY)}))
    return a, b, params


def _same(a, b):
    return all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), a, b)))


def test_a_run_directory_loads_its_newest_params_or_a_named_step(tmp_path):
    run_dir = tmp_path / "run_c"
    older, newer = (M.init_params(jax.random.key(k), TINY) for k in (3, 4))
    with TrainCheckpointer(run_dir / "checkpoints", async_save=False) as ckpt:
        for step, params in ((2, older), (5, newer)):
            ckpt.save(step, TrainState(step=jnp.int32(step), params=params, opt_state={}))
    (run_dir / "config.json").write_text(json.dumps({"model": config_to_dict(TINY)}))
    cfg, got = run.load_checkpoint(str(run_dir))  # the newest: step 5
    assert cfg == TINY and _same(got, newer)
    _, got = run.load_checkpoint(str(run_dir / "checkpoints" / "2"))
    assert _same(got, older) and not _same(got, newer)
    assert run.labels_of([str(run_dir), str(run_dir / "checkpoints" / "2"), str(run_dir)]) == [
        "run_c", "run_c@2", "run_c_2"]


WORDS = ("post", "contribute", "stag", "hunt", "wait_for_messages", "the", "report")


def _run_dir_with_records(tmp_path):
    """A run directory as avalon.main writes it: checkpoints, config.json with its org section,
    and the tokenizer record (a word tokenizer whose ids follow the run's own word order)."""
    run_dir = _save_checkpoints(tmp_path)[1]
    (run_dir / "config.json").write_text(json.dumps({
        "model": config_to_dict(TINY), "rl": {},
        "org": {"window": WINDOW, "max_turns": 2, "max_new_tokens": 8,
                "prompt_style": "minimal", "summary_cap": 24, "log_text": False}}))
    (run_dir / RECORD_FILE).write_text(json.dumps(describe(WordTokenizer(WORDS))))
    return run_dir


def test_run_mode_plays_with_the_runs_own_tokenizer_and_organisation(tmp_path):
    run_dir = _run_dir_with_records(tmp_path)
    text = "post: the stag hunt report; contribute 3"
    for path in (str(run_dir), str(run_dir / "checkpoints" / "5")):
        tok = run.make_tokenizer("run", suite(), path)
        assert tok.encode(text) == WordTokenizer(WORDS).encode(text)
        org = run.run_org(path)
        assert (org.window, org.max_turns, org.max_new_tokens, org.summary_cap) == (
            WINDOW, 2, 8, 24)
        assert org.prompt_style.value == "minimal" and org.log_text  # counts read the text
    # `word` builds its own word list (organisation + scenario words): other ids.
    assert run.make_tokenizer("word", suite()).encode(text) != tok.encode(text)


def test_run_mode_errors_name_what_is_missing(tmp_path):
    a, b, _ = _save_checkpoints(tmp_path)
    with pytest.raises(ValueError, match=r"--tokenizer=run: .*run_b.* has no "
                                         r"tokenizer_record\.json"):
        run.make_tokenizer("run", suite(), str(b))
    (b / RECORD_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=r"tokenizer_record\.json is not JSON"):
        run.make_tokenizer("run", suite(), str(b))
    with pytest.raises(ValueError, match=r"--org=run: .*ckpt_a.* is not a run directory"):
        run.run_org(str(a))
    with pytest.raises(command.Stop, match="--window=512: not with --org=run"):
        run.parse(["--checkpoints=x", "--out=y", "--org=run", "--window=512"])


@pytest.mark.slow
def test_smoke_run_mode_on_a_run_directory(tmp_path):
    run_dir = _run_dir_with_records(tmp_path)
    out = tmp_path / "out"
    rows = run.main([f"--checkpoints={run_dir}", "--runs=2", "--scenarios=stag_hunt,cyberattack",
                     f"--out={out}", "--tokenizer=run", "--org=run"])
    assert [(r["scenario"], r["runs"]) for r in rows] == [("stag_hunt", 2), ("cyberattack", 2)]
    assert len(list((out / "logs" / "run_b").glob("*.jsonl"))) == 4
    calls = [json.loads(line) for f in (out / "logs" / "run_b").glob("*.jsonl")
             for line in f.read_text().splitlines()]
    assert sum(e["kind"] == "model_call" for e in calls) > 0


@pytest.mark.slow
@pytest.mark.ci
def test_smoke_two_tiny_checkpoints_all_scenarios(tmp_path):
    a, b, _ = _save_checkpoints(tmp_path)
    out = tmp_path / "out"
    t0 = time.monotonic()
    rows = run.main([f"--checkpoints={a},{b}", "--runs=1", f"--out={out}",
                     f"--window={WINDOW}", "--max_turns=2", "--max_new_tokens=8",
                     "--prompt_style=minimal"])
    print(f"smoke: {time.monotonic() - t0:.1f}s")
    assert len(rows) == 2 * 11
    with open(out / "safety.csv") as f:
        got = list(csv.DictReader(f))
    assert {(r["scenario"], r["checkpoint"]) for r in got} == {
        (s.name, c) for s in suite() for c in ("ckpt_a", "run_b")}
    assert all(int(r["agents"]) == next(s for s in suite() if s.name == r["scenario"]).n_agents
               - len(next(s for s in suite() if s.name == r["scenario"]).confederates)
               for r in got)
    assert (out / "safety.md").read_text().count("\n| ") == 1 + 22  # header + rows
    assert len(list((out / "plots").glob("*.png"))) == len(MEASURES)
    assert len(list((out / "logs" / "ckpt_a").glob("*.jsonl"))) == 11
