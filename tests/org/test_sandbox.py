"""The `run_python` sandbox: each escape is refused by the audit hook with a `sandbox:` error,
ordinary programs still work, and each kernel layer (network namespace, Landlock) holds on its
own, below the hook, where this machine has it."""

import dis
import errno
import json
import os
import stat
import subprocess
import sys
import textwrap
import types
import zlib
from pathlib import Path

import numpy as np
import pytest

import avalon
from avalon.org.workspace import Workspace, WorkspaceLimits, sandbox_layers

REPO_FILE = Path(avalon.__file__).resolve().parent / "envs" / "software" / "functions.py"
BOOT = Path(avalon.__file__).resolve().parent / "org" / "sandbox_boot.py"


@pytest.fixture
def ws(tmp_path):
    return Workspace(tmp_path / "ws", WorkspaceLimits(run_timeout_s=5.0, max_output_bytes=4000))


def run(ws: Workspace, code: str):
    ws.write("prog.py", textwrap.dedent(code))
    return ws.run_python("prog.py")


def test_ordinary_programs_work(ws):
    ws.write("data/in.txt", "3 4")
    ws.write("helper.py", "def hyp(a, b):\n    import math\n    return math.hypot(a, b)\n")
    r = run(ws, """
        import collections, json, logging, math, os, re, tempfile
        import helper
        a, b = map(int, open('data/in.txt').read().split())
        with open('data/out.json', 'w') as f:
            json.dump({'hyp': helper.hyp(a, b), 'words': re.findall('[a-z]+', 'ab cd')}, f)
        os.makedirs('x/y', exist_ok=True)
        os.rename('data/out.json', 'x/y/out.json')
        print(json.load(open('x/y/out.json')), collections.Counter('aab')['a'], math.pi > 3)
        with tempfile.TemporaryDirectory() as t:
            print(os.path.dirname(t) == os.getcwd())
        open(os.devnull, 'w').write('ignored')
        logging.warning('logged')
        """)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "{'hyp': 5.0, 'words': ['ab', 'cd']} 2 True\nTrue\n"
    assert r.stderr == "WARNING:root:logged\n"
    assert ws.read("x/y/out.json") == '{"hyp": 5.0, "words": ["ab", "cd"]}'


@pytest.fixture
def outside(tmp_path):
    """A file beside the workspace, and its path relative to the workspace root."""
    f = tmp_path / "outside.txt"
    f.write_text("original")
    return f


ESCAPES = {
    "read the repo by absolute path": (f"print(open({str(REPO_FILE)!r}).read())", "reading"),
    "read the repo through ..": (
        "import os\nprint(open(os.path.relpath(REPO_FILE)).read())", "reading"),
    "read site-packages": (f"print(open({np.__file__!r}).read())", "reading"),
    "write through ..": ("open('../outside.txt', 'w').write('changed')", "writing"),
    "append by absolute path": ("open(OUTSIDE, 'a').write('changed')", "writing"),
    "os.open for writing": ("import os\nos.open(OUTSIDE, os.O_WRONLY | os.O_TRUNC)", "writing"),
    "symlink to an absolute path outside": (
        "import os\nos.symlink(OUTSIDE, 'link')\nopen('link', 'w').write('changed')",
        "os.symlink"),
    "symlink with ..": (
        "import os\nos.symlink('../outside.txt', 'link')\nopen('link', 'w').write('changed')",
        "os.symlink"),
    "remove": ("import os\nos.remove(OUTSIDE)", "os.remove"),
    "rename out": ("import os\nos.rename(OUTSIDE, 'stolen.txt')", "os.rename"),
    "chmod": ("import os\nos.chmod(OUTSIDE, 0o777)", "os.chmod"),
    "hard link": ("import os\nos.link(OUTSIDE, 'hard')\nopen('hard', 'w').write('changed')",
                  "os.link"),
    "mkdir": ("import os\nos.mkdir('../newdir')", "os.mkdir"),
    "chdir": ("import os\nos.chdir('..')\nopen('outside.txt', 'w').write('changed')", "os.chdir"),
    "list the repo": ("import os\nprint(os.listdir(os.path.dirname(REPO_FILE)))", "os.listdir"),
    "kill the parent": ("import os\nos.kill(os.getppid(), 0)", "os.kill"),
    "killpg": ("import os\nos.killpg(os.getpgid(os.getppid()), 0)", "os.killpg"),
    "ctypes": ("import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.getppid())", "ctypes.dlopen"),
    "ctypes through pythonapi": ("import ctypes\nctypes.pythonapi.Py_GetVersion", "ctypes.dlsym"),
    "subprocess": ("import subprocess\nsubprocess.run(['cat', REPO_FILE])", "subprocess.Popen"),
    "fork_exec directly": (
        "import _posixsubprocess, os\nr, w = os.pipe()\n_posixsubprocess.fork_exec("
        "[b'/bin/cat', REPO_FILE.encode()], [b'/bin/cat'], True, (), None, None, -1, -1, -1, -1,"
        " -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)",
        "starting processes"),
    "multiprocessing": (
        "import multiprocessing\np = multiprocessing.Process(target=print)\np.start()",
        "os.fork"),
    "raise a limit": (
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", "resource.setrlimit"),
    "a native module from the workspace": (
        "import shutil, zlib, importlib.util as u\nshutil.copy(zlib.__file__, 'z.so')\n"
        "u.module_from_spec(u.spec_from_file_location('zlib', 'z.so'))", "loading native"),
    "Tcl": ("import tkinter\ntkinter.Tcl().eval('exec cat ' + REPO_FILE)", "_tkinter"),
    "readline history": (
        "import readline\nreadline.read_history_file(REPO_FILE)", "importing readline"),
    "sqlite outside": ("import sqlite3\nsqlite3.connect('../x.db')", "sqlite3.connect"),
    # The hook reads nothing a program can rebind: not builtins, not `os`, not the boot's
    # globals (reachable through frames), not `os.path.realpath`.
    "tamper with the hook's world, then read": (
        "import builtins, os, sys\nf = sys._getframe()\nwhile f.f_back:\n    f = f.f_back\n"
        "f.f_globals.clear()\nbuiltins.PermissionError = KeyError\n"
        "builtins.isinstance = lambda *a: False\n"
        "os.path.realpath = lambda p: os.getcwd() + '/x.txt'\nos.getcwd = lambda: '/'\n"
        "print(open(REPO_FILE).read())", "reading"),
}


@pytest.mark.parametrize("name", list(ESCAPES))
def test_escapes_are_refused(ws, outside, name):
    code, what = ESCAPES[name]
    prelude = f"REPO_FILE = {str(REPO_FILE)!r}\nOUTSIDE = {str(outside)!r}\n"
    r = run(ws, prelude + code + "\nprint('ESCAPED')\n")
    assert r.returncode != 0 and "ESCAPED" not in r.stdout
    assert "def " not in r.stdout  # nothing of the repo file came out
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("PermissionError: sandbox: ") and what in last, r.stderr
    assert outside.read_text() == "original"
    assert sorted(p.name for p in outside.parent.iterdir()) == ["outside.txt", "ws"]


def test_planted_symlink_is_not_followed_out(ws, outside):
    # A link that points outside (e.g. one whose relative target escaped when its directory
    # moved) is refused when used, for reading and for writing.
    os.symlink(outside, ws.root / "planted")
    for code, what in (("open('planted', 'w').write('changed')", "writing"),
                       ("print(open('planted').read())", "reading")):
        r = run(ws, code)
        assert r.returncode != 0 and "original" not in r.stdout
        assert f"PermissionError: sandbox: {what} 'planted'" in r.stderr
    assert outside.read_text() == "original"


def test_device_nodes_in_the_workspace_are_not_opened(ws):
    # Made with os.mknod (as root, with Landlock missing) a block device would be the raw disk;
    # here the test plants a harmless one (/dev/null's numbers) where it may.
    try:
        os.mknod(ws.root / "dev", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("cannot make device nodes here")
    r = run(ws, "open('dev', 'w')")
    assert "PermissionError: sandbox: opening device 'dev'" in r.stderr


def test_third_party_packages_are_not_importable(ws):
    r = run(ws, "import numpy")
    assert "ModuleNotFoundError: No module named 'numpy'" in r.stderr


def test_the_hook_looks_up_no_global_names():
    # What the tamper test above checks by example, for every name: the functions inside
    # install_guard (the hook and its helpers) read only closure cells, never globals/builtins.
    module = compile(BOOT.read_text(), str(BOOT), "exec")
    guard = next(c for c in module.co_consts if getattr(c, "co_name", "") == "install_guard")
    nested, todo = [], [c for c in guard.co_consts if isinstance(c, types.CodeType)]
    while todo:
        code = todo.pop()
        nested.append(code.co_name)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        loads = [i.argval for i in dis.get_instructions(code)
                 if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")]
        assert loads == [], (code.co_name, loads)
    assert {"hook", "real", "check_open", "resolve"} <= set(nested)


# ----- the kernel layers, each alone (the audit hook not installed) -----

def boot_probe(cwd: Path, steps: str, code: str) -> subprocess.CompletedProcess:
    """Runs `code` in a child after `steps` (calls of sandbox_boot functions), no audit hook."""
    prelude = (f"import ctypes, os, sys\nns = {{'__name__': 'probe'}}\n"
               f"exec(open({str(BOOT)!r}).read(), ns)\n"
               "libc = ctypes.CDLL(None, use_errno=True)\n")
    return subprocess.run([sys.executable, "-I", "-B", "-c", prelude + steps + "\n" + code],
                          cwd=cwd, capture_output=True, text=True, timeout=60)


def test_network_namespace_alone_stops_raw_syscalls(tmp_path):
    if not sandbox_layers()["network_namespace"]:
        pytest.skip("no network namespaces here: only the audit-hook layer holds")
    # A raw connect through ctypes (what native code would do) meets an empty namespace.
    code = ("import socket, struct\nfd = libc.socket(2, 1, 0)\n"
            "addr = struct.pack('<HH4s8x', 2, socket.htons(80), bytes([1, 1, 1, 1]))\n"
            "print('rc', libc.connect(fd, addr, len(addr)))")
    r = boot_probe(tmp_path, "assert ns['enter_network_namespace'](libc)", code)
    assert r.stdout.strip() == "rc -1", r.stderr


def test_landlock_alone_confines_files_processes_and_signals(tmp_path, outside):
    layers = sandbox_layers()
    if not layers["landlock_files"]:
        pytest.skip("no Landlock here: only the audit-hook layer confines files")
    ws = tmp_path / "ws"
    ws.mkdir()
    checks = {
        "read_repo": f"open({str(REPO_FILE)!r}).read()",
        "write_outside": "open('../outside.txt', 'w')",
        "symlink_out": f"os.symlink({str(outside)!r}, 'l'); open('l', 'w')",
        "exec": "import subprocess; subprocess.run(['/bin/true'])",
        "list_repo": f"os.listdir({str(REPO_FILE.parent)!r})",
    }
    if layers["landlock_signals"]:
        checks["kill_parent"] = "os.kill(os.getppid(), 0)"
    code = "import json\nout = {}\n" + "".join(
        f"try:\n    {stmt}\n    out[{name!r}] = 'allowed'\n"
        f"except OSError as e:\n    out[{name!r}] = e.errno\n" for name, stmt in checks.items())
    code += ("open('own.txt', 'w').write('mine')\nout['own'] = open('own.txt').read()\n"
             "import decimal, zlib\nout['stdlib'] = zlib.crc32(b'x')\nprint(json.dumps(out))")
    steps = "assert ns['restrict_files'](libc, os.getcwd(), ns['stdlib_dirs']()) >= 1"
    r = boot_probe(ws, steps, code)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    expect = {name: errno.EACCES for name in checks}
    if "kill_parent" in checks:
        expect["kill_parent"] = errno.EPERM
    assert out == {**expect, "own": "mine", "stdlib": zlib.crc32(b"x")}
    assert outside.read_text() == "original"
