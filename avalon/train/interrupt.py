"""Ctrl-C that stops a training run even when it lands in a callback.

Python turns SIGINT into a KeyboardInterrupt in whatever Python code the main thread runs next.
When that is a callback native code called (a JAX monitoring listener during a compile, a
destructor), the caller may swallow the exception, and the run went on to its end as if no
Ctrl-C had come (the Ctrl-C test saw a run go on to its end after one, on a loaded machine;
where it was lost was not found). While `catching()` is active the
handler also records the request, and the loop's unit boundaries (`check`) raise it again, so a
swallowed Ctrl-C stops the run at the next SFT step, evaluation or RLCR step.
"""

from __future__ import annotations

import contextlib
import signal
import threading

_requested = False


def _on_sigint(signum, frame):
    global _requested
    _requested = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def catching():
    """While active (in the main thread), Ctrl-C is recorded as well as raised."""
    global _requested
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _requested = False
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def check() -> None:
    """Raise KeyboardInterrupt when a Ctrl-C came while `catching()` was active."""
    if _requested:
        raise KeyboardInterrupt
