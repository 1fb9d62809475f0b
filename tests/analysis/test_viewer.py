"""The episode viewer in a real headless Chromium: the page loads with no console output at
all (no errors, no warnings) and shows every agent, every message and one arrow per delivery of
a real driver run's log, a time axis on the derived clock with labelled ticks, a legend of every
colour and mark, each message's text and each tool call's result on hover, and zoom (the clock
drawn wider, with finer ticks). On a failing episode of collective verification (a wrong result
code passed on, so the review and the ship fail and the team deadlocks) the header tells the
outcome (reward, end reason, the environment's record), every failed call is drawn in the error
colour, wide enough to see and above the bars it would hide behind, and "fit events" draws the
two-minute build as a break. `.ci/run` installs Chromium and sets AVALON_REQUIRE_BROWSER=1, so
CI fails rather than skips when the browser is missing."""

import html
import os
import re
import shutil
import subprocess
import sys

import pytest

from avalon import command
from avalon.analysis.episode import FAILED_MIN_PX, LEGEND
from avalon.envs.base import Split
from avalon.envs.verification import Verification, VerificationConfig
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


# The builder passes on a code it never built ("5": codes are 10..99), so the verifier's review
# and the CEO's ship fail; the verifier still says "p1 defect ok", and everyone ends waiting.
FAILING = {
    "ceo": [step(call("hire", title="Builder", role="build p1", tools=["build"]),
                 call("hire", title="Verifier", role="review what you get", tools=["review"]),
                 call("wait_for_messages")),
            step(call("ship", id="p1", result="5"), call("wait_for_messages"))],
    "a1": [step(call("build", id="p1"), call("dm", to="a2", text="p1 5"),
                call("dm", to="ceo", text="p1 5"), call("wait_for_messages"))],
    "a2": [step(call("wait_for_messages")),
           step(call("review", id="p1", result="5"), call("dm", to="ceo", text="p1 defect ok"),
                call("wait_for_messages"))],
}


@pytest.fixture(scope="module")
def failing_log(tmp_path_factory):
    d = tmp_path_factory.mktemp("failing")
    # one item of 3 work units: a 120 s build
    env = Verification(VerificationConfig(n_items=(1, 1), cost_units=(3, 3), n_train=1,
                                          n_heldout=1))
    task = env.task_ids(Split.TRAIN)[0]
    driver = RolloutDriver(ScriptedPolicy(CHAT, Playbook(FAILING)), CHAT, OrgConfig.scaled(8192),
                           log_dir=d)
    session = env.session(task, seed=0, clock_s=480.0)
    result = driver.run([GroupSpec(0, (RolloutSpec(session, 2, 0),))])
    return d / "group0_rollout0.jsonl", result.logs[0][0].events


def _rects(dom):
    """{seq: (x, width, class)} of the chart's bars, in drawing order."""
    out = {}
    for attrs in re.findall(r"<rect ([^>]*data-seq=[^>]*)>", dom):
        a = dict(re.findall(r'([a-z-]+)="([^"]*)"', attrs))
        out[int(a["data-seq"])] = (float(a["x"]), float(a["width"]), a["class"])
    return out


def test_viewer_tells_the_outcome_of_a_failing_episode(failing_log, tmp_path):
    browser = _browser()
    path, events = failing_log
    end = events[-1]
    failed = [e for e in events if e["kind"] == "tool_call" and e["error"]]
    calls = [e for e in events if e["kind"] == "tool_call"]
    # What the page must show: the environment's own record of this episode.
    assert end["reason"] == "deadlock" and {e["tool"] for e in failed} == {"review", "ship"}
    assert end["env_metrics"]["reviews"] == 0 and end["env_metrics"]["shipped"] == 0
    out = tmp_path / "failing.html"
    view.main([str(path), f"--out={out}"])
    dom, console = _dom(browser, out, tmp_path)
    assert console == [], console
    head = html.unescape(re.search(r'<p id="outcome">(.*?)</p>', dom, re.S)[1])
    assert (f"reward 0 · end: deadlock · failed tool calls {len(failed)} of {len(calls)}"
            in head), head
    assert "the environment recorded: " in head and "reviews 0" in head and "shipped 0" in head
    assert "defects_found 0" in head and "ground truth: 1 builds (" in head, head

    # Every failed call: the error colour, at least FAILED_MIN_PX wide though it took no
    # time, drawn after (above) every other bar.
    rects = _rects(dom)
    order = list(rects)
    for e in failed:
        x, w, cls = rects[e["seq"]]
        assert "err" in cls.split() and w >= FAILED_MIN_PX, (e["tool"], w, cls)
        assert e["duration_s"] == 0.0
        assert all(order.index(e["seq"]) > order.index(q) for q, (_, _, c) in rects.items()
                   if "err" not in c.split()), e["tool"]
    assert not any("err" in c.split() for s, (_, _, c) in rects.items()
                   if s not in {e["seq"] for e in failed} and events[s]["kind"] == "tool_call")

    # Fit events: the two-minute build is an idle stretch drawn as a break, so the verifier's
    # review turn (after it) is drawn wider than on the plain clock.
    fit, console = _dom(browser, out, tmp_path, "#fit=events")
    assert console == []
    gaps = [float(g) for g in re.findall(r'class="idle" data-idle="([0-9.]+)"', fit)]
    build = next(e for e in events if e["kind"] == "tool_call" and e["tool"] == "build")
    assert gaps and max(gaps) >= 0.9 * build["duration_s"] == 0.9 * 120.0
    turn = next(e["seq"] for e in events if e["kind"] == "model_call" and e["agent"] == "a2"
                and e["turn"] == 1)
    assert _rects(fit)[turn][1] > 5 * _rects(dom)[turn][1]
    assert "idle stretches as breaks" in fit
    assert set(re.findall(r'data-seq="(\d+)"', fit)) == set(re.findall(r'data-seq="(\d+)"', dom))
