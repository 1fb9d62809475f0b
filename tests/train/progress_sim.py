"""A training run's console, replayed on fake clocks: the calls `avalon/train/loop.py` makes on
`Telemetry` and its `ProgressBar` (plan, status notes, begin / record / log / update per unit,
rollouts done of an evaluation's or an RLCR step's, the finish, close), with each unit's work,
compile and backend-compile seconds given, so every progress line's ETA can be set against the
time the run really had left."""

from __future__ import annotations

import dataclasses

from avalon.train.telemetry import Telemetry

# (work seconds, compile seconds, of which XLA's backend), and optionally the persistent
# cache's (loads, compiles) of the unit's programs
Unit = tuple


@dataclasses.dataclass
class Timeline:
    """What one invocation's units cost: the teacher traces, SFT steps, evaluations (after SFT,
    every `eval_every` RLCR steps and at the end; one entry per evaluation it runs), RLCR steps
    (one per step it runs), `rollouts` status lines per evaluation or RLCR step, `finish_s`:
    the last checkpoint's wait, plots and summary."""

    sft: list[Unit]
    evals: list[Unit]
    rl: list[Unit]
    eval_every: int
    rollouts: int = 4
    teacher_s: float = 3.0
    finish_s: float = 2.0

    def scaled(self, work: float, compiled: float) -> Timeline:
        """The same run on a machine `work` times slower at work, `compiled` at compiling."""
        def s(units):
            return [(u[0] * work, u[1] * compiled, u[2] * compiled, *u[3:]) for u in units]
        return dataclasses.replace(self, sft=s(self.sft), evals=s(self.evals), rl=s(self.rl),
                                   teacher_s=self.teacher_s * work,
                                   finish_s=self.finish_s * work)


class Clocks:
    def __init__(self):
        self.now, self.compiled, self.backend = 0.0, 0.0, 0.0
        self.events = (0, 0)  # the cache's loads and compiles

    def cache(self):
        return self.events

    def wall(self):
        return self.now

    def compile(self):
        return self.compiled

    def backend_compile(self):
        return self.backend


class Lines:
    """The console: every line drawn, with the fake time it was drawn at."""

    def __init__(self, clocks: Clocks):
        self.clocks, self.lines = clocks, []

    def write(self, text: str) -> None:
        for part in text.split("\r"):
            if part.strip():
                self.lines.append((self.clocks.now, part.strip()))

    def flush(self) -> None:
        pass


def _spend(clocks: Clocks, unit: Unit, parts: int, each=None) -> None:
    """Compile first, then work, in `parts` even slices, calling `each(k)` after slice k."""
    work, compiled, backend = unit[:3]
    if len(unit) > 3:
        clocks.events = tuple(a + b for a, b in zip(clocks.events, unit[3]))
    clocks.now += compiled
    clocks.compiled += compiled
    clocks.backend += backend
    for k in range(1, parts + 1):
        clocks.now += work / parts
        if each is not None:
            each(k)


def _counts_cache(t: Timeline) -> bool:
    return any(len(u) > 3 for u in t.sft + t.evals + t.rl)


def play(workdir: str, t: Timeline, *, n_sft: int, n_rl: int, sft_done: int = 0,
         rl_done: int = 0, kill_at_rl: int | None = None, compile_cache: bool = True,
         timings: str | None = None, shipped: str | None = None
         ) -> tuple[list[tuple[float, str]], float]:
    """One invocation of a run of `n_sft` SFT and `n_rl` RLCR steps from (sft_done, rl_done)
    (a resume when either is > 0) to the end, or killed at the status line of RLCR step
    `kill_at_rl` (1-based). `t` holds the units this invocation runs, in order. Returns the
    lines drawn and the time the invocation ended. `compile_cache`: the persistent
    compilation cache is on; `timings`: the machine's record; `shipped`: the reference shipped
    for the config."""
    clocks = Clocks()
    out = Lines(clocks)
    step = sft_done + rl_done
    tel = Telemetry(workdir, resume_step=step, total_steps=n_sft + n_rl, stream=out,
                    clock=clocks.wall, compile_clock=clocks.compile,
                    backend_clock=clocks.backend_compile, compile_cache=compile_cache,
                    cache_events=clocks.cache if _counts_cache(t) else None,
                    timings=timings, shipped=shipped)
    bar = tel.progress
    eval_at = [0] + [s for s in range(1, n_rl + 1) if s % t.eval_every == 0 or s == n_rl]
    evals_left = [s for s in eval_at if s > rl_done or (s == 0 and sft_done < n_sft)]
    schedule = [("teacher", 0)] * (sft_done < n_sft) + [("sft", k) for k in range(sft_done, n_sft)]
    schedule += [("eval", 0)] * (0 in evals_left)
    for k in range(rl_done, n_rl):
        schedule += [("rl", k)] + [("eval", k + 1)] * (k + 1 in evals_left)
    bar.plan(schedule + [("finish", 0)])
    evals, sfts, rls = iter(t.evals), iter(t.sft), iter(t.rl)

    def evaluate(at: int) -> None:
        bar.begin("eval")
        bar.status(f"evaluating at RL step {at}")
        _spend(clocks, next(evals), t.rollouts,
               lambda k: bar.status(f"evaluating at RL step {at}: {k}/{t.rollouts} rollouts"))
        bar.record("eval")
        tel.log(step, {"phase": "eval", "rl_step": at})

    if sft_done < n_sft:
        bar.begin("teacher")
        bar.status("teacher traces")
        clocks.now += t.teacher_s
        bar.record("teacher")
    for _ in range(sft_done, n_sft):
        if not bar.seconds.get("sft"):
            bar.status("SFT: compiling the update step")
        bar.begin("sft")
        unit = next(sfts)
        _spend(clocks, unit, 1)
        step += 1
        bar.record("sft")
        tel.log(step, {"phase": "sft", "time/step_s": unit[0] + unit[1]})
        bar.update(step, "SFT")
    if 0 in evals_left:  # not yet evaluated at RL step 0 (a resume after it skips it)
        evaluate(0)
    for r in range(rl_done, n_rl):
        bar.begin("rl")
        note = f"RL {r + 1}/{n_rl}: rollouts"
        bar.status(note)
        if kill_at_rl == r + 1:
            return out.lines, clocks.now  # killed: the next start resumes from its checkpoint
        unit = next(rls)
        _spend(clocks, unit, t.rollouts,
               lambda k, note=note: bar.status(f"{note} {k}/{t.rollouts}"))
        step += 1
        bar.record("rl")
        tel.log(step, {"phase": "rl", "rl_step": r + 1, "time/step_s": unit[0] + unit[1]})
        bar.update(step, f"RL {r + 1}/{n_rl}")
        if r + 1 in eval_at:
            evaluate(r + 1)
    bar.begin("finish")
    bar.status("waiting for the last checkpoint")
    clocks.now += t.finish_s
    tel.close()
    return out.lines, clocks.now
