"""Runs every attack of the red-team list and prints a table (attack, outcome, detail).

    python -m experiments.security.redteam [--only=SUBSTRING]

Each attack module exposes `ATTACKS: list[Attack]`; an attack that raises is a crash. Exit status 1
when any attack crashed.
"""

import argparse
import sys
import tempfile
import time
import traceback

from experiments.security.outcome import Attack, Outcome


def all_attacks() -> list[Attack]:
    from experiments.security import checkpoint_attacks, http_attacks, sandbox_attacks
    return [*sandbox_attacks.ATTACKS, *http_attacks.ATTACKS, *checkpoint_attacks.ATTACKS]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only attacks whose name contains this")
    args = parser.parse_args(argv)
    rows = []
    for attack in all_attacks():
        if args.only not in attack.name:
            continue
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
    crashed = sum(row[1] == Outcome.CRASH.value for row in rows)
    print(f"\n{len(rows)} attacks: {len(rows) - crashed} blocked or tool errors, {crashed} crashes")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
