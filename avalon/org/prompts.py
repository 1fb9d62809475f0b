"""The text the simulator shows agents: role cards, observations, results, deliveries.

Kept terse on purpose: toy presets spell unknown words character by character, and every
token is paid for on the derived clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from avalon.org.channels import Delivery, MessageKind, Subscription
from avalon.org.config import PromptStyle
from avalon.org.env import ToolSpec

CEO_ROLE = "You lead: plan, hire, co-ordinate, then send the final message."
CALL_FORMAT = ('Act by calls after your text: <|call|>name {"arg":value}; end your turn with '
               "<|end|>.")
# Text calls (a pretrained vocabulary without a call token; avalon/tokenizer/chat.py).
JSON_CALL_FORMAT = ("To act, write tool calls after your text, one per line: <tool_call>"
                    '{"name": "tool_name", "arguments": {"arg": value}}</tool_call>')


def role_card(*, agent: str, title: str, role: str, task: str | None, brief: str,
              roster: Sequence[tuple[str, str]], subscriptions: Sequence[tuple[str, str]],
              budget_left: int | None, commitments: str, tools: Sequence[ToolSpec],
              style: PromptStyle, json_calls: bool = False) -> str:
    """The system text of an agent (also the pinned part after a compaction)."""
    lines = [f"You are {agent}, {title}. {role}".rstrip()]
    if task is not None:
        lines.append(f"Task: {task}")
    if brief:
        lines.append(f"Brief: {brief}")
    lines.append("Team: " + "; ".join(f"{a} {t}" for a, t in roster))
    if subscriptions:
        lines.append("Channels: " + "; ".join(f"{c} {m}" for c, m in subscriptions))
    if budget_left is not None:
        lines.append(f"Hires left: {budget_left}")
    if commitments:
        lines.append(f"Commitments: {commitments}")
    if style is PromptStyle.MINIMAL:
        lines.append("Tools: " + " ".join(t.name for t in tools))
    elif style is PromptStyle.COMPACT:
        lines.append("Tools: " + " ".join(t.signature() for t in tools))
    else:
        lines.append("Tools:")
        lines += [f"{t.signature()} - {t.description}" for t in tools]
        lines.append(JSON_CALL_FORMAT if json_calls else CALL_FORMAT)
    return "\n".join(lines)


def start_text(*, ceo: bool, budget: int, plan_mode: bool, hirer: str | None) -> str:
    if not ceo:
        return f"Start. Hired by {hirer}."
    text = f"Start. Budget: {budget} hires."
    return text + (" Plan mode: this turn plans; no task tools yet." if plan_mode else "")


def result_line(seq: int, tool: str, text: str, error: bool) -> str:
    """`[#12 post] sent m3` or `[#12 post error] no channel #x`: the seq is citable evidence."""
    return f"[#{seq} {tool}{' error' if error else ''}] {text}"


def message_text(d: Delivery, snippet_chars: int) -> str:
    """A delivered message as the recipient reads it."""
    m = d.message
    if m.kind is MessageKind.REACTION:
        return f"{m.sender} reacted {m.text} to {m.target}"
    if m.kind is MessageKind.DM:
        return f"dm {m.sender} {m.id}: {m.text}"
    if m.kind is MessageKind.REPORT:
        return f"report {m.sender} {m.id}: {m.text}"
    body = m.text
    if d.mode is Subscription.LIGHT and len(body) > snippet_chars:
        body = body[:snippet_chars] + f"... (read_message {m.id})"
    return f"{m.channel} {m.sender} {m.id}: {body}"


def keep_improving(written: int, needed: int) -> str:
    """The S8 baseline's refusal of an early submission (SPEC §5)."""
    return (f"not accepted yet: keep improving your work, then submit again ({written} of "
            f"{needed} output tokens written)")


def summary_request(cap: int) -> str:
    return f"Context full: summarise your work in at most {cap} tokens; it replaces your context."


def summary_restart(summary: str, obs: str) -> str:
    return f"Summary of your work so far: {summary}\n{obs}".rstrip()


def stub(n_tokens: int) -> str:
    return f"(elided {n_tokens} tokens)"
