"""The `run_python` sandbox, in both of its modes: under bubblewrap each escape fails in the
kernel (the file, process or network it reaches for does not exist for the program, or the
call is refused), and without bubblewrap (the legacy layers) each is refused by the audit hook
with a `sandbox:` error; ordinary programs work in both, and each legacy kernel layer (network
namespace, Landlock) holds on its own where this machine has it."""

import dataclasses
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
from avalon.org import sandbox
from avalon.org.workspace import Workspace, WorkspaceLimits
from tests.security.layers import require_bwrap

REPO_FILE = Path(avalon.__file__).resolve().parent / "envs" / "software" / "functions.py"
GUARD = Path(avalon.__file__).resolve().parent / "org" / "sandbox_guard.py"
LEGACY = dataclasses.replace(sandbox.Layers(False, False, True, False, "test"))


@pytest.fixture(params=["bubblewrap", "legacy"])
def mode(request, monkeypatch):
    if request.param == "bubblewrap":
        require_bwrap()
        assert sandbox.layers().bubblewrap, sandbox.layers().why
    else:
        monkeypatch.setattr(sandbox, "layers", lambda: LEGACY)
    return request.param


@pytest.fixture
def ws(tmp_path, mode):
    return Workspace(tmp_path / "ws", WorkspaceLimits(run_timeout_s=5.0, max_output_bytes=4000))


def run(ws: Workspace, code: str):
    ws.write("prog.py", textwrap.dedent(code))
    return ws.run_python("prog.py")


def test_ordinary_programs_work(ws):
    ws.write("data/in.txt", "3 4")
    ws.write("helper.py", "def hyp(a, b):\n    import math\n    return math.hypot(a, b)\n")
    r = run(ws, """
        import asyncio, collections, json, logging, math, os, re, tempfile, threading
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
        late = []
        threading.Thread(target=lambda: late.append(print('a thread at exit'))).start()
        print(asyncio.run(asyncio.sleep(0, 'async')))
        """)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("{'hyp': 5.0, 'words': ['ab', 'cd']} 2 True\nTrue\n"
                        "a thread at exit\nasync\n")
    assert r.stderr == "WARNING:root:logged\n"
    assert ws.read("x/y/out.json") == '{"hyp": 5.0, "words": ["ab", "cd"]}'
    assert r.changed == ("x/y/out.json",)


@pytest.fixture
def outside(tmp_path):
    """A file beside the workspace, and its path relative to the workspace root."""
    f = tmp_path / "outside.txt"
    f.write_text("original")
    return f


# Under bubblewrap: the program's view holds no path of the machine but the interpreter's and
# the libraries' (read-only), and no process but its own and its supervisor.
KERNEL_ESCAPES = {
    "read the repo by absolute path": f"print(open({str(REPO_FILE)!r}).read())",
    "read the trainer's memory": "print(open('/proc/1/maps').read())",
    "write through ..": "open('../outside.txt', 'w').write('changed')",
    "append by absolute path": "open(OUTSIDE, 'a').write('changed')",
    "write the interpreter": "import os\nopen(os.__file__, 'a').write('changed')",
    "symlink out, then write": "import os\nos.symlink(OUTSIDE, 'link')\n"
                               "open('link', 'w').write('changed')",
    "remove": "import os\nos.remove(OUTSIDE)",
    "rename out": "import os\nos.rename('prog.py', '/prog.py')",
    "chmod": "import os\nos.chmod(OUTSIDE, 0o777)",
    "mkdir at the root": "import os\nos.mkdir('/newdir')",
    "write /dev/shm": "open('/dev/shm/x', 'w').write('x')",
    "write /tmp": "open('/tmp/x', 'w').write('x')",
    "list the repo": "import os\nprint(os.listdir(os.path.dirname(REPO_FILE)))",
    "signal the trainer": "import os\nos.kill(TRAINER, 0)",
    "subprocess": "import subprocess\nsubprocess.run(['cat', REPO_FILE])",
    "fork_exec directly": (
        "import _posixsubprocess, os\nr, w = os.pipe()\n_posixsubprocess.fork_exec("
        "[b'/bin/cat', REPO_FILE.encode()], [b'/bin/cat'], True, (), None, None, -1, -1, -1, -1,"
        " -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)"),
    "multiprocessing": "import multiprocessing\np = multiprocessing.Process(target=print)\n"
                       "p.start()",
    "raise a limit": "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
    "connect": "import socket\ns = socket.create_connection(('127.0.0.1', 9), timeout=2)",
    "sqlite outside": "import sqlite3\nsqlite3.connect('/x.db').execute('create table t(a)')",
    "raw syscalls through ctypes": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.syscall(103, 10, 0, 0) < 0  # syslog\n"
        "assert libc.syscall(425, 4, 0) < 0  # io_uring_setup\n"
        "assert libc.syscall(321, 0, 0, 0) < 0  # bpf\n"
        "raise PermissionError(ctypes.get_errno(), 'all refused')"),
}


@pytest.mark.parametrize("name", list(KERNEL_ESCAPES))
def test_escapes_fail_in_the_kernel(ws, outside, mode, name):
    if mode != "bubblewrap":
        pytest.skip("the legacy layers: test_escapes_are_refused_by_the_hook")
    if name == "raw syscalls through ctypes" and os.uname().machine != "x86_64":
        pytest.skip("syscall numbers of x86-64")
    prelude = (f"REPO_FILE = {str(REPO_FILE)!r}\nOUTSIDE = {str(outside)!r}\n"
               f"TRAINER = {os.getpid()}\n")
    r = run(ws, prelude + KERNEL_ESCAPES[name] + "\nprint('ESCAPED')\n")
    assert r.returncode != 0 and "ESCAPED" not in r.stdout, (r.stdout, r.stderr)
    assert "def " not in r.stdout  # nothing of the repo file came out
    last = r.stderr.strip().splitlines()[-1]
    assert last.split(":")[0] in ("PermissionError", "FileNotFoundError", "OSError",
                                  "ProcessLookupError", "sqlite3.OperationalError",
                                  "ValueError"), r.stderr  # (setrlimit: EPERM)
    assert outside.read_text() == "original"
    assert sorted(p.name for p in outside.parent.iterdir()) == ["outside.txt", "ws"]


# Without bubblewrap: the audit hook refuses each with a readable error.
HOOK_ESCAPES = {
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
    "remove": ("import os\nos.remove(OUTSIDE)", "os.remove"),
    "rename out": ("import os\nos.rename(OUTSIDE, 'stolen.txt')", "os.rename"),
    "chdir": ("import os\nos.chdir('..')\nopen('outside.txt', 'w').write('changed')", "os.chdir"),
    "kill the parent": ("import os\nos.kill(os.getppid(), 0)", "os.kill"),
    "ctypes": ("import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.getppid())", "ctypes.dlopen"),
    "subprocess": ("import subprocess\nsubprocess.run(['cat', REPO_FILE])", "subprocess.Popen"),
    "raise a limit": (
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", "resource.setrlimit"),
    "a native module from the workspace": (
        "import shutil, zlib, importlib.util as u\nshutil.copy(zlib.__file__, 'z.so')\n"
        "u.module_from_spec(u.spec_from_file_location('zlib', 'z.so'))", "loading native"),
    "sqlite outside": ("import sqlite3\nsqlite3.connect('../x.db')", "sqlite3.connect"),
    "tamper with the hook's world, then read": (
        "import builtins, os, sys\nf = sys._getframe()\nwhile f.f_back:\n    f = f.f_back\n"
        "f.f_globals.clear()\nbuiltins.PermissionError = KeyError\n"
        "builtins.isinstance = lambda *a: False\n"
        "os.path.realpath = lambda p: os.getcwd() + '/x.txt'\nos.getcwd = lambda: '/'\n"
        "print(open(REPO_FILE).read())", "reading"),
}


@pytest.mark.parametrize("name", list(HOOK_ESCAPES))
def test_escapes_are_refused_by_the_hook(ws, outside, mode, name):
    if mode != "legacy":
        pytest.skip("under bubblewrap: test_escapes_fail_in_the_kernel")
    code, what = HOOK_ESCAPES[name]
    prelude = f"REPO_FILE = {str(REPO_FILE)!r}\nOUTSIDE = {str(outside)!r}\n"
    r = run(ws, prelude + code + "\nprint('ESCAPED')\n")
    assert r.returncode != 0 and "ESCAPED" not in r.stdout
    assert "def " not in r.stdout
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("PermissionError: sandbox: ") and what in last, r.stderr
    assert outside.read_text() == "original"


def test_a_planted_symlink_is_not_followed_out(ws, outside, mode):
    # A link that points outside: under bubblewrap it is not copied into the sandbox (the
    # program sees no such file); without, the hook refuses it when used.
    os.symlink(outside, ws.root / "planted")
    r = run(ws, "print(open('planted').read())")
    assert r.returncode != 0 and "original" not in r.stdout
    r = run(ws, "open('planted', 'w').write('changed')")
    assert outside.read_text() == "original"
    if mode == "bubblewrap":  # a file of the program's own, which replaced the link
        assert r.returncode == 0 and ws.read("planted") == "changed"


def test_device_nodes_in_the_workspace_are_not_opened(ws, mode):
    try:
        os.mknod(ws.root / "dev", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("cannot make device nodes here")
    r = run(ws, "import os, stat\ntry:\n    fd = os.open('dev', os.O_WRONLY)\n"
                "    print('OPENED', stat.S_ISCHR(os.fstat(fd).st_mode))\n"
                "except OSError as e:\n    print('refused', e.errno)\n")
    assert "OPENED True" not in r.stdout, (r.stdout, r.stderr)


def test_third_party_packages_are_not_importable(ws):
    r = run(ws, "import numpy")
    assert "ModuleNotFoundError: No module named 'numpy'" in r.stderr


def test_the_legacy_hook_looks_up_no_global_names():
    # The functions inside install_guard (the hook and its helpers) read only closure cells,
    # never globals/builtins: a program that rebinds them does not change the hook.
    module = compile(GUARD.read_text(), str(GUARD), "exec")
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


# ----- the legacy kernel layers, each alone (no audit hook) -----

def guard_probe(cwd: Path, steps: str, code: str) -> subprocess.CompletedProcess:
    """Runs `code` in a child after `steps` (calls of sandbox_guard functions), no hook."""
    prelude = (f"import ctypes, os, sys\nns = {{'__name__': 'probe'}}\n"
               f"exec(open({str(GUARD)!r}).read(), ns)\n"
               "libc = ctypes.CDLL(None, use_errno=True)\n")
    return subprocess.run([sys.executable, "-I", "-B", "-c", prelude + steps + "\n" + code],
                          cwd=cwd, capture_output=True, text=True, timeout=60)


def test_network_namespace_alone_stops_raw_syscalls(tmp_path):
    if not sandbox._probe_netns():
        pytest.skip("no network namespaces here")
    code = ("import socket, struct\nfd = libc.socket(2, 1, 0)\n"
            "addr = struct.pack('<HH4s8x', 2, socket.htons(80), bytes([1, 1, 1, 1]))\n"
            "print('rc', libc.connect(fd, addr, len(addr)))")
    r = guard_probe(tmp_path, "assert ns['enter_network_namespace'](libc)", code)
    assert r.stdout.strip() == "rc -1", r.stderr


def test_landlock_alone_confines_files_processes_and_signals(tmp_path, outside):
    abi = sandbox._probe_landlock()
    if abi < 1:
        pytest.skip("no Landlock here")
    ws = tmp_path / "ws"
    ws.mkdir()
    checks = {
        "read_repo": f"open({str(REPO_FILE)!r}).read()",
        "write_outside": "open('../outside.txt', 'w')",
        "symlink_out": f"os.symlink({str(outside)!r}, 'l'); open('l', 'w')",
        "exec": "import subprocess; subprocess.run(['/bin/true'])",
        "list_repo": f"os.listdir({str(REPO_FILE.parent)!r})",
    }
    if abi >= 6:
        checks["kill_parent"] = "os.kill(os.getppid(), 0)"
    code = "import json\nout = {}\n" + "".join(
        f"try:\n    {stmt}\n    out[{name!r}] = 'allowed'\n"
        f"except OSError as e:\n    out[{name!r}] = e.errno\n" for name, stmt in checks.items())
    code += ("open('own.txt', 'w').write('mine')\nout['own'] = open('own.txt').read()\n"
             "import decimal, zlib\nout['stdlib'] = zlib.crc32(b'x')\nprint(json.dumps(out))")
    steps = "assert ns['restrict_files'](libc, os.getcwd(), ns['stdlib_dirs']()) >= 1"
    r = guard_probe(ws, steps, code)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    expect = {name: errno.EACCES for name in checks}
    if "kill_parent" in checks:
        expect["kill_parent"] = errno.EPERM
    assert out == {**expect, "own": "mine", "stdlib": zlib.crc32(b"x")}
    assert outside.read_text() == "original"


def test_the_trainers_uid_mode_is_read_only_but_the_workspace_and_holds_nothing(tmp_path,
                                                                              monkeypatch):
    """A trainer that is not root cannot give the sandbox a uid of its own: the sandbox runs as
    uid 0 of its user namespace (the trainer's uid outside), still with no capability, and its
    root and /dev are read-only (else a tmpfs without a cap)."""
    require_bwrap()
    monkeypatch.setattr(sandbox, "own_uid", lambda: False)
    ws = Workspace(tmp_path / "ws", WorkspaceLimits(run_timeout_s=5.0))
    r = run(ws, """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        hdr, caps = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
        libc.capget(hdr, caps)
        print(os.getuid(), any(caps), libc.prctl(23, 21, 0, 0, 0))  # CAP_SYS_ADMIN bounded?
        for p in ['/x', '/dev/x', '/dev/shm/x']:
            try:
                open(p, 'w')
                print('wrote', p)
            except OSError as e:
                print(e.strerror)
        open('/dev/null', 'w').write('fine')
        open('mine.txt', 'w').write('kept')
        """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:4] == ["0 False 0", "Read-only file system",
                                        "Read-only file system", "Read-only file system"]
    assert ws.read("mine.txt") == "kept"


def test_missing_layers_are_said_once_at_start_up(tmp_path, monkeypatch, caplog):
    import threading
    monkeypatch.setattr(sandbox, "layers", lambda: LEGACY)
    monkeypatch.setattr(sandbox, "_reported", threading.Event())
    with caplog.at_level("WARNING", logger="avalon.org.sandbox"):
        Workspace(tmp_path / "a")
        Workspace(tmp_path / "b")
    said = [r.getMessage() for r in caplog.records if r.name == "avalon.org.sandbox"]
    assert len(said) == 1 and "bubblewrap (test)" in said[0] and "Landlock" in said[0], said
