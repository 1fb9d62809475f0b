"""Environment 1: parallel subtasks under a clock (the toy organisation's training environment).

A task is a handful of arithmetic subtasks (`tasks.py`), each with a known work cost and
optional dependencies. The environment does none of the co-ordination: agents pick subtasks
themselves, and a dependent subtask's input is its parent's *result*, which only the agent
whose solve counted sees. One tool, `solve(id, answer)`:
- declared duration: the subtask's work cost, plus any wait for its dependencies (below);
- correct: reward +1 (label `subtask`) and the subtask's result (`s1 correct, result 4`), to
  this caller only; a teammate who needs r1 must be told (message, post or workspace file);
- already solved (by anyone, this caller included): the work time is spent all the same and
  nothing is earned or shown (`s1 already solved`): two agents on one subtask both pay, only
  the first counts. The first is the first call the simulator applies; with clock-ordered
  scheduling (the simulator's turn order following the derived clock) that is the first in
  clock order;
- wrong: reward -wrong_penalty (label `wrong`, default 0: nothing), the work time is spent all
  the same, and after `max_attempts` wrong answers the subtask is closed (no answer-guessing);
- refused with a tool error (no time, no reward): unknown ids, a closed subtask, a subtask
  whose dependency is not solved yet (or closed);
- the episode ends (terminal) once every subtask is solved or closed.
With `check_answers=False` every well-formed solve counts as correct: the task is then pure
scheduling (who works on what, how many to hire under the clock), for models too small to learn
the arithmetic (experiments/bench/RESULTS.md). The organisation drops rewards of calls that
finish after the wall clock, so the reward is the number of subtasks solved in time.

Dependencies on the derived clock. A dependency solved by a teammate finishes at that
teammate's clock. If the caller's clock is earlier, the call's duration includes the wait until
then, so no one builds on work that, on the derived clock, is not finished yet.

The best head-count is computable: `best_hires(task_id, clock_s, max_budget)` and
`max_solved_for(task_id, hires, clock_s)` (schedule.py, with the work time that fits in
clock_s - overhead_s); it assumes results are passed on at no cost in time, as a message is.
Sessions are deterministic; the session seed is unused.

Difficulty tiers (`avalon/envs/tiers.py`): `ParallelSubtasks(config, tiers=(...))` adds easier
tiers below `config` (today's tasks, the top), each setting some of `TIER_FIELDS` (fewer
subtasks, no dependencies, cheaper work, fewer ops, answers unchecked, a longer clock, ...).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from avalon.envs.parallel import schedule
from avalon.envs.parallel.tasks import (
    Op,
    ParallelTask,
    make_task,
    parse_prompt,
    prompt,
    reveal_text,
    signature,
)
from avalon.envs.parallel.teacher import (
    DEFAULT_TEACHER,
    TEACHER_WORDS,
    ParallelTeacherConfig,
    cast,
)
from avalon.envs.table import TieredEnv
from avalon.envs.teacher import Baselines, TeacherPolicy, chance_policy
from avalon.org.env import (
    CallContext,
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
from avalon.org.workspace import Workspace
from avalon.tokenizer.chat import ChatFormat
from avalon.validation import FieldChecks

SOLVE = ToolSpec("solve", "answer one subtask; takes its work time", (
    Param("id", ParamType.STRING, "subtask id, e.g. s2"),
    Param("answer", ParamType.INTEGER, "the result")))
LOOK = ToolSpec("look", "show one subtask's operation and operands", (
    Param("id", ParamType.STRING, "subtask id, e.g. s2"),))


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """Task generation, timing and reward rules (toy defaults: 5-7 subtasks of 1-3 minutes)."""

    n_subtasks: tuple[int, int] = (5, 7)  # inclusive range
    cost_units: tuple[int, int] = (1, 3)  # inclusive range of work units per subtask
    dep_prob: float = 0.3  # chance a subtask depends on one earlier subtask
    max_depth: int = 0  # > 0: parents only among subtasks less deep (1: star-shaped trees)
    ops: tuple[Op, ...] = tuple(Op)
    max_operand: int = 9
    unit_s: float = 60.0  # seconds of work per unit
    clock_s: float = 300.0  # default wall clock (the curriculum passes its own)
    overhead_s: float = 30.0  # planning and token time set aside in best-head-count maths
    max_attempts: int = 2  # wrong answers before a subtask closes
    wrong_penalty: float = 0.0
    check_answers: bool = True  # False: any integer answer is correct (scheduling only)
    # Hidden operands: the prompt lists ids, work and dependencies only; `look(id)` shows a
    # subtask (taking look_s), so what to compute is read close to where it is used.
    inspect: bool = False
    look_s: float = 0.0
    n_train: int = 512
    n_heldout: int = 64
    seed: int = 0

    def __post_init__(self):
        check = FieldChecks("ParallelConfig")
        lo, hi = self.n_subtasks
        if not 1 <= lo <= hi <= schedule.MAX_JOBS:
            check.fail("n_subtasks", self.n_subtasks,
                       f"must be 1 <= lo <= hi <= {schedule.MAX_JOBS}")
        if not 1 <= self.cost_units[0] <= self.cost_units[1]:
            check.fail("cost_units", self.cost_units, "must be 1 <= lo <= hi")
        if not 0 <= self.dep_prob <= 1:
            check.fail("dep_prob", self.dep_prob, "must be in [0, 1]")
        if not self.ops or not all(isinstance(o, Op) for o in self.ops):
            check.fail("ops", self.ops, "must be a non-empty tuple of Op")
        if not 1 <= self.max_operand <= 9:
            check.fail("max_operand", self.max_operand, "must be 1..9")
        for name in ("unit_s", "clock_s"):
            if not getattr(self, name) > 0:
                check.fail(name, getattr(self, name), "must be > 0")
        if self.overhead_s < 0 or self.wrong_penalty < 0:
            check.fail_together({"overhead_s": self.overhead_s,
                                 "wrong_penalty": self.wrong_penalty}, "must both be >= 0")
        if self.max_attempts < 1:
            check.fail("max_attempts", self.max_attempts, "must be >= 1")
        if isinstance(self.max_depth, bool) or not isinstance(self.max_depth, int) or \
                self.max_depth < 0:
            check.fail("max_depth", self.max_depth, "must be an int >= 0")
        if self.look_s < 0:
            check.fail("look_s", self.look_s, "must be >= 0")


# What a difficulty tier may change; the work unit, overhead, attempts, penalty and tools are
# the environment's (the teacher reads work in units of unit_s).
TIER_FIELDS = frozenset({"n_subtasks", "cost_units", "dep_prob", "max_depth", "ops",
                         "max_operand", "check_answers", "clock_s", "n_train", "n_heldout"})


def _make(rng: np.random.Generator, c: ParallelConfig) -> ParallelTask:
    return make_task(rng, n_subtasks=c.n_subtasks, cost_units=c.cost_units,
                     dep_prob=c.dep_prob, ops=c.ops, max_operand=c.max_operand,
                     max_depth=c.max_depth)


class ParallelSession:
    """One rollout of one task (see the module docstring for the rules)."""

    def __init__(self, task_id: str, spec: ParallelTask, clock_s: float, config: ParallelConfig):
        self.spec, self.config = spec, config
        self.by_id = {s.id: s for s in spec.subtasks}
        self.done_at: dict[str, float] = {}  # subtask -> derived clock when it was solved
        self.wrong: dict[str, int] = {}
        self.closed: set[str] = set()
        self.duplicates = 0  # solves of a subtask already solved (work spent for nothing)
        self.solver: dict[str, str] = {}  # subtask -> the agent whose solve counted
        # Dependants solved right by someone other than their parent's solver: the parent's
        # result crossed agents (was passed on, or guessed).
        self.handoffs = 0
        self._task = Task(task_id=task_id,
                          prompt=prompt(spec, clock_s, config.unit_s, hidden=config.inspect),
                          tools=(LOOK, SOLVE) if config.inspect else (SOLVE,),
                          wall_clock_s=clock_s)

    @property
    def task(self) -> Task:
        return self._task

    def on_start(self, budget: int, workspace: Workspace) -> None:
        pass

    def brief(self, agent: str, index: int, title: str, role: str) -> str:
        return ""

    def call(self, tool: str, args: dict, ctx: CallContext) -> ToolOutcome:
        if tool == "look" and self.config.inspect:
            sub = self.by_id.get(args["id"])
            if sub is None:
                raise ToolError(f"no subtask {args['id']!r}; ids are s1..s{len(self.by_id)}")
            return ToolOutcome(reveal_text(sub), duration_s=self.config.look_s)
        if tool != "solve":
            raise ToolError(f"unknown tool {tool!r}")
        sid, answer = args["id"], args["answer"]
        sub = self.by_id.get(sid)
        if sub is None:
            raise ToolError(f"no subtask {sid!r}; ids are s1..s{len(self.by_id)}")
        if sid in self.closed:
            raise ToolError(f"{sid} closed after {self.config.max_attempts} wrong answers")
        for d in sub.after:
            if d in self.closed:
                raise ToolError(f"{sid} needs {d}, which is closed")
            if d not in self.done_at:
                raise ToolError(f"{sid} needs {d} first")
        ready = max((self.done_at[d] for d in sub.after), default=0.0)
        wait = max(0.0, ready - ctx.clock_s)
        duration = wait + sub.units * self.config.unit_s
        waited = f" (waited {round(wait)} for {' '.join(sub.after)})" if wait > 0 else ""
        if sid in self.done_at:  # a second agent on the same subtask: the work, for nothing
            self.duplicates += 1
            return ToolOutcome(f"{sid} already solved{waited}", duration_s=duration)
        if answer == sub.answer or not self.config.check_answers:
            self.done_at[sid] = ctx.clock_s + duration
            self.solver[sid] = ctx.agent
            self.handoffs += any(self.solver[d] != ctx.agent for d in sub.after)
            return ToolOutcome(f"{sid} correct{waited}, result {sub.result}",
                               (EnvReward(1.0, "subtask"),), terminal=self._settled(),
                               duration_s=duration)
        self.wrong[sid] = self.wrong.get(sid, 0) + 1
        text = f"{sid} wrong{waited}"
        if self.wrong[sid] >= self.config.max_attempts:
            self.closed.add(sid)
            text += ", closed"
        rewards = (EnvReward(-self.config.wrong_penalty, "wrong"),) if \
            self.config.wrong_penalty else ()
        return ToolOutcome(text, rewards, terminal=self._settled(), duration_s=duration)

    def _settled(self) -> bool:
        return len(self.done_at) + len(self.closed) == len(self.by_id)

    def on_end(self, ctx: EndContext) -> FinalOutcome:
        cap = self._task.wall_clock_s
        in_time = sum(t <= cap for t in self.done_at.values())
        return FinalOutcome(metrics={"subtasks": float(len(self.by_id)),
                                     "solved": float(in_time),  # by the clock: rewarded
                                     # the learning-progress sampler's success rate
                                     "success": in_time / len(self.by_id),
                                     "solved_late": float(len(self.done_at) - in_time),
                                     "wrong": float(sum(self.wrong.values())),
                                     "closed": float(len(self.closed)),
                                     "duplicates": float(self.duplicates),
                                     "handoffs": float(self.handoffs)})


class ParallelSubtasks(TieredEnv[ParallelConfig, ParallelTask, ParallelSession]):
    """Environment 1 (see the module docstring). `config` is the top tier (today's tasks);
    `tiers` the easier ones below it, easiest first (`avalon/envs/tiers.py`)."""

    name = "parallel"

    def __init__(self, config: ParallelConfig = ParallelConfig(),
                 tiers: Sequence[Mapping] = ()):
        super().__init__(config, _make, signature, tiers=tiers, tier_fields=TIER_FIELDS)

    def _open(self, task_id: str, spec: ParallelTask, seed: int, clock_s: float,
              config: ParallelConfig) -> ParallelSession:
        return ParallelSession(task_id, spec, clock_s, config)

    def horizon(self, clock_s: float) -> int:
        """Work units that fit in the clock after the overhead."""
        return schedule.horizon_units(clock_s, self.config.unit_s, self.config.overhead_s)

    def max_solved_for(self, task_id: str, hires: int, clock_s: float | None = None) -> int:
        """The most subtasks hires + 1 workers (the CEO works too) solve in time."""
        _, spec, clock = self._lookup(task_id, clock_s)
        return schedule.max_solved(spec.costs(), spec.deps(), hires + 1, self.horizon(clock))

    def best_hires(self, task_id: str, clock_s: float | None = None, max_budget: int = 8) -> int:
        """The fewest hires that solve the most subtasks in time (budget permitting)."""
        _, spec, clock = self._lookup(task_id, clock_s)
        return schedule.best_headcount(spec.costs(), spec.deps(), self.horizon(clock),
                                       max_budget)

    def teacher(self, chat: ChatFormat,
                config: ParallelTeacherConfig = DEFAULT_TEACHER) -> TeacherPolicy:
        """The scripted teacher organisation (`teacher.py`), as an org Policy."""
        return TeacherPolicy(chat, cast(self.config.unit_s, self.config.overhead_s, config))

    def baselines(self, chat: ChatFormat) -> Baselines:
        """The reference organisations (`avalon/envs/teacher.py`): chance answers uniform in
        0..81 on random subtasks; the teacher alone, silent, and whole (one hire and three
        solves per turn, so turns fit a toy window's 96-token cap)."""
        unit = self.config.unit_s

        def draw(context: str, rng: np.random.Generator) -> tuple:
            ids = [s.id for s in parse_prompt(context, unit)[0].subtasks]
            return "solve", {"id": ids[int(rng.integers(len(ids)))],
                             "answer": int(rng.integers(0, 82))}

        # as many calls as the largest tier's subtasks can take
        n = max(c.n_subtasks[1] for c in self.tasks.configs) * self.config.max_attempts
        small = dict(hires_per_turn=1, solves_per_turn=3)
        return Baselines(
            chance=lambda: chance_policy(chat, draw, n),
            single=lambda: self.teacher(chat, ParallelTeacherConfig(**small)),
            org_silent=lambda: self.teacher(chat, ParallelTeacherConfig(silent=True, **small)),
            org=lambda: self.teacher(chat, ParallelTeacherConfig(**small)))

    def optimum(self, task_id: str, clock_s: float, budget: int) -> float:
        """The most subtasks any organisation of at most `budget` hires solves in time."""
        return float(self.max_solved_for(task_id, self.best_hires(task_id, clock_s, budget),
                                         clock_s))

    def vocabulary(self) -> tuple[str, ...]:
        """The top tier's words first (a one-tier environment's are today's), then any other
        tier's."""
        words = [w for c in (self.config, *self.tasks.configs) for w in _words(c)]
        return tuple(dict.fromkeys(w for w in words + list(TEACHER_WORDS) if len(w) >= 2))


def _words(config: ParallelConfig) -> list[str]:
    """The words of one tier's prompts and results."""
    n = config.n_subtasks[1]
    words = ["Subtasks", "work", "after", "Clock", "Call", "solve", "with", "id", "and",
             "answer", "each", "correct", "subtask", "before", "the", "clock", "scores",
             "wrong", "closed", "waited", "for", "no", "ids", "are", "already", "solved",
             "needs", "first", "which", "is", "look", "to", "see", "result", "shows", "its",
             "solver", *(o.value for o in Op)]
    words += [f"s{i}" for i in range(1, n + 1)] + [f"r{i}" for i in range(1, n + 1)]
    words += [str(i) for i in range(10, 100)]
    span = range(config.cost_units[0], config.cost_units[1] + 1)
    words += [str(round(u * config.unit_s)) for u in span]
    words += [str(round(config.clock_s))]
    return words
