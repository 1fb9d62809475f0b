"""Every model-output attack on the driver (`experiments/security/driver_attacks.py`), as a test:
each crashed the driver or worked on the code before (a title with a newline was hired and
pinned in role cards; `seq:²` raised out of `RolloutDriver.run`; a remote environment's
workspace mirror raised at the end; a DM put the real call id into a teammate's prompt; a tool
argument of `1e400` parsed as an infinity, and writing the event log then raised out of
`RolloutDriver.run`), and each must now be a tool error or have no effect."""

import pytest

from experiments.security.driver_attacks import ATTACKS
from experiments.security.outcome import Outcome

B, T = Outcome.BLOCKED, Outcome.TOOL_ERROR
EXPECTED = {
    "driver: evidence 'seq:²' and other non-ASCII or huge numbers": T,
    "driver: tool arguments past a double (1e400), the event log written": T,
    "driver: titles with newlines, NUL, escapes": T,
    "driver: titles with RTL overrides, zero-width characters": T,
    "driver: file names with hidden characters": T,
    "ors mirror: files 'a/b' and 'a\\b'": B,
    "ors mirror: folders moved (the mirror's emptied directories)": B,
    "driver: message text holding a non-special <tool_call>": B,
}


def test_every_attack_has_an_expectation():
    assert sorted(a.name for a in ATTACKS) == sorted(EXPECTED)


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack_is_stopped(attack, tmp_path):
    if "tool_call" in attack.name:
        pytest.importorskip("tokenizers")
    outcome, detail = attack.run(str(tmp_path))
    assert outcome is EXPECTED[attack.name], detail
