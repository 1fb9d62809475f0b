"""The task content of the toy's three co-ordination environments, pinned as hashes:
`tier_content.json` holds, per environment and split, a hash of every task's id, prompt, tools,
default clock, spec (briefs, hidden operands, defect rates included) and the rewards a fixed
sequence of calls earns on it, recorded from the code before environments had difficulty
tiers. `tests/envs/test_tiers.py` recomputes them: an environment with one tier (the default),
and the top tier of one with several, must keep today's tasks (ids, content, rewards).

    python -m tests.envs.tier_content        # prints the hashes (what tier_content.json holds)

The environments: configs/toy_org.py's three (its `env` section with all three), and each
environment's default config.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import tempfile
from pathlib import Path

from avalon.envs.base import Split
from avalon.envs.hidden_profile import HiddenProfile
from avalon.envs.parallel import ParallelSubtasks
from avalon.envs.verification import Verification
from avalon.org.env import CallContext, EndContext, EndReason
from avalon.org.workspace import Workspace

PINNED = Path(__file__).with_name("tier_content.json")


def toy_environments(tiers: dict | None = None) -> list:
    """configs/toy_org.py's three environments (with `tiers`: its env section updated by it)."""
    from configs import toy_org
    env = toy_org.get_config().env
    env.three_environments = True
    if tiers:
        env.update(tiers)
    return list(toy_org.make_environments(env))


def default_environments() -> list:
    return [ParallelSubtasks(), HiddenProfile(), Verification()]


class Direct:
    """One session driven by hand, as the organisation would (start, calls, end), in a
    workspace shared by every session (these environments never read it)."""

    def __init__(self, env, task_id: str, ws: Workspace, seed: int = 0):
        self.ws, self.session = ws, env.session(task_id, seed)
        self.session.on_start(0, ws)

    def call(self, tool: str, agent: str = "ceo", **args):
        ctx = CallContext(agent=agent, title=agent, clock_s=0.0, tokens_out=0, workspace=self.ws)
        return self.session.call(tool, args, ctx)

    def end(self):
        return self.session.on_end(EndContext(EndReason.FINAL_MESSAGE, "done", 0.0, self.ws))


def _rewards_parallel(env, task_id: str, ws: Workspace) -> list:
    """Solve every subtask in order: the first wrong (answer + 1), then right."""
    spec = env.spec(task_id)
    d = Direct(env, task_id, ws)
    out = []
    results = {}
    for s in spec.subtasks:
        parent = results.get(s.a_from)
        for answer in (s.answer_with(parent) + 1, s.answer_with(parent)):
            try:
                got = d.call("solve", id=s.id, answer=answer)
            except Exception as e:  # noqa: BLE001 - a tool error is part of the pinned record
                out.append(("error", str(e)))
                continue
            out.append((got.text, [(r.value, r.label) for r in got.rewards], got.duration_s))
        results[s.id] = s.result
    d.end()
    return out


def _rewards_profile(env, task_id: str, ws: Workspace) -> list:
    spec = env.spec(task_id)
    session = env.session(task_id, 0)
    out = [[session.brief(f"a{i}", i, "Analyst", "x") for i in range(4)]]
    for option in spec.options:
        d = Direct(env, task_id, ws)
        got = d.call("choose", option=option)
        out.append((got.text, [(r.value, r.label) for r in got.rewards]))
        d.end()
    return out


def _rewards_verification(env, task_id: str, ws: Workspace) -> list:
    """Build each item (seed 0), review it by another agent, ship it."""
    d = Direct(env, task_id, ws, seed=0)
    out = []
    for i in range(len(env.spec(task_id).units)):
        item = f"p{i + 1}"
        built = d.call("build", id=item)
        code = built.text.split()[-1]
        review = d.call("review", agent="a1", id=item, result=code)
        shipped = d.call("ship", id=item, result=code)
        out.append((built.text, built.duration_s, review.text,
                    [(r.value, r.label) for r in shipped.rewards]))
    d.end()
    return out


_REWARDS = {"parallel": _rewards_parallel, "hidden_profile": _rewards_profile,
            "verification": _rewards_verification}


def content(env, task_id: str, ws: Workspace) -> str:
    task = env.task(task_id)
    tools = [(t.name, t.grantable) for t in task.tools]
    return repr((task_id, task.prompt, tools, task.wall_clock_s, env.spec(task_id),
                 _REWARDS[env.name](env, task_id, ws)))


def digests(envs) -> dict:
    """{env name: {split: sha256 over every task's `content`, in id order}}."""
    with tempfile.TemporaryDirectory(prefix="avalon-tiers-") as tmp:
        return _digests(envs, Workspace(tmp))


def _digests(envs, ws: Workspace) -> dict:
    out = {}
    for env in envs:
        out[env.name] = {}
        for split in Split:
            h = hashlib.sha256()
            ids = [t for t in env.task_ids(split) if env.tier_of(t) == env.n_tiers - 1] \
                if hasattr(env, "tier_of") else env.task_ids(split)
            for task_id in ids:
                h.update(content(env, task_id, ws).encode())
            out[env.name][split.value] = f"{len(ids)}:{h.hexdigest()}"
    return out


@functools.cache
def all_digests() -> dict:
    return {"toy": digests(toy_environments()), "default": digests(default_environments())}


def main(argv):
    del argv
    print(json.dumps(all_digests(), indent=1, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv)
