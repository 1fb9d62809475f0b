"""Run telemetry: `WORKDIR/metrics.jsonl`, TensorBoard event files, a console progress bar.

One `Telemetry` per process; only process 0 writes (every host computes the same global metrics
after the cross-host reductions, so one writer is the record). Each `log(step, metrics)` appends
one JSON object per line (`{"step": ..., "name": value, ...}`; non-finite numbers are written as
null, strings and lists kept) and the scalar entries to TensorBoard under the same names.
Appending is resume-safe: on restart, lines for steps after the resumed checkpoint's step are
dropped first (the resumed run logs them again), so a killed run leaves no duplicates. A line
that reports a timed unit of work (an SFT step, an evaluation, an RLCR step) also carries
`progress/work_s`, `progress/compile_s`, `progress/first` and `progress/resumed` (`ProgressBar`),
and every unit (those too, and the teacher traces and the finish) is appended to
`WORKDIR/progress.jsonl`, kept whole across resumes, and to the machine's record of the config
(`avalon/train/eta.py`): what the ETA of a resumed run and of later runs is forecast from.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from avalon import paths
from avalon.model.accounting import H200_PEAK_FLOPS
from avalon.train import eta


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
                 compile_clock=None, backend_clock=None, compile_cache: bool | None = None,
                 timings: str | None = None, shipped: str | None = None, cache_events=None):
        """`compile_cache`: whether the persistent compilation cache holds what earlier
        invocations of this run compiled (None: JAX's cache is on and its directory is not
        empty); `cache_events`: a function giving the cache's (hits, misses) so far (None:
        JAX's, when the compile clock is JAX's too). `timings`: the machine's record of this
        config's units (`eta.machine_dir()/KEY.jsonl`; None: none), read for the ETA and
        appended to;
        `shipped`: the reference shipped for the config (`eta.shipped_record`), for the units
        neither this run nor the machine has timed."""
        self.enabled = enabled
        self.path = paths.join(workdir, "metrics.jsonl")
        self.run_record = paths.join(workdir, eta.RUN_RECORD)
        self.timings = timings
        self.invocation = f"{socket.gethostname()}-{os.getpid()}-{time.time():.3f}"
        kept = [r for r in read_metrics(self.path) if r.get("step", -1) <= resume_step] \
            if enabled else []
        own = eta.read_record(self.run_record) if enabled else []
        if enabled and not own:  # a run begun before its units were recorded apart (their
            # backend part unknown: a resume expects their compiles in full)
            own = [eta.Timed(p, u.ordinal, u.work_s, u.compile_s, first=u.first,
                             resumed=u.resumed, invocation="metrics.jsonl")
                   for p, units in history(kept).items() for u in units]
        machine = eta.read_record(timings) if enabled and timings else []
        reference = eta.read_record(shipped) if enabled and shipped else []
        self.progress = ProgressBar(
            total_steps, stream=stream, enabled=enabled, clock=clock, start=resume_step,
            compile_clock=compile_clock or CompileClock.process(),
            backend_clock=backend_clock or (CompileClock.backend() if compile_clock is None
                                            else None),
            reference=eta.Reference(own, machine, reference),
            done_before=frozenset((t.phase, t.ordinal) for t in own),
            warm_cache=_cache_holds() if compile_cache is None else compile_cache,
            cache_events=cache_events or (CacheEvents.process() if compile_clock is None
                                          else None),
            on_unit=self._timed if enabled else None)
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

    def _timed(self, phase: str, unit: Unit) -> None:
        line = eta.Timed(phase, unit.ordinal, unit.work_s, unit.compile_s, unit.backend_s,
                         unit.first, unit.resumed, unit.warm, self.invocation).as_json()
        eta.append_record(self.run_record, line)
        if self.timings:
            eta.append_record(self.timings, line)

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), **_jsonable(metrics)}
        if self.progress.last_unit is not None and \
                self.progress.last_unit[0] == record.get("phase"):  # the unit this line reports
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


def _cache_holds() -> bool:
    """JAX's persistent compilation cache is on and holds programs (an earlier invocation's)."""
    import jax
    where = jax.config.jax_compilation_cache_dir
    if not where:
        return False
    try:
        return any(True for _ in paths.path(where).iterdir())
    except OSError:
        return False


class CompileClock:
    """Seconds this process has spent compiling: the union of the time spans of JAX's tracing,
    lowering and XLA compile events (a cache hit of the persistent compilation cache counts as
    its read), and the spans `add`ed by others: the trainer's engine adds the whole first call
    of each program it compiles, first run included (`inference/first_run.py`), which the
    events leave out. Nested spans (a jit traced inside another's trace, an event inside a
    first call) count once, and spans from several threads that overlap count once, so the
    total never exceeds the wall time. `CompileClock.backend()` counts XLA's backend compile
    alone: the part the persistent compilation cache saves a later process."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
              "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")
    _instances: dict[tuple[str, ...], CompileClock] = {}

    def __init__(self, events: tuple[str, ...] = EVENTS):
        self.events = events
        self._starts: list[float] = []  # disjoint spans, sorted: their ends are sorted too
        self._ends: list[float] = []
        self._total = 0.0
        self._lock = threading.Lock()

    @classmethod
    def process(cls) -> CompileClock:
        """The one clock of this process, listening to JAX's monitoring events."""
        return cls._listening(cls.EVENTS)

    @classmethod
    def backend(cls) -> CompileClock:
        """The process's clock of XLA backend compiles (or their cache reads) only."""
        return cls._listening(cls.EVENTS[-1:])

    @classmethod
    def _listening(cls, events: tuple[str, ...]) -> CompileClock:
        if events not in cls._instances:
            import jax.monitoring
            cls._instances[events] = clock = cls(events)
            jax.monitoring.register_event_time_span_listener(clock._on_span)
        return cls._instances[events]

    def _on_span(self, event: str, start: float, end: float, **_) -> None:
        if event in self.events:
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


class CacheEvents:
    """Programs this process read from the persistent compilation cache (hits) and compiled
    and wrote there (misses): whether a unit's compile really came from the cache, which the
    forecast's record of cold compiles needs (a unit begun before a kill may have put none of
    its programs there)."""

    _instance: CacheEvents | None = None

    def __init__(self):
        self.hits = self.misses = 0

    @classmethod
    def process(cls) -> CacheEvents:
        if cls._instance is None:
            import jax.monitoring
            cls._instance = cls()
            jax.monitoring.register_event_listener(cls._instance._on_event)
        return cls._instance

    def _on_event(self, event: str, **_) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self.hits += 1
        elif event == "/jax/compilation_cache/cache_misses":
            self.misses += 1

    def __call__(self) -> tuple[int, int]:
        return self.hits, self.misses


PHASE_TIME = {"sft": "time/step_s", "eval": "time/eval_s", "rl": "time/step_s"}  # old lines


@dataclasses.dataclass(frozen=True)
class Unit:
    """One timed unit of work (an SFT step, an evaluation, an RLCR step): its seconds after
    compilation, the seconds it compiled, and whether it was its phase's first unit in its
    process (the one that compiles the phase's programs, or loads them from the persistent
    cache after a resume), and whether its process resumed a run; its ordinal in the run (SFT
    step k, the evaluation at RLCR step k, RLCR step k), the part of its compile that was XLA's
    backend, whether its programs were expected from the persistent cache."""

    work_s: float
    compile_s: float
    first: bool
    resumed: bool = False
    ordinal: int | None = None
    backend_s: float = 0.0
    warm: bool = False


def history(records: list[dict]) -> dict[str, list[Unit]]:
    """The units timed before a resume, per phase, from metrics.jsonl's records (a run begun
    before `progress.jsonl` was kept): a line's `progress/work_s`, `progress/compile_s`,
    `progress/first` and `progress/resumed` (what `Telemetry.log` adds),
    or for lines written without them its phase's time field (`PHASE_TIME`) less
    `time/compile_s` where the line has it; without either split, a phase's first such line
    is taken as its first unit, its compile the excess over the phase's later lines' mean.
    Ordinals come from the lines' steps (`rl_step`; an SFT line's step)."""
    out: dict[str, list[Unit]] = {}
    bare: dict[str, list[tuple[float, int | None]]] = {}
    for r in records:
        phase = r.get("phase")
        if phase not in PHASE_TIME:
            continue
        ordinal = _ordinal(r)
        if isinstance(r.get("progress/work_s"), (int, float)):
            out.setdefault(phase, []).append(Unit(float(r["progress/work_s"]),
                                                  float(r.get("progress/compile_s") or 0.0),
                                                  bool(r.get("progress/first")),
                                                  bool(r.get("progress/resumed")), ordinal))
        elif isinstance(r.get(PHASE_TIME[phase]), (int, float)):
            wall, compiled = float(r[PHASE_TIME[phase]]), r.get("time/compile_s")
            if isinstance(compiled, (int, float)):
                first = phase not in out
                out.setdefault(phase, []).append(Unit(wall - compiled, float(compiled), first,
                                                      ordinal=ordinal))
            else:
                bare.setdefault(phase, []).append((wall, ordinal))
    for phase, walls in bare.items():
        later = [w for w, _ in walls[1:]]
        work = sum(later) / len(later) if later else walls[0][0]
        units = [Unit(min(walls[0][0], work), max(walls[0][0] - work, 0.0), True,
                      ordinal=walls[0][1])]
        out[phase] = units + [Unit(w, 0.0, False, ordinal=o) for w, o in walls[1:]] \
            + out.get(phase, [])
    return out


def _ordinal(r: dict) -> int | None:
    if r.get("phase") == "sft" and isinstance(r.get("step"), int):
        return r["step"] - 1
    if r.get("phase") == "rl" and isinstance(r.get("rl_step"), int):
        return r["rl_step"] - 1
    if r.get("phase") == "eval" and isinstance(r.get("rl_step"), int):
        return r["rl_step"]
    return None


class ProgressBar:
    """`[#####.....] 12/40  RL 2/30 reward 0.41  ETA 3m12s  compiled 4m10s` on one line.

    Every second of an invocation after `plan` belongs to a unit of work (the teacher traces,
    an SFT step, an evaluation, an RLCR step, the finish): a unit runs from the end of the one
    before to its `record(phase)` (so checkpoint writes and engine builds between units are
    charged to the unit after them, as they will be again), and the seconds JAX spent
    compiling in it (`compile_clock`; of them `backend_clock`, XLA's backend) are kept apart
    from its work. `plan` lists the units still to run, in order, each with its ordinal; the
    ETA is the sum of a forecast of each (`avalon/train/eta.py` says where the reference comes
    from), less what the unit in progress has done (its elapsed work and compile, each at most
    its forecast). A unit's forecast is
        work: the reference's work for its ordinal x the work factor of its phase
        compile: the reference's compile for its ordinal (and, at the first unit here of a
            family of phases sharing programs, the first compile of each phase of the family
            that starts past its first ordinal here: a process builds its programs once)
            x the compile factor; with `warm_cache`, what an earlier invocation of the run
            finished (`done_before`) loads from the persistent cache: its compile less its
            backend part (`eta.CACHE_READ_SHARE` of that stays); the unit in progress, once
            it has looked programs up, loads the share of them the cache has served so far
    The factors are what this invocation's units took against the reference (work: the last
    `window` of the phase; compiles: over every phase, a machine compiles at one speed, the
    latest weighing most, drawn toward 1 while few), 1 before any. A
    phase the reference never timed uses this
    invocation's own units (the mean work of the last `window`, the mean compile of its units
    after the first), and before any a guess (`eta.GUESS`; a first compile: the mean first
    compile of the phases timed here); the ETA then starts with `~`. `status(text)` redraws
    the line (compiling, evaluating, rollouts done). The bar starts at `start` (the step a
    resumed run restarts from), and `close` ends the line with what this invocation did."""

    def __init__(self, total: int, *, stream=sys.stderr, enabled: bool = True, width: int = 28,
                 clock=time.perf_counter, compile_clock=None, backend_clock=None,
                 window: int = 10, start: int = 0, reference: eta.Reference | None = None,
                 done_before: frozenset = frozenset(), warm_cache: bool = False,
                 cache_events=None, on_unit=None):
        self.total, self.stream, self.enabled, self.width = total, stream, enabled, width
        self.clock, self.window = clock, window
        self.compile_clock = compile_clock if compile_clock is not None else (lambda: 0.0)
        self.backend_clock = backend_clock if backend_clock is not None else (lambda: 0.0)
        self.reference = reference or eta.Reference()
        self.done_before, self.warm_cache = done_before, warm_cache
        self.cache_events = cache_events
        self.on_unit = on_unit
        self.remaining: dict[str, int] = {}
        self.schedule: list[tuple[str, int | None]] = []
        self.seconds: dict[str, list[float]] = {}  # this process's units' work seconds
        self.units: dict[str, list[Unit]] = {}  # this process's units
        # this process's units with what the reference said of them (work, compile)
        self._done: list[tuple[str, Unit, float | None, float | None]] = []
        self.compile_s = 0.0
        self.start, self.step, self.note = start, start, ""
        self.last_unit: tuple[str, Unit] | None = None  # for the next metrics line
        self._t0 = clock()
        self._mark = self._now()  # where the next unit began
        self._current: str | None = None
        self._width = 0

    def _now(self) -> tuple[float, float, float, tuple[int, int] | None]:
        events = self.cache_events() if self.cache_events is not None else None
        return self.clock(), self.compile_clock(), self.backend_clock(), events

    def plan(self, schedule) -> None:
        """The units left, in the order they will run: a list of (phase, ordinal) (e.g.
        [("sft", 2), ..., ("eval", 0), ("rl", 0), ...]), or a dict of phase -> ordinals or a
        count (ordinals unknown), taken phase after phase."""
        if isinstance(schedule, dict):
            schedule = [(p, o) for p, v in schedule.items()
                        for o in ([None] * v if isinstance(v, int) else v)]
        self.schedule = list(schedule)
        self.remaining = {}
        for phase, _ in self.schedule:
            self.remaining[phase] = self.remaining.get(phase, 0) + 1
        self._mark = self._now()

    def _next(self, phase: str) -> int | None:
        """The index in the schedule of `phase`'s next unit (None: none is planned)."""
        return next((i for i, (p, _) in enumerate(self.schedule) if p == phase), None)

    def begin(self, phase: str) -> None:
        """A unit of `phase` is under way (it began when the unit before it ended)."""
        self._current = phase

    def record(self, phase: str, seconds: float | None = None) -> tuple[float, float]:
        """One unit of `phase` finished: since the unit before it, or in `seconds` (of which
        nothing compiled) when it was not begun. Returns (post-compile seconds, compile
        seconds)."""
        forecast = next((f for f in self._forecast() if f[0] == phase), None)
        if self._current == phase:
            wall, compiled, backend = self._elapsed()
        else:
            wall, compiled, backend = float(seconds or 0.0), 0.0, 0.0
        before, self._current, self._mark = self._mark[3], None, self._now()
        i = self._next(phase)
        ordinal = self.schedule.pop(i)[1] if i is not None else None
        if i is not None:
            self.remaining[phase] -= 1
        self.compile_s += compiled
        warm = self._warm(phase, ordinal)
        if before is not None:  # what the cache said: loaded at least as much as it compiled
            served = _served_share(before, self._mark[3])
            warm = served is not None and served >= 0.5
        unit = Unit(wall - compiled, compiled, phase not in self.seconds, self.start > 0,
                    ordinal, min(backend, compiled), warm)
        self.seconds.setdefault(phase, []).append(unit.work_s)
        self.units.setdefault(phase, []).append(unit)
        self._done.append((phase, unit, *(forecast[2:4] if forecast else (None, None))))
        self.last_unit = (phase, unit)
        if self.on_unit is not None:
            self.on_unit(phase, unit)
        return unit.work_s, unit.compile_s

    def _elapsed(self) -> tuple[float, float, float]:
        """(wall, compile, backend) seconds of the unit in progress."""
        t0, c0, b0, _ = self._mark
        wall = self.clock() - t0
        compiled = min(max(self.compile_clock() - c0, 0.0), wall)
        return wall, compiled, min(max(self.backend_clock() - b0, 0.0), compiled)

    def _warm(self, phase: str, ordinal: int | None) -> bool:
        # A unit an earlier invocation finished put its programs in the cache; one it was
        # killed in may have put some or none there, so its programs are expected to compile
        # again (the unit in progress goes by what the cache serves it: `_served`).
        return self.warm_cache and (phase, ordinal) in self.done_before

    def _served(self, phase: str, ordinal: int | None, current: bool) -> float:
        """The share of the unit's programs expected from the persistent cache. For the unit
        in progress, once it has looked a program up, the share the cache has served it so far
        (a unit the killed invocation began loads the programs it compiled before the kill; a
        finished one's that the cache lost compile); else all or none (`_warm`)."""
        before = self._mark[3]
        if current and before is not None and self.cache_events is not None:
            served = _served_share(before, self.cache_events())
            if served is not None:
                return served
        return 1.0 if self._warm(phase, ordinal) else 0.0

    # ---- the forecast ------------------------------------------------------------------------
    def _references(self) -> list[tuple[str, int | None, float | None, float | None]]:
        """(phase, ordinal, the reference's work, the reference's compile) of every unit left,
        in the order they run, before any factor. The compile counts what the unit builds in
        this process: its ordinal's new programs, and at the first unit of a family of phases
        that share programs (`eta.FAMILY`) the first programs of each phase of the family that
        will not start at its first ordinal here (a resumed process builds them once)."""
        ref, out = self.reference, []
        seen = {eta.FAMILY.get(p, p) for p in self.seconds}
        firsts: dict[str, int | None] = {}  # each phase's first ordinal left here
        for phase, ordinal in self.schedule:
            firsts.setdefault(phase, ordinal)
        current = self._current
        for phase, ordinal in self.schedule:
            family = eta.FAMILY.get(phase, phase)
            parts = [(phase, ordinal)]
            if family not in seen:
                seen.add(family)
                parts += [(q, ref.first_ordinal[q]) for q, o in firsts.items()
                          if eta.FAMILY.get(q, q) == family and q in ref.first_ordinal
                          and q not in self.seconds and o != ref.first_ordinal[q]]
            out.append((phase, ordinal, ref.work_of(phase, ordinal),
                        self._compile_of(parts, current=phase == current)))
            if phase == current:
                current = None
        return out

    def _compile_of(self, parts: list[tuple[str, int | None]],
                    current: bool = False) -> float | None:
        """What building `parts` costs by the reference: cold, or for what an earlier
        invocation of the run finished (for the unit in progress: what the cache has served
        so far), a load (its compile less most of its backend part)."""
        total = 0.0
        for phase, ordinal in parts:
            if phase not in self.reference.phases():
                return None
            cold = self.reference.cold_of(phase, ordinal)
            if cold is None:
                if ordinal == self.reference.first_ordinal.get(phase):
                    return None  # the programs a phase starts with were never timed cold
                continue  # no new shapes known at this ordinal
            compiled, backend = cold
            compiled -= (backend * (1.0 - eta.CACHE_READ_SHARE)
                         * self._served(phase, ordinal, current))
            total += compiled
        return total

    def _forecast(self) -> list[tuple[str, int | None, float | None, float | None, float,
                                      float, bool]]:
        """Every unit left, in order: (phase, ordinal, the reference's work and compile, the
        forecast work and compile, whether either is a guess)."""
        refs = self._references()
        current = next((c for p, _, _, c in refs if p == self._current), None)
        compile_factor = self._compile_factor(current)
        out, seen = [], set(self.seconds)
        for phase, ordinal, work_ref, compile_ref in refs:
            first = phase not in seen
            seen.add(phase)
            mine = self.units.get(phase, [])
            guessed = False
            if work_ref is not None:
                work = work_ref * self._work_factor(phase)
            elif mine:
                recent = mine[-self.window:]
                work = sum(u.work_s for u in recent) / len(recent)
            else:
                work, guessed = eta.GUESS.get(phase, eta.GUESS["rl"])[0], True
            if compile_ref is not None:
                compiled = compile_ref * compile_factor
            elif not first:  # what this phase's later units compiled here (new shapes)
                later = [u.compile_s for u in mine if not u.first][-self.window:]
                compiled = sum(later) / len(later) if later else 0.0
            else:  # a guess: this machine's first compiles so far where the phase compiles
                guess = eta.GUESS.get(phase, eta.GUESS["rl"])[1]
                seen_first = [u.compile_s for units in self.units.values() for u in units
                              if u.first and u.compile_s > 0]
                compiled = sum(seen_first) / len(seen_first) if seen_first and guess else guess
                guessed = True
            out.append((phase, ordinal, work_ref, compile_ref, work, compiled, guessed))
        return out

    def _work_factor(self, phase: str) -> float:
        """This invocation's work against the reference's: over this phase's units, else
        over every phase's (the machine's speed), else 1. A phase's first unit in a process
        does not count: it also carries one-off setup (an engine built, a resumed process's
        first runs), which its ordinal in the reference may not have carried."""
        done = [(p, w, u.work_s) for p, u, w, _ in self._done if w is not None and not u.first]
        pairs = ([(w, took) for p, w, took in done if p == phase][-self.window:]
                 or [(w, took) for _, w, took in done][-self.window:])
        expected = sum(w for w, _ in pairs)
        if expected > 0:
            return eta.clamp(sum(took for _, took in pairs) / expected)
        return 1.0

    def _compile_factor(self, current: float | None) -> float:
        """Compiles took this much of the reference's: over the units that compiled at least
        2 s by the reference, the latest weighing twice the one before (a shared machine's
        load changes within minutes, and the latest compile says most about the next), and
        drawn toward 1 while the evidence is thin (the ratio's n/(n+1)-th power, n the units'
        summed weight: one unit moves it halfway, in log terms), since programs of one run
        differ in how their compile time follows the machine's load (a smoke run's SFT
        compile once took 0.36 of its reference, its evaluation's 0.5-0.8). 1 before any. A
        compile in progress (`current`: its reference) running longer than that raises it
        at once."""
        factor, weight, n, expected, took = 1.0, 1.0, 0.0, 0.0, 0.0
        for _, u, _, c in reversed(self._done):
            if c is not None and c >= 2.0:
                expected, took = expected + weight * c, took + weight * u.compile_s
                n, weight = n + weight, weight / 2
        if expected > 0:
            factor = eta.clamp(max(took / expected, 1e-3) ** (n / (n + 1)))
        if self._current is not None and current is not None and current >= 2.0:
            factor = max(factor, eta.clamp(self._elapsed()[1] / current))
        return factor

    def phase_estimate(self, phase: str) -> float:
        """Seconds left in `phase` (see the class docstring)."""
        return self._left()[0].get(phase, 0.0)

    def _left(self) -> tuple[dict[str, float], list[str]]:
        """(seconds left per phase, the phases whose forecast is a guess)."""
        left: dict[str, float] = {}
        guessed: list[str] = []
        in_progress = self._current
        for phase, _, _, _, work, compiled, guess in self._forecast():
            if phase == in_progress:  # the unit in progress: what is left of it
                wall, elapsed_compile, _ = self._elapsed()
                work -= min(wall - elapsed_compile, work)
                compiled -= min(elapsed_compile, compiled)
                in_progress = None
            left[phase] = left.get(phase, 0.0) + max(work + compiled, 0.0)
            if guess and phase not in guessed:
                guessed.append(phase)
        return left, guessed

    def eta_seconds(self) -> tuple[float, list[str]]:
        """(seconds left, the phases whose forecast is a guess: never timed anywhere)."""
        left, guessed = self._left()
        return sum(left.values()), guessed

    def eta(self) -> str:
        seconds, guessed = self.eta_seconds()
        return ("~" if guessed else "") + fmt_seconds(shown_seconds(seconds))

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
        done = [f"{len(v)} {names[p][len(v) != 1]}" for p, v in self.seconds.items()
                if v and p in names]
        what = ", ".join(done) or "nothing"
        steps = (f"steps {self.start} -> {self.step}" if self.step != self.start
                 else f"at step {self.step}")
        return (f"this run: {steps} ({what}) in {fmt_seconds(self.clock() - self._t0)}, "
                f"{fmt_seconds(self.compile_s)} of it compiling")

    def close(self) -> None:
        """Records the finish if it was begun; ends the line with what this invocation did
        (`done_text`)."""
        if self._current == "finish":
            self.record("finish")
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


def _served_share(before: tuple[int, int], now: tuple[int, int]) -> float | None:
    """The share of the programs looked up between two (hits, misses) counts of the persistent
    cache that it served; None when none was looked up."""
    hits, misses = (n - b for n, b in zip(now, before))
    return hits / (hits + misses) if hits + misses > 0 else None


def shown_seconds(seconds: float) -> int:
    """The whole seconds the ETA shows for a forecast: to the nearest second (rounding up would
    add up to a second to every forecast, which is most of what is left at a run's end); a
    forecast under a second reads 1 s."""
    return math.floor(seconds + 0.5) if seconds >= 1.0 else math.ceil(seconds)


def shown_range(shown: float) -> tuple[float, float]:
    """The forecasts an ETA of `shown` seconds (as `fmt_seconds` writes `shown_seconds`) can
    stand for: `0m03s` 2.5 up to 3.5 s, `0m01s` anything under 1.5 s, `0m00s` nothing left,
    and from an hour on the minute written (`1h05m`: 65 up to 66 minutes)."""
    if shown >= 3600:
        return shown, shown + 60.0
    if shown <= 1:
        return 0.0, 1.5 * shown
    return shown - 0.5, shown + 0.5


def fmt_seconds(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 3600}h{(s % 3600) // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
