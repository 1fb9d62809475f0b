"""Red-team attacks: training checkpoints (issue 17). Each corrupts a checkpoint on disk the way
a failing disk or a torn copy would, then restores as a resumed run does. Blocked: the
corruption is detected, the error names the file, and resume falls back to an intact step.
Crash: wrong values restore silently, or resume stops although an intact step exists."""

import os

import jax
import jax.numpy as jnp
import numpy as np

from avalon.checkpoint.train_state import CheckpointCorruptError, TrainCheckpointer
from experiments.security.outcome import Attack, Outcome


def _state(seed: int) -> dict:
    """Random floats: incompressible, so a flipped stored bit is a flipped value."""
    w = np.random.default_rng(seed).standard_normal(1 << 16).astype(np.float32)
    return {"w": jnp.asarray(w), "k": jax.random.key(seed)}


def _save(directory: str, steps) -> None:
    with TrainCheckpointer(directory, max_to_keep=None) as ckpt:
        for step in steps:
            ckpt.save(step, _state(step), {"step": step})
        ckpt.wait()


def _flip_bit(directory: str, step: int) -> str:
    """Flips one bit in the middle of the step's largest array data file; returns the file."""
    root = os.path.join(directory, str(step), "state")
    files = [os.path.join(r, f) for r, _, fs in os.walk(root) for f in fs]
    path = max(files, key=os.path.getsize)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0x10
    with open(path, "wb") as f:
        f.write(data)
    return path


def bit_flip(tmp: str) -> tuple[Outcome, str]:
    _save(tmp, [1])
    _flip_bit(tmp, 1)
    with TrainCheckpointer(tmp) as ckpt:
        try:
            state, _ = ckpt.restore()
        except CheckpointCorruptError as e:
            return Outcome.BLOCKED, str(e).replace(tmp, "DIR")[:120]
    wrong = int((np.asarray(state["w"]) != np.asarray(_state(1)["w"])).sum())
    return Outcome.CRASH, f"restored silently with {wrong} wrong values"


def corrupt_newest_step(tmp: str) -> tuple[Outcome, str]:
    _save(tmp, [1, 2])
    _flip_bit(tmp, 2)
    with TrainCheckpointer(tmp) as ckpt:
        try:
            got = ckpt.restore_newest_intact()
        except Exception as e:  # noqa: BLE001 - resume stopped: the finding
            return Outcome.CRASH, f"resume stopped: {type(e).__name__}: {e}"[:120]
    intact = np.array_equal(np.asarray(got.state["w"]), np.asarray(_state(1)["w"]))
    if got.step == 1 and intact and [s for s, _ in got.skipped] == [2]:
        return Outcome.BLOCKED, f"resumed from step 1; skipped step 2: " \
            f"{got.skipped[0][1].replace(tmp, 'DIR')[:70]}"
    return Outcome.CRASH, f"resumed from step {got.step} (values intact: {intact})"


def corrupt_json(tmp: str) -> tuple[Outcome, str]:
    _save(tmp, [1])
    bad = os.path.join(tmp, "1", "host", "metadata")
    with open(bad, "w") as f:
        f.write('{"step": ')
    with TrainCheckpointer(tmp) as ckpt:
        try:
            ckpt.restore()
        except Exception as e:  # noqa: BLE001 - what the error says is the finding
            message = str(e)
            if bad in message:
                return Outcome.BLOCKED, f"{type(e).__name__}: " + message.replace(tmp, "DIR")[:90]
            return Outcome.CRASH, f"the error names no file: {type(e).__name__}: {message[:80]}"
    return Outcome.CRASH, "torn JSON restored without an error"


ATTACKS = [
    Attack("checkpoint: one flipped bit in array data", bit_flip),
    Attack("checkpoint: corrupt newest step, intact previous one", corrupt_newest_step),
    Attack("checkpoint: torn host-state JSON", corrupt_json),
]
