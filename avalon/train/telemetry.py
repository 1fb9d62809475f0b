"""Run telemetry: `WORKDIR/metrics.jsonl`, TensorBoard event files, a console progress bar.

One `Telemetry` per process; only process 0 writes (every host computes the same global metrics
after the cross-host reductions, so one writer is the record). Each `log(step, metrics)` appends
one JSON object per line (`{"step": ..., "name": value, ...}`; non-finite numbers are written as
null, strings and lists kept) and the scalar entries to TensorBoard under the same names.
Appending is resume-safe: on restart, lines for steps after the resumed checkpoint's step are
dropped first (the resumed run logs them again), so a killed run leaves no duplicates.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
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
        self.progress = ProgressBar(total_steps, stream=stream, enabled=enabled)
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


class ProgressBar:
    """`[#####.....] 12/40  RL 2/30 reward 0.41  ETA 3m12s` on one console line.

    The ETA is per phase: each phase's remaining units (`plan`) times its measured seconds per
    unit (`record`), the first unit left out once there are two (it includes the compile). A
    phase with work left and nothing measured yet shows as `+ PHASE ?`, so SFT step times are
    never extrapolated over RLCR steps. `status(text)` redraws the line with a note of what is
    happening now (compiling, evaluating)."""

    def __init__(self, total: int, *, stream=sys.stderr, enabled: bool = True, width: int = 28):
        self.total, self.stream, self.enabled, self.width = total, stream, enabled, width
        self.remaining: dict[str, int] = {}
        self.seconds: dict[str, list[float]] = {}
        self.step, self.note = 0, ""
        self._width = 0

    def plan(self, remaining: dict[str, int]) -> None:
        """Units of work left per phase (e.g. {"sft": 300, "eval": 4, "rl": 30})."""
        self.remaining = dict(remaining)

    def record(self, phase: str, seconds: float) -> None:
        """One unit of `phase` finished in `seconds`."""
        self.seconds.setdefault(phase, []).append(float(seconds))
        if self.remaining.get(phase, 0) > 0:
            self.remaining[phase] -= 1

    def eta(self) -> str:
        known, unknown = 0.0, []
        for phase, left in self.remaining.items():
            if left <= 0:
                continue
            times = self.seconds.get(phase, [])
            if not times:
                unknown.append(phase)
                continue
            steady = times[1:] if len(times) > 1 else times
            known += left * sum(steady) / len(steady)
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
        line = f"[{bar}] {self.step}/{self.total}  {note}  ETA {self.eta()}"
        self.stream.write("\r" + line.ljust(self._width))  # blank what a longer line left
        self._width = len(line)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.total > 0:
            self.stream.write("\n")
            self.stream.flush()


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
