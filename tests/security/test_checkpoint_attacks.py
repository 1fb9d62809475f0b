"""Every checkpoint attack of the red-team list (`experiments/security/checkpoint_attacks.py`), as a
test. Those of its second pass each resumed wrongly or stopped on the code before (a flipped bit in
the newest meta's format or a shape stopped resume with a plain ValueError; format v1 skipped
verification, so a flipped data bit restored silently; a step directory that is a link or a copy
restored as the wrong step; +k, -2k, +k left the content sums unchanged; a save that filled the disk
left a manager that listed no step at all), and each must now fall back to the newest intact step,
or say why."""

import pytest

from experiments.security.checkpoint_attacks import ATTACKS
from experiments.security.outcome import Outcome
from tests.security.layers import require_bwrap


def test_every_attack_is_blocked_by_name():
    assert len({a.name for a in ATTACKS}) == len(ATTACKS) == 10


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack_is_stopped(attack, tmp_path):
    if "fills the disk" in attack.name:
        require_bwrap()
    outcome, detail = attack.run(str(tmp_path))
    assert outcome is Outcome.BLOCKED, detail
