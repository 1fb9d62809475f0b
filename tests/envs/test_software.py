"""Environment 3, software build: grading, one test per known reward hack, and the teacher,
in-process and over ORS. Submissions are tiny programs; each grading is one sandboxed run."""

import json
import os
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import avalon
from avalon.envs.base import Split
from avalon.envs.software import BY_NAME, FAMILIES, SUBMIT, SoftwareBuild, SoftwareConfig, same
from avalon.envs.software.grader import make_cases
from avalon.org.env import EndReason, ToolError
from avalon.org.workspace import Workspace
from tests.envs.helpers import BYTES, MODES, Direct, environment, run_teacher, totals

LOCAL = SoftwareBuild(SoftwareConfig(n_train=64, n_heldout=8))
HAND = SoftwareBuild(SoftwareConfig(n_train=64, n_heldout=8, n_functions=(2, 3),
                                    hand_written=True))
REPO = str(Path(avalon.__file__).resolve().parent.parent)
REFERENCE = str(Path(avalon.__file__).resolve().parent / "envs" / "software" / "functions.py")


@pytest.fixture(scope="module", params=MODES)
def env(request):
    with environment(LOCAL, request.param) as e:
        yield e


def reference_solution(names) -> str:
    return "\n\n".join(BY_NAME[n].source for n in names)


def submit(env, tid, code: str | None, seed: int = 0):
    """Writes solution.py (None: leave the stub) and submits; returns (reward, direct)."""
    d = Direct(env, tid, seed=seed)
    if code is not None:
        d.ws.write("solution.py", code)
    out = d.call("submit")
    assert out.terminal and out.duration_s == LOCAL.config.grade_cost_s
    return sum(r.value for r in out.rewards), d


def test_start_lays_out_stubs_and_a_correct_solution_scores_one(env):
    tid = env.task_ids(Split.TRAIN)[0]
    names = LOCAL.spec(tid).functions
    d = Direct(env, tid)
    stub = d.ws.read("solution.py")  # written by on_start (over ORS: mirrored back)
    assert all(f"def {n}(" in stub for n in names) and "NotImplementedError" in stub
    d.end()
    reward, d = submit(env, tid, None)
    assert reward == 0.0
    reward, d = submit(env, tid, reference_solution(names))
    assert reward == pytest.approx(1.0)
    with pytest.raises(ToolError, match="already submitted"):
        d.call("submit")
    assert d.end().rewards == ()  # graded once


def test_partial_credit_per_function(env):
    tid = next(t for t in env.task_ids(Split.TRAIN) if len(LOCAL.spec(t).functions) == 3)
    names = LOCAL.spec(tid).functions
    reward, _ = submit(env, tid, reference_solution(names[:2]))
    assert reward == pytest.approx(2 / 3)


def test_unsubmitted_work_is_graded_at_the_end(env):
    # A rollout cut off by the clock still yields its reward.
    tid = env.task_ids(Split.TRAIN)[1]
    d = Direct(env, tid)
    d.ws.write("solution.py", reference_solution(LOCAL.spec(tid).functions))
    final = d.end(EndReason.WALL_CLOCK)
    assert sum(r.value for r in final.rewards) == pytest.approx(1.0)
    assert final.metrics["pass_rate"] == 1.0


def test_hidden_inputs_are_fresh_per_session():
    names = [f.name for f in FAMILIES]
    a = make_cases(names, np.random.default_rng([0, 1]), 12)
    b = make_cases(names, np.random.default_rng([1, 1]), 12)
    assert [c[:2] for c in a] != [c[:2] for c in b]


def test_lookup_table_of_the_examples_fails(env):
    # Hack: memorise the shown examples. Hidden tests use fresh inputs.
    tid = env.task_ids(Split.TRAIN)[2]
    spec = LOCAL.spec(tid)
    code = "TABLE = " + repr({(n, json.dumps(list(a))): e for n, a, e in spec.examples}) + "\n"
    code += "import json\n"
    for name in spec.functions:
        code += (f"def {name}(*args):\n"
                 f"    return TABLE.get(({name!r}, json.dumps(list(args))))\n")
    assert submit(env, tid, code)[0] == 0.0


def test_constant_answers_fail():
    # Hack: a constant-answer floor. No family's most common output covers even 60% of its
    # generated cases, and a function scores only if it passes every hidden test.
    for fam in FAMILIES:
        rng = np.random.default_rng(5)
        ref = fam.reference()
        outs = Counter(json.dumps(ref(*fam.gen(rng))) for _ in range(400))
        assert outs.most_common(1)[0][1] / 400 < 0.6, fam.name
    tid = LOCAL.task_ids(Split.TRAIN)[3]
    for constant in ("0", "''", "[]", "True", "False", "1"):
        code = "".join(f"def {n}(*a):\n    return {constant}\n" for n in LOCAL.spec(tid).functions)
        assert submit(LOCAL, tid, code)[0] == 0.0


def test_reference_implementations_cannot_be_imported_or_read(env):
    tid = env.task_ids(Split.TRAIN)[4]
    names = LOCAL.spec(tid).functions
    # Hack: run the grader's own reference implementations.
    hack = (f"ns = {{}}\nexec(open({REFERENCE!r}).read(), ns)\n"
            + "".join(f"{n} = ns['BY_NAME'][{n!r}].reference()\n" for n in names))
    # An agent's run_code (the org sandbox) cannot read the file either ...
    with tempfile.TemporaryDirectory() as tmp:
        ws = Workspace(tmp)
        ws.write("solution.py", hack)
        ws.write("probe.py", f"import solution\nprint(solution.{names[0]} is not None)\n")
        r = ws.run_python("probe.py")
        assert r.returncode != 0 and "True" not in r.stdout
        # (the audit hook's refusal without bubblewrap; under it the file is not there)
        assert "sandbox: reading" in r.stderr or "FileNotFoundError" in r.stderr, r.stderr
    # ... and the grader refuses to read anything outside the submission and the stdlib.
    reward, d = submit(env, tid, hack)
    assert reward == 0.0
    if env is LOCAL:
        assert set(d.session.report.errors.values()) in ({"import PermissionError"},
                                                         {"import FileNotFoundError"})
    # Importing the trainer's package is refused by name too.
    code = (f"import sys\nsys.path.insert(0, {REPO!r})\nimport avalon\n"
            + reference_solution(names))
    reward, d = submit(env, tid, code)
    assert reward == 0.0


def test_writes_are_refused_and_the_workspace_is_untouched(env):
    # Hack: write outside the workspace, or edit files, while being graded. The grader runs a
    # copy with every write refused; a correct submission still scores.
    tid = env.task_ids(Split.TRAIN)[5]
    names = LOCAL.spec(tid).functions
    outside = Path(tempfile.gettempdir()) / "avalon-test-escape.txt"
    outside.unlink(missing_ok=True)
    probes = (f"import os\nfor attempt in (lambda: open({str(outside)!r}, 'w'),\n"
              "                lambda: open('../escape.txt', 'w'),\n"
              "                lambda: open('cases.json', 'w'),\n"
              "                lambda: os.remove('solution.py')):\n"
              "    try:\n        attempt()\n        raise SystemExit('a write got through')\n"
              "    except PermissionError:\n        pass\n")
    d = Direct(env, tid)
    d.ws.write("solution.py", probes + reference_solution(names))
    before = {p: d.ws.read(p) for p in d.ws.listdir(".")}
    out = d.call("submit")
    assert sum(r.value for r in out.rewards) == pytest.approx(1.0)
    assert not outside.exists()
    assert {p: d.ws.read(p) for p in d.ws.listdir(".")} == before
    d.end()


@pytest.mark.parametrize("trick", ["fake_results", "exit_zero", "rigged_eq", "bool_for_int"])
def test_faked_results_fail(trick):
    env = HAND
    tid = next(t for t in env.task_ids(Split.TRAIN) if "digit_sum" in HAND.spec(t).functions)
    names = HAND.spec(tid).functions
    header = "import json, os, sys\n"
    if trick == "fake_results":  # print and write results that claim success, then go on
        header += ("print(json.dumps([{'value': True}] * 100))\n"
                   "sys.stdout.flush()\n")
        body = "".join(f"def {n}(*a):\n    return None\n" for n in names)
    elif trick == "exit_zero":  # leave before the harness runs anything, with status 0
        header += "os._exit(0)\n"
        body = reference_solution(names)
    elif trick == "rigged_eq":  # an object equal to everything
        header += "class Any:\n    def __eq__(self, o):\n        return True\n"
        body = "".join(f"def {n}(*a):\n    return Any()\n" for n in names)
    else:  # True where an int is expected (True == 1 in Python): compared type-strictly
        body = reference_solution([n for n in names if n != "digit_sum"])
        body += "\ndef digit_sum(n):\n    return bool(sum(int(c) for c in str(n)) % 2) \n"
    reward, _ = submit(env, tid, header + body)
    share = 1 / len(names)
    assert reward == pytest.approx((len(names) - 1) * share if trick == "bool_for_int" else 0.0)


def test_symlinked_files_are_not_graded():
    # Hack: point solution.py at the reference implementations (or any file outside).
    tid = LOCAL.task_ids(Split.TRAIN)[6]
    d = Direct(LOCAL, tid)
    os.unlink(d.ws.root / "solution.py")
    os.symlink(REFERENCE, d.ws.root / "solution.py")
    assert sum(r.value for r in d.call("submit").rewards) == 0.0
    assert d.session.report.errors[LOCAL.spec(tid).functions[0]].startswith("import")


def test_endless_loops_time_out():
    env = SoftwareBuild(SoftwareConfig(n_train=4, n_heldout=1, grade_timeout_s=1.0))
    tid = env.task_ids(Split.TRAIN)[0]
    code = "while True:\n    pass\n"
    reward, d = submit(env, tid, code)
    assert reward == 0.0 and d.session.report.timed_out


def test_same_is_type_strict():
    assert same([1, "a", {"k": [True]}], [1, "a", {"k": [True]}])
    assert not same(1, True) and not same(1, 1.0) and not same([1], [1, 2])


def test_submit_is_ceo_only_and_heldout_differs_from_train():
    assert SUBMIT.grantable is False
    train = {LOCAL.spec(t).functions for t in LOCAL.task_ids(Split.TRAIN)}
    assert not any(LOCAL.spec(t).functions in train for t in LOCAL.task_ids(Split.HELDOUT))


def test_teacher_builds_heldout_tasks(env):
    ids = env.task_ids(Split.HELDOUT)[:2]
    policy = LOCAL.teacher(BYTES)
    sessions = [env.session(t, i) for i, t in enumerate(ids + ids)]
    result = run_teacher(policy, BYTES, sessions, [0, 0, 2, 2], window=16384)  # the GPU config's
    assert totals(result).tolist() == [1.0] * 4
    assert policy.cut_turns == 0
    assert [g.rollouts[0].hires for g in result.groups] == [0, 0, 2, 2]
    for g in result.groups:
        assert g.rollouts[0].metrics["tool_error_turns"] == 0


def test_heldout_functions_appear_in_no_training_task():
    # Hack: memorise the training functions. Held-out tasks ask for generated pipelines of
    # their own bucket, so not one held-out function was ever asked for in training.
    from avalon.envs.software import generated
    train = {f for t in LOCAL.task_ids(Split.TRAIN) for f in LOCAL.spec(t).functions}
    heldout = {f for t in LOCAL.task_ids(Split.HELDOUT) for f in LOCAL.spec(t).functions}
    assert len(train) > 150 and len(heldout) > 20 and not train & heldout
    assert {generated.bucket(f) for f in heldout} == {0} and 0 not in {
        generated.bucket(f) for f in train}
    # The name spells the pipeline: its spec and reference come back from the name alone.
    name = sorted(heldout)[0]
    assert name in BY_NAME and BY_NAME[name].source.startswith(f"def {name}(xs):")
    assert "not_a__pipeline" not in BY_NAME and "sum" not in BY_NAME


def test_generated_functions_have_no_constant_answer_floor():
    names = sorted({f for t in LOCAL.task_ids(Split.TRAIN) for f in LOCAL.spec(t).functions})
    for name in names[:60]:
        fam = BY_NAME[name]
        ref, rng = fam.reference(), np.random.default_rng(11)
        outs = Counter(json.dumps(ref(*fam.gen(rng))) for _ in range(200))
        assert outs.most_common(1)[0][1] / 200 < 0.6, name
