"""The episode viewer in a real headless Chromium: the page loads with no console output at
all (no errors, no warnings) and shows every agent, every message and one arrow per delivery of
a real driver run's log. `.ci/run` installs Chromium and sets AVALON_REQUIRE_BROWSER=1, so CI
fails rather than skips when the browser is missing."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from avalon import command
from avalon.org import GroupSpec, OrgConfig, RolloutDriver, RolloutSpec
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


def test_viewer_page_in_headless_chromium(log_file, tmp_path):
    browser = _browser()
    path, events = log_file
    out = tmp_path / "episode.html"
    subprocess.run([sys.executable, "-m", "avalon.tools.view", str(path), f"--out={out}"],
                   check=True, capture_output=True, timeout=60)
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                        "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
                        f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                        out.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    dom = r.stdout
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
    assert rewarded and dom.count('class="reward"') == len(rewarded)


def test_view_cli_rejects_an_empty_log(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(command.Stop, match="no events"):
        view.main([str(empty), f"--out={tmp_path / 'x.html'}"])
    assert not (tmp_path / "x.html").exists()
