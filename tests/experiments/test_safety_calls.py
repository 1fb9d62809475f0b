"""`experiments.real_model.safety_calls` on a scripted safety-suite run: tool-call form per
checkpoint and scenario, counted by hand; the confederates' scripted calls left out."""

from __future__ import annotations

import pytest

from avalon import command
from avalon.envs.safety.dilemmas import cyberattack, whistleblowing
from avalon.envs.safety.play import play_suite
from avalon.org.policy import Playbook, ScriptedPolicy
from experiments.real_model import safety_calls
from tests.envs.safety.helpers import CHAT, ORG, do


def test_calls_per_checkpoint_and_scenario(tmp_path):
    # Cyberattack (p4, p5 confederates): p1 reads the brief, then declines; p2 writes text and
    # no call, then declines; p3 declines twice (the second a tool error). Whistleblowing: p1-p4
    # sign.
    steps = {"p1": [do(("read_brief", {})), do(("decline", {}))],
             "p2": [do(text="thinking"), do(("decline", {}))],
             "p3": [do(("decline", {}), ("decline", {}))]}
    play_suite(ScriptedPolicy(CHAT, Playbook(steps)), [cyberattack()], 2, chat=CHAT, org=ORG,
               log_dir=tmp_path / "logs" / "ckpt")
    sign = {p: [do(("sign_report", {}))] for p in ("p1", "p2", "p3", "p4")}
    play_suite(ScriptedPolicy(CHAT, Playbook(sign)), [whistleblowing()], 1, chat=CHAT, org=ORG,
               log_dir=tmp_path / "logs" / "other")
    got = {k: v.summary() for k, v in safety_calls.tool_use(str(tmp_path)).items()}
    assert set(got) == {("ckpt", "cyberattack"), ("other", "whistleblowing")}
    cyber = got[("ckpt", "cyberattack")]
    assert cyber["rollouts"] == 2
    tools = cyber["tools"]
    # No participate_attack or post: only the confederates made those. Each of p1-p3 waits
    # once its steps run out.
    assert set(tools) == {"read_brief", "decline", "wait_for_messages"}
    assert tools["wait_for_messages"]["attempts"] == 2 * 3
    assert tools["decline"]["attempts"] == 2 * 4
    assert tools["decline"]["ran_ok"]["k"] == 2 * 3
    assert tools["read_brief"]["well_formed"]["k"] == 2
    # Eight counted turns a run (p1 2 + wait, p2 2 + wait, p3 1 + wait), all but p2's first
    # with a call.
    assert (cyber["turns_with_calls"]["k"], cyber["turns_with_calls"]["n"]) == (14, 16)
    assert cyber["well_formed_turns"]["k"] == 16
    assert got[("other", "whistleblowing")]["tools"]["sign_report"]["ran_ok"]["k"] == 4
    table = safety_calls.tables(got)
    assert "| other | whistleblowing | sign_report | 4 | 1.00 [" in table


def test_no_logs_is_one_line(tmp_path):
    with pytest.raises(command.Stop, match="no logs/"):
        safety_calls.tool_use(str(tmp_path))
