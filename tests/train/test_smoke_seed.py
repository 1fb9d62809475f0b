"""The smoke run's seed (`avalon/data/toy_smoke_seed/`, made by `python -m experiments.smoke_seed`)
is small, is the smoke model, and still speaks the toy's word tokenizer: its word list is the one
`configs/toy_org.py:smoke` builds from the environments and the organisation's vocabulary
today (a changed vocabulary would shift every id under the seed's embeddings), and
`init_from` loads it onto the smoke config's model."""

import importlib.util
import json
import os

import jax
import numpy as np
import pytest

from avalon import sharding
from avalon.tokenizer.record import RECORD_FILE
from avalon.train.config import from_config_dict
from avalon.train.setup import build_tokenizer, check_init_words, initial_params

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REMAKE = "the seed is stale: remake it with `python -m experiments.smoke_seed`"


def _toy():
    spec = importlib.util.spec_from_file_location("toy_org", os.path.join(REPO, "configs",
                                                                          "toy_org.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_seed_is_small_and_describes_itself():
    seed = _toy().SMOKE_SEED
    names = set(os.listdir(seed))
    assert {"config.json", "tokenizer.json", RECORD_FILE, "README.md"} <= names
    assert any(n.endswith(".safetensors") for n in names)
    size = sum(os.path.getsize(os.path.join(seed, n)) for n in names)
    assert size < 600 * 1024, size
    readme = open(os.path.join(seed, "README.md")).read()
    assert "python -m experiments.smoke_seed" in readme and "Made at commit" in readme


def test_the_seed_speaks_the_smoke_configs_tokenizer_and_loads_onto_its_model():
    toy = _toy()
    c = toy.get_config("smoke")
    c.mesh.data = jax.device_count()
    c.sft.batch_seqs = max(c.sft.batch_seqs, jax.device_count())
    cfg = from_config_dict(c, num_devices=jax.device_count())
    assert cfg.init_from == toy.SMOKE_SEED
    record = json.loads(open(os.path.join(toy.SMOKE_SEED, RECORD_FILE)).read())
    tok = build_tokenizer(cfg, list(cfg.make_environments(c.env)))
    assert record == {"kind": "word", "words": tok.words}, REMAKE
    _, params = initial_params(cfg, sharding.make_mesh(cfg.mesh))
    assert params["embed"].shape == (cfg.model.vocab_size, cfg.model.hidden_size)
    assert np.isfinite(np.asarray(params["embed"])).all()


def test_a_seed_of_other_words_is_refused():
    """Another config's environments give other words (the three co-ordination environments
    here): starting from the seed would give every id another meaning, so it is refused."""
    toy = _toy()
    c = toy.get_config("smoke")
    c.env.three_environments = True
    cfg = from_config_dict(c, num_devices=1)
    tok = build_tokenizer(cfg, list(cfg.make_environments(c.env)))
    with pytest.raises(ValueError, match=r"tokenizer_record\.json lists other words"):
        check_init_words(cfg, tok)
