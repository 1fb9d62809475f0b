"""Playing one scripted rollout through the real `RolloutDriver`, for attacks and the fuzz suite.

    played = play(tmp, session, {"ceo": [['roster'], ['write_file {"path": "x", "text": "y"}']]})
    played.crash  # the exception out of `RolloutDriver.run`, "hung", or ""

A turn is the list of call texts the agent writes after `<|call|>` (raw, so malformed JSON and
escapes such as `\\ud800` reach the parser as a model would write them), or raw token ids.
After its turns an agent waits. The rollout runs in a thread bounded by `timeout_s`: a run
that does not come back is reported as hung (the thread is left behind, a daemon).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from avalon.org import GroupSpec, OrgConfig, RolloutDriver, RolloutSpec
from avalon.org.env import EndContext, FinalOutcome, Task, ToolError, ToolOutcome
from avalon.org.policy import Turn, TurnOutput, scripted_output
from avalon.org.workspace import WorkspaceLimits
from avalon.tokenizer import ByteTokenizer, ChatFormat

CHAT = ChatFormat(ByteTokenizer())
RawTurn = Sequence[str] | np.ndarray


class RawScript:
    """A policy answering each agent's ordinary turns from a script of raw turns."""

    def __init__(self, chat: ChatFormat, turns: Mapping[str, Sequence[RawTurn]]):
        self.chat, self.turns = chat, {k: list(v) for k, v in turns.items()}

    def act(self, turns: Sequence[Turn]) -> list[TurnOutput]:
        out = []
        for turn in turns:
            script = self.turns.get(turn.key.agent, [])
            view = turn.view
            if view.summary:
                ids = self.chat.output("summary")
            elif view.turn < len(script) and isinstance(script[view.turn], np.ndarray):
                ids = [int(i) for i in script[view.turn]]
            elif view.turn < len(script):
                ids = self.chat.output("", list(script[view.turn]))
            else:
                ids = self.chat.output("", ["wait_for_messages"])
            out.append(scripted_output(ids, turn.max_new_tokens))
        return out

    def release(self, key) -> None:
        pass

    def prefill_shared(self, keys, prefix) -> None:
        pass


class BareEnv:
    """An environment with no tools of its own: only the organisation's tools are in play."""

    def __init__(self, task_id: str = "bare"):
        self._task = Task(task_id=task_id, prompt="Use the workspace.", tools=(),
                          wall_clock_s=1e6)

    @property
    def task(self) -> Task:
        return self._task

    def on_start(self, budget, workspace) -> None:
        pass

    def brief(self, agent, index, title, role) -> str:
        return ""

    def call(self, tool, args, ctx) -> ToolOutcome:
        raise ToolError(f"unknown tool {tool!r}")

    def on_end(self, ctx: EndContext) -> FinalOutcome:
        return FinalOutcome()


@dataclasses.dataclass
class Played:
    crash: str  # "" when the driver returned; else the exception, or "hung"
    events: list[dict]  # the rollout's event log (empty when it crashed)
    workspace: Path | None  # the rollout's workspace (kept), when the driver got that far
    result: object = None  # the driver's RunResult

    def tool_calls(self, tool: str) -> list[dict]:
        return [e for e in self.events if e["kind"] == "tool_call" and e["tool"] == tool]


def play(tmp: str | Path, session, turns: Mapping[str, Sequence[RawTurn]], *,
         limits: WorkspaceLimits | None = None, budget: int = 0, seed: int = 0,
         timeout_s: float = 60.0, config: OrgConfig | None = None,
         chat: ChatFormat = CHAT, log_dir: str | Path | None = None) -> Played:
    """Plays one rollout of `session` with the scripted raw turns (see the module docstring),
    rendered with `chat` (the byte tokenizer's format unless given); with `log_dir`, the driver
    writes the event log there as a training run does."""
    cfg = config or OrgConfig.scaled(8192, workspace=limits or WorkspaceLimits())
    workdir = Path(tmp) / "driver"
    workdir.mkdir(parents=True, exist_ok=True)
    driver = RolloutDriver(RawScript(chat, turns), chat, cfg, workdir=workdir,
                           keep_workspaces=True, log_dir=log_dir)
    box: dict = {}

    def target():
        try:
            box["result"] = driver.run([GroupSpec(0, (RolloutSpec(session, budget, seed),))])
        except BaseException as e:  # noqa: BLE001 - what leaves the driver is the finding
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    roots = sorted(workdir.glob("avalon-org-*/group0_rollout0"))
    ws = roots[-1] if roots else None
    if thread.is_alive():
        return Played("hung", [], ws)
    if "error" in box:
        e = box["error"]
        return Played(f"{type(e).__name__}: {e}".splitlines()[0][:200], [], ws)
    result = box["result"]
    return Played("", result.logs[0][0].events, ws, result)
