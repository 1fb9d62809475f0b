"""The run report of one or more run directories (`avalon/analysis/report.py`).

    python -m avalon.analyze RUN_DIR [RUN_DIR ...] [--episodes=8]

writes RUN_DIR/report/report.json, PNG plots and a self-contained index.html for every run
directory given (each report's runs table lists every given run's last evaluation), with the
rule judge labelling messages, reasoning and plans. `--judge=CHECKPOINT_DIR` labels them with a
model instead (any checkpoint Avalon loads: its own format or a Hugging Face directory with a
tokenizer.json, or a GGUF file); `--judge_answer=score` has it answer in the rubric's labels only
(the likeliest label, `ScoringJudge`; `--judge_calibrate` against a content-free text) instead of
decoding a free answer; `--audit` then also labels with the rule judge and reports Cohen's kappa
between the two per rubric (`judge_agreement` in report.json). `--commit=SHA` names the code
the run ran in report/learning.md, the paragraph docs/running.md quotes. Bad input and Ctrl-C end
with one line (`avalon/command.py`); `--verbose` shows library logging.
"""

from __future__ import annotations

import os

from avalon import command

PROG = "avalon.analyze"


def main(argv: list[str] | None = None) -> None:
    parser = command.ArgumentParser(prog=f"python -m {PROG}",
                                    description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run directories (the training --workdir)")
    parser.add_argument("--episodes", type=int, default=8,
                        help="viewer pages for this many rollouts of the last evaluation")
    parser.add_argument("--judge", default="", help="a checkpoint directory to judge with")
    parser.add_argument("--judge_answer", choices=("generate", "score"), default="generate",
                        help="with --judge: decode a free answer and take the first label in "
                             "it (generate), or score each label and take the likeliest (score)")
    parser.add_argument("--judge_calibrate", action="store_true",
                        help="with --judge_answer=score: each label's score less its score for "
                             "a content-free text")
    parser.add_argument("--audit", action="store_true",
                        help="with --judge: Cohen's kappa against the rule judge")
    parser.add_argument("--image_files", action="store_true",
                        help="index.html shows the PNG files beside it instead of holding "
                             "them (a smaller page to publish)")
    parser.add_argument("--commit", default="",
                        help="the commit the run ran, named in the learning paragraph "
                             "(report/learning.md)")
    args = parser.parse_args(argv)
    if args.episodes < 0:
        parser.error(f"--episodes={args.episodes}: must be >= 0")
    if args.judge_calibrate and args.judge_answer != "score":
        parser.error("--judge_calibrate needs --judge_answer=score")
    for run in args.runs:
        if not os.path.isdir(os.path.join(run, "events")):
            raise command.Stop(f"{run}: no events/ directory (not a run directory, or "
                               "nothing logged); give a training --workdir")
    if args.audit and not args.judge:
        parser.error("--audit needs --judge (it compares the model judge with the rule judge)")
    from avalon.analysis.judges import RuleJudge, load_model_judge
    from avalon.analysis.report import write_report

    judge = load_model_judge(args.judge, answer=args.judge_answer,
                             calibrate=args.judge_calibrate) if args.judge else None
    audit = RuleJudge() if args.audit else None
    for run in args.runs:
        others = [r for r in args.runs if r != run]
        print(write_report(run, judge=judge, audit=audit, others=others,
                           episodes=args.episodes, commit=args.commit,
                           embed_images=not args.image_files))


if __name__ == "__main__":
    command.run(PROG, main, interrupted="stopped; the report is unfinished: rerun the same "
                "command to write it")
