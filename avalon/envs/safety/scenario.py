"""What every safety scenario is: a no-CEO team, decision tools, and labels read from the log.

A `Scenario` is a frozen description: its name, the number of peers (`PeerTeam`, see
`avalon/org/peers.py`), the prompt every peer reads, its decision tools, how a logged decision
is labelled, the keywords the "considered" judge looks for, and which peers are confederates
(played by a fixed policy, `confederates.py`). `ScenarioEnv(scenario)` is its `Environment`:
one held-out task and no training tasks (the suite measures checkpoints; training on it would
make the held-out measurement meaningless).

Labels come from the event log only (`counts.py`): `Scenario.label(tool, args, result)` maps
one successful logged `tool_call` (its tool name, logged args and logged result text) to the
`Label`s it carries. Sessions write into their results whatever a label needs (a commons
harvest result states the month's sustainable catch), so counting never reads a session.

Every action is simulated: the tools change the session's own numbers and texts, nothing else.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Mapping

from avalon.envs.base import Split, UnknownTaskError, check_clock
from avalon.org.env import (
    CallContext,
    EndContext,
    FinalOutcome,
    Task,
    ToolError,
    ToolOutcome,
    ToolSpec,
)
from avalon.org.peers import PeerTeam, peer_ids
from avalon.org.workspace import Workspace


class Label(enum.Enum):
    HARMFUL = "harmful"  # the harmful action (sign the doctored report, join the attack, ...)
    ESCALATE = "escalate"  # a report to someone outside the team (regulator, inspector, evals)
    FALSE_ALARM = "false_alarm"  # an escalation where nothing was wrong (benign decoy)
    COOPERATE = "cooperate"  # a co-operative move of a game
    DEFECT = "defect"  # its non-co-operative alternative
    PUNISH = "punish"  # a costly punishment (public goods with punishment)


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    n_agents: int
    prompt: str
    tools: tuple[ToolSpec, ...]
    # (scenario, task_id, clock_s, seed) -> a fresh session (an `avalon/org/env.py` EnvSession)
    session: Callable[[Scenario, str, float, int], ScenarioSession]
    # (tool, logged args, logged result text) of a successful call -> its labels.
    label: Callable[[str, Mapping, str], frozenset[Label]]
    # What the "considered" judge looks for in an agent's text (lower-case phrases).
    escalation_words: tuple[str, ...] = ()
    harm_words: tuple[str, ...] = ()
    game: bool = False  # a co-operation game (its table rows show co-operation rates)
    confederates: tuple[str, ...] = ()  # peer ids played by the scenario's fixed policy
    confederate_message: str = ""  # what scripted confederates post before acting
    confederate_calls: tuple[tuple[str, Mapping], ...] = ()  # then these decision calls
    clock_s: float = 3600.0
    # Tools that only show information (a game's status, a dilemma's evidence); every other
    # tool of the scenario is a decision tool (`decision_tools`).
    info_tools: tuple[str, ...] = ("status",)

    def __post_init__(self):
        ids = peer_ids(self.n_agents)
        bad = [c for c in self.confederates if c not in ids]
        if bad:
            raise ValueError(f"scenario {self.name!r}: confederates {bad} are not among {ids}")
        names = {t.name for t in self.tools}
        unknown = [t for t in self.info_tools if t not in names]
        if unknown:
            raise ValueError(f"scenario {self.name!r}: info_tools {unknown} are not among its "
                             f"tools {sorted(names)}")

    @property
    def decision_tools(self) -> tuple[str, ...]:
        """The tools that decide something (a move, a final decision, an escalation)."""
        return tuple(t.name for t in self.tools if t.name not in self.info_tools)

    @property
    def team(self) -> PeerTeam:
        return PeerTeam(n=self.n_agents)

    @property
    def counted(self) -> tuple[str, ...]:
        """The peers whose actions are counted (not the confederates)."""
        return tuple(p for p in peer_ids(self.n_agents) if p not in self.confederates)


class ScenarioSession:
    """Shared plumbing: the task, the peers' ids and indices, tool dispatch by method name."""

    def __init__(self, scenario: Scenario, task_id: str, clock_s: float, seed: int):
        self.scenario, self.seed = scenario, seed
        self.peers = peer_ids(scenario.n_agents)
        self._task = Task(task_id=task_id, prompt=scenario.prompt, tools=scenario.tools,
                          wall_clock_s=clock_s)

    @property
    def task(self) -> Task:
        return self._task

    def on_start(self, budget: int, workspace: Workspace) -> None:
        pass

    def brief(self, agent: str, index: int, title: str, role: str) -> str:
        return ""

    def call(self, tool: str, args: dict, ctx: CallContext) -> ToolOutcome:
        if ctx.agent not in self.peers:
            raise ToolError(f"{ctx.agent} is not a member of this team")
        handler = self.handlers().get(tool)
        if handler is None:
            raise ToolError(f"unknown tool {tool!r}")
        return handler(ctx.agent, args)

    def handlers(self) -> dict[str, Callable[[str, dict], ToolOutcome]]:
        raise NotImplementedError

    def on_end(self, ctx: EndContext) -> FinalOutcome:
        return FinalOutcome()


class ScenarioEnv:
    """A scenario as an `Environment` (avalon/envs/base.py)."""

    uses_workspace = False

    def __init__(self, scenario: Scenario):
        self.scenario = scenario

    @property
    def name(self) -> str:
        return self.scenario.name

    def task_ids(self, split: Split) -> tuple[str, ...]:
        return (f"{self.scenario.name}-heldout-0",) if split is Split.HELDOUT else ()

    def task(self, task_id: str, clock_s: float | None = None):
        return self.session(task_id, 0, clock_s).task

    def session(self, task_id: str, seed: int, clock_s: float | None = None) -> ScenarioSession:
        if task_id not in self.task_ids(Split.HELDOUT):
            raise UnknownTaskError(f"environment {self.name!r} has no task {task_id!r}")
        clock = check_clock(clock_s, self.scenario.clock_s, f"{self.name} task {task_id!r}")
        return self.scenario.session(self.scenario, task_id, clock, seed)

    def vocabulary(self) -> tuple[str, ...]:
        text = " ".join([self.scenario.prompt, self.scenario.confederate_message] + [
            f"{t.name} {t.description} " + " ".join(p.name for p in t.params)
            for t in self.scenario.tools])
        return tuple(dict.fromkeys(re.findall(r"[A-Za-z0-9_]{2,}", text)))


def int_arg(args: Mapping, name: str, lo: int, hi: int) -> int:
    """An integer argument in lo..hi, else a ToolError naming it."""
    value = args[name]
    if not lo <= value <= hi:
        raise ToolError(f"{name} must be {lo}..{hi}, got {value}")
    return value
