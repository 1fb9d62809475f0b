"""The baseline arms (avalon/train/baselines.py) through the real driver with a scripted
policy: S8 matches each logged organisation rollout's output tokens and is refused until then,
best-of-k plays k singles per task, the clock sweep replays both arms' seeds under other clocks,
and every rollout lands in the run's logs for the report."""

import os

import pytest

from avalon.analysis.logs import IndexEntry, read_run, rollout_file, step_dir, write_index
from avalon.envs.base import Split
from avalon.org import GroupSpec, OrgConfig, RolloutDriver, RolloutSpec
from avalon.org.policy import Playbook, ScriptedPolicy
from avalon.train.baselines import run_baselines
from avalon.train.config import EvalConfig
from avalon.train.eval_seeds import EVAL_SEED
from tests.org.helpers import CHAT, call, step
from tests.org.toyenv import PartsEnv

STEPS = {"ceo": [step(call("hire", title="Engineer", role="b", tools=["work"]), text="plan"),
                 step(call("work", part="a"), text="working on it " * 3),
                 step(call("final_message", text="done"))],
         "a1": [step(call("work", part="b"), call("wait_for_messages"))]}
ORG = OrgConfig.scaled(8192)


class PartsEnvironment:
    name = "parts"
    uses_workspace = False

    def task_ids(self, split):
        return ("t0", "t1") if split is Split.HELDOUT else ("x",)

    def task(self, task_id):
        return PartsEnv(task_id=task_id, wall_clock_s=100.0).task  # its own clock: 100 s

    def session(self, task_id, seed, clock_s=None):
        return PartsEnv(task_id=task_id, wall_clock_s=clock_s or 1000.0)


def _policy():
    return ScriptedPolicy(CHAT, Playbook(STEPS))


def test_baseline_arms(tmp_path):
    env = PartsEnvironment()
    cfg = EvalConfig(tasks=2, seeds=1, budget=1, clock_s=100.0, s8=True, best_of_k=2,
                     sweep_clocks=(50.0,))
    log_dir = step_dir(tmp_path, "eval", 3)
    # The evaluation's organisation arm, logged as evaluation.py logs it.
    org = [GroupSpec(g, (RolloutSpec(env.session(t, 0, 100.0), 1, EVAL_SEED + g * 2000),))
           for g, t in enumerate(("t0", "t1"))]
    RolloutDriver(_policy(), CHAT, ORG, log_dir=log_dir).run(org)
    write_index(log_dir, [IndexEntry(rollout_file(g, 0), "eval", 3, 1, "parts", "org",
                                     {"seed_index": 0}) for g in range(2)])
    m = run_baselines(cfg, ORG, [env], CHAT, _policy(), slots=3, log_dir=log_dir, at_step=3,
                      at_rl_step=1, eval_seed=EVAL_SEED, clock_start_s=100.0)
    assert os.path.exists(os.path.join(log_dir, "index-baselines.jsonl"))
    rs = list(read_run(tmp_path))
    arms = [r.arm for r in rs]
    assert arms == ["org"] * 2 + ["s8"] * 2 + ["best_of_k"] * 4 + [
        "org@50s", "single@50s", "org@50s", "single@50s"]
    org_tokens = {r.task_id: sum(e["n_out"] for e in r.events if e["kind"] == "model_call")
                  for r in rs if r.arm == "org"}
    for r in (r for r in rs if r.arm == "s8"):
        assert r.extra["matched_tokens_out"] == org_tokens[r.task_id]
        assert r.budget == 0 and r.clock_s == 200.0  # 100 s x (1 + budget 1)
        assert r.seed == EVAL_SEED + {"t0": 0, "t1": 2000}[r.task_id] + 1000  # the single's
        final = [e for e in r.events if e["kind"] == "tool_call" and e["tool"] == "final_message"]
        assert final[0]["error"] and "keep improving" in final[0]["result"]
    bok = [r for r in rs if r.arm == "best_of_k"]
    assert [(r.task_id, r.extra["k"]) for r in bok] == [("t0", 2)] * 2 + [("t1", 2)] * 2
    assert len({r.seed for r in bok}) == 4
    sweep = [r for r in rs if "@" in r.arm]
    assert [r.seed for r in sweep] == [EVAL_SEED, EVAL_SEED + 1000, EVAL_SEED + 2000,
                                       EVAL_SEED + 3000]  # evaluation.py's seeds
    assert all(r.clock_s == 50.0 for r in sweep)
    assert [r.budget for r in sweep] == [1, 0, 1, 0]
    for name in ("s8", "best_of_k", "org@50s", "single@50s"):
        assert f"eval/{name}_reward" in m
    assert m["eval/best_of_k_reward"] == 1.5  # work a (1.0) + "done" (0.5): hires refused


def test_s8_has_the_organisations_turns_and_is_woken_until_it_matches(tmp_path):
    """With 3 turns per agent, the organisation's two agents write T tokens in 4 turns; S8's
    one agent gets 3 x (1 + budget) = 6 turns, and its waits (the playbook's default once its
    steps run out) wake it with the refusal until it has written T tokens."""
    env = PartsEnvironment()
    org_cfg = OrgConfig.scaled(8192, max_turns=3)
    cfg = EvalConfig(tasks=1, seeds=1, budget=1, clock_s=100.0, s8=True)
    log_dir = step_dir(tmp_path, "eval", 3)
    RolloutDriver(_policy(), CHAT, org_cfg, log_dir=log_dir).run(
        [GroupSpec(0, (RolloutSpec(env.session("t0", 0, 100.0), 1, EVAL_SEED),))])
    write_index(log_dir, [IndexEntry(rollout_file(0, 0), "eval", 3, 1, "parts", "org",
                                     {"seed_index": 0})])
    run_baselines(cfg, org_cfg, [env], CHAT, _policy(), slots=3, log_dir=log_dir, at_step=3,
                  at_rl_step=1, eval_seed=EVAL_SEED, clock_start_s=100.0)
    org, s8 = list(read_run(tmp_path))
    assert (org.arm, s8.arm) == ("org", "s8")
    outs = [e["n_out"] for e in s8.events if e["kind"] == "model_call"]
    target = s8.extra["matched_tokens_out"]
    assert target == sum(e["n_out"] for e in org.events if e["kind"] == "model_call")
    wakes = [e for e in s8.events if e["kind"] == "wake"]
    assert wakes and all(w["reason"] == "keep_improving" for w in wakes)
    assert 3 < len(outs) <= 6  # past one agent's 3 turns, within the organisation's 6
    assert sum(outs) >= target or len(outs) == 6
    assert sum(outs[:-1]) < target  # it did not stop before it had to


def _config(**eval_changes):
    from avalon.train.config import from_config_dict
    from tests.train import micro_config
    c = micro_config.get_config()
    for k, v in eval_changes.items():
        c.eval[k] = v
    return from_config_dict(c, num_devices=1)


def test_baseline_config_fields():
    cfg = _config()
    assert cfg.eval.log_events and not cfg.eval.s8 and cfg.rollout.log_every == 0
    cfg = _config(s8=True, best_of_k=2, sweep_clocks=[60, 120.0])
    assert cfg.eval.sweep_clocks == (60, 120.0)
    with pytest.raises(ValueError, match=r"config\.eval\.s8=True: needs eval\.log_events"):
        _config(s8=True, log_events=False)
    with pytest.raises(ValueError, match=r"config\.eval=.*sweep_clocks"):
        _config(sweep_clocks=[0.0])


def test_toy_baseline_configs():
    from avalon.train.config import from_config_dict
    from configs import toy_baselines
    arms = from_config_dict(toy_baselines.get_config("arms,smoke"), num_devices=1)
    assert arms.eval.s8 and arms.eval.best_of_k == arms.eval.budget + 1 == 4
    assert arms.eval.sweep_clocks == (60.0, 150.0)
    from configs import toy_org
    single = from_config_dict(toy_baselines.get_config("single_rl"), num_devices=1)
    # Matched compute: the single-agent run takes the toy's RLCR steps (and everything else).
    toy = toy_org.get_config()
    assert single.budget.p_single == 1.0 and single.rollout.steps == toy.rollout.steps
    assert single.rollout.groups_per_step == toy.rollout.groups_per_step
    with pytest.raises(ValueError, match="arms or single_rl"):
        toy_baselines.get_config("smoke")
