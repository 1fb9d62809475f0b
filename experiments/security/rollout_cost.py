"""What the organisation's rollout phase costs, the model left out: the toy run's environment
and organisation (configs/toy_org.py), its held-out tasks played by the toy's SFT teacher (a
scripted policy: no engine, so what is timed is the organisation, its tools, prompts and the
environment), in the toy's evaluation arms (the organisation at the evaluation budget and the
single agent).

    python -m experiments.security.rollout_cost --tasks=16 --seeds=2 --repeats=3 [--ors]

With `--ors` the sessions are played over ORS with the Avalon extension (an `OrsServer` on
127.0.0.1 in this process, `OrsEnvironment` as the client): the transport's cost is then in the
figures too. Prints one JSON object: the median wall and CPU seconds (this process's) of
`RolloutDriver.run` over `--repeats` runs (after one warm-up), and the turns of a run. On a
loaded machine the CPU seconds are the steadier figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

from avalon.envs.base import Split
from avalon.envs.ors import OrsEnvironment
from avalon.envs.ors_server import OrsServer
from avalon.org.driver import GroupSpec, RolloutDriver, RolloutSpec
from avalon.train.config import from_config_dict
from avalon.train.setup import build
from configs.toy_org import get_config


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ors", action="store_true", help="play the sessions over ORS")
    args = parser.parse_args(argv)
    config = get_config()
    cfg = from_config_dict(config, num_devices=1)
    setup = build(cfg, config.env)
    env = setup.envs[0]
    with OrsServer([env]) if args.ors else contextlib.nullcontext() as server:
        sessions = env if server is None else OrsEnvironment(server.url, env.name,
                                                             extension=True)
        return _measure(args, cfg, setup, env, sessions)


def _measure(args, cfg, setup, env, sessions) -> dict:
    def once() -> tuple[float, float, int]:
        specs = []
        for t_index, task_id in enumerate(env.task_ids(Split.HELDOUT)[:args.tasks]):
            for a_index, budget in enumerate((cfg.eval.budget, 0)):
                specs.append(GroupSpec(len(specs), tuple(
                    RolloutSpec(sessions.session(task_id, seed=s, clock_s=cfg.eval.clock_s),
                                budget=budget, seed=(t_index * 2 + a_index) * 1000 + s)
                    for s in range(args.seeds))))
        driver = RolloutDriver(cfg.make_teacher(env, setup.chat), setup.chat, cfg.org)
        start, cpu = time.perf_counter(), time.process_time()
        result = driver.run(specs)
        return (time.perf_counter() - start, time.process_time() - cpu,
                sum(t.turns for t in result.ticks))

    once()
    runs = [once() for _ in range(args.repeats)]
    out = {"env": env.name, "ors": args.ors, "tasks": args.tasks, "seeds": args.seeds,
           "median_wall_s": statistics.median(r[0] for r in runs),
           "median_cpu_s": statistics.median(r[1] for r in runs), "turns": runs[0][2],
           "walls_s": [round(r[0], 3) for r in runs]}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
