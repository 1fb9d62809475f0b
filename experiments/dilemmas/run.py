"""Co-operation of checkpoints in OpenSpiel's social dilemmas, with Wilson intervals.

    python -m experiments.dilemmas.run --checkpoints=RUN/checkpoints/300,RUN/checkpoints/360 \
        --runs=30 --out=DIR [--games=matrix_pd,matrix_sh] [--team=org|peers] \
        [--tokenizer=run|word|hf:PATH] [--org=run|flags] [--temperature=1.0]

Each checkpoint (a training run directory, one of its steps, an avalon params checkpoint, a
Hugging Face directory or a GGUF file: `experiments/safety/run.py`'s loaders) plays `--runs`
rollouts of each game (default: `DILEMMA_GAMES`, the one-shot Prisoner's Dilemma, Stag Hunt,
Bach or Stravinsky and Chicken-Dare, and a five-round repeated Prisoner's Dilemma) through the
engine, all in one driver call. `--team=org` (the default) is the frame the OpenSpiel configs
train in: a CEO with a budget of one hire per seat (the hires play the seats); `--team=peers`
is the safety suite's frame: no CEO, the seats' agents fixed (p1 seat 0, p2 seat 1). The
organisation is the checkpoint's run's own (`--org=run`: its window, limits, prompt style and
talk permission), or built from flags for a checkpoint without a run (`--org=flags`).
The tokenizer is the run's own by default (`run`; a word-tokenizer run of
configs/openspiel.py has every dilemma's words: OpenSpielConfig.measure_games).

Counted from the rollouts' end records (`avalon/envs/openspiel/dilemmas.py`: which action is
co-operative in each game): co-operation per decision, mutual co-operation and coordination
per joint move, finished games, and each seat's mean return. Writes DIR/dilemmas.csv (a row per
game x checkpoint: each rate, its Wilson 95% interval, k and n), DIR/dilemmas.md (the table)
and DIR/logs/<checkpoint>/ (every event log). Bad input and Ctrl-C end with one line.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from avalon import command
from avalon.envs.base import Split
from avalon.envs.openspiel import DILEMMA_GAMES, OpenSpiel, OpenSpielConfig
from avalon.envs.openspiel.dilemmas import count, is_dilemma
from avalon.inference.api import SamplingParams
from avalon.inference.engine import Engine
from avalon.org.config import OrgConfig, Permissions, PromptStyle
from avalon.org.driver import GroupSpec, RolloutDriver, RolloutSpec
from avalon.org.engine_policy import EnginePolicy
from avalon.org.peers import PeerTeam
from avalon.org.vocabulary import org_vocabulary
from avalon.tokenizer import WordTokenizer
from experiments.safety.run import (
    chat_of,
    checkpoint_source,
    labels_of,
    load_checkpoint,
    make_tokenizer,
    run_org,
)

PROG = "experiments.dilemmas.run"
RATES = ("cooperation", "mutual", "coordinated", "finished")


def environments(games: Sequence[str]) -> list[OpenSpiel]:
    out = []
    for g in games:
        if not is_dilemma(g):
            raise ValueError(f"--games: {g!r} is not a social dilemma (matrix_pd, matrix_sh, "
                             "matrix_bos, matrix_cd, or a repeated_game of one)")
        out.append(OpenSpiel(OpenSpielConfig(game=g, n_train=1, n_heldout=1,
                                             measure_games=())))
    return out


def tokenizer(kind: str, envs: Sequence[OpenSpiel], checkpoint: str, text_calls: bool):
    """`word`: the organisation's words and these games' (a word list of its own, so only for
    a checkpoint trained on it); `run`, `byte`, `hf:PATH` as the safety suite reads them."""
    if kind == "word":
        words = list(org_vocabulary())
        for env in envs:
            words += env.vocabulary()
        return WordTokenizer(tuple(dict.fromkeys(words)))
    return make_tokenizer(kind, (), checkpoint, text_calls=text_calls)


def play(policy, chat, org: OrgConfig, envs: Sequence[OpenSpiel], runs: int, team: str,
         seed: int, log_dir: Path | None = None, progress=None):
    """Every run of every game in one driver call; the end records per game, in order."""
    groups = []
    for g, env in enumerate(envs):
        seats = env.game.num_players()
        task = env.task_ids(Split.HELDOUT)[0]
        groups.append(GroupSpec(g, tuple(
            RolloutSpec(env.session(task, seed=seed * 1_000_003 + j),
                        budget=seats if team == "org" else 0, seed=seed * 1_000_003 + j,
                        peers=PeerTeam(n=seats) if team == "peers" else None)
            for j in range(runs))))
    result = RolloutDriver(policy, chat, org, log_dir=log_dir, progress=progress).run(groups)
    return [[_end_record(log.events) for log in logs] for logs in result.logs]


def _end_record(events) -> dict:
    end = [e for e in events if e["kind"] == "end"]
    return end[-1].get("env_record", {}) if end else {}


def rows_of(label: str, path: str, envs: Sequence[OpenSpiel], records) -> list[dict]:
    rows = []
    for env, recs in zip(envs, records):
        counts = count(env.config.game, recs)
        row = {"game": env.config.game, "checkpoint": label, "path": path,
               "runs": counts.rollouts}
        for name, rate in counts.rates().items():
            lo, hi = rate.interval
            row.update({name: rate.value, f"{name}_lo": lo, f"{name}_hi": hi,
                        f"{name}_k": rate.k, f"{name}_n": rate.n})
        for seat, mean in enumerate(counts.returns):
            row[f"return_seat{seat}"] = mean
        rows.append(row)
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _cell(row: dict, name: str) -> str:
    if row[f"{name}_n"] == 0:
        return "-"
    return (f"{row[name]:.2f} [{row[name + '_lo']:.2f}, {row[name + '_hi']:.2f}] "
            f"({row[name + '_k']}/{row[name + '_n']})")


def write_markdown(path: Path, rows: list[dict]) -> None:
    head = ["game", "checkpoint", "runs", *RATES, "mean returns"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        means = ("-" if r["finished_k"] == 0  # no finished game has returns to average
                 else " ".join(f"{r[k]:.2f}" for k in r if k.startswith("return_seat")))
        lines.append("| " + " | ".join([r["game"], r["checkpoint"], str(r["runs"])]
                                        + [_cell(r, m) for m in RATES] + [means]) + " |")
    path.write_text("Rates with Wilson 95% intervals (k/n): co-operation per decision, mutual "
                    "co-operation and coordination per joint move, finished per run; mean "
                    "returns of seats 0 and 1 over finished games.\n\n" + "\n".join(lines) + "\n")


def parse(argv: Sequence[str]):
    p = command.ArgumentParser(prog=f"python -m {PROG}")
    p.add_argument("--checkpoints", required=True, help="comma-separated checkpoint paths")
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--games", default=",".join(DILEMMA_GAMES),
                   help="comma-separated game strings (semicolons also separate, for game "
                        "strings with commas)")
    p.add_argument("--out", required=True)
    p.add_argument("--team", default="org", choices=("org", "peers"))
    p.add_argument("--tokenizer", default="run")
    p.add_argument("--org", default="run", choices=("run", "flags"))
    p.add_argument("--window", type=int, default=2048, help="with --org=flags")
    p.add_argument("--max_turns", type=int, default=12, help="with --org=flags")
    p.add_argument("--compaction_ratio", type=float, default=0.75,
                   help="share of the window at which compaction starts (room for the summary "
                        "request with a word tokenizer)")
    p.add_argument("--prompt_style", default=PromptStyle.COMPACT.value,
                   choices=[s.value for s in PromptStyle])
    p.add_argument("--no_talk", action="store_true", help="with --org=flags: no talk tools")
    p.add_argument("--text_tool_calls", action="store_true")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--prefill_chunk", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs must be >= 1, got {args.runs}")
    return args


def split_games(text: str) -> list[str]:
    """Game strings from `--games`: split on `;`, or on commas outside parentheses."""
    if ";" in text:
        return [g.strip() for g in text.split(";") if g.strip()]
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [g.strip() for g in out if g.strip()]


def main(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse(sys.argv[1:] if argv is None else argv)
    envs = environments(split_games(args.games))
    paths = [c.strip() for c in args.checkpoints.split(",") if c.strip()]
    if not paths:
        raise ValueError("--checkpoints: no paths")
    for path in paths:
        checkpoint_source(path)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for path, label in zip(paths, labels_of(paths)):
        chat = chat_of(tokenizer(args.tokenizer, envs, path, args.text_tool_calls))
        if args.org == "run":
            org = run_org(path)
        else:
            org = OrgConfig.scaled(args.window, max_turns=args.max_turns,
                                   compaction_ratio=args.compaction_ratio,
                                   prompt_style=PromptStyle(args.prompt_style),
                                   text_tool_calls=args.text_tool_calls,
                                   permissions=Permissions(talk=not args.no_talk))
        org = dataclasses.replace(org, log_text=True)
        cfg, params = load_checkpoint(path)
        if chat.tok.vocab_size > cfg.vocab_size:
            raise ValueError(f"--tokenizer={args.tokenizer}: {chat.tok.vocab_size} ids, more "
                             f"than {label}'s vocab_size {cfg.vocab_size}")
        slots = args.runs * sum(1 + e.game.num_players() for e in envs)
        engine = Engine(cfg, params, num_slots=slots, max_context=org.window,
                        prefill_chunk=args.prefill_chunk, detokenize=chat.tok.decode)
        policy = EnginePolicy(engine, chat, SamplingParams(temperature=args.temperature))
        records = play(policy, chat, org, envs, args.runs, args.team, args.seed,
                       log_dir=out / "logs" / label,
                       progress=command.ProgressLine(f"dilemmas {label}", "runs"))
        rows += rows_of(label, path, envs, records)
    write_csv(out / "dilemmas.csv", rows)
    write_markdown(out / "dilemmas.md", rows)
    (out / "command.json").write_text(json.dumps({"argv": list(sys.argv[1:] if argv is None
                                                               else argv)}))
    print(f"wrote {out / 'dilemmas.csv'}, {out / 'dilemmas.md'}", file=sys.stderr)
    return rows


if __name__ == "__main__":
    command.run(PROG, main, interrupted="stopped; the tables were not written: rerun the same "
                "command")
