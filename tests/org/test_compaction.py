"""Two-tier compaction: stubs, the summary turn as a training row, pinned org state, and
read_trace returning the uncompacted context afterwards."""

import re

import numpy as np
import pytest

from avalon.org import GroupSpec, OrgConfig, PromptStyle, RolloutDriver, RolloutSpec
from avalon.org.policy import Playbook, ScriptedPolicy
from avalon.rl.types import TokenFlag
from tests.org.helpers import CHAT, Recorder, call, events_of, step
from tests.org.toyenv import PartsEnv

NOTE = "N" * 200  # an archive note: each read returns it (an elidable tool result)
SHORT = "short note"
THINK = "t" * 150  # free text the specialist writes in phase 2 (not elidable)
N_READS, N_THINKS = 4, 10
PAGE = 400
HEADER = re.compile(r"trace a1 tokens (\d+)-(\d+) of (\d+):")


class TraceReader:
    """A CEO script that, once a1 reports, reads a1's trace page by page, then finishes."""

    def __init__(self, playbook):
        self.playbook = playbook

    def __call__(self, view):
        if view.summary or view.key.agent != "ceo" or view.turn < 2:
            return self.playbook(view)
        m = HEADER.search(view.obs)
        if m is None:
            return step(call("read_trace", agent="a1"))
        if int(m.group(2)) < int(m.group(3)):
            return step(call("read_trace", agent="a1", start=int(m.group(2))))
        return step(call("final_message", text="done"))


@pytest.fixture(scope="module")
def episode():
    cfg = OrgConfig.scaled(2048, prompt_style=PromptStyle.COMPACT, keep_recent_obs=0,
                           compaction_ratio=0.75, elide_target_ratio=0.6,
                           max_result_tokens=1024, max_obs_tokens=1024, trace_read_tokens=PAGE,
                           max_new_tokens=256)
    steps = {
        "ceo": [step(call("create_channel", name="plan"),
                     call("hire", title="Writer", role="write notes", tools=[])),
                step(call("wait_for_messages"))],
        # Phase 1 grows the context with tool results (tier 1 suffices), phase 2 with the
        # agent's own text (only a summary helps).
        "a1": ([step(call("archive_write", key="n", text=NOTE)),
                step(call("archive_write", key="s", text=SHORT),
                     call("subscribe", channel="plan", mode="light"))]
               + [step(*[call("archive_read", key="n")] * 3) for _ in range(N_READS)]
               + [step(call("archive_read", key="s"), text=THINK) for _ in range(N_THINKS)]
               + [step(call("report_to_ceo", status="written", next="rest"))]),
    }
    rec = Recorder(TraceReader(Playbook(steps, summary_text="I wrote note n and read it back.")))
    driver = RolloutDriver(ScriptedPolicy(CHAT, rec), CHAT, cfg)
    result = driver.run([GroupSpec(0, (RolloutSpec(PartsEnv(), 1, 0),))])
    return result, rec, result.logs[0][0].events, cfg


def test_both_tiers_happen_and_are_logged(episode):
    result, rec, events, cfg = episode
    comps = events_of(events, "compaction", agent="a1")
    tiers = [c["tier"] for c in comps]
    assert 1 in tiers and 2 in tiers
    for c in comps:
        assert c["tokens_after"] < c["tokens_before"]
        assert c["tokens_before"] < cfg.window
    summary_calls = events_of(events, "model_call", agent="a1", summary=True)
    assert len(summary_calls) == tiers.count(2)
    for s in summary_calls:  # tier 2 is logged right after its summary turn, caused by it
        nxt = [e for e in events if e["seq"] > s["seq"] and e["agent"] == "a1"][0]
        assert nxt["kind"] == "compaction" and nxt["tier"] == 2 and nxt["cause"] == s["seq"]
    assert result.groups[0].rollouts[0].metrics["compactions"] == len(
        events_of(events, "compaction"))


def test_segments_are_training_rows(episode):
    result, _, events, cfg = episode
    rows = [r for r in result.groups[0].rollouts[0].rows if r.agent == "a1"]
    n_comp = len(events_of(events, "compaction", agent="a1"))
    assert [r.segment for r in rows] == list(range(n_comp + 1))
    for r in rows:
        assert len(r.tokens) <= cfg.window
        assert set(np.unique(r.flags)) <= {int(TokenFlag.NORMAL)}
    # The summary turn is the last thing its row was trained on: its tokens carry loss.
    summary = CHAT.output("I wrote note n and read it back.")
    for s in events_of(events, "model_call", agent="a1", summary=True):
        row = rows[s["segment"]]
        assert list(row.tokens[-len(summary):]) == summary
        assert row.loss_mask[-len(summary):].all()
    # Every row after a reset starts with its own system segment (the whole context is new).
    system_id = CHAT.tok.special_ids
    for r in rows:
        assert r.tokens[0] == system_id[next(iter(system_id))]
        assert not r.loss_mask[0]
    # n_in_new of the first model call of a segment is the whole rebuilt context.
    for c in events_of(events, "compaction", agent="a1"):
        first = [e for e in events_of(events, "model_call", agent="a1")
                 if e["segment"] == c["segment"]][0]
        assert first["n_in_new"] == len(rows[c["segment"]].tokens) - first["n_out"] - sum(
            e["n_in_new"] + e["n_out"] for e in events_of(events, "model_call", agent="a1")
            if e["segment"] == c["segment"] and e["seq"] > first["seq"])


def test_pinned_state_and_summary_after_restart(episode):
    result, rec, events, _ = episode
    rows = [r for r in result.groups[0].rollouts[0].rows if r.agent == "a1"]
    tier2 = events_of(events, "compaction", agent="a1", tier=2)[0]
    text = CHAT.tok.decode(rows[tier2["segment"]].tokens)
    card = text.split("<|end|>")[0]
    assert card.startswith("<|system|>You are a1, Writer. write notes")
    assert "Team: ceo CEO; a1 Writer" in card
    assert "Tools: subscribe(channel, mode)" in card
    views = rec.views["a1"]
    after = [v for v in views if v.obs.startswith("Summary of your work so far:")]
    assert after and "I wrote note n and read it back." in after[0].obs
    # A scripted policy sees the card as text: the first one before, the pinned one after
    # (which shows the subscription a1 changed since its hire).
    assert card == "<|system|>" + after[0].system and "Channels: #plan light" in card
    assert "Channels: #plan full" in views[0].system
    assert CHAT.tok.decode(rows[0].tokens).startswith("<|system|>" + views[0].system + "<|end|>")
    # The observation held back during the summary turn follows the summary.
    assert all(re.search(r"\n\[#\d+ archive_read\] ", v.obs) for v in after)
    elided = [r for r in rows if "(elided " in CHAT.tok.decode(r.tokens)]
    assert elided  # tier 1 left stubs in some row


def test_read_trace_returns_the_uncompacted_context(episode):
    result, _, events, _ = episode
    assert result.reports[0][0].end_reason == "final_message"
    reads = events_of(events, "tool_call", agent="ceo", tool="read_trace")
    pages, covered = [], 0
    for read in reads:
        assert not read["error"]
        header, page = read["result"].split("\n", 1)
        start, end, n = map(int, HEADER.fullmatch(header).groups())
        assert start == covered and end == min(n, start + PAGE)
        pages.append(page)
        covered = end
    assert covered == n and len(reads) == -(-n // PAGE)
    body = "".join(pages)
    a1_rows = [r for r in result.groups[0].rollouts[0].rows if r.agent == "a1"]
    assert body.startswith(CHAT.tok.decode(a1_rows[0].tokens))  # segment 0 is uncompacted
    # Every note read is there, including the ones elided from the live context, and no
    # compaction artefact is.
    assert body.count(NOTE) == 3 * N_READS + 1  # the write's args + every read result
    assert body.count(THINK) == N_THINKS
    assert "(elided " not in body and "Summary of your work so far" not in body
    assert "Start. Hired by ceo." in body
