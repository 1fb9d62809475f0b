"""A training run's console, replayed on fake clocks: the calls `avalon/train/loop.py` makes on
`Telemetry` and its `ProgressBar` (plan, status notes, begin / record / log / update per unit,
rollouts done of an evaluation's or an RLCR step's, the last checkpoint, close), with each
unit's work and compile seconds given, so every progress line's ETA can be set against the time
the run really had left."""

from __future__ import annotations

import dataclasses

from avalon.train.telemetry import Telemetry

Unit = tuple[float, float]  # (work seconds, compile seconds)


@dataclasses.dataclass
class Timeline:
    """What a run's units cost: SFT steps, evaluations (after SFT, every `eval_every` RLCR
    steps and at the end), RLCR steps; `rollouts` status lines per evaluation or RLCR step;
    `tail_s`: the last checkpoint's wait."""

    sft: list[Unit]
    evals: list[Unit]
    rl: list[Unit]
    eval_every: int
    rollouts: int = 4
    tail_s: float = 0.0


class Clocks:
    def __init__(self):
        self.now, self.compiled = 0.0, 0.0

    def wall(self):
        return self.now

    def compile(self):
        return self.compiled


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
    work, compiled = unit
    clocks.now += compiled
    clocks.compiled += compiled
    for k in range(1, parts + 1):
        clocks.now += work / parts
        if each is not None:
            each(k)


def play(workdir: str, t: Timeline, *, sft_done: int = 0, rl_done: int = 0,
         stop_after_rl: int | None = None, compile_cache: bool = True
         ) -> tuple[list[tuple[float, str]], float]:
    """One invocation from (sft_done, rl_done) (a resume when either is > 0) to the end or to
    `stop_after_rl` RLCR steps (killed right after that step's checkpoint). Returns the lines
    drawn and the time the invocation ended. `compile_cache`: the persistent compilation cache
    is on (a resumed process loads its programs)."""
    clocks = Clocks()
    out = Lines(clocks)
    n_sft, n_rl = len(t.sft), len(t.rl)
    step = sft_done + rl_done
    tel = Telemetry(workdir, resume_step=step, total_steps=n_sft + n_rl, stream=out,
                    clock=clocks.wall, compile_clock=clocks.compile, compile_cache=compile_cache)
    bar = tel.progress
    eval_at = [0] + [s for s in range(1, n_rl + 1) if s % t.eval_every == 0 or s == n_rl]
    evals_left = [s for s in eval_at if s > rl_done or (s == 0 and sft_done < n_sft)]
    bar.plan({"sft": n_sft - sft_done, "eval": len(evals_left), "rl": n_rl - rl_done})

    def evaluate(at: int) -> None:
        bar.begin("eval")
        bar.status(f"evaluating at RL step {at}")
        _spend(clocks, t.evals[eval_at.index(at)], t.rollouts,
               lambda k: bar.status(f"evaluating at RL step {at}: {k}/{t.rollouts} rollouts"))
        bar.record("eval")
        tel.log(step, {"phase": "eval", "rl_step": at})

    for i in range(sft_done, n_sft):
        if not bar.seconds.get("sft"):
            bar.status("SFT: compiling the update step")
        bar.begin("sft")
        _spend(clocks, t.sft[i], 1)
        step += 1
        bar.record("sft")
        tel.log(step, {"phase": "sft", "time/step_s": sum(t.sft[i])})
        bar.update(step, "SFT")
    if 0 in evals_left:  # not yet evaluated at RL step 0 (a resume after it skips it)
        evaluate(0)
    if stop_after_rl == 0:
        return out.lines, clocks.now
    for r in range(rl_done, n_rl):
        bar.begin("rl")
        note = f"RL {r + 1}/{n_rl}: rollouts"
        bar.status(note)
        _spend(clocks, t.rl[r], t.rollouts,
               lambda k, note=note: bar.status(f"{note} {k}/{t.rollouts}"))
        step += 1
        bar.record("rl")
        tel.log(step, {"phase": "rl", "rl_step": r + 1, "time/step_s": sum(t.rl[r])})
        bar.update(step, f"RL {r + 1}/{n_rl}")
        if r + 1 in eval_at:
            evaluate(r + 1)
        if stop_after_rl is not None and r + 1 == stop_after_rl:
            return out.lines, clocks.now  # killed: the next start resumes here
    bar.status("waiting for the last checkpoint")
    clocks.now += t.tail_s
    tel.close()
    return out.lines, clocks.now
