"""An HF export of a toy run carries the run's word tokenizer as tokenizer.json, and
`transformers` alone (AutoTokenizer on the export directory) encodes every text of real toy
episodes to the run's ids and decodes them back to the text (`avalon/tokenizer/word_export.py`).
The texts are what the toy's organisation reads and writes: the SFT teacher's outputs, tool
arguments and results, and messages of collective verification episodes."""

import importlib.util
import json
import os
import re

import jax
import pytest

from avalon import sharding
from avalon.checkpoint.train_state import TrainCheckpointer
from avalon.envs.base import Split
from avalon.org.driver import GroupSpec, RolloutDriver, RolloutSpec
from avalon.rl.update import make_update_step
from avalon.tokenizer import ChatFormat
from avalon.tokenizer.record import RECORD_FILE, describe
from avalon.tokenizer.word_export import as_tokenizers, word_table
from avalon.tools import convert
from avalon.train.config import describe as describe_config
from avalon.train.config import from_config_dict, org_config
from avalon.train.setup import build_tokenizer, initial_params
from tests.train import micro_config

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytestmark = pytest.mark.hf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _toy():
    spec = importlib.util.spec_from_file_location("toy_org", os.path.join(REPO, "configs",
                                                                          "toy_org.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    cfg = from_config_dict(c, num_devices=1)
    envs = list(cfg.make_environments(c.env))
    return c, cfg, envs, build_tokenizer(cfg, envs)


def episode_texts(c, cfg, envs, tok, episodes=4) -> list[str]:
    """Every text of `episodes` teacher-played toy episodes (outputs, tool calls, messages)."""
    env, chat = envs[0], ChatFormat(tok)
    teacher = c.make_teacher(env, chat)
    ids = env.task_ids(Split.TRAIN)
    groups = [GroupSpec(i, (RolloutSpec(env.session(t, seed=i), budget=3, seed=i),))
              for i, t in enumerate(ids[:episodes])]
    result = RolloutDriver(teacher, chat, org_config(c.org)).run(groups)
    texts = []
    for group in result.logs:
        for e in group[0].events:
            for key in ("text", "result", "brief", "role"):
                if isinstance(e.get(key), str) and e[key]:
                    texts.append(e[key])
            if isinstance(e.get("args"), dict):
                texts.append(json.dumps(e["args"]))
    return texts


def ids_as_generated(tok, text: str) -> list[int]:
    """The ids a model generated for a logged output: its special strings (`<|call|>`,
    `<|end|>`, which the log writes as text) are the special ids, the rest `tok.encode`.
    (`tok.encode` itself spells a special's string as characters, so that message text can
    never forge one; the exported tokenizer reads them as specials, as HF tokenizers do.)"""
    specials = {s.value: i for s, i in tok.special_ids.items()}
    pattern = "(" + "|".join(re.escape(s) for s in specials) + ")"
    ids = []
    for part in re.split(pattern, text):
        ids += [specials[part]] if part in specials else tok.encode(part)
    return ids


def test_the_table_is_the_word_tokenizers_layout():
    _, _, _, tok = _toy()
    table = word_table(tok)
    assert len(table) == tok.vocab_size
    for text, i in table.items():
        if text.startswith("<|"):
            continue  # the specials: ids only, their strings encode as characters there
        assert tok.encode(text) == [i] and tok.decode([i]) == text


def save_micro_run(run) -> None:
    """A run directory as avalon.main writes one: config.json and a training state (the micro
    config's params; the run's tokenizer record is written by the test)."""
    c = micro_config.get_config()
    c.mesh.data, c.sft.batch_seqs = jax.device_count(), jax.device_count()
    cfg = from_config_dict(c, num_devices=jax.device_count())
    os.makedirs(run)
    (run / "config.json").write_text(json.dumps(describe_config(cfg, c.env)))
    mesh = sharding.make_mesh(cfg.mesh)
    _, params = initial_params(cfg, mesh)
    with TrainCheckpointer(run / "checkpoints") as ckpt:
        state = make_update_step(cfg.model, cfg.rl, mesh=mesh).init_state(params)
        ckpt.save(1, state, {"sft_step": 1, "rl_step": 0})


def test_a_toy_run_exported_to_hf_encodes_and_decodes_through_transformers(tmp_path):
    c, cfg, envs, tok = _toy()
    texts = episode_texts(c, cfg, envs, tok)
    assert len(texts) > 50 and any("hire" in t for t in texts)
    run = tmp_path / "run"
    save_micro_run(run)
    (run / RECORD_FILE).write_text(json.dumps(describe(tok)))
    out = tmp_path / "hf"
    convert.convert(run, out, convert.Target.HF, progress=False)
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(out))

    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    assert len(hf) == tok.vocab_size
    for text in texts + ["a word_that_is_not listed, 12+30=42\n\tend"]:
        ids = hf.encode(text, add_special_tokens=False)
        assert ids == ids_as_generated(tok, text), text
        assert hf.decode(ids) == text
    # Specials are single ids both ways; an id sequence decodes as the word tokenizer's does.
    for special, i in tok.special_ids.items():
        assert hf.convert_tokens_to_ids(special.value) == i
    sample = tok.encode(texts[0]) + [tok.special_ids[next(iter(tok.special_ids))]]
    assert hf.decode(sample) == tok.decode(sample)


def test_the_tokenizer_object_alone_matches(tmp_path):
    """Without transformers' wrapper: the `tokenizers` object itself."""
    _, _, _, tok = _toy()
    t = as_tokenizers(tok)
    for text in ("hire a verifier", "ship build 3", "xyz!? __init__ 007", "two\nlines"):
        assert t.encode(text).ids == tok.encode(text)
        assert t.decode(t.encode(text).ids) == text
