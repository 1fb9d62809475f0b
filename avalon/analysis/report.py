"""The run report: RUN_DIR/report/report.json, PNG plots and a self-contained index.html.

    python -m avalon.analyze RUN_DIR [RUN_DIR ...]      # avalon/analyze.py

From the run's logged rollouts (`logs.read_run`), labelled by a judge (the rule judge unless
given one) and measured with `metrics.py` (the training loop's definitions, so its numbers are
the loop's `eval/<arm>/<measure>` under the rule judge):
- `checkpoints`: per phase ("eval", "rl"), step and arm, every measure with its 95% interval
  and SE (`metrics.aggregate`; None: n/a, e.g. a team measure for the single agent), and the
  RLCR step the checkpoint was played at (`rl_step`, every plot's x axis).
- `comparisons`: per evaluation step and environment, the organisation against the single
  agent, paired by task (each task's mean reward over its seeds): a Wilcoxon signed-rank test,
  sign counts, a paired bootstrap interval of the mean difference, and with two or more
  environments the same over environments; and `paired`: the reward difference paired by
  task and seed with its SE (the number `experiments/bench/toy_gain.py` prints).
- `baselines`: every evaluated arm (S8, best-of-k, clock sweeps, ...) per step: reward, output
  tokens and latency with intervals, and latency relative to the organisation's on the same
  step (for S8 at matched tokens, the report's "3.9x sooner" is this ratio).
- `best_of_k`: per step, for arms whose rollouts come k per task (`extra.k`): the best-by-score
  reward (the most of the k) and the majority-vote reward (the mean reward of the most common
  final answer's rollouts).
- `curves`: per measure of `CURVES`, per arm, [rl_step, estimate, low, high] over the
  evaluations (points where the measure is n/a are left out).
- `shifts`: each SPEC §5 measure (reviews both as the environment recorded them and as
  messages, failed calls) at the first and last evaluation, paired rollout by rollout (same
  environment, task and seed), the difference with its SE and what it counts (`basis`:
  actions or messages), beside the figure the published report gives (`PUBLISHED`);
  `coordination_by_team_size` beside the report's 9% (one specialist) and 32% (eight).
- `env_records`: per checkpoint, the environment's end records summed as it wrote them
  (`report_tables.py`); `failed_calls`: per checkpoint, role and tool, calls, failed calls and
  the commonest error.
- `timing`: where the run's time went, from metrics.jsonl (`report_timing.py`).
- `judge`: which judge labelled the messages.
- `code`: the code the run ran (`report_code.py`: its commit, read from the run's record),
  and `commit` (`--commit`, or the recorded commit when one is known).
- `learning`: the paragraph docs/running.md quotes (`learning.py`), from these numbers.
- `runs`: with several run directories, every run's last evaluation per arm side by side.
- `episodes`: a viewer page per rollout of the last evaluation (up to `episodes`).
- `judge_agreement`: with an audit judge, Cohen's kappa between the two judges per rubric.
Plots and the page: `report_pages.py`.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Sequence

import numpy as np

from avalon.analysis.episode import render_episode
from avalon.analysis.judges import Judge, RuleJudge
from avalon.analysis.learning import paragraph
from avalon.analysis.logs import LoggedRollout, read_run
from avalon.analysis.metrics import (
    RolloutMetrics,
    aggregate,
    agreement,
    coordination_by_hires,
    estimate,
    judge_rollouts,
    measure,
    rollout_metrics,
    shift,
)
from avalon.analysis.report_code import run_code
from avalon.analysis.report_pages import index_html, plots, shifts_markdown
from avalon.analysis.report_tables import env_records, failed_calls
from avalon.analysis.report_timing import read_metrics, timing
from avalon.analysis.stats import bootstrap_mean, paired_bootstrap, sign_test, wilcoxon
from avalon.org.events import EventKind
from avalon.org.tools import OrgTool

ORG, SINGLE = "org", "single"
ARMS = (ORG, SINGLE)
_ORG_TOOLS = frozenset(t.value for t in OrgTool)
# The measures drawn over checkpoints (report_pages.py lays them out).
CURVES = ("hires_per_rollout", "lead_title_share", "reviewer_title_share",
          "verifier_title_share", "messages_per_agent", "teams_with_help_offer",
          "coordination_time_share", "critical_token_share", "latency_s",
          "teams_with_review_message", "review_message_tokens_per_org_hour",
          "opening_plan_pipeline",
          "teams_with_review", "reviews_per_team", "defects_found_per_team",
          "reviewed_ship_share", "shipped_per_rollout", "shipped_defects_per_rollout",
          "review_messages_per_team", "review_message_precision", "review_message_recall",
          "rubber_stamp_share", "rubber_stamps_per_team",
          "failed_calls_per_rollout", "failed_call_share", "failed_calls_ceo",
          "failed_calls_per_specialist")
# What the published report gives for the same measure (SPEC §5; seeds/). Over training,
# "a -> b"; a hub statistic, its value at the end of training.
PUBLISHED = {
    "lead_title_share": "0.4% -> 12.5%",
    "reviewer_title_share": "13% -> 26%",
    "verifier_title_share": "8% -> 17%",
    "teams_with_review_message": "42% -> 64%",
    "review_message_tokens_per_org_hour": "0.4k -> 2.9k",
    "opening_plan_component": "71% -> 31%",
    "opening_plan_pipeline": "16% -> 54%",
    "teams_with_help_offer": "about 5% -> over 60%",
    "teams_with_help_plan": "10% -> towards 60%",
    "coordination_time_share": "9% (1 specialist), 32% (8)",
    "critical_token_share": "26-53% (organisation)",
    "trace_reads_lead_vs_peer": "15x",
    "messages_lead_vs_peer": "3.3x",
    "ceo_reads_lead_vs_peer": "25x",
    "lead_most_contacted": "78%",
    "lead_coordination_call_share": "6.5%",
    "peer_coordination_call_share": "31%",
    "teams_with_review": "not measured",
    "review_message_precision": "not measured",
    "review_message_recall": "not measured",
    "rubber_stamp_share": "not measured",
    "rubber_stamps_per_team": "not measured",
}
SHIFT_MEASURES = (
    "reward", "hires_per_rollout", "messages_per_agent", "lead_title_share",
    "reviewer_title_share", "verifier_title_share",
    # reviews the environment ran, and what it shipped (its end record)
    "teams_with_review", "reviews_per_team", "self_review_share", "defects_found_per_team",
    "reviewed_ship_share", "shipped_per_rollout", "shipped_defects_per_rollout",
    "shipped_defect_share",
    # messages that read as reviews, and their verdicts against the environment's truth
    "teams_with_review_message", "review_messages_per_team",
    "review_message_tokens_per_org_hour", "verdicts_per_team", "review_message_precision",
    "review_message_recall", "rubber_stamp_share", "rubber_stamps_per_team",
    "opening_plan_component", "opening_plan_pipeline",
    "teams_with_help_offer", "teams_with_help_plan", "coordination_time_share",
    "critical_token_share", "trace_reads_lead_vs_peer", "messages_lead_vs_peer",
    "ceo_reads_lead_vs_peer", "lead_most_contacted", "lead_coordination_call_share",
    "peer_coordination_call_share",
    "failed_calls_per_rollout", "failed_call_share", "failed_calls_ceo",
    "failed_calls_per_specialist")


def final_answer(events: Sequence[dict]) -> str:
    """The rollout's answer for a vote: the CEO's final message, else its last environment
    call's arguments (as JSON), else ""."""
    calls = [e for e in events if e["kind"] == EventKind.TOOL_CALL.value and e["agent"] == "ceo"
             and not e["error"] and e.get("args") is not None]
    for e in reversed(calls):
        if e["tool"] == OrgTool.FINAL_MESSAGE.value:
            return str(e["args"].get("text", "")).strip()
    for e in reversed(calls):
        if e["tool"] not in _ORG_TOOLS:
            return json.dumps(e["args"], sort_keys=True)
    return ""


def best_of_k(rollouts: Sequence[LoggedRollout]) -> dict:
    """Best-by-score and majority-vote rewards over groups of k rollouts of one task."""
    by_task: dict[str, list[LoggedRollout]] = collections.defaultdict(list)
    for r in rollouts:
        by_task[r.task_id].append(r)
    best, vote = [], []
    for rs in by_task.values():
        rewards = [r.reward for r in rs]
        best.append(max(rewards))
        answers = [final_answer(r.events) for r in rs]
        counts = collections.Counter(answers)
        top = max(counts.values())
        winner = next(a for a in answers if counts[a] == top)  # ties: the first seen
        vote.append(float(np.mean([w for w, a in zip(rewards, answers) if a == winner])))
    return {"tasks": len(by_task), "k": max(len(v) for v in by_task.values()),
            "best": bootstrap_mean(best).to_json(), "vote": bootstrap_mean(vote).to_json()}


def _paired(org: dict[str, float], single: dict[str, float]) -> dict | None:
    keys = sorted(set(org) & set(single))
    if not keys:
        return None
    x = [org[k] for k in keys]
    y = [single[k] for k in keys]
    return {"pairs": len(keys), "wilcoxon": wilcoxon(x, y).to_json(),
            "sign": sign_test(x, y).to_json(),
            "mean_difference": paired_bootstrap(x, y).to_json()}


def _task_means(rs: Sequence[LoggedRollout]) -> dict[str, float]:
    by: dict[str, list[float]] = collections.defaultdict(list)
    for r in rs:
        by[r.task_id].append(r.reward)
    return {k: float(np.mean(v)) for k, v in by.items()}


def pair_key(r: LoggedRollout) -> tuple:
    """What makes two evaluation rollouts a pair: environment, task and seed index (every
    evaluation replays the same held-out tasks with the same seeds)."""
    return (r.env, r.task_id, int(r.extra.get("seed_index", 0)))


def paired_rollouts(a: Sequence[tuple[LoggedRollout, RolloutMetrics]],
                    b: Sequence[tuple[LoggedRollout, RolloutMetrics]]
                    ) -> tuple[list[RolloutMetrics], list[RolloutMetrics]]:
    """The metrics of `a` and `b` whose rollouts pair (`pair_key`), in the same order."""
    by_b = {pair_key(r): m for r, m in b}
    keys = [pair_key(r) for r, _ in a]
    if len(set(keys)) != len(keys) or len(by_b) != len(b):
        raise ValueError("paired_rollouts: two rollouts share an environment, task and seed "
                         "index")
    pairs = [(m, by_b[pair_key(r)]) for r, m in a if pair_key(r) in by_b]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _arm_row(ms: Sequence[RolloutMetrics]) -> dict:
    return {"rollouts": len(ms), "reward": estimate(measure("reward"), ms),
            "tokens_out": estimate(measure("tokens_out"), ms),
            "latency_s": estimate(measure("latency_s"), ms)}


def _shifts(at: dict[tuple[int, str], list], first: int, last: int, rl_steps: dict) -> dict:
    """Every measure of SHIFT_MEASURES, paired from evaluation `first` to `last`, per arm."""
    out = {"first_step": first, "last_step": last, "first_rl_step": rl_steps[first],
           "last_rl_step": rl_steps[last], "arms": {}}
    for arm in ARMS:
        a, b = paired_rollouts(at.get((first, arm), []), at.get((last, arm), []))
        if not a:
            continue
        rows = [{"measure": name, "basis": measure(name).basis,
                 "published": PUBLISHED.get(name) if arm == ORG else None,
                 **(shift(measure(name), a, b) or {"n": len(a), "first": None, "last": None})}
                for name in SHIFT_MEASURES]
        out["arms"][arm] = {"pairs": len(a), "rows": rows}
    org_first = [m for _, m in at.get((first, ORG), [])]
    org_last = [m for _, m in at.get((last, ORG), [])]
    out["coordination_by_team_size"] = {
        "first": coordination_by_hires(org_first), "last": coordination_by_hires(org_last),
        "published": {"1": 0.09, "8": 0.32}}
    return out


def analyse(run_dir: str, judge: Judge | None = None, *, audit: Judge | None = None,
            commit: str = "") -> tuple[dict, list[LoggedRollout]]:
    """The report of one run directory as JSON (see the module docstring), and its rollouts.
    With `audit`, a second judge labels the same texts and `judge_agreement` holds Cohen's
    kappa between the two per rubric. `commit`: the code the run ran, for `learning`."""
    rollouts = list(read_run(run_dir))
    logs = [r.events for r in rollouts]
    labels = judge_rollouts(logs, judge or RuleJudge())
    judge_agreement = (agreement(labels, judge_rollouts(logs, audit))
                       if audit is not None else None)
    ms = [rollout_metrics(r.events, lab) for r, lab in zip(rollouts, labels)]
    groups: dict[tuple[str, int, str], list[int]] = collections.defaultdict(list)
    for i, r in enumerate(rollouts):
        groups[(r.phase, r.step, r.arm)].append(i)
    rl_of = {(r.phase, r.step): r.rl_step for r in rollouts}
    records = env_records({k: [rollouts[i].events for i in idx] for k, idx in groups.items()},
                          rl_of)
    failures = failed_calls({k: [ms[i] for i in idx] for k, idx in groups.items()}, rl_of)
    checkpoints = []
    for (phase, step, arm), idx in sorted(groups.items()):
        checkpoints.append({"phase": phase, "step": step, "rl_step": rollouts[idx[0]].rl_step,
                            "arm": arm, **aggregate([ms[i] for i in idx])})
    eval_steps = sorted({r.step for r in rollouts if r.phase == "eval"})
    rl_steps = {r.step: r.rl_step for r in rollouts if r.phase == "eval"}
    at: dict[tuple[int, str], list] = collections.defaultdict(list)  # (step, arm) -> pairs
    for r, m in zip(rollouts, ms):
        if r.phase == "eval":
            at[(r.step, r.arm)].append((r, m))
    comparisons, baselines, bok = [], [], []
    for step in eval_steps:
        arms = {arm: [p for (s, a), ps in at.items() if s == step and a == arm for p in ps]
                for arm in sorted({a for s, a in at if s == step})}
        per_env = {}
        for env in sorted({r.env for ps in arms.values() for r, _ in ps}):
            org = [r for r, _ in arms.get(ORG, []) if r.env == env]
            single = [r for r, _ in arms.get(SINGLE, []) if r.env == env]
            if org and single:
                per_env[env] = {"org_reward": bootstrap_mean([r.reward for r in org]).to_json(),
                                "single_reward": bootstrap_mean(
                                    [r.reward for r in single]).to_json(),
                                "over_tasks": _paired(_task_means(org), _task_means(single))}
        over_envs = None
        if len(per_env) >= 2:
            over_envs = _paired({e: v["org_reward"]["estimate"] for e, v in per_env.items()},
                                {e: v["single_reward"]["estimate"] for e, v in per_env.items()})
        s_ms, o_ms = paired_rollouts(arms.get(SINGLE, []), arms.get(ORG, []))
        comparisons.append({"step": step, "rl_step": rl_steps[step], "environments": per_env,
                            "over_environments": over_envs,
                            "paired": shift(measure("reward"), s_ms, o_ms) if s_ms else None})
        org_latency = (estimate(measure("latency_s"), [m for _, m in arms[ORG]])
                       if arms.get(ORG) else None)
        for arm, pairs in arms.items():
            row = {"step": step, "rl_step": rl_steps[step], "arm": arm,
                   **_arm_row([m for _, m in pairs])}
            if org_latency and org_latency["estimate"]:
                row["latency_vs_org"] = row["latency_s"]["estimate"] / org_latency["estimate"]
            baselines.append(row)
            if any("k" in r.extra for r, _ in pairs):
                bok.append({"step": step, "arm": arm, **best_of_k([r for r, _ in pairs])})
    curves: dict[str, dict[str, list]] = {name: {} for name in CURVES}
    for c in checkpoints:
        if c["phase"] != "eval" or c["arm"] not in ARMS:
            continue
        for name in CURVES:
            v = c[name]
            if v is not None:
                curves[name].setdefault(c["arm"], []).append(
                    [c["rl_step"], v["estimate"], v["low"], v["high"]])
    summary = {}
    summary_path = os.path.join(run_dir, "summary.json")
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
    code, recorded = run_code(run_dir, summary)
    judge_name = "the rule judge" if judge is None or isinstance(judge, RuleJudge) \
        else f"a model judge ({type(judge).__name__})"
    report = {"run": os.path.abspath(run_dir), "rollouts": len(rollouts),
              "commit": commit or recorded, "code": f"commit {commit}" if commit else code,
              "judge": judge_name, "env_records": records, "failed_calls": failures,
              "timing": timing(read_metrics(run_dir)),
              "summary": summary, "checkpoints": checkpoints, "comparisons": comparisons,
              "baselines": baselines, "best_of_k": bok, "curves": curves,
              "shifts": (_shifts(at, eval_steps[0], eval_steps[-1], rl_steps)
                         if len(eval_steps) >= 2 else None),
              "last_eval_step": eval_steps[-1] if eval_steps else None,
              "judge_agreement": judge_agreement, "per_rollout": [
                  {"path": os.path.relpath(r.path, run_dir), "phase": r.phase, "step": r.step,
                   "rl_step": r.rl_step, "env": r.env, "arm": r.arm, "task_id": r.task_id,
                   **m.to_json()}
                  for r, m in zip(rollouts, ms)]}
    report["learning"] = paragraph(report)
    return report, rollouts


def last_eval_rows(report: dict, name: str) -> list[dict]:
    step = report["last_eval_step"]
    return [{"run": name, **{k: b[k] for k in ("step", "rl_step", "arm", "reward", "tokens_out",
                                                 "latency_s")}}
            for b in report["baselines"] if b["step"] == step]


def write_report(run_dir: str, *, judge: Judge | None = None, audit: Judge | None = None,
                 others: Sequence[str] = (), episodes: int = 8, commit: str = "",
                 embed_images: bool = True) -> str:
    """Analyses `run_dir` (and, for the runs table, `others`) and writes RUN_DIR/report/:
    report.json, the PNGs, index.html (holding the PNGs unless `embed_images` is False),
    learning.md, shifts.md (the shifts tables in Markdown) and the episode pages. Returns the
    report directory."""
    report, rollouts = analyse(run_dir, judge, audit=audit, commit=commit)
    out = os.path.join(run_dir, "report")
    os.makedirs(os.path.join(out, "episodes"), exist_ok=True)
    runs = []
    if others:
        runs += last_eval_rows(report, os.path.basename(os.path.abspath(run_dir)))
        for other in others:
            rep, _ = analyse(other, judge)
            runs += last_eval_rows(rep, os.path.basename(os.path.abspath(other)))
    report["runs"] = runs
    links = []
    last = [r for r in rollouts if r.phase == "eval" and r.step == report["last_eval_step"]]
    for r in last[:episodes]:
        name = f"{r.phase}_step{r.step}_{os.path.splitext(os.path.basename(r.path))[0]}.html"
        with open(os.path.join(out, "episodes", name), "w", encoding="utf-8") as f:
            f.write(render_episode(r.events, title=f"{r.arm} {r.env} {r.task_id} "
                                                   f"({os.path.basename(r.path)})"))
        links.append((f"{r.arm} · {r.env} · {r.task_id} · reward {r.reward:g}",
                      f"episodes/{name}"))
    report["episodes"] = [href for _, href in links]
    pages = {os.path.relpath(r.path, run_dir): href for r, (_, href) in zip(last, links)}
    for row in report["per_rollout"]:
        row["episode"] = pages.get(row["path"])  # the viewer page, where one was written
    images = plots(report)
    for name, png in images.items():
        with open(os.path.join(out, f"{name}.png"), "wb") as f:
            f.write(png)
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    with open(os.path.join(out, "learning.md"), "w", encoding="utf-8") as f:
        f.write(report["learning"] + "\n")
    with open(os.path.join(out, "shifts.md"), "w", encoding="utf-8") as f:
        f.write(shifts_markdown(report))
    with open(os.path.join(out, "index.html"), "w", encoding="utf-8") as f:
        f.write(index_html(report, images, links, runs, embed_images=embed_images))
    return out
