"""The ORS server's memory, slots, session deletion and number rule
(`experiments/security/server_load_attacks.py`), as tests. Each did not hold on the code before,
run against it: four bodies of empty objects, 1.9 MiB each, took 343 MiB parsed under an 8 MiB
cap that counted bytes; 40 heads held open took 141 MiB (heads had no cap); 48 slow clients
on 32 slots left an honest client 0 of 20 requests; a `/delete` while a call ran left the
session's directory on disk and a waiting call of the deleted session ran; `clock_s: 1e400`
was a 500. Each must hold now."""

import pytest

from experiments.security.outcome import Outcome
from experiments.security.server_load_attacks import ATTACKS


def test_every_attack_is_named_once():
    assert len({a.name for a in ATTACKS}) == len(ATTACKS) == 5


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_limit_holds(attack, tmp_path):
    outcome, detail = attack.run(str(tmp_path))
    assert outcome is Outcome.BLOCKED, detail
