"""The lock-step tick: the organisation's scheduler before the clock scheduler, kept for
comparison (`experiments/bench/org_throughput.py` measures the clock scheduler against it) and
for tests that need what only it produces (content newer than its reader, turns applied in
listing order whatever the clock says). `OrgConfig.schedule_horizon_s = inf` selects it
(`RolloutDriver` builds a `LockStepOrganisation` then).

Each tick every READY agent gets a turn, in agent order (CEO, then hire order), and
`apply` takes the outputs agent by agent in that order: each output's model call and then all
its calls at once, before the next agent's. No turn is ever in flight between ticks, so an
agent's clock at a boundary is its replayed clock, and commits are not in clock order
(`clock_order = False` for `schedule.verify_schedule`). Turn building, tool calls, effects,
compaction, limits and the end are the organisation's own (`organisation.py`).
"""

from __future__ import annotations

from avalon.org.agents import Agent, AgentState
from avalon.org.organisation import Organisation
from avalon.org.policy import Turn, TurnOutput
from avalon.org.schedule import Scheduled, Work


class LockStepOrganisation(Organisation):
    """An `Organisation` whose ticks are lock-step (see the module docstring)."""

    clock_order = False

    def begin_tick(self) -> list[Turn]:
        """A turn for every READY agent, in agent order; [] when none is left."""
        if self.done or self.end_reason is not None:
            return []
        turns = [self._begin_turn(a) for a in list(self.agents.values())
                 if a.state is AgentState.READY]
        return [t for t in turns if t is not None]

    def apply(self, turns: list[Turn], outputs: list[TurnOutput]) -> None:
        """Applies each output at once, agent by agent, its calls and all."""
        for turn, out in self._outputs_of(turns, outputs):
            a = self.agents[turn.key.agent]
            w = a.work = Work(turn, start_s=self.clocks.clock(a.id))
            self._set_output(w, out)
            if self._commit_model_call(a, w):
                while w.calls:
                    self._commit_call(a, w)
                self._finish_turn(a, w)

    def _commit_model_call(self, a: Agent, w: Work) -> bool:
        # The lock-step tick charges no boundary time: the scheduler's record of a model call
        # is the replay's clock before and after it.
        start, n = self.clocks.clock(a.id), len(self.scheduled)
        committed = super()._commit_model_call(a, w)
        s = self.scheduled[n]
        self.scheduled[n] = Scheduled(s.seq, start, self.clocks.clock_at(s.seq), s.at_s)
        return committed
