"""Throughput of the OpenAI-compatible server: 32 clients at once against one at a time.

    python -m experiments.bench.serve_concurrency [--clients=32] [--max_tokens=32] [--rounds=2]

Serves SmolLM2-135M-Instruct's GGUF (`python -m avalon.serve`'s `build_server`) on loopback,
warms every program up, then alternates the two sides `--rounds` times: the same `--clients`
greedy requests (distinct questions) sent one after another, and all at once from a thread
each. Prints completion tokens per second of each side, their ratio, and the engine's tokens
per decode dispatch (rows sharing a dispatch) while concurrent.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import time

from configs.smol_org import smollm2_gguf


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--max_tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    import openai

    from avalon.serve import build_server
    srv = build_server(smollm2_gguf(), slots=args.clients + 8, max_context=512,
                       prefill_chunk=128, kv_pages=256).start()
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                           timeout=1800)

    def ask(i: int) -> int:
        r = client.chat.completions.create(
            model=srv.name, messages=[{"role": "user", "content": f"Tell me a fact ({i})."}],
            max_tokens=args.max_tokens, temperature=0, stream=False)
        return r.usage.completion_tokens

    def serial() -> tuple[int, float]:
        t0 = time.perf_counter()
        n = sum(ask(i) for i in range(args.clients))
        return n, time.perf_counter() - t0

    def together() -> tuple[int, float]:
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            n = sum(pool.map(ask, range(args.clients)))
        return n, time.perf_counter() - t0

    together()
    serial()  # every bucket compiled
    rows = {"serial": [], "concurrent": []}
    shared = []
    for _ in range(args.rounds):
        n, s = serial()
        rows["serial"].append(n / s)
        before = srv.worker.stats()
        n, s = together()
        rows["concurrent"].append(n / s)
        after = srv.worker.stats()
        shared.append((after["decode_tokens"] - before["decode_tokens"])
                      / (after["decode_dispatches"] - before["decode_dispatches"]))
    srv.close()
    ser = sum(rows["serial"]) / args.rounds
    con = sum(rows["concurrent"]) / args.rounds
    print(json.dumps({"clients": args.clients, "max_tokens": args.max_tokens,
                      "serial_tokens_per_s": rows["serial"],
                      "concurrent_tokens_per_s": rows["concurrent"],
                      "ratio": con / ser,
                      "tokens_per_decode_dispatch": shared}, indent=1))


if __name__ == "__main__":
    main()
