"""`analysis.tool_use` on a hand-built log, every count worked out by hand."""

from avalon.analysis.tool_use import UNPARSED, ToolUse, tool_use_by_group
from tests.analysis.builders import Log


def _rollout():
    """CEO: a well-formed turn with two calls (hire ok, post error), a malformed turn that
    names `post`, a malformed turn naming nothing, a summary turn (excluded); a1: one
    well-formed turn without calls, one skipped turn (excluded). Reward 1.5."""
    g = Log()
    g.add("start", "ceo", None, task_id="t", budget=2, seed=0, clock_s=60.0)
    m = g.mc("ceo", 0, 10, 5)
    g.hire("ceo", g.tc("ceo", m, "hire"), "a1", "  Lead   Engineer ")
    g.tc("ceo", m, "post", error=True)
    bad = g.mc("ceo", m, 5, 5, '<tool_call>{"name": "post", "arguments": {oops}}')
    g.events[bad]["malformed"] = "call 1: not valid JSON"
    bad2 = g.mc("ceo", bad, 5, 5, "I will do it")
    g.events[bad2]["malformed"] = "call 1: expected a tool name"
    s = g.mc("ceo", bad2, 5, 5)
    g.events[s]["summary"] = True
    a = g.mc("a1", 2, 5, 5, "thinking")
    sk = g.mc("a1", a, 5, 5)
    g.events[sk]["skipped"] = "ended"
    g.add("end", "ceo", sk, reason="final", rewards=[{"value": 1.5, "label": "r"}])
    return g.rollout()


def test_counts_by_hand():
    use = ToolUse()
    use.add(_rollout())
    assert (use.rollouts, use.turns, use.well_formed, use.with_calls) == (1, 4, 2, 1)
    t = use.tools
    assert (t["hire"].attempts, t["hire"].parsed, t["hire"].ok) == (1, 1, 1)
    assert (t["post"].attempts, t["post"].parsed, t["post"].ok) == (2, 1, 0)
    assert (t[UNPARSED].attempts, t[UNPARSED].parsed) == (1, 0)
    assert use.hires == [1] and use.titles == {"lead engineer": 1} and use.rewards == [1.5]
    s = use.summary()
    assert s["well_formed_turns"]["share"] == 0.5
    assert s["tools"]["post"]["well_formed"]["share"] == 0.5
    assert s["tools"]["post"]["ran_ok"]["share"] == 0.0
    assert s["hires"] == {"mean": 1.0, "se": None, "n": 1}


def test_groups_and_standard_errors():
    groups = tool_use_by_group([_rollout(), _rollout()])
    (key, use), = groups.items()
    assert key == ("eval", 0, "toy", "org") and use.rollouts == 2
    assert use.summary()["reward"] == {"mean": 1.5, "se": 0.0, "n": 2}
