"""Shared by the update-step kernels' tests: a small SFT batch, and one step of two update steps
(with a kernel, and with the model's own path) compared."""

import jax
import numpy as np

from avalon.rl.build import build_sft_batch
from tests.rl.helpers import make_row


def sft_batch(cfg):
    """Six rows of 20-60 random tokens packed into 64-token sequences (an even count)."""
    rng = np.random.default_rng(0)
    rows = [make_row(rng, int(rng.integers(20, 60)), vocab=cfg.vocab_size) for _ in range(6)]
    return build_sft_batch(rows, seq_len=64, num_seqs_multiple=2)[0]


def assert_steps_agree(fast, plain, params, batch, keys=("loss", "nll", "grad_norm")):
    """One step of each from the same params: metrics within 1e-5 relative, every new param
    within 1e-6 (fp32 sums in another order; a step moves a param by ~lr)."""
    state, m = fast(fast.init_state(params), batch)
    ref_state, ref_m = plain(plain.init_state(params), batch)
    for key in keys:
        np.testing.assert_allclose(m[key], ref_m[key], rtol=1e-5, err_msg=key)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ref_state.params),
                            jax.tree.leaves(state.params)):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6, err_msg=jax.tree_util.keystr(path))
