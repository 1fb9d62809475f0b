"""A real model as the judge: SmolLM2 (or any checkpoint) labels a run's messages, reasoning
and opening plans under the report's rubrics, against the rule judge on the same texts.

    python -m experiments.real_model.judge_agreement --run=runs/toy \
        --judge=SmolLM2-135M-Instruct.Q4_1.gguf [--answer=score|generate] [--calibrate] \
        [--phase=eval] [--step=-1] [--max_items=400] [--json=OUT.json]

For each rubric (review, help offer, help plan, opening plan): the items labelled, Cohen's kappa
of the model judge against the rule judge, the confusion matrix (rule label -> model label),
how often the model named no allowed label (given the fallback), and examples of each kind of
disagreement, as markdown (and JSON with --json). `--answer=score` (the default) has the model
answer in labels only (`ScoringJudge`: the likeliest label's answer after the prompt; with
`--calibrate`, likeliest against the label's score for a content-free text);
`--answer=generate` decodes a free answer and takes the first label named in it (`ModelJudge`;
an answer naming none gets the fallback label and is counted). `--step=-1` is the newest
evaluation. The rule judge is the reference here, not the truth: kappa says how far the two
agree beyond chance, the examples say which of them is wrong.
"""

from __future__ import annotations

import collections
import json
import sys
from collections.abc import Mapping, Sequence

from absl import app, flags

from avalon import command
from avalon.analysis.judges import RUBRICS, Judge, Rubric, RuleJudge, cohen_kappa
from avalon.analysis.logs import read_run
from avalon.analysis.metrics import messages, opening_plan, reasoning


def _define_flags():
    """The command line, defined only when run as a program (tests import this module
    beside others that define flags of the same names)."""
    flags.DEFINE_string("run", None, "a training run directory (its events/)", required=True)
    flags.DEFINE_string("judge", None, "the model judge's checkpoint: a GGUF file, an HF "
                        "directory or an avalon checkpoint", required=True)
    flags.DEFINE_enum("answer", "score", ["score", "generate"], "score: the likeliest label; "
                      "generate: the first label named in a greedy answer")
    flags.DEFINE_bool("calibrate", False, "--answer=score: each label's score less its score "
                      "for a content-free text (the model's prior)")
    flags.DEFINE_string("phase", "eval", "events phase")
    flags.DEFINE_integer("step", -1, "the evaluation step (-1: the newest)")
    flags.DEFINE_integer("max_items", 400, "at most this many texts per rubric (the first "
                         "ones, in the run's file order)")
    flags.DEFINE_integer("slots", 32, "texts the model judge decodes together (generate), "
                         "or rows it scores together (score)")
    flags.DEFINE_string("json", "", "also write the results as JSON to this file")


FLAGS = flags.FLAGS


EXAMPLES = 2  # examples kept per kind of disagreement
EXAMPLE_CHARS = 160


def texts_by_rubric(logs: Sequence[Sequence[Mapping]]) -> dict[str, list[str]]:
    """What each rubric labels in a set of rollouts (as `metrics.judge_rollouts` does):
    messages for review and help offer, specialists' reasoning for help plan, the CEO's first
    turn and hires for opening plan."""
    msgs = [m["text"] for ev in logs for m in messages(ev)]
    thoughts = [t["text"] for ev in logs for t in reasoning(ev)]
    plans = [p for ev in logs for p in [opening_plan(ev)] if p is not None]
    return {"review": msgs, "help_offer": msgs, "help_plan": thoughts, "opening_plan": plans}


def compare(rubric: Rubric, texts: Sequence[str], rule: Judge, model: Judge) -> dict:
    """Kappa, agreement, each judge's label counts, the confusion (rule -> model) and up to
    EXAMPLES texts of each kind of disagreement, for one rubric's texts."""
    r = rule.label(rubric, texts) if texts else []
    m = model.label(rubric, texts) if texts else []
    confusion = collections.Counter(zip(r, m))
    examples = collections.defaultdict(list)
    for t, a, b in zip(texts, r, m):
        if a != b and len(examples[(a, b)]) < EXAMPLES:
            examples[(a, b)].append(t[:EXAMPLE_CHARS])
    return {"items": len(texts), "kappa": cohen_kappa(r, m) if texts else None,
            "agree": sum(a == b for a, b in zip(r, m)),
            "rule_labels": dict(collections.Counter(r)),
            "model_labels": dict(collections.Counter(m)),
            "confusion": {f"{a}->{b}": n for (a, b), n in sorted(confusion.items())},
            "disagreements": {f"{a}->{b}": v for (a, b), v in sorted(examples.items())}}


def agreement(logs: Sequence[Sequence[Mapping]], model: Judge, *, rule: Judge | None = None,
              max_items: int = 400) -> dict[str, dict]:
    """Rubric name -> `compare` of the model judge against the rule judge on the first
    `max_items` texts of that rubric in `logs`, with `model_no_label`: the model's answers that
    named no allowed label (a `ModelJudge` counts them in `invalid`; 0 for a judge without)."""
    if max_items < 1:
        raise ValueError(f"--max_items must be >= 1, got {max_items}")
    rule = RuleJudge() if rule is None else rule
    texts = texts_by_rubric(logs)
    out = {}
    for rubric in RUBRICS:
        before = getattr(model, "invalid", 0)
        out[rubric.name] = compare(rubric, texts[rubric.name][:max_items], rule, model)
        out[rubric.name]["model_no_label"] = getattr(model, "invalid", 0) - before
    return out


def evaluation_logs(run: str, phase: str = "eval", step: int = -1) -> tuple[int, list]:
    """(step, each rollout's events) of one logged evaluation of a run (-1: the newest)."""
    rollouts = list(read_run(run, phase=phase))
    if not rollouts:
        raise command.Stop(f"--run={run}: no {phase} event logs under events/")
    steps = sorted({r.step for r in rollouts})
    chosen = steps[-1] if step == -1 else step
    if chosen not in steps:
        raise command.Stop(f"--step={step}: the run's {phase} steps are {steps}")
    return chosen, [r.events for r in rollouts if r.step == chosen]


def markdown(results: Mapping[str, dict], title: str) -> str:
    out = [title, "",
           "| rubric | items | agree | kappa | rule labels | model labels | model named no "
           "label | confusion (rule->model) |", "|---|---|---|---|---|---|---|---|"]

    def counts(c: Mapping[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "-"
    for name, res in results.items():
        kappa = "n/a" if res["kappa"] is None else f"{res['kappa']:.2f}"
        conf = ", ".join(f"{k}: {v}" for k, v in res["confusion"].items()) or "-"
        out.append(f"| {name} | {res['items']} | {res['agree']} | {kappa} | "
                   f"{counts(res['rule_labels'])} | {counts(res['model_labels'])} | "
                   f"{res['model_no_label']} | {conf} |")
    out.append("")
    for name, res in results.items():
        for kind, texts in res["disagreements"].items():
            for t in texts:
                out.append(f"- {name} {kind}: {json.dumps(t)}")
    return "\n".join(out) + "\n"


def main(argv):
    del argv
    from avalon.analysis.judges import load_model_judge

    step, logs = evaluation_logs(FLAGS.run, FLAGS.phase, FLAGS.step)
    for name, value in (("max_items", FLAGS.max_items), ("slots", FLAGS.slots)):
        if value < 1:
            raise command.Stop(f"--{name} must be >= 1, got {value}")
    if FLAGS.calibrate and FLAGS.answer != "score":
        raise command.Stop(f"--calibrate applies to --answer=score, not --answer={FLAGS.answer}")
    model = load_model_judge(FLAGS.judge, slots=FLAGS.slots, max_context=1024,
                             answer=FLAGS.answer, calibrate=FLAGS.calibrate)
    answer = FLAGS.answer + (", calibrated" if FLAGS.calibrate else "")
    results = agreement(logs, model, max_items=FLAGS.max_items)
    sys.stdout.write(markdown(results, f"Judge {FLAGS.judge} ({answer}) against the "
                                       f"rule judge on "
                                       f"{FLAGS.run} ({FLAGS.phase} step {step}, {len(logs)} "
                                       "rollouts)"))
    if FLAGS.json:
        with open(FLAGS.json, "w") as f:
            json.dump({"run": FLAGS.run, "judge": FLAGS.judge, "answer": answer,
                       "phase": FLAGS.phase,
                       "step": step, "rollouts": len(logs), "results": results}, f, indent=1)


if __name__ == "__main__":
    _define_flags()
    command.run("experiments.real_model.judge_agreement",
                lambda: app.run(main, flags_parser=command.absl_flags_parser()))
