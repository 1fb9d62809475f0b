"""`experiments/bench/vs_torch.py`'s agreement check runs, and holds, at a tiny size: the same
random checkpoint in transformers and Avalon gives the same logits, greedy tokens and losses
over AdamW steps. Skipped without the `hf` extra."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from experiments.bench import vs_torch  # noqa: E402

pytestmark = [
    pytest.mark.hf,
    pytest.mark.skipif(transformers.__version__ != "5.24.0",
                       reason="agreement is defined against transformers==5.24.0"),
]


def test_agreement_at_tiny_size(tmp_path):
    vs_torch.build_checkpoint(str(tmp_path), "tiny")
    shapes = vs_torch.Shapes(prompt=12, new_tokens=6, agree_steps=3)
    got = vs_torch.agreement(str(tmp_path), shapes, {"param_dtype": "float32"})
    assert got["logit_rel_err"] <= vs_torch.LOGIT_TOL
    assert got["greedy_tokens_identical"] == 1.0 and got["greedy_tokens"] == 2 * 6
    assert got["loss_rel_err"] <= vs_torch.LOSS_TOL
    # The steps trained something: the losses moved (on both sides alike).
    assert got["losses_torch"][-1] < got["losses_torch"][0]
    assert got["ok"]
