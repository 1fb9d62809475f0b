"""The rollout driver: many organisations at once, one policy call per tick, or fed
continuously (each rollout's next turns handed over as soon as its last ones came back).

    driver = RolloutDriver(policy, chat, OrgConfig.scaled(2048), log_dir="runs/logs")
    result = driver.run([GroupSpec(group_id=0, rollouts=(RolloutSpec(session, budget=3,
                                                                     seed=0), ...))])
    result.groups  # list[RolloutGroup] for the RL core, in the order of the specs

Each tick gathers the next turns of every active rollout (rollout order, then agent order: the
agents at the front of each rollout's derived clock, `avalon/org/schedule.py`, or with
`OrgConfig.schedule_horizon_s=inf`, the lock-step tick of `lockstep.py`, every READY agent),
sends them to the policy in ONE `act` call (for the engine policy, one `engine.generate`), and
hands the outputs back in that same order. Parked agents cost nothing. After the run, every
rollout's scheduled clocks are checked against the replay of its event log
(`schedule.verify_schedule`).
An agent that will not act again is released from the policy (its engine slot freed) at the
end of the tick. When every rollout of a group starts with the same CEO system segment, the
policy may prefill it once and share it (`Policy.prefill_shared`).

Continuous feeding (`continuous=True`, the engine's continuous batching): every rollout plays
its own ticks, each batch going to the policy (`StreamingPolicy.submit`) as soon as that
rollout's previous batch came back (`collect`) and was applied; its tools ran and its clock
scheduler picked the next agents, while other rollouts' turns are still being sampled. Within
a rollout the clock scheduler decides as in tick mode, so a rollout's events are the same for
the same outputs; a scripted policy gives byte-identical logs in both modes (`TickStream`).

Admission (`max_agents`, e.g. the engine's slots): when the specs hold more agents than the
policy can keep alive, rollouts are admitted in spec order while the agents they may ever
have (1 + budget each) fit, and each one that ends makes room for the next, admitted at the
start of the following tick. Every rollout's simulated clock is its own, so admission changes
when a rollout is played, never what happens in it. Prefix sharing then covers the rollouts
of a group admitted together.

Every rollout gets its own workspace directory under `workdir` (a fresh temporary directory by
default, removed after the run unless `keep_workspaces`), and, with `log_dir`, its event log
`group{G}_rollout{I}.jsonl`.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from avalon import paths
from avalon.org.config import OrgConfig
from avalon.org.env import EnvSession
from avalon.org.events import EventLog
from avalon.org.lockstep import LockStepOrganisation
from avalon.org.organisation import Organisation
from avalon.org.outcome import OrgReport, build_rollout, org_report
from avalon.org.peers import PeerTeam
from avalon.org.policy import Policy, StreamingPolicy, TickStream
from avalon.org.schedule import Scheduled, verify_schedule
from avalon.org.workspace import Workspace
from avalon.rl.types import Rollout, RolloutGroup
from avalon.tokenizer.chat import ChatFormat


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    session: EnvSession  # a fresh environment session for this rollout
    budget: int  # hire budget b (0 = a single agent)
    seed: int  # sampling seeds of every turn derive from it
    peers: PeerTeam | None = None  # no-CEO mode (`avalon/org/peers.py`); then budget is 0


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    group_id: int  # advantages are normalised within a group
    rollouts: tuple[RolloutSpec, ...]  # K rollouts of one task


@dataclasses.dataclass(frozen=True)
class TickStat:
    active_rollouts: int
    turns: int  # agents that acted this tick (one policy call for all of them)


@dataclasses.dataclass
class RunResult:
    groups: list[RolloutGroup]
    specs: list[GroupSpec]  # the groups played: the given ones, then any `refill` returned
    logs: list[list[EventLog]]  # [group][rollout]
    reports: list[list[OrgReport]]  # [group][rollout]
    ticks: list[TickStat]
    scheduled: list[list[list[Scheduled]]]  # [group][rollout]: the clocks the scheduler used


class RolloutDriver:
    """Runs groups of rollouts against one policy (see the module docstring)."""

    def __init__(self, policy: Policy, chat: ChatFormat, config: OrgConfig, *,
                 workdir: str | os.PathLike | None = None, log_dir: str | os.PathLike | None = None,
                 share_prefix: bool = True, keep_workspaces: bool = False,
                 max_agents: int | None = None, continuous: bool = False,
                 progress: Callable[[int, int], None] | None = None):
        if max_agents is not None and (isinstance(max_agents, bool)
                                       or not isinstance(max_agents, int) or max_agents < 1):
            raise ValueError(f"RolloutDriver: max_agents={max_agents!r} must be a positive int "
                             "or None")
        self.max_agents = max_agents
        self.continuous = continuous
        if continuous and not isinstance(policy, StreamingPolicy):
            policy = TickStream(policy)
        self.policy, self.chat, self.config = policy, chat, config
        self.workdir = None if workdir is None else Path(workdir)
        self.log_dir = None if log_dir is None else paths.path(log_dir)
        self.share_prefix = share_prefix
        self.keep_workspaces = keep_workspaces
        self._next_rollout = 0  # AgentKey.rollout stays unique across runs
        # progress(rollouts finished, rollouts in this run) as rollouts end (a progress bar).
        self.progress = progress
        self._finished = self._total = 0

    def run(self, groups: Sequence[GroupSpec],
            refill: Callable[[RolloutGroup], Sequence[GroupSpec]] | None = None) -> RunResult:
        """Plays every rollout of every group to its end.

        `refill(group)`, if given, is called as each group's last rollout ends, with the
        group as the RL core will see it; the groups it returns are played too, admitted
        like the others while the rest still run (a group without signal replaced by a
        fresh one), and are in the result after the given ones."""
        groups = list(groups)
        self._check_groups(groups)
        root = Path(tempfile.mkdtemp(prefix="avalon-org-", dir=self.workdir))
        try:
            orgs = [[self._organisation(root, g, i, r) for i, r in enumerate(g.rollouts)]
                    for g in groups]
            self._root, self._specs, self._orgs, self._refill = root, groups, orgs, refill
            self._left = [len(g.rollouts) for g in groups]  # rollouts still playing, per group
            self._built: dict[int, Rollout] = {}
            self._group_of = {id(o): gi for gi, group in enumerate(orgs) for o in group}
            loop = self._stream if self.continuous else self._loop
            self._finished, self._total = 0, sum(len(g.rollouts) for g in groups)
            self._pending = collections.deque((gi, o) for gi, group in enumerate(orgs)
                                              for o in group)
            ticks = loop()
            for o in (o for group in orgs for o in group):  # one source of truth (schedule.py)
                verify_schedule(o.log.events, o.scheduled, clock_order=o.clock_order)
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                for g, group in zip(groups, orgs):
                    for i, o in enumerate(group):
                        o.log.write(self.log_dir / f"group{g.group_id}_rollout{i}.jsonl")
            return RunResult(
                groups=[self._group(gi) for gi in range(len(groups))], specs=list(groups),
                logs=[[o.log for o in group] for group in orgs],
                reports=[[org_report(o) for o in group] for group in orgs], ticks=ticks,
                scheduled=[[o.scheduled for o in group] for group in orgs])
        finally:
            if not self.keep_workspaces:
                shutil.rmtree(root, ignore_errors=True)

    def _check_groups(self, groups: Sequence[GroupSpec]) -> None:
        for g in groups:
            if not g.rollouts:
                raise ValueError(f"group {g.group_id} has no rollouts")
            ids = {r.session.task.task_id for r in g.rollouts}
            if len(ids) != 1:
                raise ValueError(f"group {g.group_id} mixes tasks {sorted(ids)}")
        # A host whose share of the step is empty plays nothing (and must not fail).
        most = max((r.budget for g in groups for r in g.rollouts), default=0)
        if self.max_agents is not None and 1 + most > self.max_agents:
            raise ValueError(f"RolloutDriver: max_agents={self.max_agents} cannot hold a "
                             f"rollout of budget {most} (1 + budget = {1 + most} agents)")

    def _group(self, gi: int) -> RolloutGroup:
        """Group gi as the RL core sees it (its rollouts built once)."""
        group = self._orgs[gi]
        for o in group:
            if id(o) not in self._built:
                self._built[id(o)] = build_rollout(o)
        return RolloutGroup(group_id=self._specs[gi].group_id, task_id=group[0].task.task_id,
                            rollouts=[self._built[id(o)] for o in group],
                            objective=group[0].task.objective)

    def _ended(self, done: list[Organisation]) -> None:
        """Rollouts that ended: progress, and each group they complete goes to `refill`,
        whose groups join the pending ones."""
        self._report(len(done))
        for o in done:
            gi = self._group_of[id(o)]
            self._left[gi] -= 1
            if self._left[gi] or self._refill is None:
                continue
            more = list(self._refill(self._group(gi)))
            self._check_groups(more)
            for g in more:
                gi = len(self._specs)
                self._specs.append(g)
                self._orgs.append([self._organisation(self._root, g, i, r)
                                   for i, r in enumerate(g.rollouts)])
                self._left.append(len(g.rollouts))
                self._total += len(g.rollouts)
                for o2 in self._orgs[gi]:
                    self._group_of[id(o2)] = gi
                    self._pending.append((gi, o2))

    def _organisation(self, root: Path, g: GroupSpec, i: int, r: RolloutSpec) -> Organisation:
        index = self._next_rollout
        self._next_rollout += 1
        ws = Workspace(root / f"group{g.group_id}_rollout{i}", self.config.workspace)
        # schedule_horizon_s=inf is the lock-step tick, kept for comparison (lockstep.py).
        kind = LockStepOrganisation if math.isinf(self.config.schedule_horizon_s) else Organisation
        return kind(r.session, rollout=index, budget=r.budget, seed=r.seed, config=self.config,
                    chat=self.chat, workspace=ws, peers=r.peers)

    def _share(self, group: list[Organisation]) -> None:
        prefix = group[0].shared_prefix()
        if len(group) > 1 and all(np.array_equal(o.shared_prefix(), prefix) for o in group):
            self.policy.prefill_shared([o.key(o.first_agent()) for o in group], prefix)

    def _admit(self, pending, active: list[Organisation], held: int) -> int:
        """Move rollouts from `pending` ((group index, org), spec order) to `active` while
        their agents fit `max_agents`; share prefixes within each group admitted. Returns the
        agents now held."""
        new: dict[int, list[Organisation]] = {}
        while pending and (self.max_agents is None
                           or held + 1 + pending[0][1].budget <= self.max_agents):
            gi, o = pending.popleft()
            held += 1 + o.budget
            new.setdefault(gi, []).append(o)
            active.append(o)
        if self.share_prefix:
            for group in new.values():
                self._share(group)
        return held

    def _loop(self) -> list[TickStat]:
        ticks = []
        pending = self._pending
        active: list[Organisation] = []
        held = 0
        while pending or active:
            held = self._admit(pending, active, held)
            batches = [(o, o.begin_tick()) for o in active]
            flat = [t for _, turns in batches for t in turns]
            outputs = self.policy.act(flat) if flat else []
            if len(outputs) != len(flat):
                raise ValueError(f"policy returned {len(outputs)} outputs for {len(flat)} turns")
            start = 0
            for o, turns in batches:
                o.apply(turns, outputs[start:start + len(turns)])
                start += len(turns)
            for o, _ in batches:
                o.end_tick()
                for key in o.take_retired():
                    self.policy.release(key)
            if flat:  # a tick in which rollouts only ended made no policy call
                ticks.append(TickStat(active_rollouts=len(active), turns=len(flat)))
            held -= sum(1 + o.budget for o in active if o.done)
            self._ended([o for o in active if o.done])
            active[:] = [o for o in active if not o.done]
        return ticks

    def _stream(self) -> list[TickStat]:
        """Continuous feeding: each rollout's next batch goes to the policy as soon as its
        previous one came back and was applied, while other rollouts' turns still run. A
        rollout's own sequence of batches (begin, act, apply, end) is the tick loop's; only
        when it is played changes. A `TickStat` per batch."""
        ticks = []
        pending = self._pending
        active: list[Organisation] = []
        running: dict[int, tuple[Organisation, list]] = {}  # batch tag -> (rollout, turns)
        busy: set[int] = set()  # ids of the rollouts with a batch running
        held, tag = 0, 0
        while pending or active:
            held = self._admit(pending, active, held)
            for o in active:
                if id(o) in busy:
                    continue
                turns = o.begin_tick()
                if turns:
                    self.policy.submit(tag, turns)
                    running[tag] = (o, turns)
                    busy.add(id(o))
                    tag += 1
                else:  # a rollout that only committed effects or ended: no policy call
                    self._finish_batch(o, [], [])
            if running:
                for done_tag, outputs in self.policy.collect():
                    o, turns = running.pop(done_tag)
                    if len(outputs) != len(turns):
                        raise ValueError(f"policy returned {len(outputs)} outputs for "
                                         f"{len(turns)} turns")
                    self._finish_batch(o, turns, outputs)
                    busy.discard(id(o))
                    ticks.append(TickStat(active_rollouts=len(active), turns=len(turns)))
            held -= sum(1 + o.budget for o in active if o.done)
            self._ended([o for o in active if o.done])
            active[:] = [o for o in active if not o.done]
        return ticks

    def _report(self, ended: int) -> None:
        if ended and self.progress is not None:
            self._finished += ended
            self.progress(self._finished, self._total)

    def _finish_batch(self, o: Organisation, turns: list, outputs: list) -> None:
        o.apply(turns, outputs)
        o.end_tick()
        for key in o.take_retired():
            self.policy.release(key)
