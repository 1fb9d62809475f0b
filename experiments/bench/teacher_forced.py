"""How much of the teacher's content a trained model predicts, token class by token class.

    python -m experiments.bench.teacher_forced --config=configs/toy_org.py --run=runs/toy \\
        [--set=env.three_environments=True ...] [--episodes=24] [--rows=40]

Plays `--episodes` fresh teacher episodes (the config's teacher, training tasks), runs the
trainer's forward (`avalon.model.model.forward`, the params of RUN's newest checkpoint or of
RUN/checkpoints/N) on the first `--rows` of their rows, and prints one JSON object: for the
demonstrated (loss) tokens of each class, the share the model's argmax predicts. Classes:
`number` (codes, answers, counts), `word` (tool names, ids, options, roles: any other
alphanumeric token) and `punct` (JSON and chat punctuation). A policy whose `word` share is far
from 1 takes wrong turns however well its loss looks: the punctuation dominates the loss.
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib.util
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="the run's config file")
    p.add_argument("--run", required=True, help="a run directory or one of its checkpoints")
    p.add_argument("--episodes", type=int, default=24)
    p.add_argument("--rows", type=int, default=40)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override, as the run had it (a Python literal)")
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location("run_config", args.config)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    for item in args.set:
        key, _, value = item.partition("=")
        *path, leaf = key.split(".")
        section = c
        for name in path:
            section = section[name]
        if leaf not in section:
            raise SystemExit(f"teacher_forced: --set={item}: no key {key!r} in the config")
        section[leaf] = ast.literal_eval(value)
    c.sft.teacher_episodes = args.episodes
    c.init_from = args.run
    cfg = from_config_dict(c, num_devices=jax.device_count())
    st = setup_lib.build(cfg, c.env)
    mcfg, params = setup_lib.initial_params(cfg, st.mesh)
    rows = teacher_traces(st).rows[:args.rows]
    fwd = jax.jit(lambda prm, t: forward(prm, t, mcfg).logits)
    hits = collections.Counter()
    total = collections.Counter()
    for r in rows:
        t = np.asarray(r.tokens)
        pred = np.asarray(fwd(params, jnp.asarray(t[None])))[0, :-1].argmax(-1)
        for p_id, g, m in zip(pred, t[1:], np.asarray(r.loss_mask)[1:]):
            if m:
                k = token_class(st.chat.tok.decode([int(g)]))
                total[k] += 1
                hits[k] += int(p_id == g)
    print(json.dumps({"run": args.run, "rows": len(rows),
                      **{k: {"accuracy": hits[k] / total[k], "tokens": total[k]}
                         for k in sorted(total)}}, indent=1))


if __name__ == "__main__":
    main()
