"""The S8 baseline's session (SPEC §5): a single agent that may not submit until it has written
as many output tokens as the matched organisation rollout.

    KeepImprovingSession(env.session(task_id, seed), min_tokens_out=org_rollout_tokens_out)

wraps any session: its task carries `submit_after_tokens` (the organisation then refuses the
CEO's `final_message` with the "keep improving" message until then, `avalon/org/handlers.py`), and
calls of the task's submission tools (by default its tools that are not grantable: the ones the
CEO keeps, such as a final `submit`) are refused the same way, as tool errors, before the inner
session sees them. Everything else passes through.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from avalon.org.env import (
    CallContext,
    EndContext,
    EnvSession,
    FinalOutcome,
    Task,
    ToolError,
    ToolOutcome,
)
from avalon.org.prompts import keep_improving


class KeepImprovingSession:
    def __init__(self, inner: EnvSession, min_tokens_out: int,
                 submit_tools: Iterable[str] | None = None):
        if isinstance(min_tokens_out, bool) or not isinstance(min_tokens_out, int) \
                or min_tokens_out < 0:
            raise ValueError(f"KeepImprovingSession min_tokens_out must be an int >= 0, got "
                             f"{min_tokens_out!r}")
        self.inner = inner
        self.min_tokens_out = min_tokens_out
        task = inner.task
        names = {t.name for t in task.tools}
        self.submit_tools = frozenset(t.name for t in task.tools if not t.grantable) \
            if submit_tools is None else frozenset(submit_tools)
        unknown = sorted(self.submit_tools - names)
        if unknown:
            raise ValueError(f"KeepImprovingSession submit_tools {unknown} are not tools of task "
                             f"{task.task_id!r} ({sorted(names)})")
        self._task = dataclasses.replace(task, submit_after_tokens=min_tokens_out)
        self.refused = 0

    @property
    def task(self) -> Task:
        return self._task

    def on_start(self, budget, workspace) -> None:
        self.inner.on_start(budget, workspace)

    def brief(self, agent: str, index: int, title: str, role: str) -> str:
        return self.inner.brief(agent, index, title, role)

    def call(self, tool: str, args: dict, ctx: CallContext) -> ToolOutcome:
        if tool in self.submit_tools and ctx.tokens_out < self.min_tokens_out:
            self.refused += 1
            raise ToolError(keep_improving(ctx.tokens_out, self.min_tokens_out))
        return self.inner.call(tool, args, ctx)

    def on_end(self, ctx: EndContext) -> FinalOutcome:
        return self.inner.on_end(ctx)
