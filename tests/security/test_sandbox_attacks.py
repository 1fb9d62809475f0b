"""Every sandbox and workspace attack of the red-team list, as a test: each one
crashed, hung or worked on the code before the hardening (`python -m experiments.security.redteam`
run against it: 14 crashes of 14), and each must now be blocked or a tool error. Each attack is
bounded in time by itself (run time limits, a 15 s bound on the rollout thread, a 4 s race)."""

import pytest

from experiments.security.outcome import Outcome
from experiments.security.sandbox_attacks import ATTACKS

B, T = Outcome.BLOCKED, Outcome.TOOL_ERROR
EXPECTED = {
    "sandbox: _posixsubprocess under another name -> fork_exec": B,
    "sandbox: call_setsid child outlives the kill": B,
    "sandbox: memory over the limit via children": B,
    "sandbox: fork bomb (no process limit)": B,
    # (tool errors unless the flipper never ran while the trainer wrote: then merely blocked)
    "workspace: symlink flip to /proc/self/cwd during write/read": {T, B},
    "workspace: path component over 255 bytes": T,
    "workspace: '\\ud800' in a path": T,
    "workspace: >4096-byte path made by run_code, then snapshot": B,
    "workspace: FIFO, link loop, locked dir, bad bytes, 20 levels": T,
    "software: deeply nested results.json": B,
    # (under bubblewrap the FIFO stays in the sandbox: write_file then just writes)
    "workspace: mkfifo then write_file": {T, B},
    "disk: 40 x 1 MiB from run_code": T,
    "disk: 20,000 files from run_code": T,
    "run_code: NUL and surrogate arguments": T,
}


def test_every_attack_has_an_expectation():
    assert sorted(a.name for a in ATTACKS) == sorted(EXPECTED)


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack_is_stopped(attack, tmp_path):
    outcome, detail = attack.run(str(tmp_path))
    expected = EXPECTED[attack.name]
    assert outcome in (expected if isinstance(expected, set) else {expected}), detail


def test_the_flip_race_is_also_lost_by_the_walk(tmp_path, monkeypatch):
    # Writes always walk (making directories); reads use openat2 where the kernel has it: here
    # the reads walk too, as on a kernel without openat2.
    from avalon.org import beneath
    from experiments.security.sandbox_attacks import symlink_flip_race
    real_open = beneath.open_beneath
    monkeypatch.setattr(beneath, "open_beneath",
                        lambda *a, **k: real_open(*a, **{**k, "use_openat2": False}))
    outcome, detail = symlink_flip_race(str(tmp_path))
    assert outcome in (T, B), detail
