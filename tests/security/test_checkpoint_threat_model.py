"""What a checkpoint's integrity checks protect against, as its modules say: corruption, not
forgery. A step replaced by another checkpoint of the same shapes, written by someone who can
write the directory (here with `TrainCheckpointer` itself), restores without a word: the sums
and the digest are unkeyed. So the docs must state that threat model and claim no more (they
said a forged checkpoint could not pass both the sums and the digest)."""

import shutil

import jax.numpy as jnp
import numpy as np

from avalon.checkpoint import content_sums, train_state
from avalon.checkpoint.train_state import TrainCheckpointer


def test_a_forged_step_restores_and_the_docs_say_so(tmp_path):
    honest, forged = np.arange(64, dtype=np.float32), -np.arange(64, dtype=np.float32)
    for name, values in (("run", honest), ("forger", forged)):
        with TrainCheckpointer(tmp_path / name) as ckpt:
            ckpt.save(1, {"w": jnp.asarray(values)}, {"step": 1})
            ckpt.wait()
    shutil.rmtree(tmp_path / "run" / "1")
    shutil.copytree(tmp_path / "forger" / "1", tmp_path / "run" / "1")
    with TrainCheckpointer(tmp_path / "run") as ckpt:
        state, _ = ckpt.restore()
    assert np.array_equal(np.asarray(state["w"]), forged)  # no check can see it
    assert "not forgery" in train_state.__doc__
    assert "nobody forges" not in content_sums.__doc__
    assert "not a signature" in content_sums.__doc__
