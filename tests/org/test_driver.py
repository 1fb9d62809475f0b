"""The rollout driver: one policy call per tick over many rollouts, determinism, episode ends,
rewards, and the RL core's rollout-group output."""

import numpy as np
import pytest

from avalon.org import GroupSpec, OrgConfig, PromptStyle, RolloutDriver, RolloutSpec
from avalon.org.latency import model_call_seconds, replay
from avalon.org.policy import AgentView, Playbook, ScriptedPolicy, Step
from avalon.rl.types import Objective, RolloutGroup
from tests.org.helpers import CHAT, call, events_of, run_playbook, step
from tests.org.toyenv import PartsEnv

CFG = OrgConfig.scaled(4096, prompt_style=PromptStyle.COMPACT)


class Delegating:
    """A scripted organisation: the CEO hires a solver per part while budget lasts, does the
    rest itself after plan mode, and finishes once every solver has reported."""

    PARTS = ("a", "b", "c")

    def __init__(self):
        self.hired: dict = {}  # CEO key -> solvers hired
        self.reports: dict = {}  # CEO key -> reports received

    def __call__(self, view: AgentView) -> Step:
        if view.key.agent != "ceo":
            part = view.role.rsplit(" ", 1)[1]
            if view.turn == 0:
                return step(call("work", part=part),
                            call("post", channel="results", text=f"part {part} done"),
                            call("report_to_ceo", status=f"solved {part}"))
            return step(call("wait_for_messages"))
        key = view.key
        if view.turn == 0:
            budget = int(view.obs.split("Budget: ")[1].split(" ")[0])
            self.hired[key] = min(budget, len(self.PARTS))
            self.reports[key] = 0
            return step(call("create_channel", name="results"),
                        *[call("hire", title=f"Solver {p}", role=f"solve part {p}",
                               tools=["work"]) for p in self.PARTS[:self.hired[key]]],
                        text="plan")
        self.reports[key] += view.obs.count("report a")
        if view.turn == 1:
            mine = [call("work", part=p) for p in self.PARTS[self.hired[key]:]]
            if self.hired[key] == 0:
                return step(*mine, call("final_message", text="done"))
            return step(*mine, call("wait_for_messages"))
        if self.reports[key] >= self.hired[key]:
            return step(call("final_message", text="done"))
        return step(call("wait_for_messages"))


COSTS = {"a": 20.0, "b": 30.0, "c": 40.0}


def _groups(budgets=(0, 1, 2, 3), k=2):
    return [GroupSpec(g, tuple(RolloutSpec(PartsEnv(COSTS), b, seed=100 * g + i)
                               for i in range(k)))
            for g, b in enumerate(budgets)]


class CountingPolicy:
    def __init__(self, inner):
        self.inner = inner
        self.calls = []

    def act(self, turns):
        self.calls.append(len(turns))
        return self.inner.act(turns)

    def release(self, key):
        self.inner.release(key)

    def prefill_shared(self, keys, prefix):
        self.inner.prefill_shared(keys, prefix)


@pytest.fixture(scope="module")
def run():
    policy = CountingPolicy(ScriptedPolicy(CHAT, Delegating()))
    return RolloutDriver(policy, CHAT, CFG).run(_groups()), policy


def test_one_policy_call_per_tick_across_rollouts(run):
    result, policy = run
    assert len(policy.calls) == len(result.ticks)
    assert policy.calls == [t.turns for t in result.ticks]
    assert max(policy.calls) > 8  # many agents of many rollouts in one call
    assert result.ticks[0].active_rollouts == 8


def test_rollout_group_output(run):
    result, _ = run
    assert [g.group_id for g in result.groups] == [0, 1, 2, 3]
    for g, budget in zip(result.groups, (0, 1, 2, 3)):
        assert isinstance(g, RolloutGroup) and g.task_id == "parts"
        assert g.objective is Objective.SUM and len(g.rollouts) == 2
        for r in g.rollouts:
            assert r.budget == budget and r.hires == budget
            assert {row.agent for row in r.rows} == {"ceo"} | {f"a{i + 1}" for i in range(budget)}
            assert sum(e.value for e in r.rewards) == 3.5  # three parts + the final bonus
            for row in r.rows:
                assert row.tokens.dtype == np.int32 and row.routing is None
                assert row.loss_mask.any() and not row.loss_mask[0]
            part_rewards = [e for e in r.rewards if e.label == "part"]
            assert {e.agent for e in part_rewards} == ({"ceo"} if budget == 0 else
                                                       {f"a{i + 1}" for i in range(budget)} |
                                                       ({"ceo"} if budget < 3 else set()))


def test_latency_buys_parallelism(run):
    result, _ = run
    lat = [g.rollouts[0].metrics["latency_s"] for g in result.groups]
    share = [g.rollouts[0].metrics["critical_token_share"] for g in result.groups]
    # Solvers in parallel beat one agent doing 20 + 30 + 40 s of work (the rest is the token
    # cost of planning and co-ordinating); past two hires the longest part (40 s) dominates.
    assert lat[0] > 90 and lat[0] > lat[1] > max(lat[2], lat[3]) and lat[3] < 50
    assert share[0] == 1.0 and share[3] < 1.0
    # The same numbers by hand from each log: alone, the CEO's clock is every part's work plus
    # every model call's rule-1 time; with hires, the work on the critical path is what the
    # slowest worker did (the CEO keeps b + c with one hire, c with two; solver c with three).
    for g, work in zip(result.groups, (90.0, 70.0, 40.0, 40.0)):
        events = result.logs[g.group_id][0].events
        report = replay(events)
        assert report.task_latency_s == g.rollouts[0].metrics["latency_s"]
        on_path = [events[i] for i in report.critical_path]
        assert sum(e["duration_s"] for e in on_path if e["kind"] == "tool_call") == work
        model_s = sum(model_call_seconds(e["n_in_new"], e["n_out"]) for e in on_path
                      if e["kind"] == "model_call")
        assert report.task_latency_s == pytest.approx(work + model_s, abs=1e-9)
        if work == 90.0:  # one agent: every event is on the path
            assert model_s == pytest.approx(sum(
                model_call_seconds(e["n_in_new"], e["n_out"]) for e in events
                if e["kind"] == "model_call"), abs=1e-9)


def test_same_seed_same_outputs_byte_identical(run):
    result, _ = run
    again = RolloutDriver(ScriptedPolicy(CHAT, Delegating()), CHAT, CFG).run(_groups())
    for logs_a, logs_b in zip(result.logs, again.logs):
        for a, b in zip(logs_a, logs_b):
            assert a.jsonl().encode() == b.jsonl().encode()
    # ... and regardless of how the turns were batched: one rollout at a time.
    alone = RolloutDriver(ScriptedPolicy(CHAT, Delegating()), CHAT, CFG).run(
        [GroupSpec(3, (RolloutSpec(PartsEnv(COSTS), 3, seed=301),))])
    assert alone.logs[0][0].jsonl() == result.logs[3][1].jsonl()


def test_logs_written_and_replayable(tmp_path):
    driver = RolloutDriver(ScriptedPolicy(CHAT, Delegating()), CHAT, CFG, log_dir=tmp_path)
    result = driver.run(_groups(budgets=(2,), k=1))
    from avalon.org.events import read_jsonl
    from avalon.org.latency import replay
    events = read_jsonl(tmp_path / "group0_rollout0.jsonl")
    assert events == list(result.logs[0][0].events)
    assert replay(events).task_latency_s == result.groups[0].rollouts[0].metrics["latency_s"]


def test_wall_clock_cuts_rewards_and_ends():
    # One agent, parts cost 2 + 3 + 4 s, the cap is 4 s: part a pays, b ends past the cap
    # (its reward is dropped), c never runs.
    steps = {"ceo": [step(call("roster")), step(call("work", part="a"), call("work", part="b"),
                                                call("work", part="c"))]}
    env = PartsEnv(wall_clock_s=4.0)
    result, _, events = run_playbook(env, steps, budget=0, config=CFG)
    r = result.groups[0].rollouts[0]
    works = events_of(events, "tool_call", tool="work")
    assert [w["args"]["part"] for w in works] == ["a", "b"]
    assert works[1]["late"] is True and "late" not in works[0]
    assert [(e.label, e.value) for e in r.rewards] == [("part", 1.0), ("final", 0.0)]
    assert events_of(events, "stop", agent="ceo")[0]["reason"] == "wall_clock"
    assert result.reports[0][0].end_reason == "wall_clock"
    assert env.ended.reason.value == "wall_clock"


def test_deadlock_and_max_turns_end_episodes():
    steps = {"ceo": [step(call("hire", title="X", role="r", tools=[])),
                     step(call("wait_for_messages"))],
             "a1": [step(call("wait_for_messages"))]}
    result, _, events = run_playbook(PartsEnv(), steps, budget=1, config=CFG)
    assert result.reports[0][0].end_reason == "deadlock"
    assert events[-1]["kind"] == "end" and events[-1]["reason"] == "deadlock"
    cfg = OrgConfig.scaled(4096, prompt_style=PromptStyle.COMPACT, max_turns=3)
    result, _, events = run_playbook(PartsEnv(), {"ceo": [step(call("roster"))] * 10},
                                     budget=0, config=cfg)
    assert result.reports[0][0].end_reason == "stopped"
    assert events_of(events, "stop")[0]["reason"] == "max_turns"
    assert len(events_of(events, "model_call")) == 3


def test_env_terminal_and_wealth():
    steps = {"ceo": [step(call("read_file", path="README.txt")),
                     step(call("work", part="a"), call("work", part="b")), step(call("roster"))]}
    env = PartsEnv(terminal_after=1, wealth=1.25)
    result, _, events = run_playbook(env, steps, budget=0, config=CFG)
    # on_start laid out the workspace before the first turn and learnt the budget.
    assert events_of(events, "tool_call", tool="read_file")[0]["result"] == "parts: a b c"
    assert env.budget == 0
    assert result.reports[0][0].end_reason == "env_terminal"
    assert [w["args"]["part"] for w in events_of(events, "tool_call", tool="work")] == ["a"]
    g = result.groups[0]
    assert g.objective is Objective.GKPO and g.rollouts[0].wealth_ratio == 1.25
    assert events[-1]["wealth_ratio"] == 1.25 and events[-1]["cause"] == events_of(
        events, "tool_call", tool="work")[0]["seq"]
    assert g.rollouts[0].metrics["env/solved"] == 1.0


def test_fired_agent_is_released_and_its_turn_recorded():
    class Releases(CountingPolicy):
        released: list

        def release(self, key):
            self.released.append(key)

    steps = {"ceo": [step(call("hire", title="X", role="r", tools=[])), step(call("roster")),
                     step(call("fire", agent="a1")), step(call("final_message", text="done"))],
             "a1": [step(call("roster"))] * 5}
    policy = Releases(ScriptedPolicy(CHAT, Playbook(steps)))
    policy.released = []
    result = RolloutDriver(policy, CHAT, CFG).run(
        [GroupSpec(0, (RolloutSpec(PartsEnv(), 1, 0),))])
    events = result.logs[0][0].events
    fire = events_of(events, "fire")[0]
    assert fire["target"] == "a1"
    skipped = events_of(events, "model_call", agent="a1", skipped="fired")
    assert len(skipped) == 1 and skipped[0]["seq"] > fire["seq"]
    assert [k.agent for k in policy.released] == ["a1", "ceo"]
    assert result.groups[0].rollouts[0].metrics["fires"] == 1
    assert result.groups[0].rollouts[0].info["titles"] == ["X"]  # fired, still a hire


def test_bad_specs_are_refused():
    driver = RolloutDriver(ScriptedPolicy(CHAT, Delegating()), CHAT, CFG)
    with pytest.raises(ValueError, match="mixes tasks"):
        driver.run([GroupSpec(0, (RolloutSpec(PartsEnv(task_id="x"), 0, 0),
                                  RolloutSpec(PartsEnv(task_id="y"), 0, 0)))])
    with pytest.raises(ValueError, match="budget must be an int >= 0"):
        driver.run([GroupSpec(0, (RolloutSpec(PartsEnv(), -1, 0),))])
    with pytest.raises(ValueError, match="cannot hold"):
        RolloutDriver(ScriptedPolicy(CHAT, Delegating()), CHAT,
                      OrgConfig.scaled(1024, compaction_ratio=0.9)).run(_groups((0,), 1))


class AliveTracking(CountingPolicy):
    """Records the most agents the policy held at once (seen, not yet released)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.alive, self.most = set(), 0

    def _hold(self, keys):
        self.alive.update(keys)
        self.most = max(self.most, len(self.alive))

    def act(self, turns):
        self._hold(t.key for t in turns)
        return super().act(turns)

    def release(self, key):
        self.alive.discard(key)
        super().release(key)

    def prefill_shared(self, keys, prefix):
        self._hold(keys)
        super().prefill_shared(keys, prefix)


def test_admission_holds_at_most_max_agents_and_changes_no_rollout(run):
    """8 rollouts of up to 4 agents (20 in all) through a policy that may hold 5 at once: the
    rollouts are played in turn as room frees up, and each one's event log is byte-identical
    to the run that admitted all of them at once."""
    result, unlimited = run
    policy = AliveTracking(ScriptedPolicy(CHAT, Delegating()))
    waves = RolloutDriver(policy, CHAT, CFG, max_agents=5).run(_groups())
    assert policy.most <= 5 and max(unlimited.calls) > 5
    assert len(policy.calls) > len(unlimited.calls)
    for logs_a, logs_b in zip(result.logs, waves.logs):
        for a, b in zip(logs_a, logs_b):
            assert a.jsonl() == b.jsonl()
    assert [[r.rewards for r in g.rollouts] for g in waves.groups] == \
        [[r.rewards for r in g.rollouts] for g in result.groups]


def test_admission_refuses_a_rollout_larger_than_max_agents():
    with pytest.raises(ValueError, match="max_agents=3 cannot hold a rollout of budget 3"):
        RolloutDriver(ScriptedPolicy(CHAT, Delegating()), CHAT, CFG, max_agents=3).run(
            _groups())
    with pytest.raises(ValueError, match="max_agents=0"):
        RolloutDriver(ScriptedPolicy(CHAT, Delegating()), CHAT, CFG, max_agents=0)


@pytest.mark.parametrize("continuous", [False, True], ids=["ticks", "continuous"])
def test_refill_plays_the_groups_it_returns_while_others_run(continuous):
    """`refill` sees each group once, when its last rollout ended, with every rollout built;
    the groups it returns are played (admitted as room frees up) and come after the given
    ones; the progress total grows with them."""
    seen, progress = [], []

    def refill(group):
        seen.append((group.group_id, len(group.rollouts)))
        assert all(r.rows for r in group.rollouts)
        if group.group_id in (0, 2):  # replace two of them, once each
            return [GroupSpec(10 + group.group_id, tuple(
                RolloutSpec(PartsEnv(COSTS), 1, seed=900 + group.group_id * 10 + i)
                for i in range(2)))]
        return []

    driver = RolloutDriver(ScriptedPolicy(CHAT, Delegating()), CHAT, CFG, max_agents=6,
                           continuous=continuous,
                           progress=lambda done, total: progress.append((done, total)))
    result = driver.run(_groups(budgets=(0, 1, 2)), refill=refill)
    assert [g.group_id for g in result.groups] == [0, 1, 2, 10, 12]
    assert sorted(seen) == [(0, 2), (1, 2), (2, 2), (10, 2), (12, 2)]
    for g in result.groups[3:]:
        assert [r.budget for r in g.rollouts] == [1, 1]
        assert all(sum(e.value for e in r.rewards) == 3.5 for r in g.rollouts)
    assert progress[-1] == (10, 10)
    # The played groups are the same whether or not they were refills: a refill group's
    # rollouts equal the same specs played directly.
    direct = RolloutDriver(ScriptedPolicy(CHAT, Delegating()), CHAT, CFG).run(
        [GroupSpec(10, tuple(RolloutSpec(PartsEnv(COSTS), 1, seed=900 + i) for i in range(2)))])
    for a, b in zip(result.groups[3].rollouts, direct.groups[0].rollouts):
        assert [r.tokens.tolist() for r in a.rows] == [r.tokens.tolist() for r in b.rows]


def test_refill_groups_are_checked_like_the_given_ones():
    def refill(group):
        return [GroupSpec(9, ())]

    driver = RolloutDriver(ScriptedPolicy(CHAT, Delegating()), CHAT, CFG)
    with pytest.raises(ValueError, match="group 9 has no rollouts"):
        driver.run(_groups(budgets=(0,)), refill=refill)
