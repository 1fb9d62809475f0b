"""Workspace confinement and the code sandbox."""

import os

import pytest

from avalon.org.env import ToolError
from avalon.org.workspace import Workspace, WorkspaceLimits


@pytest.fixture
def ws(tmp_path):
    return Workspace(tmp_path / "ws", WorkspaceLimits(max_file_bytes=1000, max_total_bytes=2500,
                                                      max_files=4, run_timeout_s=2.0,
                                                      run_memory_mb=256, max_output_bytes=200))


def test_paths_inside(ws):
    assert ws.write("a/b/c.txt", "hi") == 2
    assert ws.read("a/b/c.txt") == "hi" and ws.read("./a//b/c.txt") == "hi"
    assert ws.listdir() == ["a/b/c.txt"] and ws.listdir("a") == ["a/b/c.txt"]
    assert ws.exists("a/b/c.txt") and not ws.exists("../x")


@pytest.mark.parametrize("path,why", [
    ("", "non-empty"), ("  ", "non-empty"), ("/etc/passwd", "absolute"), ("../x", "'..'"),
    ("a/../../x", "'..'"), ("a/..", "'..'"), ("x\x00y", "NUL"), ("\\\\server\\x", "absolute"),
])
def test_paths_refused(ws, path, why):
    with pytest.raises(ToolError, match=why):
        ws.resolve(path)


@pytest.mark.parametrize("walk", [False, None], ids=["walk", "openat2"])
def test_symlinks_are_never_followed(ws, tmp_path, monkeypatch, walk):
    # Every component, both resolvers (openat2 where the kernel has it, the O_NOFOLLOW walk).
    from avalon.org import beneath
    real_open = beneath.open_beneath
    monkeypatch.setattr(beneath, "open_beneath",
                        lambda *a, **k: real_open(*a, **k, use_openat2=walk))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    os.symlink(outside, ws.root / "link")
    os.symlink(outside / "secret", ws.root / "file_link")
    ws.write("inside/f.txt", "in")
    os.symlink(ws.root / "inside", ws.root / "in_dir_link")
    os.symlink("inside/f.txt", ws.root / "in_file_link")
    for path in ("link/secret", "file_link", "in_dir_link/f.txt", "in_file_link",
                 "link/new.txt", "in_dir_link/new.txt"):
        with pytest.raises(ToolError, match="symbolic link"):
            ws.read(path)
        with pytest.raises(ToolError, match="symbolic link"):
            ws.write(path, "x")
        assert not ws.exists(path)
    assert (outside / "secret").read_text() == "s" and sorted(os.listdir(outside)) == ["secret"]
    assert ws.read("inside/f.txt") == "in" and ws.listdir() == ["inside/f.txt"]


def test_size_caps(ws):
    with pytest.raises(ToolError, match="per-file limit"):
        ws.write("big", "x" * 1001)
    ws.write("f1", "x" * 1000)
    ws.write("f2", "x" * 1000)
    with pytest.raises(ToolError, match="exceed 2500 bytes"):
        ws.write("f3", "x" * 600)
    ws.write("f1", "x" * 10)  # rewriting frees the old size
    ws.write("f3", "x" * 600)
    ws.write("f4", "x")
    with pytest.raises(ToolError, match="4 entries"):
        ws.write("f5", "x")
    os.remove(ws.root / "f4")
    with pytest.raises(ToolError, match="4 entries"):  # directories are entries too
        ws.write("d/f5", "x")
    assert not (ws.root / "d").exists()  # the directory made for it is gone again


def test_run_python(ws):
    ws.write("ok.py", "import sys\nprint('hello', sys.argv[1:])\nimport helper\nprint(helper.X)")
    ws.write("helper.py", "X = 42")
    r = ws.run_python("ok.py", ("a",))
    assert (r.returncode, r.timed_out) == (0, False)
    assert r.stdout == "hello ['a']\n42\n" and r.duration_s > 0
    ws.write("fail.py", "raise SystemExit(3)")
    assert ws.run_python("fail.py").returncode == 3
    ws.write("loud.py", "print('x' * 10000)")
    assert ws.run_python("loud.py").stdout.endswith("(output truncated: 9801 bytes not shown)")
    with pytest.raises(ToolError, match="no file"):
        ws.run_python("missing.py")


def test_run_python_limits(ws):
    ws.write("spin.py", "while True: pass")
    r = ws.run_python("spin.py")
    assert r.timed_out and r.returncode is None and r.duration_s < 10
    ws.write("hog.py", "x = bytearray(512 * 1024 * 1024)\nprint('allocated')")
    r = ws.run_python("hog.py")
    assert r.returncode != 0 and "MemoryError" in r.stderr and "allocated" not in r.stdout
    ws.write("spawn.py", "import os\nos.system('echo hi')")
    r = ws.run_python("spawn.py")
    assert r.returncode != 0 and "sandbox: os.system is not allowed" in r.stderr, r.stderr


def test_run_python_has_no_network(ws):
    ws.write("net.py", "import socket\ns = socket.socket()\ns.settimeout(2)\n"
                       "s.connect(('127.0.0.1', 9))\nprint('connected')")
    r = ws.run_python("net.py")
    assert r.returncode != 0 and "connected" not in r.stdout
    assert "sandbox: socket.__new__ is not allowed: there is no network" in r.stderr or \
        "sandbox: socket.connect is not allowed" in r.stderr, r.stderr  # bubblewrap, or not
    # The namespace below the hook: tests/org/test_sandbox.py (its raw-syscall test).
