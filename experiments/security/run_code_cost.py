"""What one `run_code` costs: a small program run `--runs` times in a workspace of `--files`
small files (as an agent's program runs: through `Workspace.run_python`, in one trainer
process), after two warm-up runs (the first probes the sandbox's layers).

    python -m experiments.security.run_code_cost --runs=30 --files=20

Prints one JSON object: the median, min and max wall seconds of a run (the trainer's whole
call: sandbox start, the workspace copied in and back, the program, the teardown).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from avalon.org.workspace import Workspace, WorkspaceLimits

PROGRAM = ("import json, os\n"
           "data = [open(f'src/f{i}.txt').read() for i in range(len(os.listdir('src')))]\n"
           "open('out.json', 'w').write(json.dumps(sorted(data)))\n"
           "print(sum(map(len, data)))\n")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--files", type=int, default=20)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        ws = Workspace(tmp, WorkspaceLimits())
        for i in range(args.files):
            ws.write(f"src/f{i}.txt", f"line {i}\n" * 40)
        ws.write("p.py", PROGRAM)
        for _ in range(2):
            ws.run_python("p.py")
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            r = ws.run_python("p.py")
            times.append(time.perf_counter() - start)
            if r.returncode != 0:
                raise SystemExit(f"run_code_cost: the program failed: {r.stderr[-300:]}")
    out = {"runs": args.runs, "files": args.files, "median_s": statistics.median(times),
           "min_s": min(times), "max_s": max(times)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
