"""Hand-built event logs for the analysis tests: three rollouts whose every metric is worked out
by hand in `test_metrics.py`."""

from __future__ import annotations

import copy
import os

from avalon.analysis.logs import IndexEntry, LoggedRollout, rollout_file, step_dir, write_index
from avalon.org.events import dumps


class Log:
    """Appends events with consecutive seqs; each method returns the new event's seq."""

    def __init__(self):
        self.events: list[dict] = []

    def add(self, kind, agent, cause, **fields) -> int:
        seq = len(self.events)
        self.events.append({"seq": seq, "kind": kind, "agent": agent, "cause": cause, **fields})
        return seq

    def mc(self, agent, cause, n_in, n_out, text="") -> int:
        return self.add("model_call", agent, cause, n_in_new=n_in, n_out=n_out, segment=0,
                        turn=0, stop="stop", text=text)

    def tc(self, agent, cause, tool, duration=0.0, error=False, **fields) -> int:
        return self.add("tool_call", agent, cause, tool=tool, duration_s=duration, error=error,
                        **fields)

    def send(self, agent, cause, mid, kind, to, text, channel=None) -> int:
        return self.add("send", agent, cause, message_id=mid, message_kind=kind, channel=channel,
                        to=list(to), text=text)

    def hire(self, agent, cause, new, title, role="") -> int:
        return self.add("hire", agent, cause, new_agent=new, title=title, role=role, tools=[],
                        brief="")

    def rollout(self, arm="org", step=0, env="toy") -> LoggedRollout:
        return LoggedRollout(path="", events=self.events, phase="eval", step=step, rl_step=0,
                             env=env, arm=arm, extra={})


def team_with_lead() -> LoggedRollout:
    """CEO hires Lead Engineer (a1), QA Reviewer (a2), Data Analyst (a3); a2 reviews a1's work;
    a3 offers a1 help; the CEO reads a1's and a2's traces and ends."""
    g = Log()
    g.add("start", "ceo", None, task_id="t1", budget=3, seed=1, clock_s=600.0, prompt="p",
          brief="")
    mc = g.mc("ceo", 0, 1500, 50, "Plan: split by component")  # 1.1 s
    h1 = g.hire("ceo", g.tc("ceo", mc, "hire"), "a1", "Lead Engineer", "build part a")
    g.hire("ceo", g.tc("ceo", mc, "hire"), "a2", "QA Reviewer", "review")
    g.hire("ceo", g.tc("ceo", mc, "hire"), "a3", "Data Analyst", "part b")
    m = g.mc("a1", h1, 0, 100, "I will build part a")  # 2 s: a1 at 3.1
    g.tc("a1", m, "work", 10.0, rewards=[{"value": 1.0, "label": "part"}])  # 13.1
    send_m1 = g.send("a1", g.tc("a1", m, "dm", args={"to": "a2"}), "m1", "dm", ["a2"],
                     "please review my part a")
    m = g.mc("a2", 5, 0, 50, "waiting")  # 1 s: a2 at 2.1
    g.add("wait", "a2", g.tc("a2", m, "wait_for_messages"))
    m = g.mc("a3", 7, 0, 50, "I can help a1 with part b")  # 1 s: a3 at 2.1
    g.tc("a3", m, "read_trace", args={"agent": "a1"})
    g.send("a3", g.tc("a3", m, "dm", args={"to": "a1"}), "m2", "dm", ["a1"],
           "happy to help with part b")
    g.add("wake", "a2", send_m1, message_id="m1")
    g.add("deliver", "a2", send_m1, message_id="m1", mode="full")  # a2 up to 13.1
    m = g.mc("a2", 20, 0, 100, "Reviewed part a")  # 2 s: a2 at 15.1
    g.send("a2", g.tc("a2", m, "post"), "m3", "post", ["a1", "a3", "ceo"],
           "review of @a1 part a: LGTM", channel="#dev")
    report = g.send("a2", g.tc("a2", m, "report_to_ceo"), "m4", "report", ["ceo"],
                    "status: reviewed a")
    g.add("deliver", "ceo", report, message_id="m4", mode="full")  # ceo up to 15.1
    m = g.mc("ceo", 26, 3000, 50, "done")  # 1.2 s: ceo at 16.3
    g.tc("ceo", m, "read_trace", args={"agent": "a1"})
    g.tc("ceo", m, "read_trace", args={"agent": "a2"})
    fm = g.tc("ceo", m, "final_message", args={"text": "done"})
    g.add("end", "ceo", fm, reason="final_message", rewards=[{"value": 1.0, "label": "final"}])
    return g.rollout()


def single_agent() -> LoggedRollout:
    g = Log()
    g.add("start", "ceo", None, task_id="t1", budget=0, seed=2, clock_s=600.0)
    m = g.mc("ceo", 0, 1500, 100, "solo")  # 2.1 s
    g.tc("ceo", m, "work", 30.0, rewards=[{"value": 1.0, "label": "part"}])  # 32.1
    fm = g.tc("ceo", m, "final_message", args={"text": "x"})
    g.add("end", "ceo", fm, reason="final_message", rewards=[{"value": 0.5, "label": "final"}])
    return g.rollout(arm="single")


def team_without_lead() -> LoggedRollout:
    """Engineer (a1) and Tester (a2); a1's reward comes after the 6.5 s clock cap (late)."""
    g = Log()
    g.add("start", "ceo", None, task_id="t2", budget=2, seed=3, clock_s=6.5)
    mc = g.mc("ceo", 0, 0, 50, "Pipeline: build then test")  # 1 s
    h1 = g.hire("ceo", g.tc("ceo", mc, "hire"), "a1", "Engineer", "build")
    h2 = g.hire("ceo", g.tc("ceo", mc, "hire"), "a2", "Tester", "test")
    g.add("wait", "ceo", g.tc("ceo", mc, "wait_for_messages"))
    m = g.mc("a1", h1, 0, 50, "building")  # a1 at 2
    g.tc("a1", m, "work", 5.0, rewards=[{"value": 1.0, "label": "part"}], late=True)  # 7
    m = g.mc("a2", h2, 0, 50, "testing")  # a2 at 2
    g.tc("a2", m, "work", 4.0, rewards=[{"value": 1.0, "label": "part"}])  # 6
    g.add("end", "ceo", 11, reason="deadlock", rewards=[])
    return g.rollout()


def minimal_events(rewards=(), *, budget: int = 0, hires: int = 0, task_id: str = "t") -> list:
    """The smallest log with these hires and reward events (for tests of whole groups): the
    CEO's one turn hires `hires` Workers and its final message carries the rewards."""
    g = Log()
    g.add("start", "ceo", None, task_id=task_id, budget=budget, seed=0, clock_s=600.0)
    mc = g.mc("ceo", 0, 100, 10, "plan")
    for i in range(hires):
        g.hire("ceo", g.tc("ceo", mc, "hire"), f"a{i + 1}", "Worker")
    fm = g.tc("ceo", mc, "final_message", args={"text": "done"},
              rewards=[{"value": float(v), "label": "r"} for v in rewards])
    g.add("end", "ceo", fm, reason="final_message", rewards=[])
    return g.events


def _truth(item, code, builder, defective):
    return {"item": item, "code": code, "builder": builder, "defective": defective}


def verification_team() -> LoggedRollout:
    """Collective verification with ground truth. Builder a1, Verifier a2. Builds: p1 47
    (defective), p2 33 (sound), p1 58 (sound), p2 61 (defective). Verdicts: "p1 defect" (on
    47: a true flag), "p1 58 ok" (sound), "p2 defect" (on 33, sound: a false flag), a1's own
    "p2 61 ok" (a rubber stamp), "reviewed everything" (names no build). The CEO ships p1 58
    and p2 61."""
    g = Log()
    g.add("start", "ceo", None, task_id="v1", budget=3, seed=5, clock_s=480.0)
    mc = g.mc("ceo", 0, 200, 20, "Plan: 1 builders; verifier a2.")
    h1 = g.hire("ceo", g.tc("ceo", mc, "hire"), "a1", "Builder", "Build p1 p2.")
    h2 = g.hire("ceo", g.tc("ceo", mc, "hire"), "a2", "Verifier", "Review what you get.")
    m = g.mc("a1", h1, 50, 10)
    g.tc("a1", m, "build", 40.0, args={"id": "p1"}, result="p1 built 47")
    g.tc("a1", m, "build", 40.0, args={"id": "p2"}, result="p2 built 33")
    a1 = g.send("a1", g.tc("a1", m, "dm"), "m1", "dm", ["a2"], "p1 47")
    m = g.mc("a2", h2, 50, 10)
    g.tc("a2", m, "review", 20.0, args={"id": "p1", "result": "47"}, result="p1 47 defect")
    a2 = g.send("a2", g.tc("a2", m, "dm"), "m2", "dm", ["a1"], "p1 defect")
    m = g.mc("a1", a1, 20, 10)
    g.tc("a1", m, "build", 40.0, args={"id": "p1"}, result="p1 built 58")
    a1 = g.send("a1", g.tc("a1", m, "dm"), "m3", "dm", ["a2"], "p1 58 p2 33")
    m = g.mc("a2", a2, 20, 10)
    g.tc("a2", m, "review", 20.0, args={"id": "p1", "result": "58"}, result="p1 58 ok")
    g.send("a2", g.tc("a2", m, "dm"), "m4", "dm", ["ceo"], "p1 58 ok")
    g.send("a2", g.tc("a2", m, "dm"), "m5", "dm", ["a1"], "p2 defect")
    g.send("a2", g.tc("a2", m, "post"), "m6", "post", ["ceo", "a1"], "reviewed everything",
           channel="#plan")
    m = g.mc("a1", a1, 20, 10)
    g.tc("a1", m, "build", 40.0, args={"id": "p2"}, result="p2 built 61")
    g.send("a1", g.tc("a1", m, "dm"), "m7", "dm", ["ceo"], "p2 61 ok")
    m = g.mc("ceo", mc, 30, 10)
    g.tc("ceo", m, "ship", 5.0, args={"id": "p1", "result": "58"}, result="p1 shipped",
         rewards=[{"value": 1.0, "label": "shipped"}])
    last = g.tc("ceo", m, "ship", 5.0, args={"id": "p2", "result": "61"}, result="p2 shipped",
                rewards=[{"value": -2.0, "label": "defect"}])
    builds = [_truth("p1", "47", "a1", True), _truth("p2", "33", "a1", False),
              _truth("p1", "58", "a1", False), _truth("p2", "61", "a1", True)]
    # As collective verification records it: a2's two reviews of a1's builds (one found
    # p1 47's defect), four builds, two ships (one defective).
    g.add("end", "ceo", last, reason="env_terminal", rewards=[],
          env_metrics={"items": 2.0, "shipped": 2.0, "shipped_defects": 1.0, "success": 0.5,
                       "reviews": 2.0, "self_reviews": 0.0, "defects_found": 1.0,
                       "builds": 4.0},
          env_record={"builds": builds, "shipped": [builds[2], builds[3]]})
    return g.rollout(env="verification")


def verification_single() -> LoggedRollout:
    """A single agent builds p1 (defective); a malformed turn, a compaction, a ship with a
    wrong code (a tool error), then it ships p1 blind."""
    g = Log()
    g.add("start", "ceo", None, task_id="v1", budget=0, seed=6, clock_s=480.0)
    m = g.mc("ceo", 0, 200, 20, "build")  # 0.41333 s
    g.tc("ceo", m, "build", 40.0, args={"id": "p1"}, result="p1 built 20")
    m = g.add("model_call", "ceo", m + 1, n_in_new=20, n_out=10, segment=0, turn=1,
              stop="stop", text="ship p1", malformed="no tool call parsed")  # 0.20133 s
    g.add("compaction", "ceo", m, tier=1, tokens_before=800, tokens_after=300, segment=1)
    m = g.mc("ceo", m + 1, 20, 10, "ship")  # 0.20133 s
    g.tc("ceo", m, "ship", 0.0, error=True, args={"id": "p1", "result": "21"},
         result="p1 has no result '21'")
    last = g.tc("ceo", m, "ship", 5.0, args={"id": "p1", "result": "20"}, result="p1 shipped",
                rewards=[{"value": -2.0, "label": "defect"}])
    truth = _truth("p1", "20", "ceo", True)
    g.add("end", "ceo", last, reason="env_terminal", rewards=[],
          env_metrics={"items": 1.0, "shipped": 1.0, "shipped_defects": 1.0, "success": 0.0,
                       "reviews": 0.0, "self_reviews": 0.0, "defects_found": 0.0,
                       "builds": 1.0},
          env_record={"builds": [truth], "shipped": [truth]})
    return g.rollout(arm="single", env="verification")


def parallel_team() -> LoggedRollout:
    """Parallel subtasks: Solver a1 solves s1 (result 7) and passes "s1 7" on (its own result)
    and "s3 8" (not its result); the environment counts one hand-off."""
    g = Log()
    g.add("start", "ceo", None, task_id="q1", budget=1, seed=7, clock_s=300.0)
    mc = g.mc("ceo", 0, 0, 50, "Plan")
    h = g.hire("ceo", g.tc("ceo", mc, "hire"), "a1", "Solver")
    m = g.mc("a1", h, 0, 50, "solve")
    g.tc("a1", m, "solve", 10.0, args={"id": "s1"}, result="s1 correct, result 7",
         rewards=[{"value": 1.0, "label": "subtask"}])
    g.send("a1", g.tc("a1", m, "dm"), "m1", "dm", ["ceo"], "s1 7")
    last = g.send("a1", g.tc("a1", m, "dm"), "m2", "dm", ["ceo"], "s3 8")
    g.add("end", "ceo", last, reason="deadlock", rewards=[], env_metrics={"handoffs": 1.0})
    return g.rollout(env="parallel")


def verification_failing_team() -> LoggedRollout:
    """Collective verification as the smoke run played it: Builder a1 builds p1 (code 47)
    and passes on a code it never built ("p1 5"); Verifier a2's review of it fails, yet a2
    tells the CEO "p1 defect ok"; the CEO's ship fails too and the team deadlocks. The
    environment records no review and no ship."""
    g = Log()
    g.add("start", "ceo", None, task_id="v1", budget=3, seed=5, clock_s=480.0)
    mc = g.mc("ceo", 0, 200, 20, "Plan: a builder and a verifier.")
    h1 = g.hire("ceo", g.tc("ceo", mc, "hire"), "a1", "Builder", "Build p1.")
    h2 = g.hire("ceo", g.tc("ceo", mc, "hire"), "a2", "Verifier", "Review what you get.")
    m = g.mc("a1", h1, 50, 10)
    g.tc("a1", m, "build", 40.0, args={"id": "p1"}, result="p1 built 47")
    g.send("a1", g.tc("a1", m, "dm"), "m1", "dm", ["a2"], "p1 5")
    m = g.mc("a2", h2, 50, 10)
    g.tc("a2", m, "review", 0.0, error=True, args={"id": "p1", "result": "5"},
         result="p1 has no result '5'")
    a2 = g.send("a2", g.tc("a2", m, "dm"), "m2", "dm", ["ceo"], "p1 defect ok")
    m = g.mc("ceo", a2, 30, 10)
    last = g.tc("ceo", m, "ship", 0.0, error=True, args={"id": "p1", "result": "5"},
                result="p1 is closed after 2 wrong codes")
    build = _truth("p1", "47", "a1", False)
    g.add("end", "ceo", last, reason="deadlock", rewards=[],
          env_metrics={"items": 1.0, "shipped": 0.0, "shipped_defects": 0.0, "success": 0.0,
                       "reviews": 0.0, "self_reviews": 0.0, "defects_found": 0.0,
                       "builds": 1.0},
          env_record={"builds": [build], "shipped": []})
    return g.rollout(env="verification")


def with_task(logged: LoggedRollout, task: str) -> list:
    """A copy of the rollout's events, its start event naming `task`."""
    events = copy.deepcopy(logged.events)
    events[0]["task_id"] = task
    return events


def write_eval_step(run, step: int, rl_step: int, env: str, rollouts) -> None:
    """An evaluation's directory as the trainer writes it: rollouts [(arm, seed_index, events)],
    one event log each, and the step's index."""
    d = step_dir(run, "eval", step)
    os.makedirs(d, exist_ok=True)
    entries = []
    for g, (arm, seed_index, events) in enumerate(rollouts):
        with open(os.path.join(d, rollout_file(g, 0)), "w") as f:
            f.write("".join(dumps(e) + "\n" for e in events))
        entries.append(IndexEntry(rollout_file(g, 0), "eval", step, rl_step, env, arm,
                                  {"seed_index": seed_index}))
    write_index(d, entries)
