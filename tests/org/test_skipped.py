"""Loss only on tokens that had an effect: turns whose calls never ran (sampled after the end,
after a fire, past the wall clock) are flagged SKIPPED and carry no loss and no advantage."""

import dataclasses
import math

import numpy as np

from avalon.org import OrgConfig, PromptStyle
from avalon.rl.build import build_rl_batch
from avalon.rl.config import RLConfig
from avalon.rl.types import RewardEvent, RolloutGroup, TokenFlag
from tests.org.helpers import call, events_of, run_playbook, step
from tests.org.toyenv import PartsEnv

CFG = OrgConfig.scaled(8192, prompt_style=PromptStyle.COMPACT)
HIRE = call("hire", title="S", role="s", tools=["work"])


def _output_spans(rollout, events, agent):
    """(model_call event, flags of its sampled tokens, loss mask there) in call order."""
    calls = events_of(events, "model_call", agent=agent)
    out = []
    for row in (r for r in rollout.rows if r.agent == agent):
        pos = 0
        for c in (c for c in calls if c["segment"] == row.segment):
            pos += c["n_in_new"]
            span = slice(pos, pos + c["n_out"])
            out.append((c, row.flags[span], row.loss_mask[span]))
            pos += c["n_out"]
    return out


def _check(result, events, skipped_kinds):
    rollout = result.groups[0].rollouts[0]
    seen = set()
    for agent in {r.agent for r in rollout.rows}:
        for c, flags, mask in _output_spans(rollout, events, agent):
            assert mask.all()  # sampled: the row's loss mask still says so ...
            if "skipped" in c:
                seen.add(c["skipped"])
                assert (flags == TokenFlag.SKIPPED).all()  # ... the flag takes it off the loss
            else:
                assert not (flags == TokenFlag.SKIPPED).any()
    assert seen == skipped_kinds
    # The RL batch: no loss and no advantage on any skipped token. A second rollout with
    # another reward makes the group's variance non-zero.
    other = dataclasses.replace(rollout, rewards=[RewardEvent("ceo", 7.0, 0)])
    group = RolloutGroup(0, "parts", [rollout, other])
    batch, _ = build_rl_batch([group], RLConfig(), seq_len=8192)
    skipped = sum(int((r.flags == TokenFlag.SKIPPED).sum()) for r in rollout.rows)
    trained = sum(int((r.loss_mask & (r.flags != TokenFlag.SKIPPED))[1:].sum())
                  for r in rollout.rows + other.rows)
    assert skipped > 0 and int(batch.loss_mask.sum()) == trained
    assert np.count_nonzero(batch.advantages[~batch.loss_mask]) == 0


def test_turns_after_a_fire_and_after_the_end_carry_no_loss():
    # Lock-step: a1's turn is applied after the CEO fired it in the same tick, a2's after the
    # CEO ended the episode in the next.
    cfg = dataclasses.replace(CFG, schedule_horizon_s=math.inf)
    steps = {"ceo": [step(HIRE, HIRE), step(call("fire", agent="a1")),
                     step(call("final_message", text="done"))],
             "a1": [step(call("roster"))] * 4, "a2": [step(call("roster"))] * 4}
    result, _, events = run_playbook(PartsEnv(), steps, budget=2, config=cfg)
    _check(result, events, {"fired", "ended"})


def test_clock_fire_and_end_skip_turns_in_flight():
    # On the clock: a1's long turn (600 tokens, 12 s) is in flight when the CEO fires it; a2's
    # when the CEO ends the episode.
    long = "y" * 600
    steps = {"ceo": [step(HIRE, HIRE), step(call("fire", agent="a1"), text="x" * 100),
                     step(call("final_message", text="done"))],
             "a1": [step(call("roster"), text=long)], "a2": [step(call("roster"), text=long)]}
    result, _, events = run_playbook(PartsEnv(), steps, budget=2, config=CFG)
    _check(result, events, {"fired", "ended"})


def test_calls_past_the_wall_clock_carry_no_loss():
    # The second turn's model call ends past the 3 s cap: none of its calls can run.
    steps = {"ceo": [step(call("roster")), step(call("work", part="a"), text="x" * 200)]}
    result, _, events = run_playbook(PartsEnv(wall_clock_s=3.0), steps, budget=0, config=CFG)
    assert not events_of(events, "tool_call", tool="work")
    assert events_of(events, "stop")[0]["reason"] == "wall_clock"
    _check(result, events, {"wall_clock"})
