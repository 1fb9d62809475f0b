"""Run telemetry: `WORKDIR/metrics.jsonl`, TensorBoard event files, a console progress bar.

One `Telemetry` per process; only process 0 writes (every host computes the same global metrics
after the cross-host reductions, so one writer is the record). Each `log(step, metrics)` appends
one JSON object per line (`{"step": ..., "name": value, ...}`; non-finite numbers are written as
null, strings and lists kept) and the scalar entries to TensorBoard under the same names.
Appending is resume-safe: on restart, lines for steps after the resumed checkpoint's step are
dropped first (the resumed run logs them again), so a killed run leaves no duplicates.
"""

from __future__ import annotations

import bisect
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
                 total_steps: int = 0, stream=sys.stderr):
        self.enabled = enabled
        self.path = paths.join(workdir, "metrics.jsonl")
        self.progress = ProgressBar(total_steps, stream=stream, enabled=enabled,
                                    compile_clock=CompileClock.process())
        self._tb = None
        if not enabled:
            return
        paths.path(workdir).mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(self.path) if r.get("step", -1) <= resume_step]
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


class ProgressBar:
    """`[#####.....] 12/40  RL 2/30 reward 0.41  ETA 3m12s  compiled 4m10s` on one line.

    Compilation is a phase of its own: a unit of work (an SFT step, an evaluation, an RLCR step)
    is timed between `begin(phase)` and `record(phase)`, and the seconds JAX spent compiling in
    between (`compile_clock`) go to the compile phase's elapsed time, not to the unit's. The
    ETA is then each phase's remaining units (`plan`) times its mean post-compile seconds per
    unit (over the last `window` units: steps that lengthen as the organisation grows move it).
    Compiles still to come are not forecast; the time spent so far is shown beside the ETA. A
    phase with work left and nothing measured yet shows as `+ PHASE ?`, so SFT step times are
    never extrapolated over RLCR steps. `status(text)` redraws the line with a note of what is
    happening now (compiling, evaluating)."""

    def __init__(self, total: int, *, stream=sys.stderr, enabled: bool = True, width: int = 28,
                 clock=time.perf_counter, compile_clock=None, window: int = 10):
        self.total, self.stream, self.enabled, self.width = total, stream, enabled, width
        self.clock, self.window = clock, window
        self.compile_clock = compile_clock if compile_clock is not None else (lambda: 0.0)
        self.remaining: dict[str, int] = {}
        self.seconds: dict[str, list[float]] = {}
        self.compile_s = 0.0
        self.step, self.note = 0, ""
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
            t0, c0 = self._begun.pop(phase)
            wall, compiled = self.clock() - t0, self.compile_clock() - c0
            compiled = min(max(compiled, 0.0), wall)
        else:
            wall, compiled = float(seconds or 0.0), 0.0
        self.compile_s += compiled
        self.seconds.setdefault(phase, []).append(wall - compiled)
        if self.remaining.get(phase, 0) > 0:
            self.remaining[phase] -= 1
        return wall - compiled, compiled

    def eta_seconds(self) -> tuple[float, list[str]]:
        """(seconds of measured phases' remaining work, phases with work left but no unit
        measured yet)."""
        known, unknown = 0.0, []
        for phase, left in self.remaining.items():
            if left <= 0:
                continue
            times = self.seconds.get(phase, [])[-self.window:]
            if not times:
                unknown.append(phase)
                continue
            known += left * sum(times) / len(times)
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

    def close(self) -> None:
        if self.enabled and self.total > 0:
            self.stream.write("\n")
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
