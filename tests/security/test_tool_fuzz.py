"""Property-based fuzz (`hypothesis`) of every tool of every environment, and of the
organisation's own tools, with the arguments a model could write: Unicode digits ('²', '٣',
'１'), separators, control, bidi and zero-width characters, lone surrogates, huge and negative
numbers, ids that almost match. Bounded and derandomized, so the default suite stays fast and
repeatable (`-m slow` plays ten times as many).

What must hold:
- session level (every environment, every tool): a call whose arguments pass the tool's
  `Param` types (what the organisation lets through) returns a `ToolOutcome` or raises
  `ToolError`; nothing else leaves `call`, and `on_end` still returns a `FinalOutcome`;
- driver level (in-process and over ORS with the Avalon extension): a rollout of generated
  calls, org tools and the environment's, written as raw call text with JSON escapes, never
  raises out of `RolloutDriver.run` and ends.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from avalon.envs import (
    HiddenProfile,
    OrsEnvironment,
    OrsServer,
    ParallelConfig,
    ParallelSubtasks,
    ProfileConfig,
    SoftwareBuild,
    SoftwareConfig,
    Split,
    Verification,
    VerificationConfig,
    Wealth,
)
from avalon.envs.escalation import Escalation
from avalon.envs.safety import ScenarioEnv, suite
from avalon.org.env import (
    CallContext,
    EndContext,
    EndReason,
    FinalOutcome,
    ParamType,
    ToolError,
    ToolOutcome,
)
from avalon.org.tools import SPECS
from avalon.org.workspace import Workspace, WorkspaceLimits
from experiments.security.play import play

LIMITS = WorkspaceLimits(run_timeout_s=2.0, max_total_bytes=1 << 20, max_files=64)
ENVS = {
    "parallel": ParallelSubtasks(ParallelConfig(n_train=4, n_heldout=2)),
    "hidden_profile": HiddenProfile(ProfileConfig(n_train=4, n_heldout=2)),
    "software": SoftwareBuild(SoftwareConfig(n_train=4, n_heldout=2, grade_timeout_s=2.0)),
    "wealth": Wealth(),
    "verification": Verification(VerificationConfig(n_train=4, n_heldout=2)),
    "escalation": Escalation(ParallelSubtasks(ParallelConfig(n_train=4, n_heldout=2))),
    **{s.name: ScenarioEnv(s) for s in suite()},
}
FAST = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])

# Strings a model writes where an id, a number or a name is expected.
TRICKY = ["", " ", "0", "1", "-1", "²", "٣", "１", "1²", "seq:²", "seq:１", "s1", "s١", "m1",
          "a1", "ceo", "CEO", "#plan", "plan", "1_000", "1e9", "0x10", " 7", "7\n", "nan",
          "inf", "\x00", "\u202e", "\u200b", "\ud800", "a\\b", "../x", "/etc/passwd", "x" * 300,
          "🙂", "e\u0301", "\u2028", "None", "true", "[]", "{}"]
PREFIXES = ["seq:", "file:", "archive:", "#", "@", "s", "m", "a", "p", "build ", "item "]
texts = st.one_of(st.sampled_from(TRICKY),
                  st.text(st.characters(codec=None, categories=None), max_size=40),
                  st.builds(lambda a, b: a + b, st.sampled_from(PREFIXES + TRICKY),
                            st.sampled_from(TRICKY)))
# Programs an agent might run: names the tools read otherwise, trees moved between folders,
# links, FIFOs, files past the caps. Each is followed by an environment call (over ORS the
# workspace then travels to the server's mirror) and ends the rollout's workspace somehow.
PROGRAMS = [
    "import os\nos.makedirs('a', exist_ok=True)\nopen('a/b', 'w').write('1')\n"
    "open('a\\\\b', 'w').write('2')\n",
    "import os\nfor i in range(150):\n    os.makedirs(f'src/m{i}', exist_ok=True)\n"
    "    open(f'src/m{i}/f.py', 'w').write('x')\n",
    "import os\nif os.path.isdir('src'):\n    os.rename('src', 'lib')\n"
    "elif os.path.isdir('lib'):\n    os.rename('lib', 'src')\n",
    "import os\nos.symlink('/proc/self/cwd', 'cwd')\nos.mkfifo('fifo')\n",
    "open('n\\u202eame.txt', 'w').write('x')\nopen('big', 'wb').write(b'x' * (3 << 20))\n",
    "print('x' * 100000)\n",
]
ints = st.one_of(st.integers(-3, 12), st.integers(-2**70, 2**70), st.sampled_from([0, -0]))
numbers = st.one_of(ints, st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, 0.5, 1.0000001]))
scalars = st.one_of(texts, ints, numbers, st.booleans(), st.none())
VALUES = {
    ParamType.STRING: texts,
    ParamType.INTEGER: ints,
    ParamType.NUMBER: numbers,
    ParamType.BOOLEAN: st.booleans(),
    ParamType.ARRAY: st.lists(st.one_of(scalars, st.lists(scalars, max_size=3)), max_size=6),
    ParamType.OBJECT: st.dictionaries(texts, scalars, max_size=4),
}


def _near(prefixes) -> st.SearchStrategy:
    """Strings that almost name something: a known prefix, then a tricky or plain suffix."""
    return st.builds(lambda p, t: p + t, st.sampled_from(prefixes),
                     st.sampled_from(TRICKY + ["0", "1", "2", "3", "10"]))


# Parameters a model aims at (the organisation's and the environments'): drawn near a real value
# half of the time.
BY_NAME = {"evidence": st.lists(_near(["seq:", "file:", "archive:"]), max_size=4),
           "message_id": _near(["m", "M"]), "agent": _near(["a", "ceo"]),
           "to": _near(["a", "ceo"]), "channel": _near(["", "#", "plan"]),
           "path": _near(["", "d/", "p", "./"]), "id": _near(["s", "S", "item "])}


@st.composite
def call_args(draw, spec):
    """Arguments for `spec`: each declared parameter (optional ones sometimes) of its type,
    with hostile contents."""
    args = {}
    for p in spec.params:
        if p.required or draw(st.booleans()):
            near = BY_NAME.get(p.name)
            args[p.name] = draw(near if near is not None and draw(st.booleans())
                                else VALUES[p.type])
    return args


def _task_id(env) -> str:
    return (env.task_ids(Split.TRAIN) or env.task_ids(Split.HELDOUT))[0]


@pytest.mark.parametrize("name", list(ENVS))
def test_every_tool_of_every_environment(name, tmp_path_factory):
    env = ENVS[name]
    tools = env.task(_task_id(env)).tools
    examples = 6 if name == "software" else 25

    @settings(FAST, max_examples=examples)
    @given(st.lists(st.tuples(st.sampled_from(tools), st.data()), min_size=1, max_size=6),
           st.integers(0, 3))
    def check(calls, seed):
        session = env.session(_task_id(env), seed)
        ws = Workspace(tmp_path_factory.mktemp("ws"), LIMITS)
        session.on_start(2, ws)
        agents = list(getattr(session, "peers", ())) or ["ceo", "a1"]
        for i, agent in enumerate(agents):
            session.brief(agent, i, "Dev", "")
        clock = 0.0
        for i, (spec, data) in enumerate(calls):
            args = data.draw(call_args(spec))
            if spec.check_args(args) is not None:
                continue  # the organisation refuses it before the environment sees it
            ctx = CallContext(agent=agents[i % len(agents)], title="Dev", clock_s=clock,
                              tokens_out=100 * i, workspace=ws)
            try:
                out = session.call(spec.name, args, ctx)
            except ToolError:
                continue
            assert isinstance(out, ToolOutcome), (spec.name, args, out)
            assert math.isfinite(out.duration_s) and out.duration_s >= 0, (spec.name, args)
            assert all(math.isfinite(r.value) for r in out.rewards), (spec.name, args)
            clock += out.duration_s
            if out.terminal:
                break
        final = session.on_end(EndContext(EndReason.STOPPED, None, clock, ws))
        assert isinstance(final, FinalOutcome)

    check()


# ----- through the driver: raw call text, org tools and the environment's -----

ORG_SPECS = list(SPECS.values())


def _escaped(value) -> str:
    """JSON as a model might write it: non-ASCII and lone surrogates as \\u escapes."""
    return json.dumps(value, ensure_ascii=True)


@st.composite
def raw_call(draw, specs):
    spec = draw(st.sampled_from(specs))
    return f"{spec.name} {_escaped(draw(call_args(spec)))}"


@st.composite
def program_turns(draw, env_specs):
    """Write a program, run it, call the environment."""
    code = draw(st.sampled_from(PROGRAMS))
    turns = [[f"write_file {_escaped({'path': 'p.py', 'text': code})}"], ['run_code {"path": '
                                                                         '"p.py"}']]
    if env_specs:
        turns.append([draw(raw_call(env_specs))])
    return turns


@st.composite
def script(draw, env):
    env_specs = list(env.task(_task_id(env)).tools)
    specs = ORG_SPECS + env_specs
    turns = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.integers(0, 3)) == 0:
            turns += draw(program_turns(env_specs))
        else:
            turns.append(draw(st.lists(raw_call(specs), min_size=1, max_size=3)))
    hire = 'hire {"title": "Dev", "role": "x", "tools": ["read_file", "write_file", ' \
           '"list_files", "run_code"]}'
    reports = [SPECS[t] for t in SPECS if t.value in ("report_to_ceo", "react", "dm", "post")]
    specialist = draw(st.lists(st.lists(st.one_of(raw_call(specs), raw_call(reports)),
                                        min_size=1, max_size=2), max_size=6))
    return {"ceo": [["roster"], [hire], *turns, ["wait_for_messages"]], "a1": specialist}


DRIVER_ENVS = ["parallel", "hidden_profile", "software", "wealth", "verification",
               "escalation"]
# Known regressions, played first in every run (then the generated ones): a specialist's
# evidence in digits `int` refuses, and a program leaving names the file tools read otherwise.
HIRE = ('hire {"title": "Dev", "role": "x", "tools": ["read_file", "write_file", "list_files", '
        '"run_code"]}')
WRITE = f"write_file {_escaped({'path': 'p.py', 'text': PROGRAMS[0]})}"
KNOWN = {"ceo": [["roster"], [HIRE], [WRITE], ['run_code {"path": "p.py"}'],
                 ["wait_for_messages"]],
         "a1": [[f"report_to_ceo {_escaped({'status': 's', 'evidence': ['seq:²', 'seq:١']})}"]]}


@pytest.mark.parametrize("name", DRIVER_ENVS)
def test_driver_in_process(name, tmp_path_factory):
    env = ENVS[name]

    @settings(FAST, max_examples=4 if name == "software" else 10)
    @given(script(env), st.integers(0, 3))
    @example(KNOWN, 0)
    def check(turns, seed):
        tmp = tmp_path_factory.mktemp("drv")
        played = play(tmp, env.session(_task_id(env), seed), turns, limits=LIMITS, budget=2,
                      seed=seed, timeout_s=120.0)
        assert played.crash == "", played.crash
        assert any(e["kind"] == "end" for e in played.events)

    check()


@pytest.mark.parametrize("name", ["parallel", "software", "verification"])
def test_driver_over_ors(name, tmp_path_factory):
    env = ENVS[name]
    with OrsServer([env]) as server:
        remote = OrsEnvironment(server.url, env.name, extension=True)

        @settings(FAST, max_examples=5)
        @given(script(env), st.integers(0, 3))
        @example(KNOWN, 0)
        def check(turns, seed):
            tmp = tmp_path_factory.mktemp("ors")
            played = play(tmp, remote.session(_task_id(env), seed), turns, limits=LIMITS,
                          budget=2, seed=seed, timeout_s=120.0)
            assert played.crash == "", played.crash
            assert any(e["kind"] == "end" for e in played.events)

        check()


@pytest.mark.slow
@pytest.mark.parametrize("name", DRIVER_ENVS)
def test_driver_in_process_long(name, tmp_path_factory):
    env = ENVS[name]

    @settings(FAST, max_examples=100)
    @given(script(env), st.integers(0, 50))
    def check(turns, seed):
        tmp = tmp_path_factory.mktemp("long")
        played = play(tmp, env.session(_task_id(env), seed), turns, limits=LIMITS, budget=2,
                      seed=seed, timeout_s=120.0)
        assert played.crash == "", played.crash

    check()
