"""Make the toy smoke run's seed checkpoint (`avalon/data/toy_smoke_seed/`), in one command:

    python -m experiments.smoke_seed [--workdir=runs/toy_smoke_seed]

1. trains `configs/toy_org.py:smoke_seed` with `python -m avalon.main` (the smoke model: the
   toy's layers at half width and half the experts, 0.22M params; the toy's SFT recipe: 1024
   teacher episodes, 150 skill updates then 450 on teacher traces; no RLCR; one evaluation;
   resumable like any run);
2. exports its params as a Hugging Face directory in bf16 (`avalon.tools.convert`, which also
   writes the run's word tokenizer as tokenizer.json) into the package, beside the run's
   tokenizer record and a README.md saying how it was made (command, commit, the evaluation).

`configs/toy_org.py:smoke` starts from it (`init_from`), so a few-minute smoke run plays an
organisation that hires, messages and reviews. The word tokenizer's ids come from the toy's
environments and the organisation's vocabulary: when those change, `tests/train/
test_smoke_seed.py` fails and this command makes the seed again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from avalon import command

PROG = "experiments.smoke_seed"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "configs/toy_org.py:smoke_seed"
SEED_DIR = os.path.join(REPO, "avalon", "data", "toy_smoke_seed")


def describe_seed(run: str, commit: str) -> str:
    """The seed's README: how it was made, and what its run measured (the last SFT update's
    loss; the evaluation after SFT, when the run has logged it)."""
    records = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))]
    sft = [r for r in records if r.get("phase") == "sft"]
    evals = [r for r in records if r.get("phase") == "eval"]
    measured = []
    if sft:
        measured.append(f"- last SFT update ({sft[-1]['sft_step']}): `sft/nll` "
                        f"{sft[-1]['sft/nll']:.3f}")
    keys = ("eval/org_reward", "eval/single_reward", "eval/org/hires_per_rollout",
            "eval/org/messages_per_agent")
    if evals:
        measured += [f"- `{k}`: {evals[-1][k]:.3f}" for k in keys
                     if isinstance(evals[-1].get(k), (int, float))]
    return (
        "# The toy smoke run's seed\n\n"
        "The params `configs/toy_org.py:smoke` starts from (`init_from`): the smoke model "
        "(the toy's layers at half width and half the experts, 0.22M params) after the toy's "
        "SFT recipe (1024 teacher episodes of collective verification; 150 skill updates, then "
        "450 on teacher traces), no RLCR, stored in bf16 as a Hugging Face directory "
        "(config.json, safetensors) with the run's word tokenizer (tokenizer.json; "
        "tokenizer_record.json is the word list the run trained with).\n\n"
        f"Made at commit {commit} with one command:\n\n"
        "    python -m experiments.smoke_seed\n\n"
        f"(`python -m avalon.main --config={CONFIG}`, then `python -m avalon.tools.convert "
        "--to=hf --param_dtype=bfloat16`). What its run measured (the evaluation: held-out "
        "tasks, the organisation at budget 3 against a single agent):\n\n"
        + "\n".join(measured) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = command.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/toy_smoke_seed",
                        help="the seed's training run (rerunning resumes it)")
    parser.add_argument("--out", default=SEED_DIR, help="where the seed goes (the package's)")
    args = parser.parse_args(argv)
    run = os.path.abspath(args.workdir)
    rc = subprocess.run([sys.executable, "-m", "avalon.main", f"--config={CONFIG}",
                         f"--workdir={run}"], cwd=REPO).returncode
    if rc:
        raise SystemExit(rc)
    from avalon.tokenizer.record import RECORD_FILE
    from avalon.tools import convert
    tmp = args.out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    convert.convert(run, tmp, convert.Target.HF, param_dtype="bfloat16", progress=False)
    shutil.copy2(os.path.join(run, RECORD_FILE), os.path.join(tmp, RECORD_FILE))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip() or "unknown"
    with open(os.path.join(tmp, "README.md"), "w") as f:
        f.write(describe_seed(run, commit))
    shutil.rmtree(args.out, ignore_errors=True)
    os.replace(tmp, args.out)
    size = sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out))
    print(f"{PROG}: wrote {args.out} ({size / 1024:.0f} KB)")


if __name__ == "__main__":
    command.run(PROG, main, interrupted="stopped; rerun the same command to resume the seed's "
                "training")
