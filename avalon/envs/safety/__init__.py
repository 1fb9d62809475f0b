"""The safety and co-operation scenarios of SPEC §5, played by no-CEO teams of peers.

- `scenario.py`: `Scenario` (a frozen description), `ScenarioEnv` (its Environment), `Label`.
- `games.py`: public goods (with and without punishment), stag hunt, commons (with and
  without a fining authority), intergroup allocation, self-sacrifice.
- `dilemmas.py`: whistleblowing (doctored report, and a benign decoy), vaccine dispatch (loss of
  control), the cyberattack with confederates.
- `suite.py`: the 11, in table order; `confederates.py`: fixed-policy peers mixed in;
  `counts.py`: counts from event logs, Wilson intervals; `judge.py`: the rule judge.
"""

from avalon.envs.safety.confederates import ConfederateScript, mix, rollout_confederates
from avalon.envs.safety.counts import MEASURES, RunCounts, count_run, summarise, wilson
from avalon.envs.safety.judge import rule_judge
from avalon.envs.safety.scenario import Label, Scenario, ScenarioEnv
from avalon.envs.safety.suite import by_name, suite

__all__ = ["MEASURES", "ConfederateScript", "Label", "RunCounts", "Scenario", "ScenarioEnv",
           "by_name", "count_run", "mix", "rollout_confederates", "rule_judge", "suite",
           "summarise", "wilson"]
