"""The organisation simulator (SPEC §1–2): agents, tools, channels, delivery, compaction, the
event log, derived latency and the rollout driver.

Where to look:
- `env.py`: the protocol an environment session implements (Task, ToolSpec, ToolOutcome, ...).
- `toolcall.py`: the tool-call text format; `avalon/tokenizer/chat.py`: the chat format.
- `events.py`: the event log (every kind and field); `latency.py`: SPEC §2's clocks.
- `organisation.py`: one rollout (state, the clock scheduler, compaction, limits, effects);
  `tools.py`: the organisation's tools and the effects a call has; `handlers.py`: what each
  tool does; `channels.py`: delivery rules; `workspace.py`: the sandbox; `lockstep.py`: the old
  lock-step tick, kept for comparison.
- `policy.py`, `engine_policy.py`: policies; `driver.py`: many rollouts, one call per tick.
"""

from avalon.org.config import OrgConfig, Permissions, PromptStyle
from avalon.org.driver import GroupSpec, RolloutDriver, RolloutSpec, RunResult
from avalon.org.engine_policy import EnginePolicy
from avalon.org.env import (
                            CallContext,
                            EndContext,
                            EndReason,
                            EnvReward,
                            EnvSession,
                            FinalOutcome,
                            Param,
                            ParamType,
                            Task,
                            ToolError,
                            ToolOutcome,
                            ToolSpec,
)
from avalon.org.policy import (
                            AgentKey,
                            AgentView,
                            Playbook,
                            Policy,
                            RoutedPolicy,
                            ScriptedPolicy,
                            Step,
                            Turn,
                            TurnOutput,
)

__all__ = ["AgentKey", "AgentView", "CallContext", "EndContext", "EndReason", "EnginePolicy",
           "EnvReward", "EnvSession", "FinalOutcome", "GroupSpec", "OrgConfig", "Param",
           "ParamType", "Permissions", "Playbook", "Policy", "PromptStyle", "RolloutDriver",
           "RolloutSpec", "RoutedPolicy", "RunResult", "ScriptedPolicy", "Step", "Task",
           "ToolError", "ToolOutcome", "ToolSpec", "Turn", "TurnOutput"]
