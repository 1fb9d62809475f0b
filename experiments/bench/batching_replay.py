"""Rows computed by tick and continuous batching on `continuous_batching`'s workload, no model.

    python -m experiments.bench.batching_replay

Replays the benchmark's turns (same seed, agents, turns, lengths) through both schedules on the
host: tick = every agent's turn t together, no turn t + 1 before the slowest turn t ended;
continuous = an agent's next turn joins `--gap` dispatches after its previous one ended (its
prefill). Each dispatch computes `--steps` tokens for the rows of its row bucket (the engine's
decode ladder 8, 16 and finer ones). On a CPU a dispatch costs about in proportion to its
rows, so tick / continuous row-dispatches predicts the benchmark's tokens/s ratio there
(RESULTS.md, topic 2, where the replay is quoted).
"""

from __future__ import annotations

from absl import app, flags

from avalon import model as M
from experiments.bench.continuous_batching import workload

FLAGS = flags.FLAGS
# --agents, --turns, --min_len, --max_len, --steps, --seed: continuous_batching's flags.
flags.DEFINE_integer("gap", 1, "dispatches between an agent's turns in continuous mode")


def _bucket(n: int, ladder) -> int:
    return next(x for x in ladder if n <= x)


def tick(lengths, steps: int, ladder) -> list[int]:
    rows = []
    for t in range(len(lengths[0])):
        left = [agent[t] for agent in lengths]
        while any(left):
            rows.append(_bucket(sum(n > 0 for n in left), ladder))
            left = [max(0, n - steps) for n in left]
    return rows


def continuous(lengths, steps: int, ladder, gap: int) -> list[int]:
    queue = [list(agent[1:]) for agent in lengths]
    left = [agent[0] for agent in lengths]
    wait = [0] * len(lengths)
    rows = []
    while any(left):
        live = [a for a in range(len(left)) if left[a] and not wait[a]]
        if live:
            rows.append(_bucket(len(live), ladder))
        for a in range(len(left)):
            if wait[a]:
                wait[a] -= 1
            elif left[a]:
                left[a] = max(0, left[a] - steps)
                if not left[a] and queue[a]:
                    left[a], wait[a] = queue[a].pop(0), gap
    return rows


def main(argv):
    del argv
    work = workload(M.presets.get("toy"), FLAGS.agents, FLAGS.turns, FLAGS.min_len, FLAGS.max_len,
                    FLAGS.seed)
    lengths = [[n for _, n in agent] for agent in work]
    S = FLAGS.steps
    print("useful row-dispatches", sum(-(-n // S) for agent in lengths for n in agent))
    print("dispatches per agent", sorted(sum(-(-n // S) for n in agent) for agent in lengths))
    top = FLAGS.agents
    for ladder in [(8, top), (4, 8, top), (2, 4, 8, top), (1, 2, 4, 8, top)]:
        t, c = tick(lengths, S, ladder), continuous(lengths, S, ladder, FLAGS.gap)
        print(f"rows {ladder}: tick {len(t)} dispatches, {sum(t)} row-dispatches; continuous "
              f"{len(c)}, {sum(c)}; tick / continuous rows {sum(t) / sum(c):.3f}")


if __name__ == "__main__":
    app.run(main)
