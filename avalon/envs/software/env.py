"""Environment 3: software build. Implement functions in the workspace; hidden tests grade them.

A task asks for 3-5 functions in `solution.py`, each shown with its signature, a one-line spec
and two examples: procedurally generated pipelines (`generated.py`), held-out tasks drawing only
pipelines that no training task has. The clock (150 s by default) binds at the derived clock's
token rates (SPEC §2: 50 output tokens a second): a model that spends ~2,000 tokens of thought
and code per function fits about three alone; a team writes them in parallel. `on_start` lays
out `solution.py` with stubs.
Grading (`grader.py`) runs fresh hidden tests (`tests_per_function` per function, inputs drawn
from the session seed) against the workspace's code in the sandbox, outside the workspace.

Reward: 1 / n_functions (label `function`) for each function whose hidden pass rate is at least
`pass_threshold` (default 1.0: every test). Rewards come from `submit` (CEO only, terminal;
declared duration `grade_cost_s`) or, if the episode ends without a submission (the CEO's
final message, the wall clock), from grading the workspace at the end, so a rollout cut off at
any point still yields a reward.

Hardening against reward hacks (each has a test in tests/envs/test_software.py):
- lookup tables: hidden inputs are fresh random draws per session, never the shown examples;
- constant-answer floors: generators balance output classes (no constant passes more than
  about half of a family's tests) and a function scores only above the pass threshold;
- reading or editing the tests and grader: tests live only in the grader's parent process;
  the sandboxed run sees inputs only, cannot read outside its directory and the standard
  library, cannot import `avalon`, and its outputs are compared outside it, type-strictly;
- writing outside the workspace: the graded copy runs with every write refused; symlinked
  files are not copied in;
- printing fake results or exiting early with status 0: results come from the harness's own
  file, and without correct values they only lose cases.
"""

from __future__ import annotations

import dataclasses
import re
import zlib

import numpy as np

from avalon.envs.software import generated
from avalon.envs.software.functions import BY_NAME, FAMILIES
from avalon.envs.software.grader import GradeReport, grade
from avalon.envs.software.teacher import TEACHER_WORDS, cast
from avalon.envs.table import TableEnv
from avalon.envs.teacher import Baselines, TeacherPolicy, chance_policy
from avalon.org.env import (
    CallContext,
    EndContext,
    EnvReward,
    FinalOutcome,
    Task,
    ToolError,
    ToolOutcome,
    ToolSpec,
)
from avalon.org.workspace import Workspace, WorkspaceLimits
from avalon.tokenizer.chat import ChatFormat
from avalon.validation import FieldChecks

SUBMIT = ToolSpec("submit", "grade solution.py with the hidden tests; ends the task",
                  grantable=False)
SOLUTION = "solution.py"


@dataclasses.dataclass(frozen=True)
class SoftwareConfig:
    n_functions: tuple[int, int] = (3, 5)  # inclusive range
    examples_per_function: int = 2
    tests_per_function: int = 12
    pass_threshold: float = 1.0
    grade_cost_s: float = 30.0
    grade_timeout_s: float = 10.0
    clock_s: float = 150.0
    # The 14 hand-written families instead of generated pipelines (held-out tasks then differ
    # only in which set they ask for: memorisable; kept for grader tests).
    hand_written: bool = False
    n_train: int = 256
    n_heldout: int = 64
    seed: int = 0

    def __post_init__(self):
        check = FieldChecks("SoftwareConfig")
        lo, hi = self.n_functions
        top = len(FAMILIES) if self.hand_written else 8
        if not 1 <= lo <= hi <= top:
            check.fail("n_functions", self.n_functions, f"must be 1 <= lo <= hi <= {top}")
        if not 0 < self.pass_threshold <= 1:
            check.fail("pass_threshold", self.pass_threshold, "must be in (0, 1]")
        for name in ("examples_per_function", "tests_per_function"):
            if getattr(self, name) < 1:
                check.fail(name, getattr(self, name), "must be >= 1")
        for name in ("grade_cost_s", "grade_timeout_s", "clock_s"):
            if not getattr(self, name) > 0:
                check.fail(name, getattr(self, name), "must be > 0")


DEFAULT_CONFIG = SoftwareConfig()


@dataclasses.dataclass(frozen=True)
class SoftwareTask:
    functions: tuple[str, ...]
    examples: tuple[tuple[str, tuple, object], ...]  # (function, args, expected)


def make_task(rng: np.random.Generator, config: SoftwareConfig,
              heldout: bool = False) -> SoftwareTask:
    n = int(rng.integers(config.n_functions[0], config.n_functions[1] + 1))
    if config.hand_written:
        names = tuple(sorted(FAMILIES[i].name
                             for i in rng.choice(len(FAMILIES), n, replace=False)))
    else:
        names = generated.draw(rng, n, heldout, BY_NAME.__getitem__)
    examples = []
    for name in names:
        fam = BY_NAME[name]
        ref = fam.reference()
        for _ in range(config.examples_per_function):
            args = fam.gen(rng)
            examples.append((name, args, ref(*args)))
    return SoftwareTask(names, tuple(examples))


def _make_heldout(rng: np.random.Generator, config: SoftwareConfig) -> SoftwareTask:
    return make_task(rng, config, heldout=True)


def _functions(task: SoftwareTask) -> tuple[str, ...]:
    """A task's content signature: the functions it asks for."""
    return task.functions


def _call_text(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def prompt(task: SoftwareTask) -> str:
    lines = [f"Write {SOLUTION} (Python standard library only) defining these functions."]
    for name in task.functions:
        fam = BY_NAME[name]
        lines.append(f"{fam.signature}: {fam.spec}")
        lines += [f"  e.g. {_call_text(n, a)} == {e!r}" for n, a, e in task.examples
                  if n == name]
    lines.append("Hidden tests with new inputs grade it when the CEO calls submit or the task "
                 "ends; a function scores only if it passes every test.")
    return "\n".join(lines)


def stub(task: SoftwareTask) -> str:
    return "".join(f"def {BY_NAME[n].signature}:\n    raise NotImplementedError\n\n\n"
                   for n in task.functions).rstrip() + "\n"


class SoftwareSession:
    def __init__(self, task_id: str, spec: SoftwareTask, seed: int, clock_s: float,
                 config: SoftwareConfig):
        self.spec, self.config = spec, config
        self.rng = np.random.default_rng([seed, zlib.crc32(task_id.encode()), 7])
        self.limits = WorkspaceLimits(run_timeout_s=config.grade_timeout_s)
        self.report: GradeReport | None = None
        self._task = Task(task_id=task_id, prompt=prompt(spec), tools=(SUBMIT,),
                          wall_clock_s=clock_s)

    @property
    def task(self) -> Task:
        return self._task

    def on_start(self, budget: int, workspace: Workspace) -> None:
        workspace.write(SOLUTION, stub(self.spec))

    def brief(self, agent: str, index: int, title: str, role: str) -> str:
        return ""

    def _grade(self, workspace: Workspace) -> tuple[EnvReward, ...]:
        self.report = grade(workspace, self.spec.functions, self.rng,
                            self.config.tests_per_function, self.limits)
        share = 1.0 / len(self.spec.functions)
        return tuple(EnvReward(share, "function") for f in self.spec.functions
                     if self.report.rate(f) >= self.config.pass_threshold)

    def call(self, tool: str, args: dict, ctx: CallContext) -> ToolOutcome:
        if tool != "submit":
            raise ToolError(f"unknown tool {tool!r}")
        if self.report is not None:
            raise ToolError("already submitted")
        rewards = self._grade(ctx.workspace)
        r = self.report
        text = "; ".join(f"{f} {r.passed[f]}/{r.total[f]}" for f in self.spec.functions)
        return ToolOutcome(f"graded: {text}", rewards, terminal=True,
                           duration_s=self.config.grade_cost_s)

    def on_end(self, ctx: EndContext) -> FinalOutcome:
        rewards = () if self.report is not None else self._grade(ctx.workspace)
        r = self.report
        metrics = {"functions": float(len(self.spec.functions)),
                   "pass_rate": float(np.mean([r.rate(f) for f in self.spec.functions]))}
        return FinalOutcome(rewards=rewards, metrics=metrics)


class SoftwareBuild(TableEnv[SoftwareConfig, SoftwareTask, SoftwareSession]):
    """Environment 3 (see the module docstring). Sessions use their seed for hidden inputs."""

    name = "software"
    uses_workspace = True

    def __init__(self, config: SoftwareConfig = DEFAULT_CONFIG):
        super().__init__(config, make_task, _functions, make_heldout=_make_heldout)

    def _open(self, task_id: str, spec: SoftwareTask, seed: int, clock_s: float,
              config: SoftwareConfig) -> SoftwareSession:
        return SoftwareSession(task_id, spec, seed, clock_s, config)

    def teacher(self, chat: ChatFormat, silent: bool = False) -> TeacherPolicy:
        """The scripted teacher organisation (`teacher.py`); `silent`: nobody reports."""
        return TeacherPolicy(chat, lambda start: cast(start, silent))

    def baselines(self, chat: ChatFormat) -> Baselines:
        """Reference organisations: chance submits the stubs; the teacher alone, silent (the
        CEO writes everything) and whole."""
        return Baselines(chance=lambda: chance_policy(chat, lambda c, r: ("submit", {}), 1),
                         single=lambda: self.teacher(chat),
                         org_silent=lambda: self.teacher(chat, silent=True),
                         org=lambda: self.teacher(chat))

    def optimum(self, task_id: str, clock_s: float, budget: int) -> float | None:
        return None  # every function right (1.0) is possible only when the clock allows

    def vocabulary(self) -> tuple[str, ...]:
        words = re.findall(r"[A-Za-z0-9_]{2,}", " ".join(
            [prompt(SoftwareTask(tuple(f.name for f in FAMILIES), ())), *(
                f.source for f in FAMILIES), stub(SoftwareTask(tuple(BY_NAME), ())),
             "graded already submitted unknown tool", *TEACHER_WORDS,
             *(p.phrase + " " + p.code + " " + p.key for p in generated.STEPS + generated.REDUCERS)
             ]))
        return tuple(dict.fromkeys(words))
