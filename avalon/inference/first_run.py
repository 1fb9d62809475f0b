"""A fresh program's first call, timed whole, for whoever counts compile time.

JAX's compile events (`/jax/core/compile/*_duration`) cover tracing, lowering and the XLA
compile, not the rest of a fresh program's first call: jit's dispatch bookkeeping, loading the
executable and its first run, which on XLA:CPU costs more than its later runs. On the toy
engine (configs/toy_org.py, 8 rows, no persistent cache, at load 10), 5 fresh programs' first
calls ran 10 s of wall past their 208 s of compile events, while their later calls took
milliseconds. A progress ETA that counts that time as work overstates every later evaluation.

`FirstRuns(on_first_run)(program, *args)` calls `program`; when the call compiled (a
backend-compile event in this thread: a new shape bucket, or a program dropped by
`release_programs`), it waits for the result and reports the call's (start, end) in
`time.time()` seconds, the clock of JAX's event spans (`train.telemetry.CompileClock.add`).
That whole call counts, so one steady run per fresh program is counted too (milliseconds to a
fraction of a second per dispatch on the toy). Without `on_first_run` nothing waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_thread = threading.local()
_listening = threading.Lock()
_registered = False


def _on_duration(event: str, duration: float, **_) -> None:
    if event == BACKEND_COMPILE_EVENT:
        _thread.compiles = getattr(_thread, "compiles", 0) + 1


def compiles_in_this_thread() -> int:
    """Backend compiles (or persistent-cache loads) this thread has done since the first
    `FirstRuns` was made."""
    return getattr(_thread, "compiles", 0)


def _listen() -> None:
    global _registered
    with _listening:
        if not _registered:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            _registered = True


class FirstRuns:
    """Calls programs, reporting the span of each call that compiled (module docstring)."""

    def __init__(self, on_first_run: Callable[[float, float], None] | None = None):
        self.on_first_run = on_first_run
        _listen()

    def __call__(self, program, *args, **kwargs):
        if self.on_first_run is None:
            return program(*args, **kwargs)
        before, start = compiles_in_this_thread(), time.time()
        out = program(*args, **kwargs)
        if compiles_in_this_thread() != before:
            jax.block_until_ready(out)
            self.on_first_run(start, time.time())
        return out
