"""PNG plots of a run, drawn from `WORKDIR/metrics.jsonl` at the end of training.

`reward.png`: the training collective reward (band: its logged std over the step's rollouts;
dashed: the shaped reward the advantages use, `batch/reward_mean`) and the held-out reward of
the organisation against a single agent (bands: the std over each arm's evaluation rollouts).
`organisation.png`: hires per rollout and share of the budget hired; messages and trace reads per
agent; critical-path token share and derived latency as a share of the step's clock.

Every key read here is in `PLOTTED_KEYS` (tests check them against what a real run logs). The
x axis is the RLCR step (0 = after SFT), with integer ticks. Missing series are skipped, so a
short run still plots.
"""

from __future__ import annotations

import dataclasses
import os

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from avalon import paths  # noqa: E402
from avalon.train.telemetry import read_metrics  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Line:
    key: str  # the metric drawn
    label: str
    std_key: str | None = None  # a logged std drawn as a band around the line
    per_key: str | None = None  # drawn as key / per_key (a share of another logged value)
    style: str = "-"
    marker: str = "o"
    zorder: int = 2


@dataclasses.dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    lines: tuple[Line, ...]


REWARD_PANELS = (
    Panel("Training reward", "collective reward per rollout", (
        Line("reward/mean", "collective reward (env)", std_key="reward/std", zorder=3),
        Line("batch/reward_mean", "shaped (underhire penalty), for advantages", style="--",
             marker=""),
    )),
    # The organisation is drawn last and on top: where the arms agree it stays visible.
    Panel("Held-out reward", "mean collective reward", (
        Line("eval/single_reward", "single agent", std_key="eval/single_reward/std",
             style="--", marker="s"),
        Line("eval/org_reward", "organisation", std_key="eval/org_reward/std", zorder=3),
    )),
)
ORG_PANELS = (
    Panel("Hiring", "per rollout / share", (
        Line("org/hires_per_rollout", "hires per rollout"),
        Line("org/budget_use", "share of budget hired", marker="s"),
    )),
    Panel("Co-ordination", "per agent", (
        Line("org/messages_per_agent", "messages per agent"),
        Line("org/trace_reads_per_agent", "trace reads per agent", marker="s"),
    )),
    Panel("Derived latency", "share", (
        Line("org/critical_token_share", "critical-path token share"),
        Line("org/latency_s", "derived latency / clock", per_key="clock_s", marker="s"),
    )),
)
PLOTTED_KEYS = frozenset(k for panels in (REWARD_PANELS, ORG_PANELS) for p in panels
                         for line in p.lines for k in (line.key, line.std_key, line.per_key)
                         if k)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _series(records: list[dict], key: str, std_key: str | None = None,
            per_key: str | None = None):
    """(rl steps, values, stds or None) over the lines that have `rl_step` and the key."""
    # RLCR and evaluation lines carry `rl_step` (0 = the SFT starting point).
    xs, ys, stds = [], [], []
    for r in records:
        if "rl_step" not in r or not _number(r.get(key)):
            continue
        y = r[key]
        if per_key is not None:
            if not _number(r.get(per_key)) or not r[per_key]:
                continue
            y = y / r[per_key]
        xs.append(r["rl_step"])
        ys.append(y)
        stds.append(r.get(std_key) if std_key and _number(r.get(std_key)) else None)
    if not xs:
        return None
    return xs, ys, (stds if all(s is not None for s in stds) and std_key else None)


def _panel(ax, records, panel: Panel) -> bool:
    drawn = False
    for line in panel.lines:
        s = _series(records, line.key, line.std_key, line.per_key)
        if not s:
            continue
        xs, ys, stds = s
        (handle,) = ax.plot(xs, ys, line.style, marker=line.marker if len(xs) < 30 else "",
                            label=line.label, zorder=line.zorder, linewidth=1.8)
        if stds is not None:
            ax.fill_between(xs, [y - d for y, d in zip(ys, stds)],
                            [y + d for y, d in zip(ys, stds)], color=handle.get_color(),
                            alpha=0.15, linewidth=0, zorder=line.zorder - 1)
        drawn = True
    ax.set_title(panel.title)
    ax.set_xlabel("RL step")
    ax.set_ylabel(panel.ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if drawn:
        ax.legend(fontsize=8)
    return drawn


def _figure(path, records: list[dict], panels: tuple[Panel, ...]) -> str:
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        _panel(ax, records, panel)
    fig.tight_layout()
    with paths.path(path).open("wb") as f:  # a local file or a gs:// object alike
        fig.savefig(f, dpi=90, format="png")
    plt.close(fig)
    return os.fspath(path)


def write_plots(workdir: str) -> list[str]:
    """Write the PNGs into `workdir`; returns the paths written."""
    records = read_metrics(paths.join(workdir, "metrics.jsonl"))
    return [_figure(paths.join(workdir, "reward.png"), records, REWARD_PANELS),
            _figure(paths.join(workdir, "organisation.png"), records, ORG_PANELS)]
