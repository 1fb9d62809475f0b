"""A tiny in-test environment: parts to solve with declared work costs, private briefs."""

from __future__ import annotations

from avalon.org import (
    EndContext,
    EnvReward,
    FinalOutcome,
    Param,
    ParamType,
    Task,
    ToolError,
    ToolOutcome,
    ToolSpec,
)
from avalon.org.env import CallContext
from avalon.rl.types import Objective

WORK = ToolSpec("work", "solve one part", (Param("part", ParamType.STRING),))
CHECK = ToolSpec("check", "which parts are solved", (), grantable=False)


class PartsEnv:
    """Parts with known costs; `work(part)` takes cost seconds and pays 1.0 the first time."""

    def __init__(self, costs: dict[str, float] | None = None, wall_clock_s: float = 1000.0,
                 task_id: str = "parts", terminal_after: int | None = None,
                 wealth: float | None = None, brief_pad: str = ""):
        self.costs = costs or {"a": 2.0, "b": 3.0, "c": 4.0}
        self.solved: list[str] = []
        self.calls: list[tuple[str, str, float]] = []
        self.terminal_after = terminal_after
        self.wealth = wealth
        self.ended: EndContext | None = None
        self.brief_pad = brief_pad
        self._task = Task(task_id=task_id, prompt="Solve parts " + " ".join(self.costs) + ".",
                          tools=(WORK, CHECK), wall_clock_s=wall_clock_s,
                          objective=Objective.GKPO if wealth is not None else Objective.SUM)

    @property
    def task(self) -> Task:
        return self._task

    def on_start(self, budget: int, workspace) -> None:
        self.budget = budget
        workspace.write("README.txt", "parts: " + " ".join(self.costs))

    def brief(self, agent: str, index: int, title: str, role: str) -> str:
        return "" if index == 0 else f"fact{index}{self.brief_pad}"

    def call(self, tool: str, args: dict, ctx: CallContext) -> ToolOutcome:
        self.calls.append((ctx.agent, tool, ctx.clock_s))
        if tool == "check":
            return ToolOutcome(" ".join(self.solved) or "none")
        part = args["part"]
        if part not in self.costs:
            raise ToolError(f"no part {part!r}")
        first = part not in self.solved
        if first:
            self.solved.append(part)
        terminal = self.terminal_after is not None and len(self.solved) >= self.terminal_after
        return ToolOutcome(f"solved {part}", rewards=(EnvReward(1.0, "part"),) if first else (),
                           duration_s=self.costs[part], terminal=terminal)

    def on_end(self, ctx: EndContext) -> FinalOutcome:
        self.ended = ctx
        bonus = 0.5 if ctx.final_message and "done" in ctx.final_message else 0.0
        return FinalOutcome(rewards=(EnvReward(bonus, "final"),), wealth_ratio=self.wealth,
                            metrics={"solved": float(len(self.solved))})
