"""The laboratory: reading run directories and event logs, organisation metrics, judges,
statistics and the run report (SPEC §5). It reads logs only; it never runs rollouts.

- `logs.py`: the run directory's layout and `read_run(workdir)`.
- `stats.py`: Wilcoxon signed-rank (exact), sign counts, Wilson and bootstrap intervals.
- `titles.py`: the job-title classifier (its rules are data).
- `metrics.py`: the organisation metrics of SPEC §5, per rollout and per checkpoint.
- `judges.py`: the `Judge` interface, a rule judge, a model judge, Cohen's kappa.
- `episode.py`: one episode as an HTML page (`python -m avalon.tools.view EVENTS.jsonl`).
- `report.py`: report.json, plots and index.html (`python -m avalon.analyze RUN_DIR`).
The runs it reads come from `avalon/train/` (evaluation logs, `baselines.py`'s arms,
`python -m avalon.tools.evaluate` for a trained checkpoint).
"""
