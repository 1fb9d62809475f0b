"""Config validation names the field; the pattern splits into runs that rebuild it."""

import pytest

from avalon.model import presets
from avalon.model.config import layer_blocks
from avalon.model.presets import NANO_PATTERN, SUPER_PATTERN


@pytest.mark.parametrize("pattern", [NANO_PATTERN, SUPER_PATTERN, "MEME*-ME*M", "M", "*-" * 16,
                                     "MEMEMEMEME*"])
def test_layer_blocks_rebuild_the_pattern(pattern):
    blocks = layer_blocks(pattern)
    assert "".join(unit * reps for unit, reps in blocks) == pattern


def test_published_patterns_compile_as_few_runs():
    # Runs keep compile time flat: Super's 88 layers become 19 scans, Nano's 52 become 15.
    assert len(layer_blocks(SUPER_PATTERN)) == 19
    assert len(layer_blocks(NANO_PATTERN)) == 15


def test_repeated_unit_is_one_run():
    assert layer_blocks("ME" * 20) == (("ME", 20),)


@pytest.mark.parametrize("overrides, field", [
    ({"pattern": "MEX"}, "pattern"),
    ({"pattern": ""}, "pattern"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"n_groups": 3}, "n_groups"),
    ({"n_group": 3}, "n_group"),
    ({"num_experts_per_tok": 7}, "num_experts_per_tok"),
    ({"hidden_size": 0}, "hidden_size"),
    ({"dtype": "int8"}, "dtype"),
    ({"mtp_pattern": "*Q"}, "mtp_pattern"),
])
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=rf"ModelConfig\.{field}="):
        presets.get("tiny", **overrides)


def test_unknown_preset_lists_the_names():
    with pytest.raises(ValueError, match="tiny"):
        presets.get("huge")
