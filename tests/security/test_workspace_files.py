"""Trainer-side file operations on a workspace that sandboxed code has filled with hostile
entries: every one is a tool error or skipped, none blocks, none raises anything else."""

import json
import os
import shutil
import socket
import stat
import tempfile
import threading
from pathlib import Path

import pytest

from avalon.envs.software.grader import MAX_RESULT_DEPTH, _read_results, json_depth
from avalon.org import beneath, sandbox
from avalon.org.env import ToolError
from avalon.org.workspace import Workspace, WorkspaceLimits


@pytest.fixture
def ws(tmp_path):
    return Workspace(tmp_path / "ws", WorkspaceLimits(run_timeout_s=5.0))


def bounded(fn, timeout_s=5.0):
    """fn() in a daemon thread; its result, or AssertionError if it blocks past the bound."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"blocked for {timeout_s} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.mark.parametrize("path,why", [
    ("a" * 256, "a name of 256 bytes"), ("é" * 128, "a name of 256 bytes"),
    ("/".join(["a" * 200] * 21), "4220 bytes; the limit is 4096"),
    ("\ud800", "lone surrogate"), ("ok/\udfffx", "lone surrogate"), ("a\x00", "NUL"),
    ("d/" * 40 + "f", "41 levels deep"),
])
def test_bad_paths_are_tool_errors(ws, path, why):
    for op in (ws.read, lambda p: ws.write(p, "x"), ws.run_python, ws.listdir):
        with pytest.raises(ToolError, match=why):
            op(path)
    assert not ws.exists(path)


def test_longest_allowed_names_work(ws):
    name = "a" * 255
    assert ws.write(f"{name}/{name}", "x") == 1 and ws.read(f"{name}/{name}") == "x"


def _plant(ws):
    """FIFO, socket, link loop, dangling link, unreadable directory, as sandboxed code could."""
    root = str(ws.root)
    os.mkfifo(f"{root}/fifo")
    s = socket.socket(socket.AF_UNIX)
    s.bind(f"{root}/sock")
    os.symlink("loop", f"{root}/loop")
    os.symlink("nowhere", f"{root}/dangling")
    os.mkdir(f"{root}/locked")
    open(f"{root}/locked/f", "w").close()
    os.chmod(f"{root}/locked", 0)
    return s


@pytest.mark.parametrize("name,kind", [("fifo", "a FIFO"), ("sock", "a socket"),
                                       ("loop", "symbolic link"), ("dangling", "symbolic link"),
                                       ("locked", "a directory")])
def test_special_files_are_tool_errors_and_never_block(ws, name, kind):
    s = _plant(ws)
    ops = [ws.read, lambda p: ws.write(p, "x"), ws.run_python]
    if name != "locked":  # (root may write into a directory of mode 0)
        ops.append(lambda p: ws.write(p + "/x", "x"))
    try:
        for op in ops:
            with pytest.raises(ToolError) as e:
                bounded(lambda op=op: op(name))
            assert kind in str(e.value) or "symbolic link" in str(e.value) \
                or "not a directory" in str(e.value), str(e.value)
        assert not bounded(lambda: ws.exists(name))
    finally:
        s.close()
        os.chmod(ws.root / "locked", 0o700)


def test_listing_and_snapshots_stand_a_hostile_tree(ws):
    s = _plant(ws)
    try:
        ws.write("ok.txt", "x")
        root_fd = os.open(ws.root, os.O_RDONLY)
        # A 4,836-byte path (made by moving chains inside each other) and a name that is not
        # UTF-8: both exist, neither is a name the file tools accept.
        chain = "/".join(["n" * 200] * 12)
        os.makedirs(ws.root / "A" / chain)
        (ws.root / "A" / chain / "deep.txt").write_text("x")
        os.makedirs(ws.root / "B" / chain)
        os.rename(ws.root / "A", ws.root / "B" / chain / "A")
        open(os.open(b"bad\xff", os.O_WRONLY | os.O_CREAT, dir_fd=root_fd), "w").close()
        os.close(root_fd)
        readable = ["locked/f"] if os.geteuid() == 0 else []  # mode 0 does not stop root
        assert bounded(lambda: ws.listdir()) == readable + ["ok.txt"]  # (before ok.py)
        snap = bounded(ws.snapshot)
        assert "ok.txt" in snap and "fifo" not in snap and "loop" not in snap
        assert any(k.endswith("deep.txt") and len(k) > 4096 for k in snap)
        ws.write("ok.py", "print('ran')")
        r = ws.run_python("ok.py")  # a run's own before/after scans stand it too
        assert r.returncode == 0 and r.caps_broken == ""
    finally:
        s.close()
        os.chmod(ws.root / "locked", 0o700)


@pytest.fixture
def fast_dir(tmp_path):
    """A directory in memory where there is one (inode operations on this disk are slow)."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    d = tempfile.mkdtemp(dir="/dev/shm")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def test_removing_a_very_deep_tree_needs_few_descriptors(fast_dir):
    # 3,000 levels: os.walk recursion and one descriptor per level would both fail.
    tmp_path = fast_dir
    top = tmp_path / "top"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    before = len(os.listdir("/proc/self/fd"))
    root = os.open(tmp_path, os.O_RDONLY)
    try:
        beneath.remove_beneath(root, ("top",))
    finally:
        os.close(root)
    assert not top.exists() and len(os.listdir("/proc/self/fd")) == before


def test_a_run_over_the_byte_cap_loses_what_it_wrote_and_only_that(tmp_path):
    ws = Workspace(tmp_path / "ws", WorkspaceLimits(max_total_bytes=4096, max_files=8,
                                                    run_timeout_s=5.0))
    ws.write("keep.txt", "kept")
    ws.write("edit.txt", "old")
    ws.write("p.py", "open('edit.txt', 'w').write('new')\nimport os\nos.makedirs('x/y')\n"
                     "open('x/y/big', 'w').write('z' * 5000)\n")
    r = ws.run_python("p.py")
    assert r.caps_broken == "over 4096 bytes" and r.changed == ()
    assert ws.listdir() == ["edit.txt", "keep.txt", "p.py"] and ws.read("edit.txt") == "old"
    ws.write("q.py", "open('new.txt', 'w').write('fine')")
    r = ws.run_python("q.py")
    assert r.caps_broken == "" and r.changed == ("new.txt",) and ws.read("new.txt") == "fine"


def test_the_entry_cap_holds_while_a_run_makes_files(tmp_path):
    """Under bubblewrap the kernel refuses the entry past the cap (the program sees ENOSPC
    and what it made within the cap is kept); without, the run is killed soon after and loses
    what it made."""
    ws = Workspace(tmp_path / "ws", WorkspaceLimits(max_files=64, run_timeout_s=8.0))
    ws.write("p.py", "i = 0\nwhile True:\n    open(f'f{i}', 'w').close()\n    i += 1\n")
    r = ws.run_python("p.py")
    assert not r.timed_out and r.duration_s < 4.0
    if sandbox.layers().bubblewrap:
        assert "No space left on device" in r.stderr and r.caps_broken == ""
        assert len(ws.listdir()) == 64  # p.py and 63 files: the root is the 65th inode
    else:
        assert r.caps_broken == "over 64 entries" and ws.listdir() == ["p.py"]


def test_results_files_are_read_with_size_and_depth_bounds(tmp_path):
    ws = Workspace(tmp_path / "g", WorkspaceLimits(max_file_bytes=1 << 16))
    assert json_depth('[{"a": "[[[[\\"[["}, [[]]]') == 3
    deepest = "[" * MAX_RESULT_DEPTH + "]" * MAX_RESULT_DEPTH
    ws.write("results.json", deepest)
    assert _read_results(ws, 1) == json.loads(deepest)  # a list of 1 result, 64 deep: read
    ws.write("results.json", "[" + deepest + "]")
    assert _read_results(ws, 1) == [None]  # 65 deep: refused
    ws.write("results.json", "[" * 60000)
    assert _read_results(ws, 2) == [None, None]  # json.loads would raise RecursionError
    (ws.root / "results.json").write_bytes(b"[" + b"1," * 40000 + b"1]")
    assert _read_results(ws, 1) == [None]  # over the size cap
    ws.remove("results.json")
    os.mkfifo(ws.root / "results.json")
    assert bounded(lambda: _read_results(ws, 1)) == [None]
    assert stat.S_ISFIFO(os.lstat(ws.root / "results.json").st_mode)
