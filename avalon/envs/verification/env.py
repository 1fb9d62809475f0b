"""Environment 5: collective verification. Work results carry hidden defects; only another
agent's review finds them; shipping a defect costs more than leaving the item out.

A task is n items p1..pn, each with a work cost. Tools:
- `build(id)` (grantable): takes the item's work time and yields a fresh *result*, a code
  shown only to the builder (`p2 built 47`). Each build is defective with the task's known
  rate (`defect_rates`: one per task, stated in the prompt), independently (rebuilding draws
  again);
- `review(id, result)` (grantable): takes `review_s`; by an agent other than the result's
  builder it tells the truth (`p2 47 defect` / `p2 47 ok`); by the builder it finds nothing
  (`p2 47 no defect found (own work)`), whatever the truth: one cannot check one's own work;
- `ship(id, result)` (CEO only): once per item, takes `ship_s`: +1 (label `shipped`) for a
  sound result, -defect_cost (label `defect`, default 2) for a defective one. An item left
  out pays 0, so a blind ship is worth 1 - (1 + defect_cost) * defect_rate (0.4, 0.1 or -0.2 at
  the default rates): little or less than nothing, while a reviewed one is worth 1.
Results are codes (10..99) the CEO must be given (a message, post or file): builders' results
reach the CEO only if someone passes them on. A result code that was never built for the item
is a tool error and counts as a wrong code; after `max_wrong_codes` of them the item closes
(no guessing). The episode ends (terminal) when every item is shipped or closed.

Randomness: the k-th build of item i is defective with a draw from `default_rng([seed, task,
i, k])` and its code from the same stream, so the outcomes depend only on the session seed, the
task and how often each item was built (not on call order or on reviews). With a shared
session seed, every rollout of a group meets the same defects (common random numbers).

Ground truth: the session's final outcome carries a `record` (logged in the `end` event as
`env_record`) of every build in call order (`item`, `code`, `builder`, `defective`) and of what
was shipped, so the analysis can check each review's verdict against the build's true defect
(`avalon/analysis/reviews.py`).

Difficulty tiers (`avalon/envs/tiers.py`): `Verification(config, tiers=(...))` adds easier tiers
below `config` (today's tasks, the top), each setting some of `TIER_FIELDS`: fewer items,
cheaper work, lower defect rates (at 0 a blind ship always pays: the task is build, pass the
code on, ship), a clock, and its own task counts (an easy tier's task space is small: a task
is its items' work and its defect rate).
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from avalon.envs.table import TieredEnv
from avalon.envs.teacher import Baselines, TeacherPolicy, chance_policy
from avalon.envs.verification.teacher import (
    DEFAULT_TEACHER,
    ITEMS,
    TEACHER_WORDS,
    VerifyTeacherConfig,
    cast,
)
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

_ID = Param("id", ParamType.STRING, "item id, e.g. p2")
_RESULT = Param("result", ParamType.STRING, "a build's result code, e.g. 47")
BUILD = ToolSpec("build", "build one item; takes its work time; shows its result", (_ID,))
REVIEW = ToolSpec("review", "check a teammate's result for a defect; takes time", (_ID, _RESULT))
SHIP = ToolSpec("ship", "ship one item's result, once", (_ID, _RESULT), grantable=False)


@dataclasses.dataclass(frozen=True)
class VerificationConfig:
    n_items: tuple[int, int] = (3, 6)  # inclusive range
    cost_units: tuple[int, int] = (1, 3)
    unit_s: float = 40.0
    defect_rates: tuple[float, ...] = (0.2, 0.3, 0.4)  # one per task, stated in its prompt
    defect_cost: float = 2.0  # shipping a defect costs this; an item left out pays 0
    review_s: float = 20.0
    ship_s: float = 5.0
    max_wrong_codes: int = 2
    clock_s: float = 480.0
    n_train: int = 512
    n_heldout: int = 64
    seed: int = 0

    def __post_init__(self):
        check = FieldChecks("VerificationConfig")
        lo, hi = self.n_items
        if not 1 <= lo <= hi <= 9:
            check.fail("n_items", self.n_items, "must be 1 <= lo <= hi <= 9")
        if not 1 <= self.cost_units[0] <= self.cost_units[1]:
            check.fail("cost_units", self.cost_units, "must be 1 <= lo <= hi")
        if not self.defect_rates or not all(0 <= q < 1 for q in self.defect_rates):
            check.fail("defect_rates", self.defect_rates,
                       "must be a non-empty tuple of rates in [0, 1)")
        if not self.defect_cost > 0:
            check.fail("defect_cost", self.defect_cost,
                       "must be > 0 (more than a missed item pays)")
        for name in ("unit_s", "review_s", "ship_s", "clock_s"):
            if not getattr(self, name) > 0:
                check.fail(name, getattr(self, name), "must be > 0")
        if self.max_wrong_codes < 1:
            check.fail("max_wrong_codes", self.max_wrong_codes, "must be >= 1")

    def blind_value(self, defect_rate: float) -> float:
        """Expected reward of shipping an unreviewed result."""
        return 1 - (1 + self.defect_cost) * defect_rate


@dataclasses.dataclass(frozen=True)
class VerificationTask:
    units: tuple[int, ...]  # work units of p1..pn
    defect_rate: float


# What a difficulty tier may change; work unit, review and ship times, the defect cost and the
# wrong-code limit are the environment's.
TIER_FIELDS = frozenset({"n_items", "cost_units", "defect_rates", "clock_s", "n_train",
                         "n_heldout"})


def make_task(rng: np.random.Generator, config: VerificationConfig) -> VerificationTask:
    n = int(rng.integers(config.n_items[0], config.n_items[1] + 1))
    lo, hi = config.cost_units
    units = tuple(int(u) for u in rng.integers(lo, hi + 1, size=n))
    return VerificationTask(units, config.defect_rates[int(rng.integers(len(config.defect_rates)))])


def prompt(task: VerificationTask, config: VerificationConfig, clock_s: float) -> str:
    items = "; ".join(f"p{i + 1} work {round(u * config.unit_s)}"
                      for i, u in enumerate(task.units))
    return (f"Items: {items}. Clock {round(clock_s)}. build id shows a result code; "
            f"{round(task.defect_rate * 100)} percent of builds are defective. review id "
            f"result by someone else finds a defect ({round(config.review_s)} s); the builder "
            f"finds none. ship id result: sound scores 1, defective costs "
            f"{config.defect_cost:g}, unshipped 0.")


@dataclasses.dataclass
class _Build:
    item: str
    code: str
    builder: str
    defective: bool

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class VerificationSession:
    def __init__(self, task_id: str, spec: VerificationTask, seed: int, clock_s: float,
                 config: VerificationConfig):
        self.spec, self.config = spec, config
        self.key = zlib.crc32(task_id.encode())
        self.seed = seed
        self.ids = [f"p{i + 1}" for i in range(len(spec.units))]
        self.builds: dict[str, dict[str, _Build]] = {i: {} for i in self.ids}
        self.built: list[_Build] = []  # every build in call order (the end record)
        self.ships: list[_Build] = []  # what was shipped, in order
        self.shipped: dict[str, bool] = {}  # item -> shipped result was defective
        self.closed: set[str] = set()
        self.wrong: dict[str, int] = {}
        self.reviews = 0  # by another agent (the ones that can find something)
        self.self_reviews = 0
        self.found = 0  # defects a review found
        self._task = Task(task_id=task_id, prompt=prompt(spec, config, clock_s),
                          tools=(BUILD, REVIEW, SHIP), wall_clock_s=clock_s)

    @property
    def task(self) -> Task:
        return self._task

    def on_start(self, budget: int, workspace: Workspace) -> None:
        pass

    def brief(self, agent: str, index: int, title: str, role: str) -> str:
        return ""

    def _item(self, args: dict) -> str:
        item = args["id"].strip()
        if item not in self.builds:
            raise ToolError(f"no item {args['id']!r}; items are p1..p{len(self.ids)}")
        if item in self.closed:
            raise ToolError(f"{item} is closed after {self.config.max_wrong_codes} wrong codes")
        return item

    def _build_of(self, item: str, args: dict) -> _Build:
        b = self.builds[item].get(args["result"].strip())
        if b is None:
            self.wrong[item] = self.wrong.get(item, 0) + 1
            if self.wrong[item] >= self.config.max_wrong_codes:
                self.closed.add(item)
            raise ToolError(f"{item} has no result {args['result']!r}")
        return b

    def call(self, tool: str, args: dict, ctx: CallContext) -> ToolOutcome:
        if tool == "build":
            item = self._item(args)
            if item in self.shipped:
                raise ToolError(f"{item} is already shipped")
            k = len(self.builds[item])
            rng = np.random.default_rng([self.seed, self.key, self.ids.index(item), k])
            defective = bool(rng.random() < self.spec.defect_rate)
            taken = {b.code for b in self.builds[item].values()}
            code = next(c for c in (str(int(x)) for x in rng.permutation(90) + 10)
                        if c not in taken)
            self.builds[item][code] = _Build(item, code, ctx.agent, defective)
            self.built.append(self.builds[item][code])
            units = self.spec.units[self.ids.index(item)]
            return ToolOutcome(f"{item} built {code}", duration_s=units * self.config.unit_s)
        if tool == "review":
            item = self._item(args)
            b = self._build_of(item, args)
            if b.builder == ctx.agent:
                self.self_reviews += 1
                return ToolOutcome(f"{item} {b.code} no defect found (own work)",
                                   duration_s=self.config.review_s)
            self.reviews += 1
            self.found += b.defective
            verdict = "defect" if b.defective else "ok"
            return ToolOutcome(f"{item} {b.code} {verdict}", duration_s=self.config.review_s)
        if tool != "ship":
            raise ToolError(f"unknown tool {tool!r}")
        item = self._item(args)
        if item in self.shipped:
            raise ToolError(f"{item} is already shipped")
        b = self._build_of(item, args)
        self.shipped[item] = b.defective
        self.ships.append(b)
        reward = EnvReward(-self.config.defect_cost, "defect") if b.defective else \
            EnvReward(1.0, "shipped")
        settled = len(self.shipped) + len(self.closed - set(self.shipped)) == len(self.ids)
        return ToolOutcome(f"{item} shipped", (reward,), terminal=settled,
                           duration_s=self.config.ship_s)

    def on_end(self, ctx: EndContext) -> FinalOutcome:
        sound = sum(not d for d in self.shipped.values())
        return FinalOutcome(metrics={
            "items": float(len(self.ids)), "shipped": float(len(self.shipped)),
            "shipped_defects": float(sum(self.shipped.values())),
            "success": sound / len(self.ids), "reviews": float(self.reviews),
            "self_reviews": float(self.self_reviews), "defects_found": float(self.found),
            "builds": float(sum(len(b) for b in self.builds.values()))},
            # Ground truth for review quality (avalon/analysis/reviews.py): every build in call
            # order with its builder and whether it was defective, and what was shipped.
            record={"builds": [b.to_json() for b in self.built],
                    "shipped": [b.to_json() for b in self.ships]})


class Verification(TieredEnv[VerificationConfig, VerificationTask, VerificationSession]):
    """Environment 5 (see the module docstring). Sessions use their seed for defects and
    result codes. `config` is the top tier (today's tasks); `tiers` the easier ones below it,
    easiest first (`avalon/envs/tiers.py`)."""

    name = "verification"

    def __init__(self, config: VerificationConfig = VerificationConfig(),
                 tiers: Sequence[Mapping] = ()):
        super().__init__(config, make_task, dataclasses.astuple, tiers=tiers,
                         tier_fields=TIER_FIELDS)

    def _open(self, task_id: str, spec: VerificationTask, seed: int, clock_s: float,
              config: VerificationConfig) -> VerificationSession:
        return VerificationSession(task_id, spec, seed, clock_s, config)

    def teacher(self, chat: ChatFormat,
                config: VerifyTeacherConfig = DEFAULT_TEACHER) -> TeacherPolicy:
        """The scripted teacher organisation (`teacher.py`)."""
        return TeacherPolicy(chat, cast(self.config, config))

    def baselines(self, chat: ChatFormat) -> Baselines:
        """Reference organisations: chance builds and ships at random; the single agent builds
        and ships blind (worth it only while `blind_value` > 0); the silent organisation's
        hires build but their results never reach the CEO, so it does as the single agent; the
        teacher always hires a verifier."""
        def draw(context: str, rng: np.random.Generator) -> tuple:
            n = len(ITEMS.findall(context))
            item = f"p{int(rng.integers(n)) + 1}"
            if rng.random() < 0.5:
                return "build", {"id": item}
            return "ship", {"id": item, "result": str(int(rng.integers(10, 100)))}

        n = max(c.n_items[1] for c in self.tasks.configs) * 2  # the largest tier's
        return Baselines(
            chance=lambda: chance_policy(chat, draw, n),
            single=lambda: self.teacher(chat),
            org_silent=lambda: self.teacher(chat, VerifyTeacherConfig(silent=True,
                                                                      hires_per_turn=1)),
            org=lambda: self.teacher(chat, VerifyTeacherConfig(verifier_rate=1.0,
                                                               hires_per_turn=1)))

    def optimum(self, task_id: str, clock_s: float, budget: int) -> float | None:
        return None  # depends on the defects drawn; the teacher's score is the reference

    def vocabulary(self) -> tuple[str, ...]:
        """The top tier's words first (a one-tier environment's are today's), then any other
        tier's."""
        words = [w for c in (self.config, *self.tasks.configs) for w in _words(c)]
        return tuple(dict.fromkeys(w for w in words + list(TEACHER_WORDS) if len(w) >= 2))


def _words(config: VerificationConfig) -> list[str]:
    """The words of one tier's prompts and results."""
    words = re.findall(r"[A-Za-z0-9_]{2,}", prompt(VerificationTask((1,), 0.5), config,
                                                    config.clock_s))
    words += ["built", "defect", "ok", "no", "found", "own", "work", "shipped", "has",
              "result", "item", "items", "are", "is", "closed", "after", "wrong", "codes",
              "already", "unknown", "tool"]
    words += [f"p{i}" for i in range(1, 10)] + [str(i) for i in range(10, 100)]
    span = range(config.cost_units[0], config.cost_units[1] + 1)
    words += [str(round(u * config.unit_s)) for u in span]
    words += [str(round(q * 100)) for q in config.defect_rates]
    return words
