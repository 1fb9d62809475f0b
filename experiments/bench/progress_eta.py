"""How true is the console's ETA? A training run played with every progress line timed, and each
line's ETA set against the time that invocation really had left.

    python -m experiments.bench.progress_eta --workdir=/tmp/eta -- --config=configs/toy_org.py:smoke
    python -m experiments.bench.progress_eta --workdir=/tmp/eta --kill_at='RL 3/3: rollouts' \
        -- --config=configs/toy_org.py:smoke

runs `python -m avalon.main --workdir=WORKDIR ARGS...`, reading its stderr as it comes and
stamping each progress line (the bar redraws with a carriage return) with the time its first
character arrived. With `--kill_at=TEXT` the run is killed (SIGKILL) at the first line holding
TEXT and started again with the same command, which resumes from its newest checkpoint; only
the lines of the invocation that ran to the end are scored (a killed one has no "time left").
A line's ETA (`ETA 1m10s`; `ETA ~1m10s` where a phase's forecast is a guess, never timed on
the machine: scored like the others) is set against `left`, the seconds from the line to the
invocation's last output: it is within 2x when a time the display rounds to what it shows
(`shown_range`: `0m03s` is 2.5 s up to 3.5 s, `1h05m` 65 up to 66 minutes) lies between
left/2 and 2 x left. Prints a JSON summary (and every line with `--lines`): lines with a full
ETA, how many are within 2x, the worst ratios of what they show to `left`; lines of older code
with an untimed phase (`ETA 0m06s + EVAL ?`, a lower bound), how many are lower bounds (at most
`left`).

    python -m experiments.bench.progress_eta --workdir=/tmp/eta --ship_reference \
        -- --config=configs/toy_org.py:smoke

`--ship_reference` (fresh runs, not killed; `--runs=N` of them, in WORKDIR/1 ... WORKDIR/N, the
last scored) then writes the runs' units as the reference Avalon ships for the config
(`avalon/train/eta_reference/`, `eta.ship`; each unit forecast by its median over the runs):
what a machine that never ran the config forecasts its first lines from. Record it on a quiet
2-core CPU, with an empty machine record (`AVALON_TIMINGS_DIR` pointing at an empty
directory).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

from avalon.train import telemetry

_SPAN = re.compile(r"(\d+)h(\d\d)m|(\d+)m(\d\d)s")


def eta_of(line: str) -> tuple[float | None, bool]:
    """(the seconds a line's ETA says, whether a phase is still untimed); None: no ETA."""
    if "ETA " not in line:
        return None, False
    text = line.split("ETA ", 1)[1].split("  compiled")[0]
    m = _SPAN.search(text)
    seconds = 0.0
    if m:
        seconds = (int(m[1]) * 3600 + int(m[2]) * 60) if m[1] else int(m[3]) * 60 + int(m[4])
    return seconds, "?" in text


def shown_range(text: str) -> tuple[float, float] | None:
    """The forecasts a line's ETA can stand for (`telemetry.shown_range`); None: no ETA."""
    seconds, _ = eta_of(text)
    return None if seconds is None else telemetry.shown_range(seconds)


def within_2x(text: str, left: float) -> bool:
    """Whether a line's ETA, as far as its rounding can tell, is within 2x of `left`."""
    low, high = shown_range(text)
    return low <= 2.0 * left and high >= 0.5 * left


def play(command: list[str], kill_at: str = "") -> tuple[list[tuple[float, str]], float, bool]:
    """Runs `command`; returns (lines with the time each began, the time of the last output,
    whether it was killed at `kill_at`)."""
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    lines, current, began, last = [], b"", None, time.time()
    killed = False
    while True:
        chunk = proc.stderr.read1(4096)
        if not chunk:
            break
        now = time.time()
        last = now
        for byte in chunk:
            if byte in (13, 10):  # \r or \n ends a line
                text = current.decode(errors="replace").strip()
                if text:
                    lines.append((began, text))
                    if kill_at and kill_at in text:
                        proc.send_signal(signal.SIGKILL)
                        killed = True
                current, began = b"", None
            else:
                if began is None:
                    began = now
                current += bytes([byte])
        if killed:
            break
    proc.wait()
    if current.strip():
        lines.append((began or last, current.decode(errors="replace").strip()))
    return lines, last, killed


def score(lines: list[tuple[float, str]], end: float) -> dict:
    full, bounds, rows = [], [], []
    for t, text in lines:
        eta, untimed = eta_of(text)
        if eta is None:
            continue
        left = end - t
        row = {"t": round(t - lines[0][0], 1), "left": round(left, 1), "eta": eta,
               "untimed": untimed, "line": re.sub(r"\s+", " ", text)[:160]}
        rows.append(row)
        if untimed:
            bounds.append(eta <= left + 1.0)
        else:
            row["within_2x"] = within_2x(text, left)
            full.append((row["within_2x"], eta / left if left > 0 else None, row))
    worst = sorted((r for _, r, _ in full if r is not None),
                   key=lambda r: abs(math.log(r)) if r > 0 else math.inf, reverse=True)[:5]
    return {"full_eta_lines": len(full), "within_2x": sum(ok for ok, _, _ in full),
            "worst_ratios": [round(r, 2) for r in worst],
            "untimed_lines": len(bounds), "lower_bounds": sum(bounds), "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--kill_at", default="")
    parser.add_argument("--lines", action="store_true")
    parser.add_argument("--ship_reference", action="store_true")
    parser.add_argument("--runs", type=int, default=1,
                        help="with --ship_reference: fresh runs to record (WORKDIR/1 ... "
                        "WORKDIR/N; the last is scored)")
    parser.add_argument("args", nargs="*", help="avalon.main's arguments (after --)")
    a = parser.parse_args(argv)
    if os.path.exists(a.workdir) and os.listdir(a.workdir):
        raise SystemExit(f"--workdir={a.workdir}: not empty (the run must start fresh)")
    if a.runs < 1 or (a.runs > 1 and not a.ship_reference):
        raise SystemExit(f"--runs={a.runs}: must be 1, or more with --ship_reference")
    workdirs = [a.workdir] if a.runs == 1 else [os.path.join(a.workdir, str(k + 1))
                                                for k in range(a.runs)]
    for workdir in workdirs[:-1]:  # recorded for the reference, not scored
        play([sys.executable, "-m", "avalon.main", f"--workdir={workdir}", *a.args])
    command = [sys.executable, "-m", "avalon.main", f"--workdir={workdirs[-1]}", *a.args]
    out = {"command": command, "kill_at": a.kill_at}
    lines, end, killed = play(command, a.kill_at)
    if killed:
        out["killed_after_s"] = round(end - lines[0][0], 1)
        lines, end, _ = play(command)
    out["wall_s"] = round(end - lines[0][0], 1)
    if a.ship_reference:
        if killed:
            raise SystemExit("--ship_reference: a reference is fresh runs; drop --kill_at")
        import jax

        from avalon.train import eta
        description = json.loads(open(os.path.join(workdirs[-1], "config.json")).read())
        out["shipped"] = eta.ship([os.path.join(w, eta.RUN_RECORD) for w in workdirs],
                                  description,
                                  devices=eta.device_text(jax.devices(), jax.process_count()))
    out |= score(lines, end)
    if not a.lines:
        out.pop("rows")
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
