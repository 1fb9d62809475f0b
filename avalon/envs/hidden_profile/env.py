"""Environment 2: hidden profile. Facts are spread across specialists' briefs; only pooling
them identifies the answer.

A task has three options and facts `<option> good <attribute>` / `<option> bad <attribute>`.
The best option has the most good minus bad facts over *all* facts. The CEO's prompt (which
specialists also read) holds the shared facts; m "analysts" (m in `n_holders`) each hold a
private set, dealt through `EnvSession.brief`: the specialist hired i-th (index i >= 1) gets
holder (i - 1) mod m's facts; the CEO's brief is empty.

The construction (scores are good minus bad). Shared facts give the three options the scores
+1, 0 and -1 (one good fact, a good/bad pair, one bad fact) in a random order, so the answer's
rank on the shared facts is uniform: no fixed rule on the shared facts (top, middle, bottom, most
or fewest facts, prompt position) beats chance (the leak probe in tests/envs/
test_hidden_profile.py, over 1,000 tasks). Each holder has one fact per option, good or bad, drawn
uniformly among the deals under which all m holders pooled make the answer the strict top and
the fewest proper subsets of holders already do (for most shared orders none or one of them).
So pooling every brief identifies the answer; the shared facts alone are right a third of the
time and a subset of the holders little more often. Option order, attributes and fact order
are random per task.

Tool: `choose(option)`, CEO only (not grantable), terminal: reward 1 (label `correct`) for the
answer, nothing otherwise; one choice per session. Sessions are deterministic (the seed is
unused).

Difficulty tiers (`avalon/envs/tiers.py`): `HiddenProfile(config, tiers=(...))` adds easier
tiers below `config` (today's tasks, the top), each setting some of `TIER_FIELDS`: two options
instead of three (`n_options`), one analyst or none (`n_holders`; with none the answer tops
the shared facts, the task is the tally alone), a clock. `tasks._shared_scores` says how the
shared facts are drawn then; every tier keeps the invariant that pooling every brief
identifies the answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from avalon.envs.hidden_profile.tasks import (
    ATTRIBUTES,
    OPTIONS,
    ProfileTask,
    brief_text,
    make_task,
    prompt,
    signature,
)
from avalon.envs.hidden_profile.teacher import OPTIONS_LINE, TEACHER_WORDS, cast
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

CHOOSE = ToolSpec("choose", "give the final answer (once)", (
    Param("option", ParamType.STRING, "one of the options"),), grantable=False)


@dataclasses.dataclass(frozen=True)
class ProfileConfig:
    n_holders: tuple[int, int] = (2, 3)  # inclusive range of analysts holding facts
    n_options: int = 3  # 2: an easier tier (see `tasks._shared_scores`)
    clock_s: float = 600.0
    n_train: int = 512
    n_heldout: int = 64
    seed: int = 0

    def __post_init__(self):
        check = FieldChecks("ProfileConfig")
        lo, hi = self.n_holders
        if not 0 <= lo <= hi <= 4:
            check.fail("n_holders", self.n_holders,
                       "must be 0 <= lo <= hi <= 4 (attributes run out beyond)")
        if self.n_options not in (2, 3):
            check.fail("n_options", self.n_options, "must be 2 or 3")
        if not self.clock_s > 0:
            check.fail("clock_s", self.clock_s, "must be > 0")


# What a difficulty tier may change (the rest is the environment's).
TIER_FIELDS = frozenset({"n_holders", "n_options", "clock_s", "n_train", "n_heldout"})


def _make(rng: np.random.Generator, config: ProfileConfig) -> ProfileTask:
    return make_task(rng, config.n_holders, config.n_options)


class ProfileSession:
    def __init__(self, task_id: str, spec: ProfileTask, clock_s: float):
        self.spec = spec
        self.choice: str | None = None
        self._task = Task(task_id=task_id, prompt=prompt(spec), tools=(CHOOSE,),
                          wall_clock_s=clock_s)

    @property
    def task(self) -> Task:
        return self._task

    def on_start(self, budget: int, workspace: Workspace) -> None:
        pass

    def brief(self, agent: str, index: int, title: str, role: str) -> str:
        if index == 0 or not self.spec.held:  # the CEO, or a task where nobody holds facts
            return ""
        return brief_text(self.spec.held[(index - 1) % len(self.spec.held)])

    def call(self, tool: str, args: dict, ctx: CallContext) -> ToolOutcome:
        if tool != "choose":
            raise ToolError(f"unknown tool {tool!r}")
        if self.choice is not None:
            raise ToolError(f"already chose {self.choice}")
        option = args["option"].strip().lower()
        if option not in self.spec.options:
            raise ToolError(f"no option {args['option']!r}; options: "
                            f"{', '.join(self.spec.options)}")
        self.choice = option
        right = option == self.spec.answer
        return ToolOutcome(f"chose {option}", (EnvReward(1.0, "correct"),) if right else (),
                           terminal=True)

    def on_end(self, ctx: EndContext) -> FinalOutcome:
        return FinalOutcome(metrics={"chose": float(self.choice is not None),
                                     "correct": float(self.choice == self.spec.answer)})


class HiddenProfile(TieredEnv[ProfileConfig, ProfileTask, ProfileSession]):
    """Environment 2 (see the module docstring). `config` is the top tier (today's tasks);
    `tiers` the easier ones below it, easiest first (`avalon/envs/tiers.py`)."""

    name = "hidden_profile"

    def __init__(self, config: ProfileConfig = ProfileConfig(), tiers: Sequence[Mapping] = ()):
        super().__init__(config, _make, signature, tiers=tiers, tier_fields=TIER_FIELDS)

    def _open(self, task_id: str, spec: ProfileTask, seed: int, clock_s: float,
              config: ProfileConfig) -> ProfileSession:
        return ProfileSession(task_id, spec, clock_s)

    def teacher(self, chat: ChatFormat, silent: bool = False) -> TeacherPolicy:
        """The scripted teacher organisation (`teacher.py`); `silent`: nobody reports."""
        return TeacherPolicy(chat, lambda start: cast(start, silent))

    def baselines(self, chat: ChatFormat) -> Baselines:
        """Reference organisations: chance picks an option at random; the single agent and the
        silent organisation choose on the shared facts; the teacher pools every brief."""
        def draw(context: str, rng: np.random.Generator) -> tuple:
            options = OPTIONS_LINE.search(context).group(1).split(", ")
            return "choose", {"option": options[int(rng.integers(len(options)))]}

        return Baselines(chance=lambda: chance_policy(chat, draw, 1),
                         single=lambda: self.teacher(chat),
                         org_silent=lambda: self.teacher(chat, silent=True),
                         org=lambda: self.teacher(chat))

    def optimum(self, task_id: str, clock_s: float, budget: int) -> float | None:
        """1 when the budget hires every holder (pooling decides), else not computed."""
        return 1.0 if budget >= len(self.spec(task_id).held) else None

    def vocabulary(self) -> tuple[str, ...]:
        words = ["Choose", "the", "best", "of", "one", "with", "most", "good", "minus", "bad",
                 "facts", "Known", "analysts", "each", "hold", "more", "Answer", "choose",
                 "Your", "chose", "already", "no", "option", "options", *OPTIONS, *ATTRIBUTES,
                 *TEACHER_WORDS]
        if any(c.n_holders[0] <= 1 for c in self.tasks.configs):
            words += ["analyst", "holds"]  # "1 analyst holds more facts."
        return tuple(dict.fromkeys(words))
