"""Seeded organisation episodes whose bytes are pinned: `golden_logs.json` holds each episode's
event log, training rows and scheduler record as hashes, recorded from the code before the
organisation became state plus effects, so the new form is held to the old one's bytes.
`tests/org/test_golden_logs.py` replays them.

    python -m tests.org.golden            # prints the digests (what golden_logs.json holds)
    python -m tests.org.golden DIR        # also writes each episode's log to DIR/<name>.jsonl

The episodes:
- `teacher/<env>/<task>/b<budget>`: the toy's SFT teacher (configs/toy_org.py with all three
  environments: parallel subtasks, hidden profile, collective verification) on held-out tasks,
  at the evaluation budget (3) and as a single agent (0), with the toy's organisation settings
  and word tokenizer; `.../lock` the same under the lock-step tick (`schedule_horizon_s=inf`).
- `tools/clock`, `tools/lock`: a scripted episode on the test environment calling all 21
  organisation tools (and bad calls: unknown tools, bad arguments, refusals, false evidence,
  plan mode) with compaction, a fire, a wait and a wake.
- `peers`: the no-CEO mode (four peers on the stag hunt) posting, messaging and reading.
Run-time measured tools (`run_code`) are left out: their durations move the clock.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np

from avalon.envs.base import Split
from avalon.org import GroupSpec, OrgConfig, PromptStyle, RolloutDriver, RolloutSpec
from avalon.org.policy import Playbook, ScriptedPolicy
from avalon.org.workspace import WorkspaceLimits
from avalon.tokenizer import ByteTokenizer, ChatFormat

GOLDEN = Path(__file__).with_name("golden_logs.json")
BYTES = ChatFormat(ByteTokenizer())


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(result) -> dict:
    """{"events", "log", "rows", "scheduled"} of a one-rollout run: event count and hashes."""
    [[log]], [[rollout]], [[scheduled]] = result.logs, [g.rollouts for g in result.groups], \
        result.scheduled
    h = hashlib.sha256()
    for r in rollout.rows:
        for a in (r.tokens, r.loss_mask, r.sampler_logp, r.flags):
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(b"-" if r.routing is None else np.ascontiguousarray(r.routing).tobytes())
        h.update(f"{r.agent}|{r.role}|{r.segment}".encode())
    h.update(repr([(e.agent, e.value, e.seq, e.label) for e in rollout.rewards]).encode())
    sched = repr([(s.seq, s.start_s, s.end_s, s.at_s) for s in scheduled]).encode()
    return {"events": len(log.events), "log": _sha(log.jsonl().encode()),
            "rows": h.hexdigest(), "scheduled": _sha(sched)}


def _run(policy, chat, config, session, budget, seed, peers=None):
    spec = RolloutSpec(session, budget, seed) if peers is None else \
        RolloutSpec(session, budget, seed, peers=peers)
    return RolloutDriver(policy, chat, config).run([GroupSpec(0, (spec,))])


@functools.cache
def _toy():
    """(organisation config, chat, {env name: env}, teacher maker) of the toy, three envs."""
    from avalon.train.config import from_config_dict
    from avalon.train.setup import build_tokenizer
    from configs.toy_org import get_config
    config = get_config()
    config.env.three_environments = True
    cfg = from_config_dict(config, num_devices=1)
    envs = list(cfg.make_environments(config.env))
    chat = ChatFormat(build_tokenizer(cfg, envs))
    return cfg.org, chat, {env.name: env for env in envs}, cfg.make_teacher


TOY_ENVS = ("parallel", "hidden_profile", "verification")  # configs/toy_org.py's order


def _teacher(env_name: str, task: int, budget: int, lock: bool):
    org, chat, envs, make_teacher = _toy()
    env = envs[env_name]
    if lock:
        org = dataclasses.replace(org, schedule_horizon_s=math.inf)
    task_id = env.task_ids(Split.HELDOUT)[task]
    return _run(make_teacher(env, chat), chat, org, env.session(task_id, seed=10 + task),
                budget, 10 + task)


def teacher_episodes():
    """(name, thunk -> run result) of the toy teacher's episodes."""
    out = []
    for env in TOY_ENVS:
        for task, budget, lock in ((0, 3, False), (0, 3, True), (1, 3, False), (2, 0, False)):
            name = f"teacher/{env}/heldout-{task}/b{budget}" + ("/lock" if lock else "")
            out.append((name, functools.partial(_teacher, env, task, budget, lock)))
    return out


def _call(tool, /, **args):
    return tool, args


def _step(*calls, text=""):
    from avalon.org.policy import Step
    return Step(text, tuple(calls))


HIRE = _call("hire", title="Engineer", role="build", tools=["work", "write_file", "read_file",
                                                            "list_files"])


def tools_steps():
    c, s = _call, _step
    return {
        "ceo": [
            s(c("archive_write", key="plan", text="first plan"), c("work", part="a"),
              c("nope")),  # plan mode refuses the work; an unknown tool
            s(c("create_channel", name="plan", topic="the plan"),
              c("subscribe", channel="plan", mode="light"), HIRE, HIRE,
              c("hire", title="bad\ntitle", role="x", tools=[])),
            s(c("post", channel="plan", text="hello @a1 and @a2"), c("dm", to="a2", text="go"),
              c("archive_read", key="plan"), c("archive_list"), c("roster")),
            s(c("read_channel", channel="plan", last=5), c("read_message", message_id="m1"),
              c("react", message_id="m1", emoji="ok"), c("read_trace", agent="a1"),
              c("write_file", path="notes.txt", text="ceo notes")),
            s(c("fire", agent="a2"), c("fire", agent="ceo"), c("read_file", path="out.txt"),
              c("list_files"), c("wait_for_messages")),
            s(c("read_channel", channel="nope"), c("dm", to="zz", text="x"),
              c("read_trace", agent="a1", start=10 ** 6), text="x" * 200),
            s(c("final_message", text="all done")),
        ],
        "a1": [
            s(c("work", part="b"), c("write_file", path="out.txt", text="b solved"),
              c("archive_write", key="b", text="b is done")),
            s(c("post", channel="plan", text="b is solved"),
              c("report_to_ceo", status="b solved", done="b", next="c",
                evidence=["file:out.txt", "archive:b"])),
            s(c("report_to_ceo", status="bad", evidence=["seq:1", "file:none.txt"]),
              c("subscribe", channel="plan", mode="loud"), c("list_files", path="."),
              c("read_file", path="notes.txt")),
            s(c("work", part="c"), c("dm", to="ceo", text="c is done too"), text="y" * 300),
            s(c("wait_for_messages")),
        ],
        "a2": [s(c("work", part="d"), c("roster"), text="z" * 150)] * 3,
    }


def tools_episodes():
    cfg = OrgConfig.scaled(8192, compaction_ratio=0.3, elide_target_ratio=0.25,
                           prompt_style=PromptStyle.COMPACT, plan_mode=True,
                           workspace=WorkspaceLimits(max_file_bytes=4096))
    lock = dataclasses.replace(cfg, schedule_horizon_s=math.inf)
    from tests.org.toyenv import PartsEnv

    def play(org):
        policy = ScriptedPolicy(BYTES, Playbook(tools_steps()))
        return _run(policy, BYTES, org, PartsEnv({"a": 5.0, "b": 20.0, "c": 30.0, "d": 8.0}),
                    2, 3)
    return [("tools/clock", lambda: play(cfg)), ("tools/lock", lambda: play(lock))]


def peers_episodes():
    from avalon.envs.safety import ScenarioEnv
    from avalon.envs.safety.games import stag_hunt
    from avalon.org.peers import PeerTeam
    c, s = _call, _step
    steps = {
        "p1": [s(c("post", channel="public", text="stag please"), c("roster")),
               s(c("read_channel", channel="public"), c("hunt", choice="stag"))],
        "p2": [s(c("dm", to="p1", text="agreed")), s(c("react", message_id="m1", emoji="+1"),
                                                     c("read_trace", agent="p1"))],
        "p3": [s(c("read_message", message_id="m1"), c("hire", title="x", role="y", tools=[]))],
    }
    org = OrgConfig.scaled(8192, max_turns=6)

    def play():
        env = ScenarioEnv(stag_hunt())
        session = env.session(env.task_ids(Split.HELDOUT)[0], seed=5)
        return _run(ScriptedPolicy(BYTES, Playbook(steps)), BYTES, org, session, 0, 5,
                    peers=PeerTeam(4))
    return [("peers", play)]


def episodes():
    return tools_episodes() + peers_episodes() + teacher_episodes()


def main(argv):
    out_dir = Path(argv[1]) if len(argv) > 1 else None
    digests = {}
    for name, play in episodes():
        result = play()
        digests[name] = digest(result)
        if out_dir is not None:
            path = out_dir / (name.replace("/", "__") + ".jsonl")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(result.logs[0][0].jsonl())
    print(json.dumps(digests, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv)
