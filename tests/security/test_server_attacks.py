"""The servers' global limits (`experiments/security/server_attacks.py`), as tests:
each limit did not hold on the code before (120 of 120 sessions past max_sessions 20; a killed
server's session directories stayed; a thread per connection and every 55 MiB body held, with no
cap; a thread per ORS call), and each must hold now."""

import pytest

from experiments.security.outcome import Outcome
from experiments.security.server_attacks import ATTACKS


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_limit_holds(attack, tmp_path):
    outcome, detail = attack.run(str(tmp_path))
    assert outcome is Outcome.BLOCKED, detail
