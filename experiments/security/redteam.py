"""Runs every attack of the red-team list and prints a table (attack, outcome, detail).

    python -m experiments.security.redteam [--only=SUBSTRING]

Each attack module exposes `ATTACKS: list[Attack]`; an attack that raises is a crash. The last
line counts the crashes by what they mean (`KINDS`: an escape from the sandbox, a crash of the
driver, a server limit broken, a wrong restore). Exit status 1 when any attack crashed.
"""

import argparse
import sys
import tempfile
import time
import traceback

from experiments.security.outcome import Attack, Outcome

# What a CRASH of each module's attacks is, for the summary line.
KINDS = {"sandbox_attacks": "escapes", "kernel_attacks": "escapes",
         "driver_attacks": "driver crashes", "ors_attacks": "server or driver failures",
         "server_attacks": "broken server limits",
         "checkpoint_attacks": "silent wrong restores or stopped resumes",
         "sandbox_side_attacks": "supervisor failures, lost work or leaks",
         "server_load_attacks": "honest clients refused, broken limits or wrong replies"}


def all_attacks() -> list[tuple[str, Attack]]:
    """(kind of failure, attack) for every attack of every module."""
    from experiments.security import (
        checkpoint_attacks,
        driver_attacks,
        kernel_attacks,
        ors_attacks,
        sandbox_attacks,
        sandbox_side_attacks,
        server_attacks,
        server_load_attacks,
    )
    modules = [sandbox_attacks, kernel_attacks, sandbox_side_attacks, driver_attacks,
               ors_attacks, server_attacks, server_load_attacks, checkpoint_attacks]
    return [(KINDS[m.__name__.rsplit(".", 1)[1]], a) for m in modules for a in m.ATTACKS]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only attacks whose name contains this")
    args = parser.parse_args(argv)
    rows, kinds = [], []
    for kind, attack in all_attacks():
        if args.only not in attack.name:
            continue
        kinds.append(kind)
        start = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                outcome, detail = attack.run(tmp)
            except Exception as e:  # noqa: BLE001 - an attack that raises is the crash we report
                outcome = Outcome.CRASH
                detail = f"{type(e).__name__}: {e}".splitlines()[0]
                traceback.print_exc(file=sys.stderr)
        rows.append((attack.name, outcome.value, f"{time.monotonic() - start:.2f}", detail))
    print("| attack | outcome | s | detail |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    crashed = [kind for kind, row in zip(kinds, rows) if row[1] == Outcome.CRASH.value]
    counts = ", ".join(f"{crashed.count(k)} {k}" for k in dict.fromkeys(KINDS.values()))
    print(f"\n{len(rows)} attacks tried: {len(rows) - len(crashed)} blocked or tool errors; "
          f"{counts}")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
