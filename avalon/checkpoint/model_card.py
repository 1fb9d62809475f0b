"""The model card (README.md) of a checkpoint exported from a training run: what the run was,
not what it started from.

    text = run_card(run_dir, step=600, exported_as="hf")     # avalon/tools/convert.py

Read from the run directory `avalon.main` wrote: `config.json` (the model, the config's
`init_from` and tokenizer), `summary.json` when the run finished (its config name, command
line, code and evaluations), else `config_history.jsonl` (every start: its step, command and
code) and `metrics.jsonl`'s evaluation lines. The card says which checkpoint step was exported,
how many SFT and RLCR updates were behind it, the held-out rewards of every evaluation up to
that step (the organisation against a single agent on the same tasks), the code and the
command that trained it, and what the run started from; a base checkpoint's own README (the
shipped seed's, say) describes that base and is not copied.
"""

from __future__ import annotations

import json
import os

from avalon import paths


def _json(path) -> dict | None:
    p = paths.path(path)
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError:
        return None


def _lines(path) -> list[dict]:
    p = paths.path(path)
    if not p.is_file():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a torn last line
    return out


def _code(code: dict | None) -> str:
    if not code or not code.get("commit"):
        return "an unrecorded commit"
    dirty = " (with uncommitted changes)" if code.get("dirty") else ""
    return f"commit {code['commit'][:12]}{dirty}"


def _reward(v) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "n/a"


def run_card(run_dir: str | os.PathLike, *, step: int, exported_as: str = "hf",
             param_dtype: str | None = None) -> str:
    """The card of checkpoint `step` of the run in `run_dir` (see the module docstring);
    `param_dtype`: the exported parameters' dtype where the export cast them."""
    run = paths.path(run_dir)
    config = _json(run / "config.json") or {}
    summary = _json(run / "summary.json") or {}
    starts = _lines(run / "config_history.jsonl")
    metrics = _lines(run / "metrics.jsonl")
    sft_total = int((config.get("sft") or {}).get("steps", 0))
    sft_steps = min(step, sft_total)
    rl_steps = step - sft_steps
    command = summary.get("command") or (starts[-1].get("command") if starts else None)
    code = summary.get("code") or (starts[-1].get("code") if starts else None)
    model = config.get("model") or {}
    evals = [r for r in metrics if r.get("phase") == "eval" and r.get("step", 0) <= step]
    name = os.path.basename(os.path.normpath(os.fspath(run_dir)))
    lines = [
        "---", "library_name: transformers" if exported_as == "hf" else "library_name: avalon",
        "tags: [avalon, rlcr, multi-agent]", "---", "",
        f"# `{name}`, step {step}: an Avalon training run",
        "",
        f"Exported by `python -m avalon.tools.convert --to={exported_as}` from the run "
        f"directory `{os.fspath(run_dir)}` at checkpoint step {step}: {sft_steps} SFT "
        f"updates, then {rl_steps} RLCR steps (reinforcement learning from collective "
        "rewards: one model trained to work as an organisation of copies of itself).",
        "",
        f"- Config: `{summary.get('config') or 'not recorded'}`"
        + (f"; command: `{' '.join(command)}`" if command else ""),
        f"- Code: {_code(code)}" + (f"; the run started {len(starts)} times (resumed "
                                    f"{len(starts) - 1}x)" if len(starts) > 1 else ""),
        f"- Model: {model.get('hidden_size', '?')} wide, {len(str(model.get('pattern', '')))} "
        f"layers (`{model.get('pattern', '?')}`), vocabulary {model.get('vocab_size', '?')}, "
        f"parameters stored as {param_dtype or model.get('param_dtype', '?')}",
        f"- Started from: `{config.get('init_from') or 'a random initialisation'}`"
        + (" (that checkpoint's own card describes it, not this run)"
           if config.get("init_from") else ""),
        f"- Tokenizer: {config.get('tokenizer') or '?'}"
        + (f" (`{config['tokenizer_path']}`)" if config.get("tokenizer_path") else ""),
        "",
        "## Held-out evaluations",
        "",
    ]
    if evals:
        lines += ["Mean collective reward over held-out tasks, the organisation against a "
                  "single agent on the same tasks (`eval/org_reward`, `eval/single_reward` of "
                  "the run's metrics.jsonl):", "",
                  "| step | RLCR step | organisation | single agent |", "| --- | --- | --- | --- |"]
        lines += [f"| {r.get('step')} | {r.get('rl_step')} | {_reward(r.get('eval/org_reward'))} "
                  f"| {_reward(r.get('eval/single_reward'))} |" for r in evals]
    else:
        lines.append("None logged up to this step.")
    lines += ["", "The run's own report (`python -m avalon.analyze RUN`) says what the "
              "organisation did: hires, messages, the reviews its environment recorded.", ""]
    return "\n".join(lines)
