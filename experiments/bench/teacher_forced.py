"""How much of the teacher's content a trained model predicts, token class by token class.

    python -m experiments.bench.teacher_forced --config=configs/toy_org.py --run=runs/toy \\
        [--config.env.three_environments=True ...] [--episodes=24] [--rows=40]

Plays `--episodes` fresh teacher episodes (the config's teacher, training tasks), runs the
trainer's forward (`avalon.model.model.forward`, the params of RUN's newest checkpoint or of
RUN/checkpoints/N) on the first `--rows` of their rows, and prints one JSON object: for the
demonstrated (loss) tokens of each class, the share the model's argmax predicts. Classes:
`number` (codes, answers, counts), `word` (tool names, ids, options, roles: any other
alphanumeric token) and `punct` (JSON and chat punctuation). A policy whose `word` share is far
from 1 takes wrong turns however well its loss looks: the punctuation dominates the loss.
"""

from __future__ import annotations

import collections
import json

import jax
import jax.numpy as jnp
import numpy as np

from avalon.model.model import forward
from avalon.train import setup as setup_lib
from avalon.train.config import from_config_dict
from avalon.train.sft import teacher_traces


def token_class(text: str) -> str:
    t = text.strip()
    if t.isdigit():
        return "number"
    return "word" if t.replace("_", "").isalnum() else "punct"


def teacher_forced(config, run: str, *, episodes: int, rows: int) -> dict:
    """The shares of the module docstring, for `config` (a ConfigDict) with RUN's params."""
    c = config.copy_and_resolve_references()
    c.sft.teacher_episodes = episodes
    c.init_from = run
    cfg = from_config_dict(c, num_devices=jax.device_count())
    st = setup_lib.build(cfg, c.env)
    mcfg, params = setup_lib.initial_params(cfg, st.mesh)
    teacher_rows = teacher_traces(st).rows[:rows]
    fwd = jax.jit(lambda prm, t: forward(prm, t, mcfg).logits)
    hits = collections.Counter()
    total = collections.Counter()
    for r in teacher_rows:
        t = np.asarray(r.tokens)
        pred = np.asarray(fwd(params, jnp.asarray(t[None])))[0, :-1].argmax(-1)
        for p_id, g, m in zip(pred, t[1:], np.asarray(r.loss_mask)[1:]):
            if m:
                k = token_class(st.chat.tok.decode([int(g)]))
                total[k] += 1
                hits[k] += int(p_id == g)
    return {"run": run, "rows": len(teacher_rows),
            **{k: {"accuracy": hits[k] / total[k], "tokens": total[k]} for k in sorted(total)}}


if __name__ == "__main__":
    from absl import app, flags
    from ml_collections import config_flags

    # Flags only here: a module imported by tests must not define absl flags.
    _CONFIG = config_flags.DEFINE_config_file("config", None, "The run's config file "
                                              "(--config.a.b=v overrides, as the run had them).")
    _RUN = flags.DEFINE_string("run", None, "A run directory or one of its checkpoints.")
    _EPISODES = flags.DEFINE_integer("episodes", 24, "Teacher episodes to play.")
    _ROWS = flags.DEFINE_integer("rows", 40, "Teacher rows to score.")
    flags.mark_flags_as_required(["config", "run"])

    def main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        print(json.dumps(teacher_forced(_CONFIG.value, _RUN.value, episodes=_EPISODES.value,
                                        rows=_ROWS.value), indent=1))

    app.run(main)
