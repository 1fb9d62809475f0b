"""Convert between Hugging Face checkpoints (Nemotron-H, Llama, Qwen2, Qwen3, Qwen3-MoE), GGUF
files of those families, and avalon params checkpoints.

    python -m avalon.tools.convert --src=/ckpt/NVIDIA-Nemotron-3-Super-120B-A12B-BF16 \
        --dst=/ckpt/super-avalon --to=avalon
    python -m avalon.tools.convert --src=/ckpt/super-avalon --dst=/out/super-hf --to=hf
    python -m avalon.tools.convert --src=runs/toy --dst=/out/toy-hf --to=hf   # a trained run
    python -m avalon.tools.convert --src=SmolLM2-135M-Instruct.Q4_1.gguf --dst=/out/smol --to=hf

A GGUF file (llama.cpp's format; `avalon/checkpoint/gguf.py`) is read as the HF checkpoint it
stands for, its quantised tensors dequantised to float32 (`--param_dtype` casts them), and
written with its tokenizer and chat template as HF tokenizer files (`tokenizer.json`,
`tokenizer_config.json`, `special_tokens_map.json`), so `transformers` alone loads the result.

--to=avalon reads a local HF directory (hub or transformers layout) onto a mesh of this host's
devices (`--mesh`, default every device on the tensor axis, so no device holds the whole model)
and writes `avalon.checkpoint.avalon_format` (orbax params + ModelConfig JSON), readable with
`load_avalon`. The source config.json is kept as `hf_config.json`, so converting back restores
its token ids and other fields the model config does not carry. --to=hf writes the hub layout
(sharded safetensors + index + config.json). Other files of the source directory (tokenizer,
generation config, chat template) are copied along. Progress goes to stderr.

A trained run (`RUN`, its newest checkpoint, or `RUN/checkpoints/N`) exports its params
(`avalon.train.run_dir`) to either format; the tokenizer files and extra HF config keys come
from the run's `tokenizer_path` or `init_from` HF directory when it has one; a run trained with
the word tokenizer (the toy) gets its word list (RUN/tokenizer_record.json) written as
tokenizer.json, so `transformers` alone encodes and decodes for it. A run's export carries a
model card of the run (README.md, `avalon/checkpoint/model_card.py`: the step, the updates
behind it, its evaluations, code and command), never the README of the checkpoint it started
from.
"""

from __future__ import annotations

import enum
import json
import shutil
import sys
import time
from pathlib import Path

import jax
from absl import app, flags

from avalon import command
from avalon.checkpoint import avalon_format, hf, hf_config
from avalon.checkpoint.model_card import run_card
from avalon.sharding import make_mesh
from avalon.tokenizer.hf_files import write_tokenizer_files
from avalon.tokenizer.record import RECORD_FILE, from_record
from avalon.tokenizer.word import WordTokenizer
from avalon.tokenizer.word_export import as_tokenizers
from avalon.train import run_dir

HF_CONFIG_COPY = "hf_config.json"
CARD = "README.md"  # a run's export: the model card of the run itself (`model_card.py`)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf",
                    ".partial")
_NOT_COPIED = {"config.json", HF_CONFIG_COPY, "model.safetensors.index.json",
               "pytorch_model.bin.index.json"}


class Target(enum.Enum):
    AVALON = "avalon"
    HF = "hf"


class ProgressBar:
    """`bar(done, total)` redraws one stderr line: a bar, count, elapsed time and ETA."""

    def __init__(self, label: str, stream=None, width: int = 30):
        self.label, self.stream, self.width = label, stream or sys.stderr, width
        self.start = time.monotonic()
        self.last = -1.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < 0.1:  # redraw at most 10 times a second
            return
        self.last = now
        elapsed = now - self.start
        eta = elapsed / done * (total - done) if done else 0.0
        filled = int(self.width * done / max(total, 1))
        self.stream.write(f"\r{self.label} [{'#' * filled:<{self.width}}] {done}/{total} tensors "
                          f"{elapsed:6.1f}s ETA {eta:6.1f}s")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def parse_mesh(spec: str) -> dict[str, int]:
    """'data=1,tensor=8' -> {'data': 1, 'tensor': 8}; '' -> every device on tensor."""
    if not spec:
        return {"tensor": len(jax.devices())}
    out = {}
    for part in spec.split(","):
        name, _, size = part.partition("=")
        if not size.strip().isdigit():
            raise ValueError(f"--mesh={spec!r}: {part!r} is not axis=size")
        out[name.strip()] = int(size)
    return out


def _copy_aux_files(src: Path, dst: Path, skip: frozenset[str] = frozenset()) -> list[str]:
    copied = []
    for f in sorted(src.iterdir()):
        if f.is_file() and f.name not in _NOT_COPIED | skip and not f.name.startswith(".") \
                and not f.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(f, dst / f.name)
            copied.append(f.name)
    return copied


def _run_aux_dir(run: Path) -> Path | None:
    """The directory whose tokenizer files (and HF config keys) a run's export carries: the
    run's `tokenizer_path`, else its `init_from` when that is a Hugging Face directory."""
    d = run_dir.run_config(run)
    for key in ("tokenizer_path", "init_from"):
        path = d.get(key) or ""
        if path and (Path(path) / "config.json").is_file() and not run_dir.is_run(path) \
                and not avalon_format.is_avalon_checkpoint(path):
            return Path(path)
    return None


def _run_gguf(run: Path) -> Path | None:
    """The GGUF file a run started from or took its tokenizer from, if any (its tokenizer and
    HF config keys go with the export)."""
    d = run_dir.run_config(run)
    for key in ("tokenizer_path", "init_from"):
        path = d.get(key) or ""
        if path and Path(path).is_file() and hf.is_gguf(path):
            return Path(path)
    return None


def _write_word_tokenizer(run, dst: Path) -> None:
    """A run trained with the word tokenizer: its word list (RUN/tokenizer_record.json) as
    tokenizer.json + tokenizer_config.json, so `transformers` alone encodes and decodes with
    the run's ids (`avalon/tokenizer/word_export.py`)."""
    record = run / RECORD_FILE
    if not record.is_file():
        return
    tok = from_record(json.loads(record.read_text()), where=str(record))
    if isinstance(tok, WordTokenizer):
        write_tokenizer_files(dst, as_tokenizers(tok))


def convert(src: str | Path, dst: str | Path, to: Target, *, mesh_spec: str = "",
            param_dtype: str | None = None, max_shard_bytes: int = hf.DEFAULT_MAX_SHARD_BYTES,
            progress: bool = True) -> None:
    """Convert `src` into `dst` (see the module docstring)."""
    src, dst = Path(src), Path(dst)
    mesh = make_mesh(parse_mesh(mesh_spec))
    overrides = {} if param_dtype is None else {"param_dtype": param_dtype}
    if src.is_file():
        _convert_gguf(src, dst, to, mesh, overrides, max_shard_bytes, progress)
        return
    if run_dir.is_run(src):  # a trained run: RUN or RUN/checkpoints/N
        cfg, params, step = run_dir.load_run_params(src, mesh)
        if param_dtype is not None:
            cfg = cfg.replace(param_dtype=param_dtype, dtype=param_dtype)
            params = jax.tree.map(lambda a: a.astype(param_dtype), params)
        run = run_dir.resolve(src)[0]
        aux = _run_aux_dir(run)
        extra = hf_config.read_json(aux / "config.json") \
            if aux is not None and (aux / "config.json").is_file() else None
        gguf_src = _run_gguf(run) if aux is None else None
        if gguf_src is not None:
            from avalon.checkpoint.gguf import GgufCheckpoint
            extra = GgufCheckpoint(gguf_src).hf_config()
        if to == Target.AVALON:
            avalon_format.save_avalon(dst, cfg, params)
        else:
            bar = ProgressBar("writing HF") if progress else None
            hf.save(dst, cfg, params, max_shard_bytes=max_shard_bytes, extra_config=extra,
                    progress=bar)
        if aux is not None:  # its tokenizer files; its card describes the base, not the run
            _copy_aux_files(aux, dst, skip=frozenset({CARD}))
        elif gguf_src is not None:
            from avalon.tokenizer.gguf import write_gguf_tokenizer_files
            write_gguf_tokenizer_files(gguf_src, dst, model_max_length=cfg.max_context)
        else:
            _write_word_tokenizer(run, dst)
        (dst / CARD).write_text(run_card(run, step=step, exported_as=to.value,
                                         param_dtype=param_dtype), encoding="utf-8")
        return
    if to == Target.AVALON:
        if avalon_format.is_avalon_checkpoint(src):
            raise ValueError(f"--src={src} is already an avalon checkpoint")
        bar = ProgressBar("reading HF") if progress else None
        cfg, params = hf.load(src, mesh, progress=bar, **overrides)
        avalon_format.save_avalon(dst, cfg, params)
        shutil.copy2(src / "config.json", dst / HF_CONFIG_COPY)
    else:
        if not avalon_format.is_avalon_checkpoint(src):
            raise ValueError(f"--src={src} is not an avalon checkpoint (no config.json + params/)"
                             " nor a run directory (no checkpoints/); convert HF -> avalon "
                             "first")
        cfg, params = avalon_format.load_avalon(src, mesh, param_dtype=param_dtype)
        extra = None
        if (src / HF_CONFIG_COPY).exists():
            extra = hf_config.read_json(src / HF_CONFIG_COPY)
        bar = ProgressBar("writing HF") if progress else None
        hf.save(dst, cfg, params, max_shard_bytes=max_shard_bytes, extra_config=extra,
                progress=bar)
    _copy_aux_files(src, dst)


def _convert_gguf(src: Path, dst: Path, to: Target, mesh, overrides: dict,
                  max_shard_bytes: int, progress: bool) -> None:
    """A GGUF file -> an HF directory or an avalon checkpoint, each with the file's tokenizer
    files (and for avalon its HF config as `hf_config.json`, so converting on restores it)."""
    from avalon.checkpoint.gguf import GgufCheckpoint, GgufError
    from avalon.tokenizer.gguf import write_gguf_tokenizer_files

    if not hf.is_gguf(src):
        raise ValueError(f"--src={src} is a file but not a GGUF file (no 'GGUF' magic); give a "
                         "GGUF file, a checkpoint directory or a run directory")
    try:
        ck = GgufCheckpoint(src)
    except GgufError as e:
        raise ValueError(str(e)) from None
    try:
        raw = ck.hf_config()
        bar = ProgressBar("reading GGUF") if progress else None
        cfg, params = hf.load_tensors(raw, ck.tensors(), mesh, source=str(src), progress=bar,
                                      **overrides)
        if to == Target.AVALON:
            avalon_format.save_avalon(dst, cfg, params)
            hf_config.write_json(dst / HF_CONFIG_COPY, raw)
        else:
            bar = ProgressBar("writing HF") if progress else None
            hf.save(dst, cfg, params, max_shard_bytes=max_shard_bytes, extra_config=raw,
                    progress=bar)
        write_gguf_tokenizer_files(ck, dst, model_max_length=cfg.max_context)
    finally:
        ck.close()


_SRC = flags.DEFINE_string("src", None, "source checkpoint directory, GGUF file or run "
                           "directory", required=True)
_DST = flags.DEFINE_string("dst", None, "destination directory", required=True)
_TO = flags.DEFINE_enum_class("to", None, Target, "output format: avalon or hf", required=True,
                              case_sensitive=False)
_MESH = flags.DEFINE_string("mesh", "", "mesh to load onto, e.g. 'tensor=8' (default: every "
                            "device on tensor)")
_DTYPE = flags.DEFINE_enum("param_dtype", None, ["float32", "bfloat16", "float16"],
                           "cast params to this dtype (default: keep the checkpoint's)")
_SHARD_GB = flags.DEFINE_float("max_shard_gb", 5.0, "--to=hf: largest safetensors file, GB")


def main(argv):
    del argv
    if not Path(_SRC.value).exists():
        raise command.Stop(f"--src={_SRC.value}: no such file or directory")
    convert(_SRC.value, _DST.value, _TO.value, mesh_spec=_MESH.value, param_dtype=_DTYPE.value,
            max_shard_bytes=int(_SHARD_GB.value * 1e9))


if __name__ == "__main__":  # one line for bad input and Ctrl-C (avalon/command.py)
    command.run("avalon.tools.convert",
                lambda: app.run(main, flags_parser=command.absl_flags_parser()),
                interrupted="stopped; --dst is incomplete: rerun the same command")
