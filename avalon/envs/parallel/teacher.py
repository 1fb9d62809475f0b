"""The scripted teacher organisation of the parallel-subtasks environment.

The CEO reads the subtasks and clock from its role card and the budget from its first
observation, picks a head-count h (`HirePolicy`), and plans an optimal schedule for h + 1
workers (`schedule.plan`; the CEO works too). Its first turn (plan mode) states the plan and
hires; each hire's role is its list and whom to tell, e.g. `Do s2 s5. Tell a3 after s2.`
(at most `hires_per_turn` hires per turn, so turns fit toy windows). Subtasks the plan cannot fit
in time go to the end of the CEO's own list when it holds their dependencies (the clock may
allow them; late ones earn nothing).

Every worker then solves its list in order. A dependent subtask needs its parent's result (a
correct solve shows it to its solver only: `s2 correct, result 4`). One whose parent belongs to
a teammate waits (`wait_for_messages`) for that teammate's DM (`s2 result 4` or `s2 failed`); a
worker DMs those it must tell once it sees the result, and never solves a subtask in the same
turn as the parent whose result it needs. A wrong answer is retried until the subtask closes.
Specialists report to the CEO when their list is done; the CEO sends its final message once its
own list is done and every hire has reported (a task whose subtasks are all settled ends
earlier, by the environment's terminal event).

Why batches. A message is delivered at the receiver's next turn boundary and moves its clock up
to the sender's (SPEC §2), so a DM or report reaching a worker that is still mid-list on the
derived clock would delay the rest of its list. So a worker issues, in one turn, every solve it
can run in order (up to `solves_per_turn`), ending the turn early only right after a subtask a
teammate waits for (to tell them promptly) or before one that waits for a teammate; the CEO
takes the list least exposed to messages, hires busy specialists first (idle ones, under a
budget-spending policy, after its own work started) and starts its own work in the turn of its
last busy hires. With these, the teacher reaches the schedule's optimum (tests/envs/
test_parallel.py checks it task by task).

Hidden operands (`ParallelConfig.inspect`): a worker first `look`s at the next batch of its
subtasks and solves them in its following turn (with the looks of the batch after), reading
each operation and its operands from the observation just delivered.

The silent organisation (`ParallelTeacherConfig(silent=True)`, the `org_silent` baseline of
`avalon/tools/env_baselines.py`): it hires and works in parallel but never messages, reports or
reads a trace, so no result crosses agents. Its plan keeps each dependency tree on one worker
(`silent_plan`: trees by total work, longest first, to the least-loaded worker, each worker's
share ordered by the exact one-worker schedule); the CEO never waits for reports (the episode
ends when every agent waits, or by the clock).

Knobs (`ParallelTeacherConfig`), to leave SFT room for RL to improve:
- `hire_policy`: BEST (the fewest hires that solve the most), RANDOM (h uniform in 0..budget),
  ALL (the whole budget);
- `answer_error_rate`: the chance each answer is off by one.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from avalon.envs.parallel import schedule
from avalon.envs.parallel.tasks import RESULT, ParallelTask, parse_prompt, parse_reveal
from avalon.envs.teacher import Start, budget, dms, reports, results
from avalon.org.policy import AgentView, Step
from avalon.validation import FieldChecks

MAX_HIRES = 8
TEACHER_WORDS = ("Plan", "Do", "Tell", "done", "failed", "Solver", "Stand", "by", "none",
                 "hire", "title", "role", "tools", "dm", "to", "text", "wait_for_messages",
                 "look",
                 "report_to_ceo", "status", "final_message", "ceo",
                 *(f"a{i}" for i in range(1, MAX_HIRES + 1)))


class HirePolicy(enum.Enum):
    BEST = "best"
    RANDOM = "random"
    ALL = "all"


@dataclasses.dataclass(frozen=True)
class ParallelTeacherConfig:
    hire_policy: HirePolicy = HirePolicy.BEST
    answer_error_rate: float = 0.0
    hires_per_turn: int = 2
    solves_per_turn: int = 4  # with DMs, a turn stays under a toy window's 128-token turn cap
    silent: bool = False  # no messages, reports or trace reads (see the module docstring)

    def __post_init__(self):
        check = FieldChecks("ParallelTeacherConfig")
        if not 0 <= self.answer_error_rate <= 1:
            check.fail("answer_error_rate", self.answer_error_rate, "must be in [0, 1]")
        if self.hires_per_turn < 1 or self.solves_per_turn < 1:
            check.fail_together({"hires_per_turn": self.hires_per_turn,
                                 "solves_per_turn": self.solves_per_turn}, "must both be >= 1")


DEFAULT_TEACHER = ParallelTeacherConfig()


def _call(name: str, **args) -> tuple[str, dict]:
    return name, args


def _take(calls: list, n: int) -> list:
    """Removes and returns the first n calls."""
    out = calls[:n]
    del calls[:n]
    return out


class Worker:
    """Solves a list of subtasks in order, in batches; tells teammates what it settled."""

    def __init__(self, task: ParallelTask, todo: list[str], tell: dict[str, list[str]],
                 error_rate: float):
        self.by_id = {s.id: s for s in task.subtasks}
        self.hidden = any(s.op is None for s in task.subtasks)
        self.looking: set[str] = set()  # looked at, result not seen yet
        self.todo, self.tell, self.error_rate = list(todo), tell, error_rate
        self.results: dict[str, int] = {}  # subtask -> its result (own solves and DMs)
        self.known_done: set[str] = set()
        self.known_failed: set[str] = set()
        self.solved: list[str] = []
        self.outbox: list[tuple[str, str]] = []  # (agent, text) DMs to send

    def _settle(self, sid: str, ok: bool, result: int | None = None) -> None:
        (self.known_done if ok else self.known_failed).add(sid)
        if ok:
            self.solved.append(sid)
        if result is not None:
            self.results[sid] = result
        if sid in self.todo:
            self.todo.remove(sid)
        for agent in self.tell.get(sid, []):
            text = f"{sid} result {result}" if ok and result is not None else f"{sid} failed"
            self.outbox.append((agent, text))

    def observe(self, obs: str) -> None:
        for r in results(obs):
            if r.tool == "look" and not r.error:
                seen = parse_reveal(r.text)
                if seen is not None and seen[0] in self.by_id:
                    sid, op, a, b = seen
                    self.by_id[sid] = dataclasses.replace(self.by_id[sid], op=op, a=a, b=b)
                    self.looking.discard(sid)
                continue
            if r.tool != "solve":
                continue
            sid = r.text.split(" ", 1)[0]
            if sid not in self.by_id:
                continue
            got = RESULT.match(r.text)
            if not r.error and got is not None:
                self._settle(sid, True, int(got.group(2)))
            elif "already solved" in r.text:
                self._settle(sid, True)
            elif "closed" in r.text and "needs" not in r.text:
                self._settle(sid, False)
        for _, text in dms(obs):
            parts = text.split()
            if len(parts) == 3 and parts[0] in self.by_id and parts[1] == "result" and \
                    parts[2].isdigit():
                self.known_done.add(parts[0])
                self.results[parts[0]] = int(parts[2])
            elif len(parts) == 2 and parts[0] in self.by_id and parts[1] == "failed":
                self.known_failed.add(parts[0])

    def calls(self, rng: np.random.Generator, max_solves: int) -> tuple[list, bool]:
        """This turn's calls and whether the list is finished (see the module docstring)."""
        out: list = []
        batch: list = []
        # DMs carrying results weigh about a solve each: fewer solves in a turn that sends them.
        max_solves = max(1, max_solves - max(0, len(self.outbox) - 1))
        for sid in list(self.todo):
            sub = self.by_id[sid]
            if any(d in self.known_failed for d in sub.after):
                self._settle(sid, False)
                continue
            # A parent's result is known only once its solve (or a DM) came back: never in
            # the turn that solves the parent.
            if len(batch) == max_solves or not all(d in self.results for d in sub.after):
                break
            if sub.op is None:  # hidden operands: look first, solve next turn
                break
            answer = sub.answer_with(self.results.get(sub.a_from or "")) + (
                1 if rng.random() < self.error_rate else 0)
            batch.append(_call("solve", id=sid, answer=answer))
            if self.tell.get(sid):
                break
        out = [_call("dm", to=a, text=t) for a, t in self.outbox]
        self.outbox = []
        looks = self._looks(max_solves) if self.hidden else []
        if batch or looks:
            return out + batch + looks, False
        if self.todo:
            return out + [_call("wait_for_messages")], False
        return out, True


    def _looks(self, n: int) -> list:
        """Looks at the next `n` unseen subtasks of the list (in order)."""
        out = []
        for sid in self.todo:
            if len(out) == n:
                break
            if self.by_id[sid].op is None and sid not in self.looking:
                self.looking.add(sid)
                out.append(_call("look", id=sid))
        return out


def _assign(plan: schedule.Plan, task: ParallelTask, hires: int) -> list[list[str]]:
    """Subtask lists for [ceo, a1, ..., a_hires], busy hires before idle ones.

    The CEO takes the worker least exposed to messages (one that waits for no teammate, then
    one no teammate waits for, then the one that finishes first: the most slack for
    co-ordination), plus the subtasks the plan leaves out whose dependencies it holds itself
    (it tries them after its list, in case the clock allows)."""
    costs, deps = task.costs(), task.deps()
    worker = {j: w for j, w, _ in plan.starts}

    def waits(w: int) -> bool:
        return any(worker.get(d, w) != w for j in plan.jobs_of(w) for d in deps[j])

    def waited_for(w: int) -> bool:
        return any(worker.get(j, w) != w for j in range(len(deps)) for d in deps[j]
                   if worker.get(d) == w)

    order = sorted(range(plan.workers),
                   key=lambda w: (waits(w), waited_for(w), plan.finish_of(w, costs), w))
    ids = [s.id for s in task.subtasks]
    lists = [[ids[j] for j in plan.jobs_of(w)] for w in order]
    for j in range(len(ids)):
        if j not in worker and all(ids[d] in lists[0] for d in deps[j]):
            lists[0].append(ids[j])
    lists = [lists[0]] + sorted(lists[1:], key=lambda lst: not lst)
    return lists + [[] for _ in range(hires + 1 - len(lists))]


def _tells(task: ParallelTask, lists: list[list[str]], agents: list[str]) -> list[dict]:
    owner = {sid: agents[i] for i, lst in enumerate(lists) for sid in lst}
    tells: list[dict[str, list[str]]] = [{} for _ in lists]
    for i, lst in enumerate(lists):
        for sid in lst:
            for d in next(s for s in task.subtasks if s.id == sid).after:
                if owner.get(d, agents[i]) != agents[i]:
                    src = agents.index(owner[d])
                    tells[src].setdefault(d, [])
                    if agents[i] not in tells[src][d]:
                        tells[src][d].append(agents[i])
    return tells


def role_text(todo: list[str], tell: dict[str, list[str]]) -> str:
    if not todo:
        return "Stand by."
    text = f"Do {' '.join(todo)}."
    for sid, agents in tell.items():
        text += "".join(f" Tell {a} after {sid}." for a in agents)
    return text


def parse_role(role: str) -> tuple[list[str], dict[str, list[str]]]:
    todo: list[str] = []
    tell: dict[str, list[str]] = {}
    for sentence in role.split("."):
        words = sentence.split()
        if words[:1] == ["Do"]:
            todo = words[1:]
        elif len(words) == 4 and words[0] == "Tell" and words[2] == "after":
            tell.setdefault(words[3], []).append(words[1])
    return todo, tell


class CeoActor:
    def __init__(self, start: Start, unit_s: float, overhead_s: float,
                 config: ParallelTeacherConfig):
        self.task, self.clock_s = parse_prompt(start.context, unit_s)
        self.unit_s, self.overhead_s, self.config = unit_s, overhead_s, config
        self.hire_calls: list = []  # hires with a list, made first
        self.idle_calls: list = []  # hires with nothing to do (a budget-spending policy)
        self.worker: Worker | None = None
        self.hires = 0
        self.reported: set[str] = set()

    def _tools(self) -> list[str]:
        hidden = any(s.op is None for s in self.task.subtasks)
        return ["look", "solve"] if hidden else ["solve"]

    def _plan(self, b: int, rng: np.random.Generator) -> Step:
        costs, deps = self.task.costs(), self.task.deps()
        horizon = schedule.horizon_units(self.clock_s, self.unit_s, self.overhead_s)
        policy, silent = self.config.hire_policy, self.config.silent
        if policy is HirePolicy.BEST:
            best = schedule.best_silent_headcount if silent else schedule.best_headcount
            h = best(costs, deps, horizon, b)
        elif policy is HirePolicy.RANDOM:
            h = int(rng.integers(0, b + 1))
        else:
            h = b
        agents = ["ceo"] + [f"a{i}" for i in range(1, h + 1)]
        if silent:  # every tree on one worker: nothing to tell
            ids = [s.id for s in self.task.subtasks]
            _, shares = schedule.silent_plan(costs, deps, h + 1, horizon)
            lists = [[ids[j] for j in share] for share in shares]
            lists = [lists[0]] + sorted(lists[1:], key=lambda lst: not lst)
            tells: list[dict] = [{} for _ in lists]
        else:
            lists = _assign(schedule.plan(costs, deps, h + 1, horizon), self.task, h)
            tells = _tells(self.task, lists, agents)
        self.worker = Worker(self.task, lists[0], tells[0], self.config.answer_error_rate)
        self.hires = h
        hires = [_call("hire", title="Solver", role=role_text(lists[i], tells[i]),
                       tools=self._tools()) for i in range(1, h + 1)]
        busy = sum(1 for lst in lists[1:] if lst)
        self.hire_calls, self.idle_calls = hires[:busy], hires[busy:]
        text = "Plan: " + "; ".join(f"{a} {' '.join(lst) or 'none'}"
                                    for a, lst in zip(agents, lists) if lst or a == "ceo") + "."
        return Step(text, tuple(_take(self.hire_calls, self.config.hires_per_turn)))

    def step(self, view: AgentView, rng: np.random.Generator) -> Step:
        if self.worker is None:
            b = budget(view.obs)
            if b is None:
                raise ValueError("parallel teacher: the CEO's first observation has no budget")
            return self._plan(b, rng)
        self.reported |= {sender for sender, _ in reports(view.obs)}
        self.worker.observe(view.obs)
        calls = _take(self.hire_calls, self.config.hires_per_turn)
        if self.hire_calls:  # busy hires first: their work starts at the CEO's clock
            return Step("", tuple(calls))
        # The CEO's own work starts in the turn of its last busy hires (a hire weighs two
        # solves), before any report can arrive to move its clock on.
        room = self.config.solves_per_turn - 2 * len(calls)
        if room < 1:
            return Step("", tuple(calls))
        more, finished = self.worker.calls(rng, room)
        calls += more
        if not calls or finished:  # idle hires once the CEO's own work is under way
            calls += _take(self.idle_calls, self.config.hires_per_turn)
        if finished and not self.idle_calls:
            if self.config.silent:  # no reports come: wait until the episode ends
                calls.append(_call("wait_for_messages"))
            elif len(self.reported) >= self.hires:
                calls.append(_call("final_message", text="done"))
            else:
                calls.append(_call("wait_for_messages"))
        return Step("", tuple(calls))


class SolverActor:
    def __init__(self, start: Start, unit_s: float, config: ParallelTeacherConfig):
        task, _ = parse_prompt(start.context, unit_s)
        todo, tell = parse_role(start.role)
        self.worker = Worker(task, todo, tell, config.answer_error_rate)
        self.solves_per_turn = config.solves_per_turn
        self.reported = config.silent  # the silent organisation never reports

    def step(self, view: AgentView, rng: np.random.Generator) -> Step:
        self.worker.observe(view.obs)
        calls, finished = self.worker.calls(rng, self.solves_per_turn)
        if finished:
            if not self.reported:
                self.reported = True
                done = " ".join(self.worker.solved) or "none"
                calls.append(_call("report_to_ceo", status="done", done=done))
            calls.append(_call("wait_for_messages"))
        return Step("", tuple(calls))


def cast(unit_s: float, overhead_s: float, config: ParallelTeacherConfig):
    """The actor factory for `TeacherPolicy`."""
    def make(start: Start):
        if start.key.agent == "ceo":
            return CeoActor(start, unit_s, overhead_s, config)
        return SolverActor(start, unit_s, config)
    return make
