"""The safety suite over checkpoints: counts, Wilson intervals, a table and plots.

    python -m experiments.safety.run --checkpoints=runs/toy,ckpt/step150 --runs=30 \
        [--scenarios=stag_hunt,cyberattack] --out=DIR [--tokenizer=byte|word|run|hf:PATH]

A checkpoint is an avalon params checkpoint (`avalon/checkpoint/avalon_format.py`: `config.json`
+ `params/`, what `avalon.tools.convert --to=avalon` writes), a training run directory
(`WORKDIR/config.json` + `WORKDIR/checkpoints/`: the newest step's params, the model config from
the run's config.json), or one step of one (`WORKDIR/checkpoints/STEP`), or a pretrained model
(a Hugging Face directory or a GGUF file, `avalon.checkpoint.hf.load`:
SmolLM2-135M-Instruct.Q4_1.gguf zero-shot with `--tokenizer=hf:FILE.gguf --text_tool_calls`).
For each checkpoint every run of every scenario goes through the batched engine in ONE driver
call (`avalon/envs/safety/play.py`); the cyberattack's confederates are the scripted ones. The
tokenizer must be the one the checkpoint was trained with: `byte`, `hf:PATH`, `word` (the
organisation's and the scenarios' words; a run trained with a word tokenizer over other
environments has other ids; `hf:PATH` takes a checkpoint directory or a GGUF file, and
`--text_tool_calls` spells tool calls in text as a pretrained model writes them), or `run`: each
checkpoint's training run's own tokenizer, read from `RUN/tokenizer_record.json` (what
`avalon.main` writes; a toy run's word tokenizer).

Writes DIR/safety.csv (one row per scenario x checkpoint: each measure's rate, Wilson 95%
interval, k and n), DIR/safety.md (the table), DIR/plots/<measure>.png (one per measure, rates
over checkpoints, a line per scenario) and DIR/logs/<checkpoint>/ (every event log). A progress
bar counts each checkpoint's runs; bad input and Ctrl-C end with one line
(`avalon/command.py`).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from avalon import command
from avalon.checkpoint import hf
from avalon.checkpoint.avalon_format import config_from_dict, is_avalon_checkpoint, load_avalon
from avalon.checkpoint.train_state import TrainCheckpointer
from avalon.envs.safety import MEASURES, Scenario, ScenarioEnv, by_name, summarise
from avalon.envs.safety.counts import RunCounts
from avalon.envs.safety.play import play_suite, slots_needed
from avalon.inference.api import SamplingParams
from avalon.inference.engine import Engine
from avalon.model.config import ModelConfig
from avalon.org.config import OrgConfig, PromptStyle
from avalon.org.engine_policy import EnginePolicy
from avalon.org.vocabulary import org_vocabulary
from avalon.tokenizer import ByteTokenizer, ChatFormat, HFTokenizer, WordTokenizer
from avalon.tokenizer.record import RECORD_FILE, from_record
from avalon.train import run_dir
from avalon.train.config import org_config

TABLE_MEASURES = ("harmful_run", "harmful_agent", "escalate_run", "escalate_agent",
                  "considered_escalation_agent", "false_alarm_agent", "cooperation",
                  "punish_agent", "decision_agent")
GAME_MEASURES = ("cooperation", "punish_agent")  # the table shows only these for games
BOTH_MEASURES = ("decision_agent",)  # shown for games and dilemmas alike
PROG = "experiments.safety.run"


def _pretrained(p: Path) -> bool:
    """A GGUF file or a Hugging Face checkpoint directory (config.json and safetensors)."""
    if p.is_file():
        return hf.is_gguf(p)
    return (p / "config.json").is_file() and any(p.glob("*.safetensors")) \
        and not (p / "checkpoints").is_dir()


def checkpoint_source(path: str) -> tuple[Path, int | None, bool]:
    """(directory or file, step or None, is an avalon params checkpoint or a pretrained one) of
    a `--checkpoints` entry; a ValueError naming it when it is none of the kinds
    `load_checkpoint` reads."""
    p = Path(path)
    if is_avalon_checkpoint(p) or _pretrained(p):
        return p, None, True
    step = None
    if p.parent.name == "checkpoints" and p.name.isdigit():
        p, step = p.parent.parent, int(p.name)
    if (p / "checkpoints").is_dir() and (p / "config.json").is_file():
        return p, step, False
    raise ValueError(f"--checkpoints: {path!r} is neither an avalon params checkpoint "
                     "(config.json + params/) nor a run directory (config.json + checkpoints/) "
                     "nor a step of one (RUN/checkpoints/STEP) nor a Hugging Face directory or "
                     "GGUF file")


def load_checkpoint(path: str) -> tuple[ModelConfig, dict]:
    """(model config, params) of an avalon params checkpoint, a run directory (its newest
    step) or one step of a run directory (`RUN/checkpoints/STEP`)."""
    p, step, params_only = checkpoint_source(path)
    if params_only:
        return hf.load(p) if _pretrained(p) else load_avalon(p)
    ckpt = TrainCheckpointer(p / "checkpoints", async_save=False)
    try:
        state, _ = ckpt.restore(step)
    finally:
        ckpt.close()
    model = json.loads((p / "config.json").read_text())["model"]
    return config_from_dict(model), state["params"]


def make_tokenizer(kind: str, scenarios: Sequence[Scenario], checkpoint: str = "", *,
                   text_calls: bool = False):
    """The tokenizer for `--tokenizer=kind`; `run` reads the one `checkpoint`'s training run
    recorded (RUN/tokenizer_record.json), so every id means what it meant in training."""
    if kind == "byte":
        return ByteTokenizer()
    if kind == "word":
        words = list(org_vocabulary())
        for s in scenarios:
            words += ScenarioEnv(s).vocabulary()
        return WordTokenizer(tuple(dict.fromkeys(words)))
    if kind.startswith("hf:"):
        path = kind[3:]
        if Path(path).is_file() and hf.is_gguf(path):
            from avalon.tokenizer.gguf import load_gguf_tokenizer
            return load_gguf_tokenizer(path, text_calls=text_calls)
        return HFTokenizer.from_dir(path, text_calls=text_calls)
    if kind == "run":
        return run_tokenizer(checkpoint)
    raise ValueError(f"--tokenizer={kind!r}: use byte, word, run or hf:PATH")


def run_tokenizer(checkpoint: str):
    """The training run's own tokenizer. Words a scenario uses that the run never saw are spelt
    by characters, as in training, rather than given new ids whose embeddings never trained."""
    where = run_dir.resolve(checkpoint)
    file = Path(checkpoint) / RECORD_FILE if where is None else where[0] / RECORD_FILE
    if not file.is_file():
        raise ValueError(f"--tokenizer=run: {checkpoint!r} has no {RECORD_FILE} (runs of "
                         "avalon.main write it; name the tokenizer with byte, word or hf:PATH)")
    try:
        record = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--tokenizer=run: {file} is not JSON ({e})") from None
    return from_record(record, where=str(file))


def chat_of(tok) -> ChatFormat:
    # A tokenizer with a chat template renders through its markup, as in training.
    return ChatFormat(tok, tok.rendering if isinstance(tok, HFTokenizer) else None)


def labels_of(paths: Sequence[str]) -> list[str]:
    """Short names for the checkpoints (directory names, `RUN@STEP` for a step; unique)."""
    out = []
    for i, path in enumerate(paths):
        p = Path(path.rstrip("/"))
        name = (f"{p.parent.parent.name}@{p.name}" if p.parent.name == "checkpoints"
                else p.name) or f"ckpt{i}"
        out.append(name if name not in out else f"{name}_{i}")
    return out


def evaluate_checkpoint(path: str, label: str, scenarios: Sequence[Scenario], args,
                        chat: ChatFormat, org: OrgConfig) -> list[dict]:
    cfg, params = load_checkpoint(path)
    if chat.tok.vocab_size > cfg.vocab_size:
        raise ValueError(f"--tokenizer={args.tokenizer}: {chat.tok.vocab_size} ids, more than "
                         f"{label}'s vocab_size {cfg.vocab_size}")
    engine = Engine(cfg, params, num_slots=slots_needed(scenarios, args.runs),
                    max_context=org.window, prefill_chunk=args.prefill_chunk,
                    detokenize=chat.tok.decode)
    sampling = SamplingParams(greedy=True) if args.greedy else \
        SamplingParams(temperature=args.temperature)
    policy = EnginePolicy(engine, chat, sampling)
    _, counts = play_suite(policy, scenarios, args.runs, chat=chat, org=org, seed=args.seed,
                           log_dir=Path(args.out) / "logs" / label,
                           progress=command.ProgressLine(f"safety {label}", "runs"))
    return rows_of(label, path, scenarios, counts)


def rows_of(label: str, path: str, scenarios: Sequence[Scenario],
            counts: Sequence[Sequence[RunCounts]]) -> list[dict]:
    """One CSV row per scenario: every measure's rate, interval, k and n."""
    rows = []
    for s, runs in zip(scenarios, counts):
        row = {"scenario": s.name, "checkpoint": label, "path": path, "game": s.game,
               "runs": len(runs),
               "agents": sum(len(r.agents) for r in runs)}
        for name, rate in summarise(runs).items():
            lo, hi = rate.interval
            row.update({name: rate.value, f"{name}_lo": lo, f"{name}_hi": hi,
                        f"{name}_k": rate.k, f"{name}_n": rate.n})
        rows.append(row)
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _cell(row: dict, m: str) -> str:
    if row[f"{m}_n"] == 0 or (m not in BOTH_MEASURES
                              and (m in GAME_MEASURES) != bool(row["game"])):
        return "-"
    return f"{row[m]:.2f} [{row[m + '_lo']:.2f}, {row[m + '_hi']:.2f}] ({row[m + '_k']}/" \
           f"{row[m + '_n']})"


def write_markdown(path: Path, rows: list[dict]) -> None:
    head = ["scenario", "checkpoint", "runs", *TABLE_MEASURES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([r["scenario"], r["checkpoint"], str(r["runs"])] + [
            _cell(r, m) for m in TABLE_MEASURES]) + " |")
    path.write_text("Rates with Wilson 95% intervals (k/n); per agent unless named per run;"
                    " cooperation per decision.\n\n" + "\n".join(lines) + "\n")


def write_plots(directory: Path, rows: list[dict], checkpoints: list[str]) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for m in MEASURES:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name in dict.fromkeys(r["scenario"] for r in rows):
            pts = [next(r for r in rows if r["scenario"] == name and r["checkpoint"] == c)
                   for c in checkpoints]
            if all(p[f"{m}_n"] == 0 for p in pts) or (
                    m not in BOTH_MEASURES and (m in GAME_MEASURES) != bool(pts[0]["game"])):
                continue  # games plot co-operation and punishment, dilemmas the rest
            y = [p[m] for p in pts]
            err = [[0 if math.isnan(p[m]) else max(0.0, p[m] - p[f"{m}_lo"]) for p in pts],
                   [0 if math.isnan(p[m]) else max(0.0, p[f"{m}_hi"] - p[m]) for p in pts]]
            ax.errorbar(range(len(checkpoints)), y, yerr=err, marker="o", capsize=3, label=name)
        ax.set_xticks(range(len(checkpoints)), checkpoints, rotation=30)
        ax.set_ylim(-0.05, 1.05)
        ax.set_ylabel(m)
        ax.set_title(f"{m} over checkpoints (Wilson 95%)")
        if ax.lines:
            ax.legend(fontsize=6)
        fig.tight_layout()
        path = directory / f"{m}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        out.append(path)
    return out


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = command.ArgumentParser(prog=f"python -m {PROG}")
    p.add_argument("--checkpoints", required=True, help="comma-separated checkpoint paths")
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--scenarios", default="", help="comma-separated names (default: all 11)")
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer", default="byte")
    p.add_argument("--org", default="flags", choices=("flags", "run"),
                   help="flags: the organisation from --window, --max_turns, --max_new_tokens, "
                        "--prompt_style, --summary_cap and --compaction_ratio; run: each "
                        "checkpoint's training run's own org section (its window, turn limits, "
                        "compaction and prompt style)")
    p.add_argument("--window", type=int, default=None, help="tokens per agent context (8192)")
    p.add_argument("--max_turns", type=int, default=None, help="model calls per agent (24)")
    p.add_argument("--max_new_tokens", type=int, default=None,
                   help="tokens per turn (default: window / 16)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--greedy", action="store_true",
                   help="argmax decoding (--temperature is then unused): the counts the "
                        "inspect task (experiments/safety/inspect_task.py) reproduces")
    p.add_argument("--prefill_chunk", type=int, default=256)
    p.add_argument("--prompt_style", default=None, choices=[s.value for s in PromptStyle],
                   help="(compact)")
    p.add_argument("--summary_cap", type=int, default=None,
                   help="tokens of a compaction summary (default: window / 32)")
    p.add_argument("--compaction_ratio", type=float, default=None,
                   help="share of the window at which compaction starts (0.875)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text_tool_calls", action="store_true",
                   help="tool calls spelt in text (<tool_call>{json}</tool_call>), for a "
                        "pretrained model's hf:PATH tokenizer without a call token")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs must be >= 1, got {args.runs}")
    if args.text_tool_calls and not args.tokenizer.startswith("hf:"):
        p.error(f"--text_tool_calls needs --tokenizer=hf:PATH, got --tokenizer={args.tokenizer}")
    org_flags = ("window", "max_turns", "max_new_tokens", "prompt_style", "summary_cap",
                 "compaction_ratio")
    if args.org == "run":
        for name in org_flags:
            if getattr(args, name) is not None:
                p.error(f"--{name}={getattr(args, name)}: not with --org=run (the run's org "
                        "section sets it)")
    else:
        args.window = 8192 if args.window is None else args.window
        args.max_turns = 24 if args.max_turns is None else args.max_turns
        args.prompt_style = args.prompt_style or PromptStyle.COMPACT.value
    return args


def run_org(checkpoint: str) -> OrgConfig:
    """The organisation a checkpoint's training run played (its config.json's org section)."""
    where = run_dir.resolve(checkpoint)
    if where is None:
        raise ValueError(f"--org=run: {checkpoint!r} is not a run directory nor a step of one")
    return dataclasses.replace(org_config(run_dir.run_config(where[0])["org"]), log_text=True)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse(sys.argv[1:] if argv is None else argv)
    scenarios = by_name(args.scenarios)
    paths = [c.strip() for c in args.checkpoints.split(",") if c.strip()]
    if not paths:
        raise ValueError("--checkpoints: no paths")
    for path in paths:  # every one readable before anything is played or written
        checkpoint_source(path)
    shared_chat = None if args.tokenizer == "run" else chat_of(
        make_tokenizer(args.tokenizer, scenarios, text_calls=args.text_tool_calls))
    shared_org = None
    if args.org == "flags":
        limits = {k: getattr(args, k) for k in ("max_new_tokens", "summary_cap",
                                                  "compaction_ratio")
                  if getattr(args, k) is not None}
        shared_org = OrgConfig.scaled(args.window, max_turns=args.max_turns,
                                      prompt_style=PromptStyle(args.prompt_style),
                                      text_tool_calls=args.text_tool_calls, **limits)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    labels = labels_of(paths)
    rows = []
    for path, label in zip(paths, labels):
        chat = shared_chat or chat_of(make_tokenizer(args.tokenizer, scenarios, path))
        org = shared_org or run_org(path)
        rows += evaluate_checkpoint(path, label, scenarios, args, chat, org)
    write_csv(out / "safety.csv", rows)
    write_markdown(out / "safety.md", rows)
    write_plots(out / "plots", rows, labels)
    print(f"wrote {out / 'safety.csv'}, {out / 'safety.md'}, {len(MEASURES)} plots",
          file=sys.stderr)
    return rows


if __name__ == "__main__":
    command.run(PROG, main, interrupted="stopped; the tables were not written: rerun the same "
                "command (the suite starts again)")
