"""What checkpoint integrity costs: content sums against sha256 and crc32 of the same bytes, and
a save + verified restore of the tiny training state.

    python -m experiments.bench.checkpoint_sums --mb=256

`content_sums` is timed on one float32 array of `--mb` MB on the host (the save's foreground
cost per that many bytes of state, on one core) and on the same array sharded over all local
devices. sha256 and crc32 are the reference points (neither is sharding-independent). Prints
one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
import zlib

import jax
import numpy as np

from avalon.checkpoint.content_sums import content_sums
from avalon.checkpoint.train_state import TrainCheckpointer


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    x = np.random.default_rng(0).standard_normal((args.mb << 20) // 4).astype(np.float32)
    devices = jax.local_devices()
    mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    rows = x.reshape(len(devices), -1)
    placed = jax.device_put(rows, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))
    out = {
        "mb": args.mb, "devices": len(devices),
        "content_sums_s": _best(lambda: content_sums([x]), args.repeats),
        "content_sums_sharded_s": _best(lambda: content_sums([placed]), args.repeats),
        "sha256_s": _best(lambda: hashlib.sha256(x.data).digest(), args.repeats),
        "crc32_s": _best(lambda: zlib.crc32(x.data), args.repeats),
    }
    state = {"w": jax.numpy.asarray(x), "k": jax.random.key(0)}
    with tempfile.TemporaryDirectory() as tmp, TrainCheckpointer(tmp, max_to_keep=None) as ckpt:
        start = time.perf_counter()
        ckpt.save(1, state, {"step": 1})
        out["save_returns_s"] = time.perf_counter() - start
        ckpt.wait()
        start = time.perf_counter()
        ckpt.restore(1)
        out["verified_restore_s"] = time.perf_counter() - start
    out["content_sums_gb_per_s"] = args.mb / 1024 / out["content_sums_s"]
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}))
    return out


if __name__ == "__main__":
    main()
