"""The laboratory: reading run directories and event logs, organisation metrics, judges,
statistics and the run report (SPEC §5). It reads logs only; it never runs rollouts.

- `logs.py`: the run directory's layout and `read_run(workdir)`.
- `stats.py`: Wilcoxon signed-rank (exact), sign counts, Wilson and bootstrap intervals.
- `titles.py`: the job-title classifier (its rules are data).
- `metrics.py`: every measure of the organisation (SPEC §5), one definition each, per rollout
  and per checkpoint, with intervals and paired shifts; the training loop, the report and the
  benchmarks all measure with it.
- `reviews.py`: review quality against ground truth (verdicts against true defects).
- `judges.py`: the `Judge` interface, a rule judge, a model judge, Cohen's kappa.
- `episode.py`: one episode as an HTML page (`python -m avalon.tools.view EVENTS.jsonl`).
- `report.py`: report.json, plots and index.html (`python -m avalon.analyze RUN_DIR`).
The runs it reads come from `avalon/train/` (evaluation logs, `baselines.py`'s arms,
`python -m avalon.tools.evaluate` for a trained checkpoint).
"""
