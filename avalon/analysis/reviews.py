"""Review quality against ground truth: each review's verdict checked against the true defect
of the build it names (SPEC §5 counts reviews; an environment that knows where the defects are
can tell a review that finds a bug from one that says "looks good").

Ground truth comes from the rollout's `end` event, `env_record` (`avalon/org/events.py`), which
an environment with defects writes: `builds`, every build in call order as `{item, code,
builder, defective}`, and `shipped`, what was shipped in the same form. Collective
verification does (`avalon/envs/verification/env.py`); rollouts without the record have no
ground truth and count in none of these numbers.

- A *verdict* is a review message (a message the judge labelled approve or reject under
  `judges.REVIEW`: `metrics.messages`) matched to a build it names. An item id followed by a
  number names that item's build with that code (`p2 47 ok`), and no build if the item never
  had that code (a made-up code); an item id not followed by a number (`p2 defect`) names the
  item's newest build before the message (the build the sender could know of). A message
  that names several builds gives a verdict on each; one that names none is *unmatched* and
  counts only there.
- A verdict *flags* a build when it rejects it. Flagged and defective: a true flag.
- *Rubber stamp*: a verdict that approves a defective build.
- *Shipped defects*: shipped builds that were defective.
- *Reviewed ships*: shipped builds that a successful `review` call by someone other than the
  build's builder checked before the ship (the calls' arguments name item and code; a log
  without them, text logging off, has no count).

Build times come from the log's successful `build` tool calls (their `args.id` and the code in
their `result`); with text logging off, a build's time is unknown and an item-only verdict
names the item's newest build overall.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from avalon.org.events import EventKind

_TC, _END = EventKind.TOOL_CALL.value, EventKind.END.value


@dataclasses.dataclass(frozen=True)
class Build:
    item: str
    code: str
    builder: str
    defective: bool
    seq: int  # the build call's event seq (-1: unknown)


@dataclasses.dataclass(frozen=True)
class ReviewTally:
    """One rollout's verdicts against the truth (zeros without ground truth)."""

    ground_truth: bool  # the log carries the builds' truth
    verdicts: int  # matched verdicts (a message naming two builds gives two)
    unmatched: int  # review messages that named no build
    flags: int  # verdicts that reject
    true_flags: int  # ... of a defective build
    on_defective: int  # verdicts on defective builds
    rubber_stamps: int  # verdicts that approve a defective build
    approvals: int  # verdicts that approve
    shipped: int
    shipped_defects: int
    shipped_reviewed: int  # shipped builds a teammate's review call checked first
    calls_logged: bool  # the log holds the calls' arguments (shipped_reviewed is known)

    @staticmethod
    def none() -> ReviewTally:
        return ReviewTally(False, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, False)


def ground_truth(events: Sequence[Mapping]) -> tuple[list[Build], list[dict]] | None:
    """(builds with their call seqs, shipped) from the end event's record, or None."""
    end = events[-1] if events and events[-1]["kind"] == _END else None
    record = (end or {}).get("env_record") or {}
    if "builds" not in record:
        return None
    seq_of: dict[tuple[str, str], int] = {}
    for e in events:
        if e["kind"] == _TC and e["tool"] == "build" and not e["error"] and "result" in e:
            item = str((e.get("args") or {}).get("id", "")).strip()
            for code in re.findall(r"\b\d+\b", str(e["result"])):
                seq_of.setdefault((item, code), e["seq"])
    builds = [Build(str(b["item"]), str(b["code"]), str(b["builder"]), bool(b["defective"]),
                    seq_of.get((str(b["item"]), str(b["code"])), -1))
              for b in record["builds"]]
    return builds, list(record.get("shipped", ()))


def named_builds(text: str, seq: int, builds: Sequence[Build]) -> list[Build]:
    """The builds a message sent at event `seq` names (see the module docstring)."""
    words = re.findall(r"[A-Za-z0-9_]+", text)
    items = {b.item for b in builds}
    out: list[Build] = []
    for i, word in enumerate(words):
        if word not in items:
            continue
        mine = [b for b in builds if b.item == word]
        code = words[i + 1] if i + 1 < len(words) and words[i + 1].isdigit() else None
        if code is not None:  # a code the item never had names no build
            named = next((b for b in mine if b.code == code), None)
        else:
            named = max((b for b in mine if b.seq < seq), key=lambda b: b.seq, default=None)
        if named is not None and named not in out:
            out.append(named)
    return out


def _call_key(e: Mapping) -> tuple[str, str]:
    args = e.get("args") or {}
    return str(args.get("id", "")).strip(), str(args.get("result", "")).strip()


def reviewed_ships(events: Sequence[Mapping], builds: Sequence[Build]) -> int | None:
    """Successful `ship` calls whose build a successful `review` call by another agent than
    its builder checked earlier in the log; None when the calls' arguments were not logged."""
    calls = [e for e in events if e["kind"] == _TC and e["tool"] in ("review", "ship")
             and not e["error"]]
    if any("args" not in e for e in calls):
        return None
    builder = {(b.item, b.code): b.builder for b in builds}
    reviewed: set[tuple[str, str]] = set()
    n = 0
    for e in calls:
        key = _call_key(e)
        if e["tool"] == "review" and builder.get(key) not in (None, e["agent"]):
            reviewed.add(key)
        elif e["tool"] == "ship":
            n += key in reviewed
    return n


def tally(events: Sequence[Mapping], review_labels: Mapping[int, str]) -> ReviewTally:
    """The rollout's verdicts against the truth; `review_labels`: send seq -> REVIEW label."""
    truth = ground_truth(events)
    if truth is None:
        return ReviewTally.none()
    builds, shipped = truth
    by_seq = {e["seq"]: e for e in events}
    verdicts = unmatched = flags = true_flags = on_defective = stamps = approvals = 0
    for seq, label in review_labels.items():
        if label not in ("approve", "reject"):
            continue
        named = named_builds(str(by_seq[seq].get("text", "")), seq, builds)
        if not named:
            unmatched += 1
        for b in named:
            verdicts += 1
            on_defective += b.defective
            if label == "reject":
                flags += 1
                true_flags += b.defective
            else:
                approvals += 1
                stamps += b.defective
    checked = reviewed_ships(events, builds)
    return ReviewTally(True, verdicts, unmatched, flags, true_flags, on_defective, stamps,
                       approvals, len(shipped), sum(bool(s["defective"]) for s in shipped),
                       checked or 0, checked is not None)
