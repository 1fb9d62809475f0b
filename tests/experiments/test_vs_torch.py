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


@pytest.mark.parametrize("loss", ["sft", "cispo"])
def test_agreement_at_tiny_size(tmp_path, loss):
    """SFT, and CISPO as `vs_torch.torch_loss` writes Avalon's loss for torch (clipped ratio
    weights against the sampler's log-probs, per-row advantages, a prompt quarter masked)."""
    vs_torch.build_checkpoint(str(tmp_path), "tiny")
    shapes = vs_torch.Shapes(prompt=12, new_tokens=6, agree_steps=3, loss=loss)
    got = vs_torch.agreement(str(tmp_path), shapes, {"param_dtype": "float32"})
    assert got["logit_rel_err"] <= vs_torch.LOGIT_TOL
    assert got["greedy_tokens_identical"] == 1.0 and got["greedy_tokens"] == 2 * 6
    assert got["loss_rel_err"] <= vs_torch.LOSS_TOL
    # A MoE model (pattern MEM*EMEM*E): the losses with torch's routing replayed agree too, and
    # torch's recorded choices are what Avalon's own router chose (no flip at this size).
    assert got["loss_rel_err_replayed"] <= vs_torch.LOSS_TOL
    assert got["routing_choices_differing"] == [0] * 3
    # The steps trained something: the losses moved (on both sides alike). SFT's falls; CISPO's
    # value is w A (-logp) with w the clipped ratio to the sampler, which grows as logp does,
    # so it need not fall: it has to move well past the tolerance.
    first, last = got["losses_torch"][0], got["losses_torch"][-1]
    if loss == "sft":
        assert last < first
    else:
        assert abs(last - first) > 0.01 * abs(first)
    assert got["ok"]
