"""A verifiers (v1) taskset as an Avalon environment: each task is the CEO's brief, the
environment's own reward functions score the organisation's answer.

    import verifiers.v1 as vf
    env = VerifiersEnvironment(vf.load_taskset(vf.TasksetConfig(id="my_taskset")),
                               n_train=64, n_heldout=8)

verifiers (`pip install verifiers`, the 0.4 line: its `v1` API of `Taskset`, `Task`, `Trace`,
`Episode`) describes a task as data (`TaskData`: a prompt, an optional system prompt) and
behaviour (`Task.score(trace)`: its `@vf.reward` methods, plugged reward functions and judges,
reading the trace's conversation, e.g. `trace.last_reply`). Here the task's prompt (its system
prompt first, when it has one) is the brief the CEO reads; the organisation works on it with
its own tools and ends with `final_message`, whose text is the answer. At the episode's end
the session builds the verifiers `Trace` of that single-agent exchange (the brief as the user
message, the answer as the root agent's reply) and awaits the task's `score` on it; the
weighted sum of its rewards (`Trace.reward`) is the episode's final reward, so the collective
reward of the rollout (SPEC §3) is the environment's reward. Each reward is also a metric of
the `end` event (`vf/NAME`).

Every token the organisation trains on comes from Avalon's engine (the driver's rollouts):
nothing is re-tokenised, verifiers sees text only. Tasks needing a runtime to score (a
container, `Task.NEEDS_CONTAINER`) are refused: scoring here runs without one (`runtime=None`
skips runtime-dependent rewards, which would silently score 0).

Splits: the first `n_train` tasks of the taskset are train, the next `n_heldout` held out
(`Taskset.take`, so an infinite taskset works); task ids are `vf-<position>`.
"""

from __future__ import annotations

import asyncio

from avalon.envs.base import Split, UnknownTaskError, check_clock
from avalon.org.env import EndContext, EnvReward, FinalOutcome, Task, ToolError


def _verifiers():
    try:
        import verifiers.v1 as vf
    except ImportError as e:  # the optional extra
        raise ImportError("VerifiersEnvironment needs the verifiers package: pip install "
                          "'avalon[verifiers]'") from e
    return vf


class VerifiersSession:
    """One rollout of one verifiers task (the organisation's `EnvSession`)."""

    def __init__(self, env: VerifiersEnvironment, vf_task, task: Task):
        self.env, self.vf_task, self._task = env, vf_task, task

    @property
    def task(self) -> Task:
        return self._task

    def on_start(self, budget: int, workspace) -> None:
        pass

    def brief(self, agent: str, index: int, title: str, role: str) -> str:
        return ""

    def call(self, tool: str, args: dict, ctx):
        raise ToolError(f"unknown tool {tool!r}")  # the task has no tools of its own

    def on_end(self, ctx: EndContext) -> FinalOutcome:
        trace = score_answer(self.vf_task, ctx.final_message or "")
        rewards = {name: (r.value if r is not None else 0.0) for name, r in trace.rewards.items()}
        total = float(trace.reward)
        return FinalOutcome(rewards=(EnvReward(total, "verifiers reward"),) if total else (),
                            metrics={"vf/reward": total,
                                     **{f"vf/{k}": float(v) for k, v in rewards.items()}},
                            record={"vf_task_key": self.vf_task.key})


def score_answer(vf_task, answer: str):
    """The verifiers `Trace` of a single-agent exchange (the task's prompt, `answer` as the
    root reply), scored by the task's own rewards."""
    vf = _verifiers()
    trace = vf.Trace(task=vf.TraceTask(type=type(vf_task).__name__, data=vf_task.data,
                                       key=vf_task.key, hash=vf_task.hash),
                     agent=vf.AgentInfo(config=vf.AgentConfig(), name="ceo"))
    trace.root_reply = answer
    trace.is_completed = trace.ok = True
    asyncio.run(vf_task.score(trace))
    return trace


class VerifiersEnvironment:
    """A verifiers v1 `Taskset` as an `Environment` (see the module docstring)."""

    uses_workspace = False

    def __init__(self, taskset, *, n_train: int, n_heldout: int, name: str = "",
                 clock_s: float = 600.0):
        for field, value in (("n_train", n_train), ("n_heldout", n_heldout)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"VerifiersEnvironment: {field}={value!r} must be an int >= 0")
        tasks = list(taskset.take(n_train + n_heldout))
        if len(tasks) < n_train + n_heldout:
            raise ValueError(f"VerifiersEnvironment: the taskset has {len(tasks)} tasks, "
                             f"n_train + n_heldout = {n_train + n_heldout}")
        for t in tasks:
            if getattr(t, "NEEDS_CONTAINER", False):
                raise ValueError(f"VerifiersEnvironment: task {type(t).__name__} needs a "
                                 "container to run and score; only tasks scored from the "
                                 "answer are supported")
        self._tasks = tasks
        self.n_train = n_train
        self.clock_s = clock_s
        self._name = name or f"vf:{taskset.config.id or type(taskset).__name__}"

    @property
    def name(self) -> str:
        return self._name

    def task_ids(self, split: Split) -> tuple[str, ...]:
        span = range(self.n_train) if split is Split.TRAIN else \
            range(self.n_train, len(self._tasks))
        return tuple(f"vf-{i}" for i in span)

    def _vf_task(self, task_id: str):
        prefix, _, pos = task_id.partition("-")
        if prefix != "vf" or not pos.isdigit() or int(pos) >= len(self._tasks):
            raise UnknownTaskError(f"environment {self.name!r} has no task {task_id!r}")
        return self._tasks[int(pos)]

    def task(self, task_id: str, clock_s: float | None = None) -> Task:
        data = self._vf_task(task_id).data
        brief = data.prompt_text
        if data.system_prompt:
            brief = f"{data.system_prompt}\n\n{brief}"
        clock = check_clock(clock_s, self.clock_s, f"{self.name} task {task_id!r}")
        return Task(task_id=task_id, prompt=brief, tools=(), wall_clock_s=clock)

    def session(self, task_id: str, seed: int, clock_s: float | None = None) -> VerifiersSession:
        return VerifiersSession(self, self._vf_task(task_id), self.task(task_id, clock_s))

    def vocabulary(self) -> tuple[str, ...]:
        import re
        text = " ".join(self.task(t).prompt for s in Split for t in self.task_ids(s))
        return tuple(dict.fromkeys(re.findall(r"[A-Za-z0-9_]{2,}", text)))
