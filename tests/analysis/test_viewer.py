"""The episode viewer in a real headless Chromium: the page loads with no console output at
all (no errors, no warnings) and shows every agent, every message and one arrow per delivery of
a real driver run's log, a time axis on the derived clock with labelled ticks, a legend of every
colour and mark, each message's text and each tool call's result on hover, and zoom (the clock
drawn wider, with finer ticks). `.ci/run` installs Chromium and sets AVALON_REQUIRE_BROWSER=1,
so CI fails rather than skips when the browser is missing."""

import html
import os
import re
import shutil
import subprocess
import sys

import pytest

from avalon import command
from avalon.analysis.episode import LEGEND
from avalon.org import GroupSpec, OrgConfig, RolloutDriver, RolloutSpec
from avalon.org.latency import replay
from avalon.org.policy import Playbook, ScriptedPolicy
from avalon.tools import view
from tests.org.helpers import CHAT, call, step
from tests.org.toyenv import PartsEnv

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")

STEPS = {
    "ceo": [step(call("create_channel", name="dev"),
                 call("hire", title="Lead Engineer", role="build </script> a", tools=["work"]),
                 call("hire", title="QA Reviewer", role="review", tools=[]),
                 text="plan: build then review"),
            step(call("work", part="a"), call("post", channel="dev", text="@a1 do b, @a2 check"),
                 call("wait_for_messages")),
            step(call("fire", agent="a2"), call("final_message", text="done"))],
    "a1": [step(call("subscribe", channel="dev", mode="full"), call("wait_for_messages")),
           step(call("work", part="b"), call("dm", to="a2", text="b done <b>bold</b>"),
                call("wait_for_messages"))],
    "a2": [step(call("subscribe", channel="dev", mode="full"), call("wait_for_messages")),
           step(call("wait_for_messages")),
           step(call("report_to_ceo", status="reviewed b: LGTM"), call("wait_for_messages"))],
}


@pytest.fixture(scope="module")
def log_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("viewer")
    driver = RolloutDriver(ScriptedPolicy(CHAT, Playbook(STEPS)), CHAT, OrgConfig.scaled(8192),
                           log_dir=d)
    result = driver.run([GroupSpec(0, (RolloutSpec(PartsEnv(), 3, 0),))])
    return d / "group0_rollout0.jsonl", result.logs[0][0].events


def _browser():
    if BROWSER is None:
        if os.environ.get("AVALON_REQUIRE_BROWSER") == "1":
            pytest.fail("AVALON_REQUIRE_BROWSER=1 but no chromium on PATH")
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    return BROWSER


def _dom(browser, page, tmp_path, fragment=""):
    """The page's DOM after its script ran, and the console lines it printed."""
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                        "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
                        f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                        page.as_uri() + fragment], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, [line for line in r.stderr.splitlines() if ":CONSOLE" in line]


def test_viewer_page_in_headless_chromium(log_file, tmp_path):
    browser = _browser()
    path, events = log_file
    out = tmp_path / "episode.html"
    subprocess.run([sys.executable, "-m", "avalon.tools.view", str(path), f"--out={out}"],
                   check=True, capture_output=True, timeout=60)
    dom, console = _dom(browser, out, tmp_path)
    assert console == [], console
    assert re.search(r'id="status">drawn \d+ events<', dom), dom[:2000]
    agents = {e["agent"] for e in events} | {e["new_agent"] for e in events
                                             if e["kind"] == "hire"}
    assert agents == {"ceo", "a1", "a2"}
    assert set(re.findall(r'data-agent="([^"]+)"', dom)) == agents
    messages = {e["message_id"] for e in events if e["kind"] == "send"}
    assert len(messages) >= 3
    assert set(re.findall(r'data-message-item="([^"]+)"', dom)) == messages
    delivered = sorted(e["message_id"] for e in events if e["kind"] == "deliver")
    assert len(delivered) >= 3
    assert sorted(re.findall(r'data-message="([^"]+)"', dom)) == delivered
    drawn = set(int(s) for s in re.findall(r'data-seq="(\d+)"', dom))
    timed = {e["seq"] for e in events if e["kind"] not in ("send", "deliver")}
    assert drawn == timed  # every other event is a bar or a mark
    assert "&lt;b&gt;bold" in dom  # message text is text, not markup
    kinds = {e["seq"]: e["kind"] for e in events}
    for kind in ("hire", "fire", "end"):  # marks of their own class
        seqs = re.findall(rf'class="{kind}" data-seq="(\d+)"', dom)
        assert seqs and all(kinds[int(q)] == kind for q in seqs), kind
    rewarded = [e for e in events if e.get("rewards") and not e.get("late")]
    # (the legend's own reward sample is one more)
    assert rewarded and dom.count('class="reward"') == len(rewarded) + 1

    # The time axis: ticks from 0 across the episode's derived latency, each labelled.
    latency = replay(events).task_latency_s
    ticks = [float(t) for t in re.findall(r'class="axis tick" data-tick="([0-9.]+)"', dom)]
    assert len(ticks) >= 4 and ticks[0] == 0.0 and ticks == sorted(ticks)
    assert ticks[-1] <= latency + 1e-6 and ticks[-1] + (ticks[1] - ticks[0]) > latency
    assert dom.count('class="tick-label"') == len(ticks) and "derived clock" in dom
    # The legend names every class the chart draws with.
    assert set(re.findall(r'data-legend="([^"]+)"', dom)) == {c for c, _ in LEGEND}
    # Hover: every message's text on its arrow, every tool call's result on its bar.
    for e in events:
        if e["kind"] == "send" and e["to"]:
            assert html.escape(e["text"], quote=False) in dom, e["text"]
    titles = dict(re.findall(r'data-seq="(\d+)"><title>([^<]*)</title>', dom))
    for e in events:
        if e["kind"] == "tool_call":
            assert html.escape(str(e["result"])[:60], quote=False) in titles[str(e["seq"])]

    # Zoom: `#zoom=4` draws the same events on a clock four times as wide, with finer ticks.
    zoomed, console = _dom(browser, out, tmp_path, "#zoom=4")
    assert console == []
    width = lambda d: float(re.search(r'<svg width="([0-9.]+)"', d.split('id="chart"')[1])[1])
    assert width(zoomed) > 3 * width(dom) - 1000
    assert len(re.findall(r'class="axis tick"', zoomed)) > len(ticks)
    assert set(re.findall(r'data-seq="(\d+)"', zoomed)) == set(re.findall(r'data-seq="(\d+)"',
                                                                            dom))
    assert "4x" in zoomed


def test_view_cli_rejects_an_empty_log(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(command.Stop, match="no events"):
        view.main([str(empty), f"--out={tmp_path / 'x.html'}"])
    assert not (tmp_path / "x.html").exists()
