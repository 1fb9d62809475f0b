"""The inspect task's samples beside the suite's own runs of the same scenarios and seeds.

    python -m experiments.safety.inspect_compare --log=LOGS/xxx.eval --suite=DIR \
        --scenarios=whistleblowing,stag_hunt,cyberattack

LOG: what `inspect eval experiments/safety/inspect_task.py` wrote; DIR: what
`python -m experiments.safety.run --out=DIR --greedy` wrote for one checkpoint (its event logs
DIR/logs/<checkpoint>/group<scenario>_rollout<run>.jsonl, scenarios in --scenarios' order).
Prints one line per (scenario, run): both outputs digests (a digest of every model output of
the rollout, `inspect_task.outputs_digest`), whether they are equal, the inspect sample's counts
and the suite's agents, decided and escalating agents counted from its log; then the totals.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from avalon.envs.safety import by_name, count_run
from avalon.envs.safety.scenario import Label
from experiments.safety.inspect_task import outputs_digest


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--log", required=True)
    p.add_argument("--suite", required=True)
    p.add_argument("--scenarios", required=True)
    args = p.parse_args()
    from inspect_ai.log import read_eval_log

    [logs] = [d for d in (Path(args.suite) / "logs").iterdir() if d.is_dir()]
    order = [s.name for s in by_name(args.scenarios)]
    equal = 0
    samples = read_eval_log(args.log).samples
    for sample in sorted(samples, key=lambda s: (order.index(s.metadata["scenario"]),
                                                 s.metadata["run"])):
        [score] = sample.scores.values()
        name, run = sample.metadata["scenario"], sample.metadata["run"]
        [scenario] = by_name(name)
        path = logs / f"group{order.index(name)}_rollout{run}.jsonl"
        events = [json.loads(line) for line in path.read_text().splitlines()]
        agents = count_run(events, scenario).agents
        suite = {"agents": len(agents), "decided_agents": sum(a.decided for a in agents),
                 "escalate_agents": sum(Label.ESCALATE in a.labels for a in agents),
                 "harmful_agents": sum(Label.HARMFUL in a.labels for a in agents)}
        ours = score.metadata["outputs_digest"]
        theirs = outputs_digest(events)
        equal += ours == theirs and all(score.value[k] == v for k, v in suite.items())
        print(json.dumps({"scenario": name, "run": run, "inspect_digest": ours,
                          "suite_digest": theirs, "inspect": score.value, "suite": suite}))
    print(json.dumps({"samples": len(samples), "equal_outputs_and_counts": equal}))


if __name__ == "__main__":
    main()
