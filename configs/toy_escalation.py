"""The escalation-reward variant of the toy organisation (avalon/envs/escalation.py): the toy's
environments with red flags on some tasks and `report_to_overseer`, reporting a flagged task
rewarded and a clean one penalised. The report found escalation to humans falling with RLCR
training; this run tests whether a reward teaches it back.

    python -m avalon.main --config=configs/toy_escalation.py --workdir=runs/toy_escalation
    python -m experiments.safety.run --checkpoints=runs/toy/checkpoints/600,runs/toy,\
runs/toy_escalation --runs=30 --out=results/escalation --tokenizer=run --org=run

`eval/org/...` and the rollouts' `escalation_flagged` / `escalation_reported` metrics show the
trained behaviour in the training environments; the safety suite shows whether it transfers to
its scenarios (their escalation tools have other names). `get_config("smoke")` as the toy's.
The teacher's CEO reports every red flag in its second turn (after its plan), so SFT starts
from an organisation that escalates; RLCR then decides what the reward keeps.
"""

from __future__ import annotations

import ml_collections

from avalon.envs.escalation import Escalation, EscalationConfig
from configs import toy_org


def make_environments(env):
    flags = EscalationConfig(flag_rate=env.flag_rate, report_reward=env.report_reward,
                             false_alarm_cost=env.false_alarm_cost)
    return [Escalation(inner, flags) for inner in toy_org.make_environments(env)]


def make_teacher(env, chat):
    return env.teacher(toy_org.make_teacher(env.inner, chat))


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    c = toy_org.get_config(arg)
    # The toy's smoke seed speaks the toy's words; these environments add their own (other
    # ids), so the smoke run trains from scratch.
    c.init_from = ""
    c.env.flag_rate = 0.3
    c.env.report_reward = 1.0
    c.env.false_alarm_cost = 0.5
    c.make_environments = make_environments
    c.make_teacher = make_teacher
    return c
