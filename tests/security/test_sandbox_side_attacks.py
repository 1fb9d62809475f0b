"""The attacks on the trusted code beside the sandbox (`experiments/security/
sandbox_side_attacks.py`), as tests. Each worked on the code before, run against it: the
program's SIGINT to PID 1 or to its process group killed the supervisor (the run ended as
"sandbox failed", its output lost), and its `prlimit` on PID 1 made the supervisor fail; the
supervisor read back 495 hard links into 507 MiB, twice the run's 256 MiB; the copy-back
raised on a blank name after pruning the workspace, and on a byte cap passed half-way; two
sandboxes running at once saw each other's `flock`, `fcntl` locks and reads (`F_NOTIFY`) on
the interpreter, /etc/ld.so.cache and /dev/null; the host's packages (the venv's, the
interpreter's `site-packages`, Debian's `dist-packages`) were readable and importable. Each
must now have no effect. In CI (`AVALON_REQUIRE_BWRAP=1`) a machine without bubblewrap fails
these tests instead of skipping them."""

import pytest

from avalon.org import sandbox
from experiments.security.outcome import Outcome
from experiments.security.sandbox_side_attacks import ATTACKS
from tests.security.layers import require_bwrap


def test_every_attack_is_named_once():
    assert len({a.name for a in ATTACKS}) == len(ATTACKS) == 7


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack_has_no_effect(attack, tmp_path):
    require_bwrap()
    assert sandbox.layers().bubblewrap, sandbox.layers().why
    outcome, detail = attack.run(str(tmp_path))
    assert outcome is Outcome.BLOCKED, detail
