"""The safety suite as an inspect-ai task (experiments/safety/inspect_task.py), run by the real
`inspect eval` against SmolLM2's GGUF served by `avalon.serve`, plays the rollouts the suite's
own engine run plays: the same outputs (a digest of every model call's text), the same counts,
every request's prompt as long as the organisation's context, and every answer's ids read
from its log-probs' bytes (ci tier: minutes)."""

import dataclasses
import os
import subprocess
import sys

import pytest

pytest.importorskip("inspect_ai")

from avalon.envs.safety import by_name, play  # noqa: E402
from avalon.inference.api import SamplingParams  # noqa: E402
from avalon.inference.engine import Engine  # noqa: E402
from avalon.org.config import OrgConfig, PromptStyle  # noqa: E402
from avalon.org.engine_policy import EnginePolicy  # noqa: E402
from tests.checkpoint.gguf_files import smollm2_file  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WINDOW, TURNS, SCENARIO = 1024, 2, "whistleblowing"


@pytest.mark.slow
@pytest.mark.ci
def test_inspect_eval_equals_the_suite(tmp_path):
    from avalon.serve import build_server
    from experiments.safety.inspect_task import COUNTS, outputs_digest

    gguf = str(smollm2_file())
    server = build_server(gguf, slots=16, max_context=WINDOW, open_cut_answers=True).start()
    try:
        env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu", AVALON_API_KEY="unused",
                   AVALON_BASE_URL=server.url + "/v1")
        r = subprocess.run(
            [sys.executable, "-m", "inspect_ai", "eval", "experiments/safety/inspect_task.py",
             "--model", f"openai-api/avalon/{server.name}", "-T", f"scenarios={SCENARIO}",
             "-T", f"window={WINDOW}", "-T", f"max_turns={TURNS}", "-T", f"tokenizer=hf:{gguf}",
             "--log-dir", str(tmp_path / "logs"), "--display", "none"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    finally:
        server.close()
    assert r.returncode == 0, r.stderr[-3000:]
    from inspect_ai.log import read_eval_log
    [path] = list((tmp_path / "logs").glob("*.eval"))
    [sample] = read_eval_log(str(path)).samples
    [score] = sample.scores.values()

    # the suite's own run: the engine in-process, greedy, the same organisation and seed
    from avalon.serve import load_model, load_tokenizer
    from avalon.tokenizer import ChatFormat
    tok = load_tokenizer(gguf)
    chat = ChatFormat(tok, tok.rendering)
    cfg, params = load_model(gguf)
    scenarios = by_name(SCENARIO)
    engine = Engine(cfg, params, num_slots=play.slots_needed(scenarios, 1), max_context=WINDOW,
                    detokenize=tok.decode)
    org = dataclasses.replace(OrgConfig.scaled(WINDOW, max_turns=TURNS,
                                               prompt_style=PromptStyle.COMPACT,
                                               text_tool_calls=True), log_text=True)
    result, [[counts]] = play.play_suite(EnginePolicy(engine, chat, SamplingParams(greedy=True)),
                                         scenarios, 1, chat=chat, org=org)
    assert score.metadata["outputs_digest"] == outputs_digest(result.logs[0][0].events)
    got = score.value
    assert got["mismatched_prompts"] == 0 and got["reencoded_answers"] == 0
    assert got["agents"] == len(counts.agents)
    assert got["decided_agents"] == sum(a.decided for a in counts.agents)
    assert set(got) == set(COUNTS)
