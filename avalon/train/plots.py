"""PNG plots of a run, drawn from `WORKDIR/metrics.jsonl` at the end of training.

`reward.png`: training collective reward and held-out reward (organisation vs single agent).
`organisation.png`: hires per rollout, messages and trace reads per agent, critical-path token
share and derived latency over training. Missing series are skipped, so a short run still plots.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402

from avalon.train.telemetry import read_metrics  # noqa: E402


def _series(records: list[dict], key: str):
    # RLCR and evaluation lines carry `rl_step` (0 = the SFT starting point).
    pts = [(r["rl_step"], r[key]) for r in records
           if "rl_step" in r and isinstance(r.get(key), (int, float))]
    return ([p[0] for p in pts], [p[1] for p in pts]) if pts else None


def _panel(ax, records, keys, title):
    drawn = False
    for key, label in keys:
        s = _series(records, key)
        if s:
            ax.plot(*s, marker="o" if len(s[0]) < 30 else None, label=label)
            drawn = True
    ax.set_title(title)
    ax.set_xlabel("RL step")
    if drawn:
        ax.legend(fontsize=8)
    return drawn


def write_plots(workdir: str) -> list[str]:
    """Write the PNGs into `workdir`; returns the paths written."""
    records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    written = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    _panel(axes[0], records, [("reward/mean", "train: collective reward")], "Training reward")
    _panel(axes[1], records, [("eval/org_reward", "organisation"),
                              ("eval/single_reward", "single agent")], "Held-out reward")
    fig.tight_layout()
    path = os.path.join(workdir, "reward.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    _panel(axes[0], records, [("org/hires_per_rollout", "hires per rollout"),
                              ("org/budget_use", "share of budget hired")], "Hiring")
    _panel(axes[1], records, [("org/messages_per_agent", "messages per agent"),
                              ("org/trace_reads_per_agent", "trace reads per agent")],
           "Co-ordination")
    _panel(axes[2], records, [("org/critical_token_share", "critical-path token share"),
                              ("org/latency_fraction_of_clock", "latency / clock")],
           "Derived latency")
    fig.tight_layout()
    path = os.path.join(workdir, "organisation.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)
    return written
