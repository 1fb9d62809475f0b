"""Run telemetry: `WORKDIR/metrics.jsonl`, TensorBoard event files, a console progress bar.

One `Telemetry` per process; only process 0 writes (every host computes the same global metrics
after the cross-host reductions, so one writer is the record). Each `log(step, metrics)` appends
one JSON object per line (`{"step": ..., "name": value, ...}`; non-finite numbers are written as
null, strings and lists kept) and the scalar entries to TensorBoard under the same names.
Appending is resume-safe: on restart, lines for steps after the resumed checkpoint's step are
dropped first (the resumed run logs them again), so a killed run leaves no duplicates. A line
that reports a timed unit of work (an SFT step, an evaluation, an RLCR step) also carries
`progress/work_s`, `progress/compile_s`, `progress/first` and `progress/resumed` (`ProgressBar`),
which a resumed run reads back for its ETA.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from avalon import paths
from avalon.model.accounting import H200_PEAK_FLOPS


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item") and getattr(v, "size", 2) == 1:
        return _jsonable(v.item())
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All records of a metrics.jsonl file, local or remote (skipping a torn last line)."""
    path = paths.path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line torn by a kill mid-write: everything after it is suspect
    return out


class Telemetry:
    def __init__(self, workdir: str, *, resume_step: int = 0, enabled: bool = True,
                 total_steps: int = 0, stream=sys.stderr, clock=time.perf_counter,
                 compile_clock=None, compile_cache: bool | None = None):
        """`compile_cache`: whether JAX's persistent compilation cache is on (None: as JAX's
        config says), so that a resumed process loads its programs instead of compiling."""
        self.enabled = enabled
        self.path = paths.join(workdir, "metrics.jsonl")
        kept = [r for r in read_metrics(self.path) if r.get("step", -1) <= resume_step] \
            if enabled else []
        # Units timed before a resume count in the ETA (evaluations, compiles to come).
        self.progress = ProgressBar(total_steps, stream=stream, enabled=enabled,
                                    clock=clock, start=resume_step, past=history(kept),
                                    compile_clock=compile_clock or CompileClock.process(),
                                    compile_cache=(_cache_on() if compile_cache is None
                                                   else compile_cache))
        self._tb = None
        if not enabled:
            return
        paths.path(workdir).mkdir(parents=True, exist_ok=True)
        paths.replace_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n"
                                              for r in kept))
        self._tb_dir = paths.join(workdir, "tensorboard")
        self._tb_local = None
        if paths.is_remote(workdir):
            # TensorBoard appends to its event file at every flush, and its fsspec layer turns
            # an append on an object store into an overwrite (gcsfs warns and keeps only the
            # last flush). So the writer writes a local file that is uploaded whole each time.
            self._tb_local = tempfile.mkdtemp(prefix="avalon-tensorboard-")
        self._tb = EventFileWriter(self._tb_local or os.fspath(self._tb_dir))

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), **_jsonable(metrics)}
        if self.progress.last_unit is not None:  # the unit this line reports (a resume's ETA)
            _, unit = self.progress.last_unit
            self.progress.last_unit = None
            record |= {"progress/work_s": unit.work_s, "progress/compile_s": unit.compile_s,
                       "progress/first": unit.first, "progress/resumed": unit.resumed}
        paths.append_text(self.path, json.dumps(record, sort_keys=True) + "\n")
        values = [summary_pb2.Summary.Value(tag=k, simple_value=float(v))
                  for k, v in record.items()
                  if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)]
        if values:
            self._tb.add_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                               summary=summary_pb2.Summary(value=values)))
            self._tb.flush()
            self._upload_events()

    def _upload_events(self) -> None:
        if self._tb_local is None:
            return
        self._tb_dir.mkdir(parents=True, exist_ok=True)
        for name in os.listdir(self._tb_local):
            with open(os.path.join(self._tb_local, name), "rb") as f:
                (self._tb_dir / name).write_bytes(f.read())

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._upload_events()
            if self._tb_local is not None:
                shutil.rmtree(self._tb_local, ignore_errors=True)
        self.progress.close()


def _cache_on() -> bool:
    import jax
    return bool(jax.config.jax_compilation_cache_dir)


class CompileClock:
    """Seconds this process has spent compiling: the union of the time spans of JAX's tracing,
    lowering and XLA compile events (a cache hit of the persistent compilation cache counts as
    its read), and the spans `add`ed by others: the trainer's engine adds the whole first call
    of each program it compiles, first run included (`inference/first_run.py`), which the
    events leave out. Nested spans (a jit traced inside another's trace, an event inside a
    first call) count once, and spans from several threads that overlap count once, so the
    total never exceeds the wall time."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
              "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")
    _instance: CompileClock | None = None

    def __init__(self):
        self._starts: list[float] = []  # disjoint spans, sorted: their ends are sorted too
        self._ends: list[float] = []
        self._total = 0.0
        self._lock = threading.Lock()

    @classmethod
    def process(cls) -> CompileClock:
        """The one clock of this process, listening to JAX's monitoring events."""
        if cls._instance is None:
            import jax.monitoring
            cls._instance = cls()
            jax.monitoring.register_event_time_span_listener(cls._instance._on_span)
        return cls._instance

    def _on_span(self, event: str, start: float, end: float, **_) -> None:
        if event in self.EVENTS:
            self.add(start, end)

    def add(self, start: float, end: float) -> None:
        """Count [start, end] (seconds), merged with every span it overlaps."""
        with self._lock:
            i = j = bisect.bisect_left(self._ends, start)
            while j < len(self._starts) and self._starts[j] <= end:
                start, end = min(start, self._starts[j]), max(end, self._ends[j])
                self._total -= self._ends[j] - self._starts[j]
                j += 1
            self._starts[i:j], self._ends[i:j] = [start], [end]
            self._total += end - start

    def __call__(self) -> float:
        return self._total


PHASE_TIME = {"sft": "time/step_s", "eval": "time/eval_s", "rl": "time/step_s"}  # old lines


@dataclasses.dataclass(frozen=True)
class Unit:
    """One timed unit of work (an SFT step, an evaluation, an RLCR step): its seconds after
    compilation, the seconds it compiled, and whether it was its phase's first unit in its
    process (the one that compiles the phase's programs, or loads them from the persistent
    cache after a resume), and whether its process resumed a run."""

    work_s: float
    compile_s: float
    first: bool
    resumed: bool = False


def history(records: list[dict]) -> dict[str, list[Unit]]:
    """The units timed before a resume, per phase, from metrics.jsonl's records: a line's
    `progress/work_s`, `progress/compile_s`, `progress/first` and `progress/resumed` (what
    `Telemetry.log` adds),
    or for lines written without them its phase's time field (`PHASE_TIME`) less
    `time/compile_s` where the line has it; without either split, a phase's first such line
    is taken as its first unit, its compile the excess over the phase's later lines' mean."""
    out: dict[str, list[Unit]] = {}
    bare: dict[str, list[float]] = {}
    for r in records:
        phase = r.get("phase")
        if phase not in PHASE_TIME:
            continue
        if isinstance(r.get("progress/work_s"), (int, float)):
            out.setdefault(phase, []).append(Unit(float(r["progress/work_s"]),
                                                  float(r.get("progress/compile_s") or 0.0),
                                                  bool(r.get("progress/first")),
                                                  bool(r.get("progress/resumed"))))
        elif isinstance(r.get(PHASE_TIME[phase]), (int, float)):
            wall, compiled = float(r[PHASE_TIME[phase]]), r.get("time/compile_s")
            if isinstance(compiled, (int, float)):
                first = phase not in out
                out.setdefault(phase, []).append(Unit(wall - compiled, float(compiled), first))
            else:
                bare.setdefault(phase, []).append(wall)
    for phase, walls in bare.items():
        later = walls[1:]
        work = sum(later) / len(later) if later else walls[0]
        units = [Unit(min(walls[0], work), max(walls[0] - work, 0.0), True)]
        out[phase] = units + [Unit(w, 0.0, False) for w in later] + out.get(phase, [])
    return out


class ProgressBar:
    """`[#####.....] 12/40  RL 2/30 reward 0.41  ETA 3m12s  compiled 4m10s` on one line.

    A unit of work (an SFT step, an evaluation, an RLCR step) is timed between `begin(phase)`
    and `record(phase)`; the seconds JAX spent compiling in between (`compile_clock`) are kept
    apart from the unit's work. The ETA of a phase with `n` units left (`plan`) is
        n x (work + recurring compile) + the first unit's compile, if still to come here
    with work the mean post-compile seconds of its last `window` units, recurring compile the
    mean compile of its last `window` units that were not a process's first (a new batch
    shape compiles mid-run), and the first unit's compile what the phase's latest first unit
    compiled: a phase this process has not run yet compiles its programs again. A resumed
    process with the persistent compilation cache on (`compile_cache`) loads them instead:
    its first unit's compile is what the latest first unit of a resumed process compiled,
    or, before any, the recurring compile (a toy smoke run's evaluation compiled 131 s in its
    first process, 2.6 s in a resumed one). Units timed before a resume count (`history`, from
    metrics.jsonl), so a resumed run knows its evaluations and compiles from the start. The
    unit in progress counts what is left of it: its estimate less its elapsed work and
    compile (each at most its estimate). A phase with work left and nothing ever timed shows
    as `+ PHASE ?`: the number before it is then a lower bound, and SFT step times are never
    extrapolated over RLCR steps. `status(text)` redraws the line (compiling, evaluating,
    rollouts done). The bar starts at `start` (the step a resumed run restarts from), and
    `close` ends the line with what this invocation did."""

    def __init__(self, total: int, *, stream=sys.stderr, enabled: bool = True, width: int = 28,
                 clock=time.perf_counter, compile_clock=None, window: int = 10,
                 start: int = 0, past: dict[str, list[Unit]] | None = None,
                 compile_cache: bool = False):
        self.total, self.stream, self.enabled, self.width = total, stream, enabled, width
        self.clock, self.window = clock, window
        self.compile_clock = compile_clock if compile_clock is not None else (lambda: 0.0)
        self.remaining: dict[str, int] = {}
        self.seconds: dict[str, list[float]] = {}  # this process's units' work seconds
        self.units: dict[str, list[Unit]] = {k: list(v) for k, v in (past or {}).items()}
        self.compile_s = 0.0
        self.start, self.step, self.note = start, start, ""
        self.cached_resume = compile_cache and start > 0  # programs load from the cache
        self.last_unit: tuple[str, Unit] | None = None  # for the next metrics line
        self._t0 = clock()
        self._begun: dict[str, tuple[float, float]] = {}
        self._width = 0

    def plan(self, remaining: dict[str, int]) -> None:
        """Units of work left per phase (e.g. {"sft": 300, "eval": 4, "rl": 30})."""
        self.remaining = dict(remaining)

    def begin(self, phase: str) -> None:
        """A unit of `phase` starts now (read the wall and the compile clocks)."""
        self._begun[phase] = (self.clock(), self.compile_clock())

    def record(self, phase: str, seconds: float | None = None) -> tuple[float, float]:
        """One unit of `phase` finished: since its `begin`, or in `seconds` (of which nothing
        compiled) when it was not begun. Returns (post-compile seconds, compile seconds)."""
        if phase in self._begun:
            wall, compiled = self._elapsed(phase)
            del self._begun[phase]
        else:
            wall, compiled = float(seconds or 0.0), 0.0
        self.compile_s += compiled
        unit = Unit(wall - compiled, compiled, phase not in self.seconds, self.start > 0)
        self.seconds.setdefault(phase, []).append(unit.work_s)
        self.units.setdefault(phase, []).append(unit)
        self.last_unit = (phase, unit)
        if self.remaining.get(phase, 0) > 0:
            self.remaining[phase] -= 1
        return unit.work_s, unit.compile_s

    def _elapsed(self, phase: str) -> tuple[float, float]:
        """(wall, compile) seconds of the unit of `phase` in progress."""
        t0, c0 = self._begun[phase]
        wall, compiled = self.clock() - t0, self.compile_clock() - c0
        return wall, min(max(compiled, 0.0), wall)

    def phase_estimate(self, phase: str) -> float | None:
        """Seconds left in `phase` (see the class docstring); None: nothing timed yet."""
        left = self.remaining.get(phase, 0)
        units = self.units.get(phase, [])
        if left <= 0:
            return 0.0
        if not units:
            return None
        recent = units[-self.window:]
        work = sum(u.work_s for u in recent) / len(recent)
        later = [u.compile_s for u in units if not u.first][-self.window:]
        recurring = sum(later) / len(later) if later else 0.0
        firsts = [u.compile_s for u in units if u.first and (u.resumed or not self.cached_resume)]
        first = 0.0
        if phase not in self.seconds:
            first = firsts[-1] if firsts else recurring if self.cached_resume else 0.0
        # the first unit here compiles `first`; the others what later units compiled
        total = left * work + (left - bool(first)) * recurring + first
        if phase in self._begun:  # the unit in progress: what is left of it
            wall, compiled = self._elapsed(phase)
            total -= min(wall - compiled, work) + min(compiled, first or recurring)
        return max(total, 0.0)

    def eta_seconds(self) -> tuple[float, list[str]]:
        """(seconds left in the timed phases, phases with work left and nothing timed)."""
        known, unknown = 0.0, []
        for phase in self.remaining:
            est = self.phase_estimate(phase)
            if est is None:
                unknown.append(phase)
            else:
                known += est
        return known, unknown

    def eta(self) -> str:
        known, unknown = self.eta_seconds()
        text = fmt_seconds(known) if known or not unknown else ""
        return " + ".join([text] * bool(text) + [f"{p.upper()} ?" for p in unknown]) or "0m00s"

    def update(self, step: int, note: str = "") -> None:
        self.step, self.note = step, note
        self._draw(note)

    def status(self, text: str) -> None:
        """Redraw the line with `text` in place of the note (until the next update)."""
        self._draw(text)

    def _draw(self, note: str) -> None:
        if not self.enabled or self.total <= 0:
            return
        frac = min(1.0, self.step / self.total)
        bar = "#" * int(frac * self.width) + "." * (self.width - int(frac * self.width))
        compiled = f"  compiled {fmt_seconds(self.compile_s)}" if self.compile_s >= 1 else ""
        line = f"[{bar}] {self.step}/{self.total}  {note}  ETA {self.eta()}{compiled}"
        self.stream.write("\r" + line.ljust(self._width))  # blank what a longer line left
        self._width = len(line)
        self.stream.flush()

    def done_text(self) -> str:
        """What this invocation did: `this run: steps 4 -> 7 (3 RLCR steps, 1 evaluation) in
        2m10s, 1m30s of it compiling`."""
        names = {"sft": ("SFT step", "SFT steps"), "eval": ("evaluation", "evaluations"),
                 "rl": ("RLCR step", "RLCR steps")}
        done = [f"{len(v)} {names.get(p, (p, p))[len(v) != 1]}" for p, v in self.seconds.items()
                if v]
        what = ", ".join(done) or "nothing"
        steps = (f"steps {self.start} -> {self.step}" if self.step != self.start
                 else f"at step {self.step}")
        return (f"this run: {steps} ({what}) in {fmt_seconds(self.clock() - self._t0)}, "
                f"{fmt_seconds(self.compile_s)} of it compiling")

    def close(self) -> None:
        """Ends the line with what this invocation did (`done_text`)."""
        if self.enabled and self.total > 0:
            frac = min(1.0, self.step / self.total)
            bar = "#" * int(frac * self.width) + "." * (self.width - int(frac * self.width))
            line = f"[{bar}] {self.step}/{self.total}  {self.done_text()}"
            self.stream.write("\r" + line.ljust(self._width) + "\n")
            self.stream.flush()
            self.total = 0  # closed: nothing more is drawn on this line


# Dense bf16 peak FLOP/s of one device, by `jax.Device.device_kind` (datasheets). MFU is logged
# only on a device listed here.
PEAK_FLOPS = {
    "NVIDIA H200": H200_PEAK_FLOPS,
    "NVIDIA H100 80GB HBM3": 989e12,
    "TPU v5p": 459e12,
    "TPU v5 lite": 197e12,
    "TPU v6 lite": 918e12,
    "TPU v4": 275e12,
}


def peak_flops(device_kind: str) -> float | None:
    """The peak of `device_kind`, or None (CPUs and unlisted accelerators: no MFU)."""
    return PEAK_FLOPS.get(device_kind)


def console(text: str, *, enabled: bool = True, stream=None) -> None:
    """One line for the person at the console (process 0 only)."""
    if enabled:
        stream = stream or sys.stderr
        stream.write(text + "\n")
        stream.flush()


def fmt_seconds(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 3600}h{(s % 3600) // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
