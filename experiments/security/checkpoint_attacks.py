"""Red-team attacks: training checkpoints. Each corrupts a checkpoint on disk the way
a failing disk or a torn copy would, then restores as a resumed run does. Blocked: the
corruption is detected, the error names the file, and resume falls back to an intact step.
Crash: wrong values restore silently, or resume stops although an intact step exists."""

import os
import re
import shutil

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


# ----- second pass: the meta, the step's name, structured data changes, a full disk -----


def _resume(tmp: str, want_step: int, want_seed: int, why: str) -> tuple[Outcome, str]:
    """Resume as the training loop does: the newest intact step must be `want_step`, holding
    the state saved with `want_seed`, and every newer step skipped."""
    with TrainCheckpointer(tmp) as ckpt:
        try:
            got = ckpt.restore_newest_intact()
        except Exception as e:  # noqa: BLE001 - resume stopped: the finding
            return Outcome.CRASH, f"resume stopped: {type(e).__name__}: {e}"[:160]
    intact = np.array_equal(np.asarray(got.state["w"]), np.asarray(_state(want_seed)["w"]))
    if got.step == want_step and intact and got.skipped:
        detail = got.skipped[0][1].replace(tmp, "DIR")
        return Outcome.BLOCKED, f"resumed from step {want_step}; skipped: {detail}"[:160]
    held = f"step {want_seed}'s state" if intact else f"a state that is not step {want_seed}'s"
    return Outcome.CRASH, f"{why}: resumed as step {got.step}, holding {held}"


def _edit_meta(directory: str, step: int, edit) -> None:
    path = os.path.join(directory, str(step), "meta", "metadata")
    with open(path, "rb") as f:
        data = bytearray(f.read())
    edit(data)
    with open(path, "wb") as f:
        f.write(data)


def _flip_in(field: bytes, xor: int):
    """An edit flipping one bit of the first byte after `field` in the meta's JSON."""
    def edit(data: bytearray) -> None:
        at = data.index(field) + len(field)
        data[at] ^= xor
    return edit


def meta_format_bit(tmp: str) -> tuple[Outcome, str]:
    """One bit of the newest meta's format ('avalon-train-v…' -> another version)."""
    _save(tmp, [1, 2])
    _edit_meta(tmp, 2, _flip_in(b'"format": "avalon-train-v', 0x01))
    return _resume(tmp, 1, 1, "a flipped format bit")


def meta_shape_bit(tmp: str) -> tuple[Outcome, str]:
    """One bit of a saved shape in the newest meta (65536 -> 65537)."""
    _save(tmp, [1, 2])
    _edit_meta(tmp, 2, _flip_in(b'"shape": [6553', 0x01))
    return _resume(tmp, 1, 1, "a flipped shape bit")


def unverified_format(tmp: str) -> tuple[Outcome, str]:
    """The newest meta says 'avalon-train-v1' (which skipped verification) and a data bit is
    flipped: it must not restore."""
    _save(tmp, [1, 2])
    _flip_bit(tmp, 2)

    def to_v1(data: bytearray) -> None:
        data[:] = re.sub(rb'"format": "avalon-train-v[0-9]+"', b'"format": "avalon-train-v1"',
                         bytes(data))
    _edit_meta(tmp, 2, to_v1)
    return _resume(tmp, 1, 1, "format v1 with a flipped data bit")


def step_dir_link(tmp: str) -> tuple[Outcome, str]:
    """Step 3 is a symbolic link to step 2's directory."""
    _save(tmp, [1, 2])
    os.symlink(os.path.join(tmp, "2"), os.path.join(tmp, "3"))
    return _resume(tmp, 2, 2, "a link named 3")


def step_dir_copy(tmp: str) -> tuple[Outcome, str]:
    """Step 3 is a copy of step 1's directory (a stale copy put back)."""
    _save(tmp, [1, 2])
    shutil.copytree(os.path.join(tmp, "1"), os.path.join(tmp, "3"))
    return _resume(tmp, 2, 2, "a copy of step 1 named 3")


def second_difference(tmp: str) -> tuple[Outcome, str]:
    """Three words of the newest step's data changed by +k, -2k, +k (its state item replaced by
    one saved from those values): sums weighted by 1 and by the index do not move."""
    _save(tmp, [1, 2])
    bent = np.asarray(_state(2)["w"]).copy()
    words = bent.view(np.uint32)
    i = int(np.argmax((words[1:-1] >= 1 << 8) & (words[1:-1] < (1 << 32) - (1 << 8)))) + 1
    words[i - 1:i + 2] += np.array([1, -2, 1], np.int64).astype(np.uint32) * np.uint32(16)
    other = os.path.join(tmp, "other")
    with TrainCheckpointer(other, max_to_keep=None) as ckpt:
        ckpt.save(2, {"w": jnp.asarray(bent), "k": jax.random.key(2)}, {"step": 2})
    shutil.rmtree(os.path.join(tmp, "2", "state"))
    shutil.copytree(os.path.join(other, "2", "state"), os.path.join(tmp, "2", "state"))
    shutil.rmtree(other)
    return _resume(tmp, 1, 1, "+k, -2k, +k in three words")


DISK_FULL = """
import json, os, sys
import jax, jax.numpy as jnp, numpy as np
from avalon.checkpoint.train_state import TrainCheckpointer
d = sys.argv[1]
out = {}
def state(n, seed):
    return {"w": jnp.asarray(np.random.default_rng(seed).standard_normal(n).astype(np.float32))}
ckpt = TrainCheckpointer(d, max_to_keep=1)
ckpt.save(1, state(1000, 1), {"step": 1})
ckpt.wait()
try:
    ckpt.save(2, state(3_000_000, 2), {"step": 2})  # 12 MB on a 6 MB disk
    ckpt.wait()
    out["save"] = "completed"
except Exception as e:
    out["save"] = type(e).__name__ + ": " + str(e).splitlines()[0][:150]
out["listed"] = ckpt.all_steps()
out["on_disk"] = sorted(os.listdir(d))
try:
    got = ckpt.restore_newest_intact()
    out["restored"] = got.step
except Exception as e:
    out["restored"] = type(e).__name__ + ": " + str(e)[:100]
ckpt.save(3, state(1000, 3), {"step": 3})
ckpt.close()
out["after_next_save"] = sorted(os.listdir(d))
print(json.dumps(out))
"""


def disk_full_save(tmp: str) -> tuple[Outcome, str]:
    """A save that runs out of disk (a 6 MB tmpfs, bubblewrap's --size) with max_to_keep=1:
    the manager must still list and restore the previous step, the half-written step must go,
    and the next save must work and keep retention."""
    import json
    import shutil as sh
    import subprocess
    import sys
    if sh.which("bwrap") is None:
        return Outcome.CRASH, "not run: no bubblewrap to make a small disk"
    disk = os.path.join(tmp, "disk")
    os.makedirs(disk)
    r = subprocess.run(["bwrap", "--dev-bind", "/", "/", "--size", str(6 << 20), "--tmpfs",
                        disk, sys.executable, "-c", DISK_FULL, os.path.join(disk, "ck")],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    if r.returncode != 0:
        return Outcome.CRASH, f"the run raised: {r.stderr.strip().splitlines()[-1:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    ok = (out["save"] != "completed" and out["listed"] == [1] and out["on_disk"] == ["1"]
          and out["restored"] == 1 and out["after_next_save"] == ["3"])
    detail = (f"save: {out['save'][:60]}; then listed {out['listed']}, on disk "
              f"{out['on_disk']}, restored {out['restored']}, after the next save "
              f"{out['after_next_save']}")
    return (Outcome.BLOCKED if ok else Outcome.CRASH), detail


ATTACKS = [
    Attack("checkpoint: one flipped bit in array data", bit_flip),
    Attack("checkpoint: corrupt newest step, intact previous one", corrupt_newest_step),
    Attack("checkpoint: torn host-state JSON", corrupt_json),
    Attack("checkpoint: one bit of the newest meta's format", meta_format_bit),
    Attack("checkpoint: one bit of a shape in the newest meta", meta_shape_bit),
    Attack("checkpoint: format avalon-train-v1 and a flipped data bit", unverified_format),
    Attack("checkpoint: a step directory that is a link to another", step_dir_link),
    Attack("checkpoint: a step directory that is a copy of another", step_dir_copy),
    Attack("checkpoint: +k, -2k, +k in three words of the data", second_difference),
    Attack("checkpoint: a save that fills the disk", disk_full_save),
]
