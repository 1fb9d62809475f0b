"""One agent's context: live segments, the uncompacted trace, and its training rows.

The live context is what the policy conditions on: a system segment, then alternating prompt
segments (`<|obs|>...<|end|><|agent|>`) and the agent's outputs. `synced` counts the tokens the
policy has already consumed, so a turn sends only `ids[synced:]` (its n_in_new).

Compaction changes earlier tokens, so it ends a training row: a row is one policy-slot lifetime
(every token the slot was given or sampled, in order), which is exactly what the sampler's
log-probs and routing were computed on. After a reset the whole new context is new to the
policy (`synced = 0`) and tokens carried over are prompts of the new row (no loss).

The trace is append-only and never elided: every prompt and output the agent received or wrote,
token for token (`read_trace`). The context a compaction rebuilds (pinned card + summary) is not
added to it, only the observation that arrived with it.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from avalon.rl.types import TokenFlag, TrajectoryRow


class SegKind(enum.Enum):
    SYSTEM = "system"
    PROMPT = "prompt"  # an observation and the `<|agent|>` header
    OUTPUT = "output"  # sampled by the policy


@dataclasses.dataclass
class Segment:
    kind: SegKind
    ids: list[int]
    elided: bool = False


class RowBuilder:
    """Accumulates one training row, turn by turn."""

    def __init__(self):
        self.tokens: list[int] = []
        self.mask: list[bool] = []
        self.logp: list[float] = []
        self.flags: list[int] = []
        self.routing: list[np.ndarray] | None = []

    def add_turn(self, new: list[int], out: list[int], logp: np.ndarray,
                 routing: np.ndarray | None) -> None:
        if len(logp) != len(out):
            raise ValueError(f"policy returned {len(logp)} log-probs for {len(out)} tokens")
        self.tokens += new + out
        self.mask += [False] * len(new) + [True] * len(out)
        self.logp += [0.0] * len(new) + [float(x) for x in logp]
        self.flags += [int(TokenFlag.NORMAL)] * (len(new) + len(out))
        if routing is None or self.routing is None:
            self.routing = None
        elif len(routing) != len(new) + len(out):
            raise ValueError(f"policy routing covers {len(routing)} positions, the turn has "
                             f"{len(new)} new + {len(out)} sampled")
        else:
            self.routing.append(np.asarray(routing))

    def flag_tail(self, n: int, flag: TokenFlag) -> None:
        """Marks the last `n` tokens (the latest output) with `flag`."""
        for i in range(len(self.flags) - n, len(self.flags)):
            self.flags[i] = int(flag)

    def build(self, agent: str, role: str, segment: int) -> TrajectoryRow | None:
        if not self.tokens:
            return None
        routing = None
        if self.routing:
            routing = np.concatenate(self.routing, axis=0)
        return TrajectoryRow(tokens=np.asarray(self.tokens, np.int32),
                             loss_mask=np.asarray(self.mask, bool),
                             sampler_logp=np.asarray(self.logp, np.float32), routing=routing,
                             flags=np.asarray(self.flags, np.int8), agent=agent, role=role,
                             segment=segment)


class AgentContext:
    """Live segments + trace + the current row of one agent."""

    def __init__(self, system_ids: list[int], agent: str, role: str):
        self.agent, self.role = agent, role
        self.segments = [Segment(SegKind.SYSTEM, list(system_ids))]
        self.trace: list[int] = list(system_ids)
        self.synced = 0
        self.segment = 0
        self.row = RowBuilder()
        self.rows: list[TrajectoryRow] = []

    @property
    def length(self) -> int:
        return sum(len(s.ids) for s in self.segments)

    def ids(self) -> list[int]:
        return [i for s in self.segments for i in s.ids]

    def unsynced(self) -> list[int]:
        """The tokens after the first `synced` (walks segments, not tokens)."""
        out: list[int] = []
        pos = 0
        for seg in self.segments:
            end = pos + len(seg.ids)
            if end > self.synced:
                out += seg.ids[max(0, self.synced - pos):]
            pos = end
        return out

    def add_prompt(self, ids: list[int], trace_ids: list[int] | None = None) -> None:
        self.segments.append(Segment(SegKind.PROMPT, list(ids)))
        self.trace += ids if trace_ids is None else trace_ids

    def add_output(self, new: list[int], out: list[int], logp: np.ndarray,
                   routing: np.ndarray | None) -> None:
        """Records a turn: `new` were the prompt tokens sent, `out` the sampled ones."""
        self.row.add_turn(new, out, logp, routing)
        self.segments.append(Segment(SegKind.OUTPUT, list(out)))
        self.trace += out
        self.synced = self.length

    def elision(self, keep_recent: int, stub) -> list[tuple[Segment, list[int]]]:
        """Tier 1's plan: (prompt segment, its stub) for every prompt older than the latest
        `keep_recent` that a stub (`stub(n_tokens)` -> ids) would shorten."""
        prompts = [s for s in self.segments if s.kind is SegKind.PROMPT and not s.elided]
        old = prompts[:len(prompts) - keep_recent] if keep_recent else prompts
        plan = [(seg, stub(len(seg.ids))) for seg in old]
        return [(seg, short) for seg, short in plan if len(short) < len(seg.ids)]

    def elide(self, plan: list[tuple[Segment, list[int]]]) -> None:
        """Tier 1: applies an `elision` plan; the row ends and the whole context is new."""
        for seg, short in plan:
            seg.ids, seg.elided = short, True
        if plan:
            self._new_row()

    def restart(self, system_ids: list[int]) -> None:
        """Tier 2: the context becomes a new system segment only (prompts follow)."""
        self.segments = [Segment(SegKind.SYSTEM, list(system_ids))]
        self._new_row()

    def _new_row(self) -> None:
        self.close_row()
        self.segment += 1
        self.synced = 0

    def close_row(self) -> None:
        row = self.row.build(self.agent, self.role, self.segment)
        if row is not None:
            self.rows.append(row)
        self.row = RowBuilder()
