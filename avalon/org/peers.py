"""No-CEO mode (SPEC §5, the safety scenarios): N peers with identical briefs, one public channel.

`Organisation(..., peers=PeerTeam(n=8))` starts the rollout with peers `p1` .. `pN` already in
the team instead of a CEO: every peer has the same title, role and tools (the co-ordination
tools below plus *every* environment tool, grantable or not), reads the task prompt, is
subscribed to the public channel, and nobody can hire, fire, create channels, report to a CEO
or send a final message. The episode ends on an environment event, the wall clock, or when no
peer can act. Everything else is an ordinary rollout: the same event log (the `start` and `end`
events keep agent "ceo", the log's system events; no agent "ceo" acts), the same latency, the
same limits and compaction.

Each peer's brief is the environment's `brief(agent, index, title, role)` with index 0 .. N-1
(scenarios that deal roles or groups do it there); each peer's sampling seeds mix its index.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from avalon.org.agents import Agent
from avalon.org.channels import channel_key
from avalon.org.context import AgentContext
from avalon.org.errors import ToolError
from avalon.org.prompts import role_card
from avalon.org.tools import SPECS, TALK_TOOLS, OrgTool

if TYPE_CHECKING:
    from avalon.org.config import OrgConfig
    from avalon.org.env import ToolSpec
    from avalon.tokenizer.chat import ChatFormat

PEER_TOOLS = (OrgTool.POST, OrgTool.DM, OrgTool.REACT, OrgTool.READ_MESSAGE,
              OrgTool.READ_CHANNEL, OrgTool.ROSTER, OrgTool.READ_TRACE,
              OrgTool.WAIT_FOR_MESSAGES)
PEER_ROLE = "You are one of a team of equals; there is no manager."
MAX_PEERS = 64


@dataclasses.dataclass(frozen=True)
class PeerTeam:
    n: int  # peers p1 .. pN
    channel: str = "public"  # the one channel every peer reads in full
    title: str = "Member"
    role: str = PEER_ROLE

    def __post_init__(self):
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= MAX_PEERS:
            raise ValueError(f"PeerTeam.n must be an int in 1..{MAX_PEERS}, got {self.n!r}")
        try:
            channel_key(self.channel)
        except ToolError as e:
            raise ValueError(f"PeerTeam.channel {self.channel!r}: {e}") from None
        if not self.title.strip():
            raise ValueError("PeerTeam.title must not be empty")


def peer_ids(n: int) -> tuple[str, ...]:
    return tuple(f"p{i + 1}" for i in range(n))


def peer_agents(team: PeerTeam, channel: str, brief: Callable[[str, int, str, str], str],
                task_prompt: str, env_specs: Mapping[str, ToolSpec], config: OrgConfig,
                chat: ChatFormat, start_seq: int) -> list[Agent]:
    """The peers of a fresh rollout, in order, each with its card and first observation;
    `brief` is the session's (called once per peer, in order). The organisation adds them and
    subscribes them to `channel` (already open) in full."""
    perms = config.permissions
    tools = tuple(t.value for t in PEER_TOOLS
                  if (t is not OrgTool.READ_TRACE or perms.read_traces)
                  and (perms.talk or t not in TALK_TOOLS))
    tools += tuple(env_specs)
    ids = peer_ids(team.n)
    specs = [SPECS[OrgTool(n)] if n not in env_specs else env_specs[n] for n in tools]
    agents = []
    for index, pid in enumerate(ids):
        text = brief(pid, index, team.title, team.role)
        roster = [(pid, team.title)] + [(q, team.title) for q in ids if q != pid]
        card = role_card(agent=pid, title=team.title, role=team.role, task=task_prompt,
                         brief=text, roster=roster,
                         subscriptions=[(channel, "full")] if perms.talk else [],
                         budget_left=None, commitments="", tools=specs,
                         style=config.prompt_style, json_calls=chat.json_calls)
        agent = Agent(id=pid, index=index, title=team.title, role=team.role, brief=text,
                      tools=tools, context=AgentContext(chat.system(card), pid, team.title),
                      last_seq=start_seq, card=card)
        agent.mark_trace()
        agent.pending.append(f"Start. Post to {channel}; everyone reads it." if perms.talk
                             else "Start.")
        agents.append(agent)
    return agents
