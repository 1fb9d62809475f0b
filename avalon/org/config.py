"""The organisation's configuration: one frozen dataclass, every number of SPEC §1 a field."""

from __future__ import annotations

import dataclasses
import enum

from avalon.org.channels import Subscription
from avalon.org.latency import MIN_MODEL_CALL_S
from avalon.org.workspace import WorkspaceLimits
from avalon.validation import FieldChecks

REAL_WINDOW = 131072
REAL_SUMMARY_CAP = 12000


class PromptStyle(enum.Enum):
    """How much of the tool list a system prompt spells out."""

    FULL = "full"  # signatures, descriptions and the call-format reminder
    COMPACT = "compact"  # signatures only (toy presets)
    MINIMAL = "minimal"  # tool names only (the tiny test model's 256-token window)


@dataclasses.dataclass(frozen=True)
class Permissions:
    """Who may use the organisation-shaping tools (switchable for ablations)."""

    specialists_hire: bool = False
    specialists_fire: bool = False
    specialists_create_channels: bool = False
    read_traces: bool = True  # every agent may read every teammate's trace
    # False: nobody gets a tool that carries text or files from one agent to another
    # (`tools.TALK_TOOLS`: channels, messages, reports, traces, archive, workspace), so agents
    # meet only in the environment's tools (a game as defined, without cheap talk). The CEO
    # still hires (its role texts are its only words to a hire) and sends the final message.
    talk: bool = True


@dataclasses.dataclass(frozen=True)
class OrgConfig:
    window: int = REAL_WINDOW  # tokens per agent context
    compaction_ratio: float = 0.875  # compaction triggers at window * ratio (114,688)
    elide_target_ratio: float = 0.75  # tier 1 suffices if it brings the context under this
    keep_recent_obs: int = 2  # tier 1 keeps this many latest observations whole
    summary_cap: int = REAL_SUMMARY_CAP  # tokens of the tier-2 summary turn
    max_new_tokens: int = 4096  # per ordinary turn
    max_turns: int = 256  # per agent; then it is stopped (a logged `stop`)
    # Clock-ordered scheduling (avalon/org/schedule.py): the ready agents whose clocks lie within
    # this many seconds of the earliest ready clock act together (one policy batch). The
    # default, the shortest possible model call, lets no effect precede a batch-mate's turn
    # boundary; inf is the old lock-step tick (every ready agent, listing order), for comparison
    # (avalon/org/lockstep.py).
    schedule_horizon_s: float = MIN_MODEL_CALL_S
    max_calls_per_turn: int = 8
    max_result_tokens: int = 8192  # a longer tool result is cut (and says so)
    max_obs_tokens: int = 16384  # a longer observation (results + deliveries) is cut
    trace_read_tokens: int = 16384  # tokens of a teammate's trace per read_trace call
    snippet_chars: int = 80  # of a `light` delivery
    prompt_style: PromptStyle = PromptStyle.FULL
    plan_mode: bool = True  # the CEO's first turn may only plan (see tools.py)
    default_subscription: Subscription = Subscription.FULL
    specialists_see_task: bool = True  # hires read the task prompt in their role card
    permissions: Permissions = Permissions()
    workspace: WorkspaceLimits = WorkspaceLimits()
    log_text: bool = True  # model outputs, tool args/results and message text in the log
    # Tool calls spelt in text, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
    # instead of after a call token: what a pretrained model without such a token can write
    # zero-shot (avalon/tokenizer/chat.py). Needs a Hugging Face tokenizer with a chat template.
    text_tool_calls: bool = False

    def __post_init__(self):
        check = FieldChecks("OrgConfig")
        positive = ("window", "summary_cap", "max_new_tokens", "max_turns", "max_calls_per_turn",
                    "max_result_tokens", "max_obs_tokens", "trace_read_tokens", "snippet_chars")
        for name in positive:
            if getattr(self, name) <= 0:
                check.fail(name, getattr(self, name), "must be > 0")
        if not 0 < self.elide_target_ratio <= self.compaction_ratio < 1:
            check.fail_together({"elide_target_ratio": self.elide_target_ratio,
                                 "compaction_ratio": self.compaction_ratio},
                                "need 0 < elide_target_ratio <= compaction_ratio < 1")
        if not self.schedule_horizon_s >= 0:
            check.fail("schedule_horizon_s", self.schedule_horizon_s,
                       "must be >= 0 (inf for lock-step)")
        if self.keep_recent_obs < 0:
            check.fail("keep_recent_obs", self.keep_recent_obs, "must be >= 0")
        if self.trigger_tokens + self.max_new_tokens + self.summary_cap > self.window:
            check.fail_together(
                {"window": self.window, "compaction_ratio": self.compaction_ratio,
                 "max_new_tokens": self.max_new_tokens, "summary_cap": self.summary_cap},
                f"the compaction trigger ({self.trigger_tokens} tokens) + max_new_tokens + "
                "summary_cap exceed the window (the organisation also checks the summary "
                "request fits)")

    @property
    def trigger_tokens(self) -> int:
        """Context length at which compaction starts (114,688 for the real window)."""
        return int(self.window * self.compaction_ratio)

    @classmethod
    def scaled(cls, window: int, **overrides) -> OrgConfig:
        """A config for a window: limits scale with it.

        From the real window (131,072) up, the real limits in proportion: the report's summary
        cap of 12,000 tokens, 4,096-token turns, and so on (`scaled(131072)` is the default
        config). Below it, toy sizes: there the fixed summary request is a larger share of the
        12.5% headroom, so the summary cap is window/32 (not the real 12000/131072) and a turn
        window/16.
        """
        if window >= REAL_WINDOW:
            real = cls()
            fields = {f: getattr(real, f) * window // REAL_WINDOW for f in (
                "summary_cap", "max_new_tokens", "max_result_tokens", "max_obs_tokens",
                "trace_read_tokens")}
            fields["window"] = window
        else:
            fields = dict(window=window, summary_cap=max(8, window // 32),
                          max_new_tokens=max(8, window // 16),
                          max_result_tokens=max(16, window // 16),
                          max_obs_tokens=max(32, window // 8),
                          trace_read_tokens=max(16, window // 16))
        fields.update(overrides)
        return cls(**fields)
