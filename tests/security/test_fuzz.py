"""Fuzzing the organisation with what a model could write: generated malformed outputs (raw
token garbage, call-syntax garbage, bad JSON, wrong types, huge and unicode-junk arguments,
hostile paths) and hostile sandbox programs, through the real `RolloutDriver` with a scripted
policy, in-process and over ORS with the Avalon extension (loopback), from a fixed seed.

What must hold: the driver returns (no exception, no hang); every turn's sampled tokens carry
the flag its outcome deserves (malformed -> MALFORMED, a failed call -> TOOL_ERROR, else
NORMAL: the RL core turns these into the -0.1 / -0.05 shaping); every turn generated to be
bad is flagged; and every workspace ends within its caps. The default run plays about 2,000
outputs (well under 60 s); `-m slow` plays ten times as many.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter

import numpy as np
import pytest

from avalon.envs.base import Split
from avalon.envs.ors import OrsEnvironment
from avalon.envs.ors_server import OrsServer
from avalon.envs.software import SoftwareBuild, SoftwareConfig
from avalon.org import GroupSpec, OrgConfig, RolloutDriver, RolloutSpec
from avalon.org.policy import scripted_output
from avalon.org.tools import SPECS
from avalon.org.workspace import WorkspaceLimits
from avalon.rl.types import TokenFlag
from avalon.tokenizer import Special
from experiments.security.play import CHAT, BareEnv

LIMITS = WorkspaceLimits(max_total_bytes=1 << 20, max_files=64, run_timeout_s=1.0,
                         run_memory_mb=256, max_output_bytes=2000)
TOOL_NAMES = [s.name for s in SPECS.values()] + ["submit"]
JUNK = ["\\ud800", "\\udfff", "a\\u0000b", "\\u202e\\u0647", "\\ud83d\\ude00" * 20,
        "e\\u0301" * 30, "\\u2028\\u2029", "\\ufeff", "\\\\x00", "\\u00ff" * 40]
# Paths every file tool refuses (JSON-escaped, as a model would write them).
BAD_PATHS = ["", "  ", "/etc/passwd", "../x", "a/../../b", "a\\u0000b", "\\ud800",
             "ok/\\udcff", "a" * 256, "d/" * 33 + "f", "\\\\\\\\server\\\\x"]
BAD_JSON = ['{"path": ', '{"a": NaN}', '{"a": Infinity}', '{"a": 1} x', "[1, 2]", '"str"',
            "{'a': 1}", '{"a": "\\ud800}', "{" * 300, '{"a": [' * 300, '{"a": 1,}', "{]",
            '{"a": 0x10}', '{"a": 1e999999}x']
BAD_NAMES = ["Read_File {}", "1abc {}", "{}", "名前 {}", "read-file {}", "- roster",
             "roster roster", "\\u0000"]
PROGRAMS = [
    "import os\nos.fork()",
    "import os\nos.mkfifo('notes.txt')",
    "import os\nos.symlink('loop', 'loop')\nos.symlink('/proc/self/cwd', 'cwd')",
    "open('big', 'wb').write(b'x' * (2 << 20))",
    "for i in range(200):\n    open(f'n{i}', 'w').close()",
    "import os\nfor i in range(40):\n    os.mkdir('d')\n    os.chdir('d')",
    "while True:\n    pass",
    "x = bytearray(1 << 30)",
    "import sys\nsys.stdout.buffer.write(bytes(range(256)) * 64)\nprint('\\udcff')",
    "import os\nos._exit(3)",
    "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "import threading\nfor _ in range(50):\n    threading.Thread(target=print).start()",
    "print('y' * 100000)",
    "import os\nos.mkdir('locked')\nopen('locked/f', 'w').write('x')\nos.chmod('locked', 0)",
    "import os\nopen(b'bad\\xff', 'w').write('x')\nos.rename('solution.py', 'gone.py')",
    "raise SystemExit('bye')",
    "import socket\ns = socket.socket(socket.AF_UNIX)\ns.bind('sock')",
    "import subprocess\nsubprocess.run(['sh', '-c', 'echo hi'])",
    "import ctypes\nctypes.CDLL(None).fork()",
    "def f():\n    f()\nf()",
]
KNOWN_BAD = {"bad_json", "bad_name", "unknown_tool", "wrong_type", "missing_arg", "extra_arg",
             "bad_path", "too_many_calls", "stray_special"}


def _call(name: str, args: dict) -> str:
    return name + " " + json.dumps(args)


def _value_not_of(rng, kind: str):
    options = {"string": [5, [], {}, None, True, 1.5], "integer": ["5", [], None, 1.5, True],
               "array": ["x", 5, {}, None], "number": ["x", [], None, True],
               "boolean": [0, "true", None], "object": [[], "x", 5]}[kind]
    return options[int(rng.integers(len(options)))]


def generate(rng: np.random.Generator, agent: str, n: int) -> tuple[str, list[str] | np.ndarray]:
    """One generated turn: (kind, call texts or raw token ids); `n` tells files apart."""
    specs = list(SPECS.values())
    spec = specs[int(rng.integers(len(specs)))]
    kind = str(rng.choice(
        ["garbage_ids", "bad_json", "bad_name", "unknown_tool", "wrong_type", "missing_arg",
         "extra_arg", "bad_path", "too_many_calls", "stray_special", "junk_text", "huge_args",
         "valid", "program"],
        p=[.10, .10, .06, .06, .10, .06, .06, .10, .03, .04, .09, .05, .11, .04]))
    if kind == "garbage_ids":
        ids = rng.integers(0, CHAT.tok.vocab_size, int(rng.integers(1, 200)))
        return kind, ids.astype(np.int32)
    if kind == "stray_special":
        ids = CHAT.output("some text", ["roster"])
        ids.insert(int(rng.integers(0, len(ids) - 1)),
                   CHAT.id(Special(str(rng.choice(["<|system|>", "<|obs|>", "<|agent|>"])))))
        return kind, np.asarray(ids, np.int32)
    if kind == "bad_json":
        return kind, [spec.name + " " + BAD_JSON[int(rng.integers(len(BAD_JSON)))]]
    if kind == "bad_name":
        return kind, [BAD_NAMES[int(rng.integers(len(BAD_NAMES)))]]
    if kind == "unknown_tool":
        return kind, [_call(str(rng.choice(["teleport", "sudo", "rm_rf", "x" * 60])), {})]
    if kind == "too_many_calls":
        return kind, ["roster"] * 9
    if kind == "wrong_type":
        typed = [s for s in specs if s.params]
        spec = typed[int(rng.integers(len(typed)))]
        args = {p.name: "x" for p in spec.params}
        p = spec.params[int(rng.integers(len(spec.params)))]
        args[p.name] = _value_not_of(rng, p.type.value)
        return kind, [_call(spec.name, args)]
    if kind == "missing_arg":
        needy = [s for s in specs if any(p.required for p in s.params)]
        spec = needy[int(rng.integers(len(needy)))]
        return kind, [_call(spec.name, {})]
    if kind == "extra_arg":
        return kind, [_call(spec.name, {"zzz_unknown": 1})]
    if kind == "bad_path":
        tool = str(rng.choice(["read_file", "write_file", "run_code"]))
        path = BAD_PATHS[int(rng.integers(len(BAD_PATHS)))]
        extra = ', "text": "x"' if tool == "write_file" else ""
        return kind, [f'{tool} {{"path": "{path}"{extra}}}']
    if kind == "junk_text":
        junk = JUNK[int(rng.integers(len(JUNK)))]
        tool = str(rng.choice(["post", "dm", "archive_write", "write_file", "create_channel",
                               "react", "report_to_ceo"]))
        fields = {"post": ("channel", "text"), "dm": ("to", "text"), "react": (
            "message_id", "emoji"), "archive_write": ("key", "text"), "write_file": (
            "path", "text"), "create_channel": ("name", "topic"), "report_to_ceo": (
            "status", "done")}[tool]
        a, b = fields
        return kind, [f'{tool} {{"{a}": "{junk}", "{b}": "{junk}"}}']
    if kind == "huge_args":
        size = int(rng.integers(500, 3000))
        return kind, [_call(str(rng.choice(["write_file", "post", "archive_write"])),
                            {"path": f"h{n}.txt", "channel": "x", "key": "k", "text": "z" * size})]
    if kind == "program":
        code = PROGRAMS[int(rng.integers(len(PROGRAMS)))]
        args = [] if rng.random() < 0.7 else ["a\\u0000", "\\ud800", "x" * 50][
            :int(rng.integers(1, 4))]
        run = f'run_code {{"path": "p{n}.py", "args": {json.dumps(args)}}}'.replace(
            "\\\\u", "\\u")
        return kind, [_call("write_file", {"path": f"p{n}.py", "text": code}), run]
    valid = [_call("write_file", {"path": f"v{n % 5}.txt", "text": "ok"}), "list_files",
             _call("read_file", {"path": "v0.txt"}), "roster", _call(
                 "create_channel", {"name": f"c{n % 3}"}), _call(
                 "post", {"channel": "c0", "text": "hi"}), _call(
                 "hire", {"title": "Dev", "role": "fuzz", "tools": [
                     "read_file", "write_file", "run_code", "list_files"]}), "archive_list",
             _call("read_channel", {"channel": "c0", "last": 500})]
    return "valid", [valid[int(rng.integers(len(valid)))]]


class FuzzPolicy:
    """Answers every agent's turns with generated outputs; remembers each turn's kind."""

    def __init__(self, seed: int, turns_per_agent: int):
        self.seed, self.turns_per_agent = seed, turns_per_agent
        self.kinds: dict[tuple[int, str], list[str]] = {}
        self.outputs = 0

    def act(self, turns):
        out = []
        for turn in turns:
            key = (turn.key.rollout, turn.key.agent)
            view = turn.view
            rng = np.random.default_rng([self.seed, turn.key.rollout, view.turn,
                                         sum(map(ord, turn.key.agent))])
            if view.summary:
                kind, ids = "summary", CHAT.output("summary")
            elif view.turn >= self.turns_per_agent:
                kind = "finish"
                ids = CHAT.output("", ['final_message {"text": "done"}' if turn.key.agent == "ceo"
                                       else "wait_for_messages"])
            else:
                kind, payload = generate(rng, turn.key.agent, view.turn)
                ids = [int(i) for i in payload] if isinstance(payload, np.ndarray) \
                    else CHAT.output("", payload)
                self.outputs += 1
            self.kinds.setdefault(key, []).append(kind)
            out.append(scripted_output(ids, turn.max_new_tokens))
        return out

    def release(self, key):
        pass

    def prefill_shared(self, keys, prefix):
        pass


def _turn_flags(rollout, events, agent) -> dict[int, set[int]]:
    """model_call seq -> the set of the flags of that call's sampled tokens, for `agent`."""
    out = {}
    calls = [e for e in events if e["kind"] == "model_call" and e["agent"] == agent]
    for row in (r for r in rollout.rows if r.agent == agent):
        pos = 0
        for c in (c for c in calls if c["segment"] == row.segment):
            pos += c["n_in_new"]
            out[c["seq"]] = set(row.flags[pos:pos + c["n_out"]].tolist())
            pos += c["n_out"]
    return out


def _usage(root) -> tuple[int, int]:
    entries = size = 0
    for dirpath, dirs, files in os.walk(root):
        entries += len(dirs) + len(files)
        size += sum(os.lstat(os.path.join(dirpath, f)).st_size for f in files)
    return entries, size


def _check_rollout(g: int, rollout, events, policy: FuzzPolicy) -> Counter:
    """Each model call's flags match its outcome; each turn generated to be bad is flagged.
    Returns how many turns ended malformed, with a tool error, or normal."""
    seen = Counter()
    causes: dict[int, list[dict]] = {}
    for e in events:
        if e["kind"] == "tool_call":
            causes.setdefault(e["cause"], []).append(e)
    for agent in sorted({r.agent for r in rollout.rows}):
        flags = _turn_flags(rollout, events, agent)
        calls = [e for e in events if e["kind"] == "model_call" and e["agent"] == agent]
        kinds = policy.kinds[(g, agent)]  # the driver's rollout index is the group's here
        assert len(kinds) == len(calls), (g, agent, len(kinds), len(calls))
        for event, kind in zip(calls, kinds):
            if event.get("skipped") or event.get("summary"):
                continue
            tool_calls = causes.get(event["seq"], [])
            if "malformed" in event:
                want = int(TokenFlag.MALFORMED)
            elif any(e["error"] for e in tool_calls):
                want = int(TokenFlag.TOOL_ERROR)
            else:
                want = int(TokenFlag.NORMAL)
            assert flags[event["seq"]] == {want}, (g, agent, kind, event, tool_calls)
            if kind in KNOWN_BAD and (tool_calls or "malformed" in event):
                assert want != int(TokenFlag.NORMAL), (g, agent, kind, event, tool_calls)
            seen[TokenFlag(want).name.lower()] += 1
    return seen


def fuzz(tmp_path, sessions, seed: int, turns_per_agent: int, timeout_s: float) -> Counter:
    """Plays one rollout per session (one group each) and checks everything the module
    docstring lists; returns how many turns of each kind were played."""
    cfg = OrgConfig.scaled(32768, workspace=LIMITS)
    policy = FuzzPolicy(seed, turns_per_agent)
    driver = RolloutDriver(policy, CHAT, cfg, workdir=tmp_path, keep_workspaces=True)
    groups = [GroupSpec(i, (RolloutSpec(s, 1, seed + i),)) for i, s in enumerate(sessions)]
    box = {}

    def target():
        try:
            box["result"] = driver.run(groups)
        except BaseException as e:  # noqa: BLE001 - reported below with its traceback
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"the driver hung (over {timeout_s} s)"
    if "error" in box:
        raise AssertionError("an exception left RolloutDriver.run") from box["error"]
    result = box["result"]
    seen = Counter()
    for g, group in enumerate(result.groups):
        seen += _check_rollout(g, group.rollouts[0], result.logs[g][0].events, policy)
        root = next(tmp_path.glob(f"avalon-org-*/group{g}_rollout0"))
        entries, size = _usage(root)
        assert entries <= LIMITS.max_files and size <= LIMITS.max_total_bytes, (g, entries, size)
    kinds = Counter(k for kinds in policy.kinds.values() for k in kinds)
    kinds["outputs"] = policy.outputs
    kinds.update(seen)
    kinds["seconds"] = round(time.monotonic() - start)
    return kinds


SOFTWARE = SoftwareBuild(SoftwareConfig(n_train=4, n_heldout=2, grade_timeout_s=2.0))


def _sessions(env, n: int) -> list:
    tid = env.task_ids(Split.TRAIN)[0]
    return [env.session(tid, i) for i in range(n)]


def test_fuzz_in_process(tmp_path):
    kinds = fuzz(tmp_path, [BareEnv() for _ in range(26)] + _sessions(SOFTWARE, 4), seed=0,
                 turns_per_agent=60, timeout_s=120)
    assert kinds["outputs"] >= 2000 and kinds["program"] >= 60, kinds
    assert kinds["malformed"] >= 400 and kinds["tool_error"] >= 800, kinds


def test_fuzz_over_ors(tmp_path):
    with OrsServer([SOFTWARE]) as server:
        remote = OrsEnvironment(server.url, SOFTWARE.name, extension=True)
        kinds = fuzz(tmp_path, _sessions(remote, 6), seed=1, turns_per_agent=40, timeout_s=120)
    assert kinds["outputs"] >= 300 and kinds["program"] >= 5, kinds


@pytest.mark.slow
def test_fuzz_long(tmp_path):
    sessions = [BareEnv() for _ in range(120)] + _sessions(SOFTWARE, 20)
    kinds = fuzz(tmp_path, sessions, seed=2, turns_per_agent=100, timeout_s=1800)
    assert kinds["outputs"] >= 20000, kinds
