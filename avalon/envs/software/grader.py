"""The software-build grader: hidden tests that the submission can neither see nor influence.

`grade(workspace, functions, rng, limits)`:
1. draws fresh inputs for every function (the caller's generator, seeded from the session, so
   a lookup table of shown examples or of earlier rollouts fails) and computes the expected
   outputs with the reference implementations, here, in the parent process;
2. copies the workspace's top-level `*.py` files (regular files only, read by descriptor: a
   symlink could smuggle a file from outside in) into a fresh temporary directory outside the
   workspace, with the inputs (`cases.json`, inputs only) and a harness;
3. runs the harness in the org sandbox (`Workspace.run_python`: time, memory and file-size
   limits, no network, no subprocesses). Before importing the submission the harness opens
   its result file and adds a stricter audit hook: reads only inside its directory and the
   standard library, no writes at all, no deleting/renaming/chmod/chdir, no signals, no
   ctypes, and no importing `avalon`, so the submission cannot read this grader, the reference
   implementations or anything else of the trainer's, and cannot touch its workspace;
4. reads the outputs back (as JSON, so an object with a rigged `__eq__` becomes plain data or
   an error; size- and depth-bounded, since the submission can write that file) and compares
   them with the expected outputs here, type-strictly (True is not 1).
The submission never holds an expected output, so printing fake results, exiting early with
status 0, monkeypatching the harness or writing to its result file can only lose cases.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from avalon.envs.software.functions import BY_NAME
from avalon.org.env import ToolError
from avalon.org.workspace import Workspace, WorkspaceLimits

HARNESS_FILES = ("_avalon_grade.py", "cases.json", "results.json")
MAX_RESULT_DEPTH = 64  # of results.json; the functions' outputs nest a few levels

_HARNESS = r'''
import json, os, sys, sysconfig


def _main():
    root = os.path.realpath(os.getcwd())
    stdlib = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
    roots = tuple([root] + sorted(stdlib))
    with open("cases.json") as f:
        cases = json.load(f)
    out = open("results.json", "w")
    writing = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    blocked = frozenset({
        "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
        "os.symlink", "os.truncate", "os.utime", "os.chdir", "os.chflags", "os.chroot",
        "os.kill", "os.killpg", "signal.pthread_kill", "os.setxattr", "os.removexattr",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function",
        "shutil.rmtree", "shutil.move", "shutil.copyfile", "shutil.copytree"})

    def guard(event, args):
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int):
                return
            write = any(c in mode for c in "wax+") if isinstance(mode, str) else False
            if write or (isinstance(flags, int) and flags & writing):
                raise PermissionError("grader: writing files is not allowed")
            real = os.path.realpath(os.fsdecode(path))
            if not any(real == r or real.startswith(r + os.sep) for r in roots):
                raise PermissionError("grader: reading outside the submission is not allowed")
        elif event == "import":
            name = args[0] or ""
            if name == "avalon" or name.startswith("avalon."):
                raise PermissionError("grader: importing avalon is not allowed")
        elif event in blocked:
            raise PermissionError("grader: " + event + " is not allowed")

    sys.addaudithook(guard)
    results = []
    try:
        import solution
    except BaseException as e:
        results = [{"error": "import " + type(e).__name__}] * len(cases)
    else:
        for name, args in cases:
            try:
                value = getattr(solution, name)(*args)
                results.append({"value": json.loads(json.dumps(value, allow_nan=False))})
            except BaseException as e:
                results.append({"error": type(e).__name__})
    out.write(json.dumps(results))
    out.close()


_main()
'''


@dataclasses.dataclass(frozen=True)
class GradeReport:
    passed: dict[str, int]  # function -> hidden tests passed
    total: dict[str, int]  # function -> hidden tests run
    errors: dict[str, str]  # function -> the first error seen ("" when none)
    timed_out: bool

    def rate(self, name: str) -> float:
        return self.passed[name] / self.total[name]


def same(a: Any, b: Any) -> bool:
    """Type-strict equality of JSON values (True is not 1, 1 is not 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def make_cases(functions: Sequence[str], rng: np.random.Generator,
               n_per_function: int) -> list[tuple[str, list, Any]]:
    """(function, args, expected) hidden cases, expected computed by the references."""
    cases = []
    for name in functions:
        fam = BY_NAME[name]
        ref = fam.reference()
        for _ in range(n_per_function):
            args = list(fam.gen(rng))
            cases.append((name, _json(args), _json(ref(*args))))
    return cases


def grade(workspace: Workspace, functions: Sequence[str], rng: np.random.Generator,
          n_per_function: int, limits: WorkspaceLimits) -> GradeReport:
    """Runs fresh hidden tests against the workspace's code (see the module docstring)."""
    cases = make_cases(functions, rng, n_per_function)
    total = {f: n_per_function for f in functions}
    passed = dict.fromkeys(functions, 0)
    errors = dict.fromkeys(functions, "")
    with tempfile.TemporaryDirectory(prefix="avalon-grade-") as tmp:
        graded = Workspace(tmp, limits)
        for rel in workspace.listdir("."):
            if "/" in rel or not rel.endswith(".py") or rel in HARNESS_FILES:
                continue
            try:  # regular files only, read by descriptor (no link followed), size-capped
                graded.write_bytes(rel, workspace.read_bytes(rel))
            except ToolError:
                continue
        with open(os.path.join(tmp, "cases.json"), "w") as f:
            json.dump([[name, args] for name, args, _ in cases], f)
        with open(os.path.join(tmp, HARNESS_FILES[0]), "w") as f:
            f.write(_HARNESS)
        run = graded.run_python(HARNESS_FILES[0])
        results = _read_results(graded, len(cases))
    for (name, _, expected), got in zip(cases, results):
        if isinstance(got, dict) and "value" in got and same(got["value"], expected):
            passed[name] += 1
        elif not errors[name]:
            errors[name] = str(got.get("error", "wrong answer")) if isinstance(got, dict) \
                else "no result"
    if run.timed_out or run.returncode != 0:
        for name in functions:
            errors[name] = errors[name] or ("timed out" if run.timed_out else
                                            f"exit {run.returncode}: {run.stderr[-200:]}")
    return GradeReport(passed, total, errors, run.timed_out)


def json_depth(text: str) -> int:
    """The deepest nesting of JSON arrays and objects in `text` (brackets inside strings not
    counted); linear time and no recursion, so a hostile file costs nothing to measure."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _read_results(graded: Workspace, n: int) -> list:
    """The harness's results, or `n` missing results when there are none to trust.

    The file is the submission's to spoil (it runs in the harness's process), so it is read
    like any workspace file (a regular file, at most `max_file_bytes`) and parsed only when
    its nesting is at most `MAX_RESULT_DEPTH` (deeper JSON would exhaust the parser's stack)."""
    try:
        text = graded.read_bytes("results.json").decode("utf-8", errors="replace")
    except ToolError:
        return [None] * n
    if json_depth(text) > MAX_RESULT_DEPTH:
        return [None] * n
    try:
        results = json.loads(text)
    except ValueError:
        return [None] * n
    if not isinstance(results, list) or len(results) != n:
        return [None] * n
    return results
