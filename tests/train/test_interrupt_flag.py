"""A Ctrl-C swallowed where it landed still stops the run at the next unit boundary
(`avalon/train/interrupt.py`): the handler records it, `check` raises it again."""

from __future__ import annotations

import os
import signal

import pytest

from avalon.train import interrupt


def test_a_swallowed_ctrl_c_is_raised_again_at_the_next_check():
    with interrupt.catching():
        interrupt.check()  # nothing requested: no exception
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs at a bytecode boundary of this thread
                pass
        except KeyboardInterrupt:
            pass  # swallowed, as a native caller of a callback would
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
    assert signal.getsignal(signal.SIGINT) is not interrupt._on_sigint  # restored


def test_a_new_run_starts_without_an_old_request():
    with interrupt.catching():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
        except KeyboardInterrupt:
            pass
    with interrupt.catching():
        interrupt.check()
