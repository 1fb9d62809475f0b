"""Channels, subscriptions and the delivery rules.

Who gets a message, and how:
- a channel post reaches every other active agent by its subscription to that channel: `full`
  (the post verbatim; wakes a waiting agent), `light` (a snippet and a pointer, `read_message`;
  does not wake), `muted` (nothing). An @-mention of an agent id (`@a2`) delivers the post in
  full and wakes, whatever the subscription;
- a direct message reaches its one recipient in full and wakes it;
- a report (`report_to_ceo`) reaches the CEO in full and wakes it;
- a reaction reaches the author of the message reacted to in full and does not wake it (an
  acknowledgement must not restart an "ack" loop).
Deliveries wait in the recipient's inbox and are drained at its next turn boundary, in
(send time on the derived clock, send seq) order. A fired agent's inbox is dropped. Agents
hired later do not receive earlier posts (they can `read_channel`). New agents and new channels
start at the organisation's default subscription.
"""

from __future__ import annotations

import dataclasses
import enum
import re

from avalon.org.env import ToolError

CHANNEL_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
MENTION = re.compile(r"@([a-z0-9_]+)")


class Subscription(enum.Enum):
    FULL = "full"
    LIGHT = "light"
    MUTED = "muted"


class MessageKind(enum.Enum):
    POST = "post"
    DM = "dm"
    REACTION = "reaction"
    REPORT = "report"


@dataclasses.dataclass(frozen=True)
class Message:
    id: str  # "m1", "m2", ... per rollout
    kind: MessageKind
    sender: str
    text: str
    channel: str | None  # "#plan" for posts
    send_seq: int  # seq of the `send` event
    send_time: float  # the sender's derived clock at the send
    target: str | None = None  # the message a reaction answers
    to: str | None = None  # the recipient of a DM or report


@dataclasses.dataclass(frozen=True)
class Delivery:
    message: Message
    mode: Subscription  # FULL or LIGHT
    wakes: bool


def channel_key(name: str) -> str:
    """'plan' or '#plan' -> '#plan'; a ToolError for names that are not [a-z0-9][a-z0-9_-]*."""
    if not isinstance(name, str):
        raise ToolError("channel must be a string")
    bare = name[1:] if name.startswith("#") else name
    if not CHANNEL_NAME.fullmatch(bare):
        raise ToolError(f"channel name {name!r}: use lowercase letters, digits, '-' or '_' "
                        "(at most 32)")
    return "#" + bare


class PostOffice:
    """Channels, subscriptions, messages and inboxes of one organisation."""

    def __init__(self, default: Subscription):
        self.default = default
        self.channels: dict[str, list[str]] = {}  # "#plan" -> message ids in order
        self.topics: dict[str, str] = {}
        self.subs: dict[str, dict[str, Subscription]] = {}  # agent -> channel -> mode
        self.messages: dict[str, Message] = {}
        self._inbox: dict[str, list[Delivery]] = {}

    def add_agent(self, agent: str) -> None:
        self.subs[agent] = {c: self.default for c in self.channels}
        self._inbox[agent] = []

    def remove_agent(self, agent: str) -> None:
        self.subs.pop(agent, None)
        self._inbox.pop(agent, None)

    def new_channel_key(self, name: str) -> str:
        """The key a new channel `name` would have; a ToolError if it is bad or taken."""
        key = channel_key(name)
        if key in self.channels:
            raise ToolError(f"channel {key} already exists")
        return key

    def open_channel(self, key: str, topic: str) -> None:
        """Opens a channel checked by `new_channel_key`: every agent at the default mode."""
        self.channels[key] = []
        self.topics[key] = topic
        for agent_subs in self.subs.values():
            agent_subs[key] = self.default

    def create_channel(self, name: str, topic: str) -> str:
        key = self.new_channel_key(name)
        self.open_channel(key, topic)
        return key

    def existing(self, name: str) -> str:
        key = channel_key(name)
        if key not in self.channels:
            known = ", ".join(self.channels) or "none yet"
            raise ToolError(f"no channel {key} (channels: {known})")
        return key

    def subscription(self, channel: str, mode: str) -> tuple[str, Subscription]:
        """(channel key, mode) of a subscribe call; a ToolError for an unknown channel or mode.
        """
        key = self.existing(channel)
        try:
            sub = Subscription(mode)
        except ValueError:
            raise ToolError(f"mode must be full, light or muted, got {mode!r}") from None
        return key, sub

    def next_id(self) -> str:
        return f"m{len(self.messages) + 1}"

    def route(self, msg: Message) -> list[tuple[str, Delivery]]:
        """Files `msg` and returns its deliveries (recipient, delivery) in agent order."""
        if msg.id in self.messages:
            raise ValueError(f"message id {msg.id!r} used twice")
        self.messages[msg.id] = msg
        if msg.kind is MessageKind.POST:
            self.channels[msg.channel].append(msg.id)
            mentioned = set(MENTION.findall(msg.text))
            out = []
            for agent, agent_subs in self.subs.items():
                if agent == msg.sender:
                    continue
                if agent in mentioned:
                    out.append((agent, Delivery(msg, Subscription.FULL, True)))
                elif agent_subs[msg.channel] is Subscription.FULL:
                    out.append((agent, Delivery(msg, Subscription.FULL, True)))
                elif agent_subs[msg.channel] is Subscription.LIGHT:
                    out.append((agent, Delivery(msg, Subscription.LIGHT, False)))
            return out
        if msg.kind is MessageKind.REACTION:
            author = self.messages[msg.target].sender
            if author == msg.sender or author not in self.subs:
                return []
            return [(author, Delivery(msg, Subscription.FULL, False))]
        raise ValueError(f"route() handles posts and reactions; use direct() for {msg.kind}")

    def direct(self, msg: Message, to: str) -> list[tuple[str, Delivery]]:
        """Files a DM or report to one active agent and returns its delivery."""
        self.messages[msg.id] = msg
        if to not in self.subs:
            return []
        return [(to, Delivery(msg, Subscription.FULL, True))]

    def queue(self, agent: str, delivery: Delivery) -> None:
        self._inbox[agent].append(delivery)

    def waking(self, agent: str) -> Delivery | None:
        """The earliest pending delivery that wakes `agent`, if any."""
        pending = [d for d in self._inbox.get(agent, ()) if d.wakes]
        return min(pending, key=_order) if pending else None

    def drain(self, agent: str) -> list[Delivery]:
        """Empties `agent`'s inbox, in (send time, send seq) order."""
        out = sorted(self._inbox.get(agent, ()), key=_order)
        self._inbox[agent] = []
        return out


def _order(d: Delivery) -> tuple[float, int]:
    return d.message.send_time, d.message.send_seq
