"""One rollout's organisation: agents, turns, tool calls, delivery, compaction, the end.

The simulator's time is the derived clock (SPEC §2). A tick has two halves, driven by
`avalon/org/driver.py`:
1. `begin_tick()` returns the turns to run next. The clock scheduler (`avalon/org/schedule.py`)
   first commits, in clock order, every pending model call and tool call that comes before the
   next turn boundary, then builds the turns of the idle ready agents at the front of the clock
   (within `OrgConfig.schedule_horizon_s`). Building a turn is the agent's turn boundary: its
   inbox is drained (`deliver` events, in (send time, seq) order), its pending tool results and
   the deliveries become one observation, and compaction runs if the context has reached
   `OrgConfig.trigger_tokens`.
2. `apply(turns, outputs)` takes the policy's outputs in the same order: each becomes a pending
   commit at boundary + the model call's seconds; its calls then commit one by one at their
   agents' clocks, interleaved with everyone else's, so shared state (environment, messages,
   channels, archive, files, traces) changes in clock order, and a turn sees the state at its
   clock. A message sent now is delivered at each recipient's next boundary (on the clock: the
   first at or after its send time), never into a turn already built. `end_tick()` then ends
   the episode when the CEO sent its final message, an environment call was terminal, or no
   agent can act; turns still in flight are then logged as skipped.
Because outputs are committed in an order fixed by the clock and a documented tie key, the log
does not depend on how the policy batched or timed the turns: the same seed and the same
outputs give the same bytes. (`schedule_horizon_s=inf` selects the old lock-step tick instead,
`avalon/org/lockstep.py`, a subclass kept for comparison.)

The organisation is state (agents, post office, archive, files' and notes' write seqs, log,
clocks) plus the effects that change it: a tool call of the organisation's own is a handler
(`handlers.py`) that reads the state and returns effects as data (`tools.py`), which `_apply`
commits right after the call's `tool_call` event, at its clock.

Compaction (at a turn boundary, context + new observation >= trigger). Tier 1 replaces every
observation but the latest `keep_recent_obs` by a stub; it is applied when that brings the
context under `elide_target_ratio` of the window. Otherwise tier 2: this turn becomes a summary
turn on the context as it stands (the summary sees everything, nothing is re-prefilled, and the
summary's tokens end the current training row), then the context is rebuilt as the pinned role
card (role, roster, subscriptions, open commitments, hires left) and an observation holding the
summary (the summary turn's free text; calls in it are ignored) and the held-back observation.
Either tier ends the agent's current training row; the trace keeps everything.

Limits that stop one agent (a logged `stop`): its derived clock reaching the task's wall-clock
cap (after a turn, or at a boundary where a delivery moved it there), `max_turns` model calls,
or a context that cannot take the next observation. A stopped agent's inbox is dropped.
"""

from __future__ import annotations

import math

import numpy as np

from avalon.inference.api import StopReason as EngineStop
from avalon.org.agents import Agent, AgentState, StopReason
from avalon.org.channels import Delivery, Message, MessageKind, PostOffice, Subscription
from avalon.org.config import OrgConfig
from avalon.org.context import AgentContext, SegKind
from avalon.org.env import CallContext, EndContext, EndReason, EnvSession, FinalOutcome, ToolError
from avalon.org.events import EventKind, EventLog
from avalon.org.handlers import HANDLERS
from avalon.org.latency import ClockReplay, model_call_seconds
from avalon.org.peers import PeerTeam, peer_agents
from avalon.org.plain_text import plain_chat
from avalon.org.policy import AgentKey, AgentView, Turn, TurnOutput
from avalon.org.prompts import (
    CEO_ROLE,
    keep_improving,
    message_text,
    result_line,
    role_card,
    start_text,
    stub,
    summary_request,
    summary_restart,
)
from avalon.org.schedule import Scheduled, Work, pick_batch
from avalon.org.toolcall import Call, ParsedTurn, parse_turn
from avalon.org.tools import (
    NOT_COORDINATION,
    PLAN_MODE_REFUSED,
    SPECS,
    TALK_TOOLS,
    WORKSPACE_TOOLS,
    ArchiveWrite,
    CountTraceRead,
    Effect,
    Finish,
    Fire,
    Hire,
    OpenChannel,
    OrgTool,
    Park,
    PinReport,
    Send,
    Subscribe,
    ToolResult,
)
from avalon.org.workspace import Workspace
from avalon.rl.types import RewardEvent, TokenFlag
from avalon.tokenizer.chat import ChatFormat

_MASK64 = (1 << 64) - 1
_ORG_TOOLS = {t.value: t for t in OrgTool}
_PLAN_REFUSED = frozenset(t.value for t in PLAN_MODE_REFUSED)
# A turn the engine refused for want of KV pages (`StopReason.POOL_FULL`).
POOL_REFUSED = "refused: the engine's KV pool is full"


def turn_seed(seed: int, agent_index: int, call_index: int) -> int:
    """A 31-bit sampling seed, a fixed mix (splitmix64) of rollout seed, agent and call."""
    x = (seed * 0x9E3779B97F4A7C15 + agent_index * 0xBF58476D1CE4E5B9
         + call_index * 0x94D049BB133111EB + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & 0x7FFFFFFF


class Organisation:
    """The simulator of one rollout (see the module docstring for the tick protocol)."""

    clock_order = True  # commits never go back on the clock (`schedule.verify_schedule`)

    def __init__(self, session: EnvSession, *, rollout: int, budget: int, seed: int,
                 config: OrgConfig, chat: ChatFormat, workspace: Workspace,
                 peers: PeerTeam | None = None):
        """`peers`: the no-CEO mode (`avalon/org/peers.py`) instead of a CEO."""
        task = session.task
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"Organisation budget must be an int >= 0, got {budget!r}")
        clash = sorted({t.name for t in task.tools} & {t.value for t in OrgTool})
        if clash:
            raise ValueError(f"task {task.task_id!r} tools {clash} clash with organisation tools")
        # A context is compacted at the first boundary at or past the trigger, so it is at most
        # one turn past it: the summary request and the summary must still fit the window.
        request = len(chat.turn_prompt(summary_request(config.summary_cap)))
        if config.trigger_tokens + config.max_new_tokens + request + config.summary_cap > \
                config.window:
            raise ValueError(
                f"OrgConfig window {config.window} cannot hold trigger_tokens "
                f"{config.trigger_tokens} + max_new_tokens {config.max_new_tokens} + the summary "
                f"request ({request} tokens with this tokenizer) + summary_cap "
                f"{config.summary_cap}")
        self.session, self.task, self.rollout = session, task, rollout
        self.budget, self.seed = budget, seed
        # Every prompt this organisation renders: text never encodes a control token.
        self.config, self.chat, self.workspace = config, plain_chat(chat), workspace
        self.env_specs = {t.name: t for t in task.tools}
        self.log = EventLog()
        self.clocks = ClockReplay()
        self.post = PostOffice(config.default_subscription)
        self.archive: dict[str, str] = {}
        # Where shared content was last written (the tool_call's seq): read tools report it as
        # `content_seq` so reading moves the reader's clock (latency.py).
        self.archive_seq: dict[str, int] = {}
        self.file_seq: dict[str, int] = {}  # Workspace.key -> seq (write_file, run_code)
        self.agents: dict[str, Agent] = {}
        self.hires = 0
        self.tokens_out = 0
        self.rewards: list[RewardEvent] = []
        self.retired: list[AgentKey] = []  # agents that will not act again; the driver releases
        self.end_reason: EndReason | None = None
        self.final_message: str | None = None
        self.final: FinalOutcome | None = None
        self.done = False
        self._ending_seq: int | None = None
        self._clock_stops = 0
        if math.isinf(config.schedule_horizon_s) and self.clock_order:
            raise ValueError("OrgConfig.schedule_horizon_s=inf is the lock-step tick: "
                             "avalon/org/lockstep.py's LockStepOrganisation runs it")
        self.now = 0.0  # the scheduler's time: the clock of the latest boundary or commit
        self.scheduled: list[Scheduled] = []  # what it charged each model and tool call
        self._last_tool_call = -1
        session.on_start(budget, workspace)
        # No-CEO mode: each peer's brief is in its role card (peers.py); the start has none.
        ceo_brief = "" if peers is not None else session.brief("ceo", 0, "CEO", CEO_ROLE)
        start_fields = dict(task_id=task.task_id, budget=budget, seed=seed,
                            clock_s=task.wall_clock_s)
        if config.log_text:  # what an analysis or a judge reads: the task and the CEO's brief
            start_fields.update(prompt=task.prompt, brief=ceo_brief)
        start = self._emit(EventKind.START, "ceo", None, **start_fields)
        if peers is not None:
            self._start_peers(peers, start)
            return
        ceo = self._add_agent("ceo", "CEO", CEO_ROLE, self._ceo_tools(), start, ceo_brief)
        ceo.plan_mode = config.plan_mode
        ceo.pending.append(start_text(ceo=True, budget=budget, plan_mode=config.plan_mode,
                                      hirer=None))

    # ----- tools and role cards -----

    def _ceo_tools(self) -> tuple[str, ...]:
        perms = self.config.permissions
        names = [t.value for t in OrgTool if t is not OrgTool.REPORT_TO_CEO
                 and (t is not OrgTool.READ_TRACE or perms.read_traces)
                 and (perms.talk or t not in TALK_TOOLS)]
        return tuple(names) + tuple(self.env_specs)

    def grantable_tools(self) -> tuple[str, ...]:
        """Tools the CEO may give a specialist at hire."""
        workspace = WORKSPACE_TOOLS if self.config.permissions.talk else ()
        return tuple(t.value for t in workspace) + tuple(
            n for n, s in self.env_specs.items() if s.grantable)

    def _specialist_tools(self, granted: tuple[str, ...]) -> tuple[str, ...]:
        perms = self.config.permissions
        withheld = {OrgTool.FINAL_MESSAGE, *WORKSPACE_TOOLS}
        if not perms.specialists_hire:
            withheld.add(OrgTool.HIRE)
        if not perms.specialists_fire:
            withheld.add(OrgTool.FIRE)
        if not perms.specialists_create_channels:
            withheld.add(OrgTool.CREATE_CHANNEL)
        if not perms.read_traces:
            withheld.add(OrgTool.READ_TRACE)
        if not perms.talk:
            withheld.update(TALK_TOOLS)
        base = [t.value for t in OrgTool if t not in withheld]
        ws = [t.value for t in WORKSPACE_TOOLS if t.value in granted]
        return tuple(base + ws + [n for n in self.env_specs if n in granted])

    def _start_peers(self, team: PeerTeam, start_seq: int) -> None:
        """No-CEO mode: the peers join at the start, on one channel they all read in full."""
        if self.budget != 0:
            raise ValueError(f"no-CEO mode has no hiring: the budget must be 0, got {self.budget}")
        channel = self.post.create_channel(team.channel, "everyone")
        for agent in peer_agents(team, channel, self.session.brief, self.task.prompt,
                                 self.env_specs, self.config, self.chat, start_seq):
            self.post.add_agent(agent.id)
            if self.config.permissions.talk:  # else nobody may post or read: no subscription
                self.post.subs[agent.id][channel] = Subscription.FULL
            self.agents[agent.id] = agent

    def _card(self, a_id: str, title: str, role: str, brief: str, tools: tuple[str, ...],
              *, pinned: bool) -> str:
        roster = [(x.id, x.title) for x in self.agents.values() if x.active and x.id != a_id]
        roster.insert(0 if a_id == "ceo" else len(roster), (a_id, title))
        subs = [(c, m.value) for c, m in self.post.subs.get(a_id, {}).items()]
        see_task = a_id == "ceo" or self.config.specialists_see_task
        return role_card(
            agent=a_id, title=title, role=role, task=self.task.prompt if see_task else None,
            brief=brief, roster=roster, subscriptions=subs,
            budget_left=self.budget - self.hires if pinned and a_id == "ceo" else None,
            commitments=self._commitments(a_id) if pinned else "",
            tools=[SPECS[OrgTool(n)] if n not in self.env_specs else self.env_specs[n]
                   for n in tools],
            style=self.config.prompt_style, json_calls=self.chat.json_calls)

    def _commitments(self, a_id: str) -> str:
        """Open commitments: the agent's own last report, or for the CEO everyone's."""
        if a_id != "ceo":
            rep = self.agents[a_id].last_report or {}
            return "; ".join(f"{k}: {rep[k]}" for k in ("next", "blocked") if k in rep)
        return "; ".join(f"{x.id} {x.last_report.get('status', '')}".strip()
                         for x in self.agents.values() if x.last_report and x.active)

    def _add_agent(self, a_id: str, title: str, role: str, tools: tuple[str, ...],
                   last_seq: int, brief: str) -> Agent:
        index = len(self.agents)
        self.post.add_agent(a_id)
        card = self._card(a_id, title, role, brief, tools, pinned=False)
        agent = Agent(id=a_id, index=index, title=title, role=role, brief=brief, tools=tools,
                      context=AgentContext(self.chat.system(card), a_id, title),
                      last_seq=last_seq, card=card)
        agent.mark_trace()
        self.agents[a_id] = agent
        return agent

    def shared_prefix(self) -> np.ndarray:
        """The first agent's (the CEO's) system segment: the same for every rollout of a task
        (prefill sharing)."""
        return np.asarray(self.first_agent().context.segments[0].ids, np.int32)

    def first_agent(self) -> Agent:
        """The CEO, or in no-CEO mode the first peer."""
        return next(iter(self.agents.values()))

    def key(self, a: Agent) -> AgentKey:
        return AgentKey(self.rollout, a.id)

    def newest(self, seqs) -> int | None:
        """Of these events, the one whose agent's clock right after it was latest (ties: the
        later event); None for none."""
        return max(seqs, key=lambda s: (self.clocks.clock_at(s), s), default=None)

    # ----- events -----

    def _emit(self, kind: EventKind, agent: str, cause: int | None, /, **fields) -> int:
        event = self.log.append(kind, agent, cause, **fields)
        self.clocks.apply(event)
        if agent in self.agents:
            self.agents[agent].last_seq = event["seq"]
        return event["seq"]

    # ----- the turn boundary -----

    def begin_tick(self) -> list[Turn]:
        """The turns the policy runs next (see the module docstring); [] when none is left."""
        if self.done or self.end_reason is not None:
            return []
        agents = list(self.agents.values())  # position = Agent.index
        while True:
            effect = self._next_effect()
            ready = [(self._ready_at(a), a.index) for a in agents
                     if a.state is AgentState.READY and a.work is None]
            if effect is not None and (not ready or effect[0] <= min(ready)[0]):
                self._commit(agents[effect[1]])
                if self.end_reason is not None:
                    return []
                agents = list(self.agents.values())  # a hire adds one
                continue
            if not ready:
                return []
            limit = math.inf if effect is None else effect[0]
            turns = []
            for i in pick_batch(ready, limit, self.config.schedule_horizon_s):
                a = agents[i]
                start = self._ready_at(a)
                self.now = max(self.now, start)
                a.wake_at = None
                turn = self._begin_turn(a)
                if turn is not None:
                    a.work = Work(turn, start_s=start)
                    turns.append(turn)
            if turns:
                return turns

    def _ready_at(self, a: Agent) -> float:
        """When an idle ready agent's next boundary is: its clock, or its wake-up."""
        clock = self.clocks.clock(a.id)
        return clock if a.wake_at is None else max(clock, a.wake_at)

    def _next_effect(self) -> tuple[float, int] | None:
        """(clock time, agent index) of the earliest pending commit (ties: lower index)."""
        best = None
        for a in self.agents.values():
            w = a.work
            if w is None or w.out is None:
                continue
            key = (w.done_s if w.mc is None else self.clocks.clock(a.id), a.index)
            if best is None or key < best:
                best = key
        return best

    def _commit(self, a: Agent) -> None:
        """Commits an agent's next item: its model call, or its next tool call."""
        w = a.work
        if w.mc is None:
            if not self._commit_model_call(a, w):
                return
        else:
            self._commit_call(a, w)
        if a.work is w and not w.calls:
            self._finish_turn(a, w)

    def _begin_turn(self, a: Agent) -> Turn | None:
        cfg, ctx = self.config, a.context
        lines, a.pending = a.pending, []
        for d in self.post.drain(a.id):
            self._emit(EventKind.DELIVER, a.id, d.message.send_seq, message_id=d.message.id,
                       mode=d.mode.value)
            lines.append(message_text(d, cfg.snippet_chars))
        if self.clocks.clock(a.id) >= self.task.wall_clock_s:  # a delivery moved it past
            self._stop(a, StopReason.WALL_CLOCK)
            return None
        obs = self._cap("\n".join(lines), cfg.max_obs_tokens,
                        "observation cut; read_message re-reads any message")
        trace_prompt = None
        if a.restart_summary is not None:  # first turn after a tier-2 restart
            trace_prompt = self.chat.turn_prompt(obs)  # the trace never holds the summary
            obs, a.restart_summary = summary_restart(a.restart_summary, obs), None
        prompt = self.chat.turn_prompt(obs)
        compactable = any(s.kind is SegKind.OUTPUT for s in ctx.segments)
        if compactable and ctx.length + len(prompt) >= cfg.trigger_tokens:
            plan = ctx.elision(cfg.keep_recent_obs, self._stub_ids)
            saved = sum(len(seg.ids) - len(short) for seg, short in plan)
            if ctx.length - saved + len(prompt) <= cfg.window * cfg.elide_target_ratio:
                before = ctx.length
                ctx.elide(plan)
                self._emit(EventKind.COMPACTION, a.id, a.last_seq, tier=1, tokens_before=before,
                           tokens_after=ctx.length, segment=ctx.segment)
            else:
                # Tier 2: this turn writes the summary, on the context as it stands (nothing
                # re-prefilled); the observation waits for the rebuilt context. OrgConfig
                # guarantees the request and `summary_cap` fit after a context at the trigger
                # plus one turn.
                a.summary_turn, a.stash, trace_prompt = True, obs, None
                obs = summary_request(cfg.summary_cap)
                prompt = self.chat.turn_prompt(obs)
        limit = cfg.summary_cap if a.summary_turn else cfg.max_new_tokens
        max_new = min(limit, cfg.window - ctx.length - len(prompt))
        if max_new < 1:
            self._stop(a, StopReason.CONTEXT_FULL)
            return None
        ctx.add_prompt(prompt, trace_prompt)
        a.mark_trace()  # the observation exists at the agent's clock at this boundary
        view = AgentView(key=self.key(a), title=a.title, role=a.role, system=a.card,
                         turn=a.turns, obs=obs, summary=a.summary_turn, tools=a.tools)
        return Turn(key=self.key(a), segment=ctx.segment,
                    new_tokens=np.asarray(ctx.unsynced(), np.int32), max_new_tokens=max_new,
                    seed=turn_seed(self.seed, a.index, a.model_calls), view=view)

    def _stub_ids(self, n_tokens: int) -> list[int]:
        return self.chat.turn_prompt(stub(n_tokens))

    # ----- applying outputs -----

    def apply(self, turns: list[Turn], outputs: list[TurnOutput]) -> None:
        """Takes the policy's outputs for `turns` (as returned by `begin_tick`), in order:
        each becomes a pending model-call commit at its clock time."""
        for turn, out in self._outputs_of(turns, outputs):
            a = self.agents[turn.key.agent]
            if a.work is None or a.work.turn is not turn or a.work.out is not None:
                raise ValueError(f"apply: {turn.key} has no turn waiting for an output")
            self._set_output(a.work, out)

    def _outputs_of(self, turns: list[Turn], outputs: list[TurnOutput]):
        """(turn, output) pairs, each turn checked to be this rollout's, as they are taken."""
        if len(turns) != len(outputs):
            raise ValueError(f"apply: {len(turns)} turns but {len(outputs)} outputs")
        for turn, out in zip(turns, outputs):
            if turn.key.rollout != self.rollout:
                raise ValueError(f"apply: turn of rollout {turn.key.rollout} given to "
                                 f"rollout {self.rollout}")
            yield turn, out

    @staticmethod
    def _set_output(w: Work, out: TurnOutput) -> None:
        w.out = out
        w.done_s = w.start_s + model_call_seconds(len(w.turn.new_tokens), len(out.tokens))

    def _commit_model_call(self, a: Agent, w: Work) -> bool:
        """Logs the model call of `w` (its output joins the context); False when skipped."""
        turn, out = w.turn, w.out
        out_ids = [int(x) for x in out.tokens]
        new = [int(x) for x in turn.new_tokens]
        a.context.add_output(new, out_ids, np.asarray(out.logprobs), out.routing)
        a.model_calls += 1
        a.stats.model_calls += 1
        a.stats.tokens_in += len(new)
        a.stats.tokens_out += len(out_ids)
        self.tokens_out += len(out_ids)
        fields = dict(n_in_new=len(new), n_out=len(out_ids), segment=turn.segment,
                      turn=a.model_calls - 1, stop=out.stop.value)
        skipped = ("ended" if self.end_reason is not None
                   else "fired" if a.state is AgentState.FIRED else None)
        if not skipped and out.stop is EngineStop.POOL_FULL:
            # The engine's KV pool (at its ceiling, full of other contexts) had no room for the
            # prompt: nothing was sampled. A penalised (malformed) turn; `_finish_turn` stops
            # the agent, whose context can no longer grow, and its slot's pages come back.
            w.parsed = ParsedTurn("", (), POOL_REFUSED, False)
            fields["malformed"] = POOL_REFUSED
        elif not skipped and a.summary_turn:
            fields["summary"] = True
        elif not skipped:
            w.parsed = parse_turn(self.chat, out_ids, self.config.max_calls_per_turn)
            if w.parsed.error is not None:
                fields["malformed"] = w.parsed.error
            elif w.parsed.calls and self.clocks.clock(a.id) + model_call_seconds(
                    len(new), len(out_ids)) >= self.task.wall_clock_s:
                skipped, w.parsed = "wall_clock", None  # none of its calls can run
        if skipped:
            fields["skipped"] = skipped
        if self.config.log_text:
            fields["text"] = self.chat.tok.decode(out_ids)
        w.mc = self._emit(EventKind.MODEL_CALL, a.id, a.last_seq, **fields)
        if not skipped:
            self.now = max(self.now, w.done_s)
        self.scheduled.append(Scheduled(w.mc, w.start_s, w.done_s, self.now))
        a.mark_trace()  # last_seq is now `mc`: the output exists at the clock after the call
        if skipped:  # no effect: no loss (rl.types.trained_mask)
            a.context.row.flag_tail(len(out_ids), TokenFlag.SKIPPED)
        if skipped == "wall_clock":
            return True  # `_finish_turn` stops the agent (its clock is past the cap)
        if skipped:
            a.work = None
            return False
        if a.summary_turn and w.parsed is None:
            self._restart(a, out_ids, w.mc)
            return True
        a.turns += 1
        if w.parsed.error is not None:
            a.context.row.flag_tail(len(out_ids), TokenFlag.MALFORMED)
            a.stats.malformed_turns += 1
            a.pending.append(f"[error] malformed turn: {w.parsed.error}")
        elif not w.parsed.calls:
            a.pending.append("(no tool call)")
        else:
            w.calls = list(w.parsed.calls)
        return True

    def _commit_call(self, a: Agent, w: Work) -> None:
        """Runs the next tool call of `w` at its agent's clock (or refuses it: ended, clock)."""
        call = w.calls.pop(0)
        if self.end_reason is not None:
            a.pending.append(f"[{call.name} not run: the task has ended]")
            w.calls.clear()
            return
        if self.clocks.clock(a.id) >= self.task.wall_clock_s:
            a.pending.append(f"[{call.name} not run: wall clock]")
            w.calls.clear()
            return
        start = self.clocks.clock(a.id)
        self.now = max(self.now, start)
        w.failed |= not self._run_call(a, call, w.mc)
        seq = self._last_tool_call
        self.scheduled.append(Scheduled(seq, start, self.clocks.clock_at(seq), self.now))

    def _finish_turn(self, a: Agent, w: Work) -> None:
        """After the turn's last call: flags, notes, and the agent's next state."""
        if w.parsed is not None:  # an ordinary turn (not a summary)
            if w.failed:
                a.context.row.flag_tail(len(w.out.tokens), TokenFlag.TOOL_ERROR)
                a.stats.tool_error_turns += 1
            if w.out.stop is not EngineStop.STOP:
                a.pending.append(f"(turn cut at {len(w.out.tokens)} tokens)")
            a.plan_mode = False
        a.work = None
        if w.out.stop is EngineStop.POOL_FULL and a.state is AgentState.READY:
            self._stop(a, StopReason.CONTEXT_FULL)
            return
        self._after_turn(a)

    def _dispatch(self, a: Agent, call: Call) -> ToolResult:
        name = call.name
        spec = self.env_specs.get(name)
        if spec is None:
            org_tool = _ORG_TOOLS.get(name)
            if org_tool is None:
                return ToolResult(f"unknown tool {name!r}; yours: {', '.join(a.tools)}", True)
            spec = SPECS[org_tool]
        if name not in a.tools:
            return ToolResult(f"{name} is not one of your tools", True)
        if a.plan_mode and (name in self.env_specs or name in _PLAN_REFUSED):
            return ToolResult(f"plan mode: {name} is refused in your first turn", True)
        problem = spec.check_args(call.args)
        if problem is not None:
            return ToolResult(problem, True)
        try:
            if name in self.env_specs:
                return self._env_call(a, name, call.args)
            return HANDLERS[_ORG_TOOLS[name]](self, a.id, call.args)
        except ToolError as e:
            return ToolResult(str(e), True)

    def _env_call(self, a: Agent, name: str, args: dict) -> ToolResult:
        ctx = CallContext(agent=a.id, title=a.title, clock_s=self.clocks.clock(a.id),
                          tokens_out=self.tokens_out, workspace=self.workspace)
        out = self.session.call(name, dict(args), ctx)
        return ToolResult(out.text, out.error, out.duration_s, out.measured, tuple(out.rewards),
                          out.terminal)

    def _run_call(self, a: Agent, call: Call, mc: int) -> bool:
        result = self._dispatch(a, call)
        duration = round(float(result.duration_s), 6)
        if not math.isfinite(duration) or duration < 0:
            raise ValueError(f"tool {call.name!r} reported duration_s {result.duration_s!r}")
        for r in result.rewards:
            if not math.isfinite(float(r.value)):
                raise ValueError(f"tool {call.name!r} reported a reward of {r.value!r}")
        fields = dict(tool=call.name, duration_s=duration, error=result.error)
        if result.measured:
            fields["measured"] = True
        start = self.clocks.clock(a.id)
        if result.content_seq is not None:
            fields["content_seq"] = result.content_seq
            start = max(start, self.clocks.clock_at(result.content_seq))
        late = False
        if result.rewards:
            late = start + duration > self.task.wall_clock_s
            fields["rewards"] = [{"value": float(r.value), "label": r.label}
                                 for r in result.rewards]
            if late:
                fields["late"] = True
        text = self._cap(result.text, self.config.max_result_tokens, "result cut")
        if self.config.log_text:
            fields["args"] = call.args
            fields["result"] = text
        tc = self._emit(EventKind.TOOL_CALL, a.id, mc, **fields)
        self._last_tool_call = tc
        a.stats.tool_calls += 1
        if call.name in _ORG_TOOLS and _ORG_TOOLS[call.name] not in NOT_COORDINATION:
            a.stats.coordination_calls += 1
        if not late:
            self.rewards += [RewardEvent(a.id, float(r.value), tc, r.label)
                             for r in result.rewards]
        a.pending.append(result_line(tc, call.name, text, result.error))
        self.file_seq.update(dict.fromkeys(result.wrote, tc))
        if not result.error:
            for effect in result.effects:
                self._apply(tc, a, effect)
        if result.terminal and self.end_reason is None:
            self.end_reason, self._ending_seq = EndReason.ENV_TERMINAL, tc
        return not result.error

    def _cap(self, text: str, cap: int, note: str) -> str:
        ids = self.chat.tok.encode(text)
        if len(ids) <= cap:
            return text
        return self.chat.tok.decode(ids[:cap]) + f" ({note}: {len(ids)} tokens)"

    def _after_turn(self, a: Agent) -> None:
        if a.state is not AgentState.READY:
            return
        if self.clocks.clock(a.id) >= self.task.wall_clock_s:
            self._stop(a, StopReason.WALL_CLOCK)
        elif a.model_calls >= self.config.max_turns:
            self._stop(a, StopReason.MAX_TURNS)
        elif a.waiting:
            a.state = AgentState.PARKED
            pending = self.post.waking(a.id)
            if pending is not None:
                self._wake(a, pending)
        a.waiting = False

    def _restart(self, a: Agent, out_ids: list[int], mc: int) -> None:
        """Tier 2: the summary turn is done; rebuild the context around the pinned card."""
        ctx = a.context
        before = ctx.length
        summary = self.chat.split_output(out_ids).text.strip()
        a.card = self._card(a.id, a.title, a.role, a.brief, a.tools, pinned=True)
        ctx.restart(self.chat.system(a.card))
        a.summary_turn = False
        a.pending.insert(0, a.stash)  # the held observation, then whatever arrives next
        a.stash, a.restart_summary = None, summary
        self._emit(EventKind.COMPACTION, a.id, mc, tier=2, tokens_before=before,
                   tokens_after=ctx.length, segment=ctx.segment)

    # ----- effects of organisation tools (tools.py), applied after the tool_call is logged ---

    def _apply(self, seq: int, a: Agent, effect: Effect) -> None:
        """Applies one effect of `a`'s tool call `seq`."""
        match effect:
            case Send():
                self._send(seq, a, effect.message_id, effect.kind, effect.text,
                           channel=effect.channel, to=effect.to, target=effect.target)
            case Hire():
                self._hire(seq, a, effect.new_id, effect.title, effect.role, effect.tools)
            case Fire():
                self._fire(seq, a, effect.target)
            case Park():
                self._emit(EventKind.WAIT, a.id, seq)
                a.waiting = True
            case Finish():
                self.final_message = effect.text
                if self.end_reason is None:
                    self.end_reason, self._ending_seq = EndReason.FINAL_MESSAGE, seq
            case OpenChannel():
                self.post.open_channel(effect.key, effect.topic)
            case Subscribe():
                self.post.subs[a.id][effect.channel] = effect.mode
            case ArchiveWrite():
                self.archive[effect.key] = effect.text
                self.archive_seq[effect.key] = seq
            case PinReport():
                a.last_report = dict(effect.fields)
            case CountTraceRead():
                a.stats.trace_reads += 1
            case _:
                raise TypeError(f"not an organisation effect: {effect!r}")

    def _send(self, seq: int, a: Agent, mid: str, kind: MessageKind, text: str, *,
              channel: str | None = None, to: str | None = None, target: str | None = None):
        msg = Message(id=mid, kind=kind, sender=a.id, text=text, channel=channel,
                      send_seq=len(self.log), send_time=self.clocks.clock(a.id), target=target,
                      to=to)
        if kind in (MessageKind.POST, MessageKind.REACTION):
            deliveries = self.post.route(msg)
        else:
            deliveries = self.post.direct(msg, to)
        fields = dict(message_id=mid, message_kind=kind.value, channel=channel,
                      to=[r for r, _ in deliveries])
        if self.config.log_text:
            fields["text"] = text
        self._emit(EventKind.SEND, a.id, seq, **fields)
        a.stats.messages_sent += 1
        for recipient, d in deliveries:
            self.post.queue(recipient, d)
            r = self.agents[recipient]
            if r.state is AgentState.PARKED and d.wakes:
                self._wake(r, d)

    def _wake(self, a: Agent, d: Delivery) -> None:
        self._emit(EventKind.WAKE, a.id, d.message.send_seq, message_id=d.message.id)
        a.state = AgentState.READY
        a.wake_at = d.message.send_time  # the clock scheduler runs its boundary then

    def _hire(self, seq: int, hirer: Agent, new_id: str, title: str, role: str,
              granted: tuple[str, ...]) -> None:
        self.hires += 1
        brief = self.session.brief(new_id, len(self.agents), title, role)
        fields = dict(new_agent=new_id, title=title)
        if self.config.log_text:
            fields.update(role=role, tools=list(granted), brief=brief)
        h = self._emit(EventKind.HIRE, hirer.id, seq, **fields)
        a = self._add_agent(new_id, title, role, self._specialist_tools(granted), h, brief)
        a.pending.append(start_text(ceo=False, budget=0, plan_mode=False, hirer=hirer.id))

    def _fire(self, seq: int, firer: Agent, target: str) -> None:
        t = self.agents[target]
        self._emit(EventKind.FIRE, firer.id, seq, target=target)
        t.state = AgentState.FIRED
        if t.work is not None:  # its turn in flight ends here
            if t.work.mc is None:
                self._commit_model_call(t, t.work)  # logged as skipped: fired
            else:  # calls not yet run never will be; those that ran keep their flags
                t.work.calls.clear()
                self._finish_turn(t, t.work)
        self.post.remove_agent(target)
        self.retired.append(self.key(t))

    def _keep_improving(self) -> bool:
        """S8 (`Task.submit_after_tokens`): waiting with nothing in flight before the
        organisation has written the output tokens it must match is not the end of the
        episode: every waiting agent is woken with the refusal, so S8 runs to matched tokens
        (SPEC §5). The turn cap, the clock and the context still end it. False: no gate."""
        needed = self.task.submit_after_tokens
        if not needed or self.tokens_out >= needed:
            return False
        for a in self.agents.values():
            if a.state is AgentState.PARKED:
                self._emit(EventKind.WAKE, a.id, a.last_seq, reason="keep_improving")
                a.state = AgentState.READY  # its clock is unchanged: waiting is free
                a.pending.append(keep_improving(self.tokens_out, needed))
        return True

    def _stop(self, a: Agent, reason: StopReason) -> None:
        a.state = AgentState.STOPPED
        self._emit(EventKind.STOP, a.id, a.last_seq, reason=reason.value)
        self.post.remove_agent(a.id)
        self.retired.append(self.key(a))
        if reason is StopReason.WALL_CLOCK:
            self._clock_stops += 1

    # ----- the end -----

    def end_tick(self) -> None:
        """Ends the episode if it is over (see the module docstring)."""
        if self.done:
            return
        if self.end_reason is None:
            if any(a.state is AgentState.READY for a in self.agents.values()):
                return
            if self._clock_stops:
                self.end_reason = EndReason.WALL_CLOCK
            elif any(a.state is AgentState.PARKED for a in self.agents.values()):
                if self._keep_improving():
                    return
                self.end_reason = EndReason.DEADLOCK
            else:
                self.end_reason = EndReason.STOPPED
        self._flush_work()
        latency = max(self.clocks.clocks.values())
        final = self.session.on_end(EndContext(reason=self.end_reason,
                                               final_message=self.final_message,
                                               latency_s=latency, workspace=self.workspace))
        end_seq = len(self.log)
        self.rewards += [RewardEvent("ceo", float(r.value), end_seq, r.label)
                         for r in final.rewards]
        fields = dict(reason=self.end_reason.value,
                      rewards=[{"value": float(r.value), "label": r.label}
                               for r in final.rewards])
        if final.wealth_ratio is not None:
            fields["wealth_ratio"] = float(final.wealth_ratio)
        if final.metrics:  # the log is the episode's whole record (avalon/analysis/ reads it)
            fields["env_metrics"] = {k: float(v) for k, v in final.metrics.items()}
        if final.record:
            fields["env_record"] = dict(final.record)
        cause = self._ending_seq if self._ending_seq is not None else end_seq - 1
        self._emit(EventKind.END, "ceo", cause, **fields)
        for a in self.agents.values():
            if a.active:
                self.retired.append(self.key(a))
        self.final, self.done = final, True

    def _flush_work(self) -> None:
        """At the end (clock scheduler): turns still in flight are logged, in commit order;
        model calls as skipped ("ended"), calls not yet run as not run."""
        working = [a for a in self.agents.values() if a.work is not None]
        working.sort(key=lambda a: (a.work.done_s if a.work.mc is None
                                    else self.clocks.clock(a.id), a.index))
        for a in working:
            w = a.work
            if w.mc is None:
                self._commit_model_call(a, w)
            else:
                while w.calls:
                    self._commit_call(a, w)
                self._finish_turn(a, w)

    def take_retired(self) -> list[AgentKey]:
        out, self.retired = self.retired, []
        return out
