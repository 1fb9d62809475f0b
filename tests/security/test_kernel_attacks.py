"""Every sandbox attack through the kernel (`experiments/security/kernel_attacks.py`), as a test:
each worked on the code before, where the audit hook was the boundary (pure Python switched it
off and reached syslog, io_uring, userfaultfd, bpf and perf_event_open as root, and, where Landlock
was missing, read and wrote files beside the workspace; the trainer was reniced and pinned and
another process put under SCHED_IDLE from inside; 300 MiB of memfds, 400 MiB of pipes, 100 MiB
and 2,400 inodes in unlisted files, 551 threads; an honest program printing 2 MiB died of "File
too large"), and each must have no effect under bubblewrap. In CI (`AVALON_REQUIRE_BWRAP=1`) a
machine without bubblewrap fails these tests instead of skipping them."""

import pytest

from avalon.org import sandbox
from experiments.security.kernel_attacks import ATTACKS
from experiments.security.outcome import Outcome
from tests.security.layers import require_bwrap


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack_has_no_effect(attack, tmp_path):
    require_bwrap()
    assert sandbox.layers().bubblewrap, sandbox.layers().why
    outcome, detail = attack.run(str(tmp_path))
    assert outcome is Outcome.BLOCKED, detail


def test_every_layer_holds_here_under_bubblewrap():
    require_bwrap()
    layers = sandbox.layers()
    assert layers.bubblewrap and layers.filter and layers.inode_cap, layers
    if layers.own_uid:  # the trainer is root: the sandbox's uid is its own
        assert layers.missing() == []
