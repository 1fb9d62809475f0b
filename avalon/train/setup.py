"""Everything a run builds once from its config: tokenizer, environments, mesh, params, steps.

The params exist once. The SFT and RLCR update steps donate and replace them; the engine reads
them through `Switch` (timed as `time/switch_s`): the decode view in `engine.decode_dtype`
(`avalon/inference/weights.py`: bf16 matrices on the accelerators, the fp32 master itself on
the CPU toy), cast on the training layout so that any re-layout moves the narrow bytes, then
`engine_params`:
- training and decode layouts agree (no `fsdp` axis) on one process: the very same arrays,
  nothing moves;
- otherwise the params are re-laid out for decoding (`DECODE_RULES`: weights whole along
  `embed`, experts and heads still split over the `expert` and `tensor` axes, which must lie
  within a host), and each process's engine serves its own organisations from the replica on
  its local devices, assembled from the re-laid-out arrays' addressable shards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from avalon import paths, sharding
from avalon.backends.training import TrainingPlatform
from avalon.checkpoint import avalon_format, hf
from avalon.envs.base import Environment, Split
from avalon.inference.weights import DecodeView
from avalon.model import init_params, param_shardings
from avalon.model.config import ModelConfig
from avalon.org.vocabulary import org_vocabulary
from avalon.rl.config import LossKind
from avalon.rl.update import UpdateStep, make_update_step
from avalon.tokenizer import ByteTokenizer, ChatFormat, HFTokenizer, WordTokenizer
from avalon.tokenizer.record import RECORD_FILE
from avalon.train import batch_plan, run_dir
from avalon.train.config import TokenizerKind, TrainConfig


@dataclasses.dataclass
class Setup:
    cfg: TrainConfig
    envs: list[Environment]
    chat: ChatFormat
    mesh: Mesh
    local_mesh: Mesh  # this process's devices (the engine's)
    sft_step: UpdateStep
    rl_step: UpdateStep

    @property
    def env_by_name(self) -> dict[str, Environment]:
        return {e.name: e for e in self.envs}


def build_tokenizer(cfg: TrainConfig, envs: list[Environment]):
    if cfg.tokenizer is TokenizerKind.WORD:
        words: list[str] = list(org_vocabulary())
        for env in envs:
            words += env.vocabulary()
        return WordTokenizer(tuple(dict.fromkeys(words)))  # first occurrence order, no repeats
    if cfg.tokenizer is TokenizerKind.BYTE:
        return ByteTokenizer()
    return hf_tokenizer(cfg)


def hf_tokenizer(cfg: TrainConfig) -> HFTokenizer:
    """The `tokenizer_path` checkpoint directory's tokenizer, or a GGUF file's vocabulary and
    chat template; tool calls as text when `org.text_tool_calls`."""
    if os.path.isfile(cfg.tokenizer_path) and hf.is_gguf(cfg.tokenizer_path):
        from avalon.tokenizer.gguf import load_gguf_tokenizer
        return load_gguf_tokenizer(cfg.tokenizer_path, text_calls=cfg.org.text_tool_calls)
    return HFTokenizer.from_dir(cfg.tokenizer_path, text_calls=cfg.org.text_tool_calls)


def check_init_words(cfg: TrainConfig, tok) -> None:
    """A word tokenizer's ids depend on the environments' words: a checkpoint that records the
    word list it was trained with (RUN/tokenizer_record.json, or beside an export's files)
    must share this run's, else every embedding row would mean another word."""
    if not cfg.init_from or not isinstance(tok, WordTokenizer):
        return
    where = run_dir.resolve(cfg.init_from)
    record = (where[0] if where else paths.path(cfg.init_from)) / RECORD_FILE
    if not record.exists():
        return
    words = json.loads(record.read_text()).get("words")
    if words is not None and list(words) != tok.words:
        raise ValueError(f"config.init_from={cfg.init_from!r}: its {RECORD_FILE} lists other "
                         "words than this config's environments give (every id would mean "
                         "another word); start from scratch (init_from='') or from a "
                         "checkpoint trained on these environments")


def build(cfg: TrainConfig, env_section) -> Setup:
    envs = list(cfg.make_environments(env_section))
    if not envs:
        raise ValueError("config.make_environments returned no environments")
    names = [e.name for e in envs]
    if len(set(names)) != len(names):
        raise ValueError(f"config.make_environments: environment names repeat: {names}")
    for e in envs:
        if not e.task_ids(Split.HELDOUT):
            raise ValueError(f"environment {e.name!r} has no held-out tasks for evaluation")
    tok = build_tokenizer(cfg, envs)
    if tok.vocab_size > cfg.model.vocab_size:
        raise ValueError(f"config.tokenizer={cfg.tokenizer.value!r} needs {tok.vocab_size} ids, "
                         f"more than the model's vocab_size={cfg.model.vocab_size} "
                         "(config.model.overrides.vocab_size)")
    check_init_words(cfg, tok)
    mesh = sharding.make_mesh(cfg.mesh)
    local_mesh = make_local_mesh(mesh)
    # The update steps' platform choices, made once for the run's mesh and model.
    platform = TrainingPlatform.for_mesh(mesh, cfg.model)
    sft_rl = dataclasses.replace(cfg.rl, loss=LossKind.SFT, lr=cfg.sft.lr,
                                 micro_batches=batch_plan.sft_micro_batches(cfg))
    # A tokenizer with a chat template renders through its markup (avalon/tokenizer/hf.py).
    rendering = tok.rendering if isinstance(tok, HFTokenizer) else None
    return Setup(cfg=cfg, envs=envs, chat=ChatFormat(tok, rendering), mesh=mesh,
                 local_mesh=local_mesh,
                 sft_step=make_update_step(cfg.model, sft_rl, mesh=mesh, platform=platform),
                 rl_step=make_update_step(cfg.model, cfg.rl, mesh=mesh, platform=platform))


def load_init_from(path: str, mesh: Mesh, param_dtype: str) -> tuple[ModelConfig, dict]:
    """(config, params on `mesh`) from a run directory or one of its checkpoints (the trained
    params), an avalon params checkpoint, or a Hugging Face directory or GGUF file, in that
    order."""
    if run_dir.is_run(path):
        loaded_cfg, params, _ = run_dir.load_run_params(path, mesh)
    elif avalon_format.is_avalon_checkpoint(path):
        loaded_cfg, params = avalon_format.load_avalon(path, mesh)
    else:
        return hf.load(path, mesh, param_dtype=param_dtype)
    if loaded_cfg.param_dtype != param_dtype:
        params = jax.tree.map(lambda a: a.astype(param_dtype), params)
    return loaded_cfg, params


def initial_params(cfg: TrainConfig, mesh: Mesh) -> tuple[ModelConfig, dict]:
    """Random init, or the params of `init_from` (see `load_init_from`) placed on the mesh."""
    if cfg.init_from:
        if not os.path.isdir(cfg.init_from) and not hf.is_gguf(cfg.init_from):
            raise ValueError(f"config.init_from={cfg.init_from!r}: no such directory or GGUF "
                             "file")
        loaded_cfg, params = load_init_from(cfg.init_from, mesh, cfg.model.param_dtype)
        for field in ("pattern", "hidden_size", "vocab_size"):
            if getattr(loaded_cfg, field) != getattr(cfg.model, field):
                raise ValueError(f"config.init_from: the checkpoint's {field}="
                                 f"{getattr(loaded_cfg, field)!r} differs from config.model's "
                                 f"{getattr(cfg.model, field)!r}")
        if cfg.tokenizer is TokenizerKind.HF and not run_dir.is_run(cfg.init_from):
            params = init_added_rows(params, hf_tokenizer(cfg))
        return cfg.model, params
    shardings = param_shardings(cfg.model, mesh, sharding.TRAIN_RULES)
    return cfg.model, init_params(jax.random.key(cfg.seed), cfg.model, shardings)


def init_added_rows(params: dict, tok: HFTokenizer) -> dict:
    """Embedding (and untied output) rows of the tokens the tokenizer added to a checkpoint's
    vocabulary (`tok.added`, e.g. `<|call|>` where there is no `<tool_call>`): each the mean of
    the rows of its string spelt as text (`<`, `|`, `call`, ...), so a new special starts near
    what its name means instead of at an untrained padding row. A run directory's params are
    trained already and are not touched."""
    embed = params["embed"]
    for i, text in sorted(tok.added.items()):
        if i >= embed.shape[0]:
            raise ValueError(f"tokenizer added {text!r} as id {i}, outside the model's "
                             f"vocab_size={embed.shape[0]}")
        pieces = np.asarray(tok.encode(text))
        embed = embed.at[i].set(embed[pieces].mean(axis=0))
        if "lm_head" in params:
            head = params["lm_head"]
            params = {**params, "lm_head": head.at[:, i].set(head[:, pieces].mean(axis=1))}
    return {**params, "embed": embed}


def make_local_mesh(mesh: Mesh) -> Mesh:
    """This process's devices as the engine's mesh, cut from the global mesh so every device
    keeps its `expert` / `tensor` position (the engine's params are the global arrays' local
    shards); the `data` and `fsdp` positions fold into the engine's slot axis."""
    devices = mesh.devices  # [data, fsdp, expert, tensor]
    mine = np.vectorize(lambda d: d.process_index == jax.process_index())(devices)
    e, t = mesh.shape["expert"], mesh.shape["tensor"]
    rows = mine.reshape(-1, e * t)  # one row per (data, fsdp) position
    if not np.all(rows.all(axis=1) == rows.any(axis=1)):
        raise ValueError(f"config.mesh: the expert x tensor = {e * t} model axes must lie within "
                         "one process's devices (the engine runs per host)")
    local = devices[mine].reshape(-1, 1, e, t)
    return Mesh(local, sharding.MESH_AXES,
                axis_types=(jax.sharding.AxisType.Auto,) * len(sharding.MESH_AXES))


def engine_params(params: dict, cfg: ModelConfig, mesh: Mesh, local_mesh: Mesh) -> dict:
    """The engine's view of the training params on this process's devices (see the module
    docstring)."""
    train = param_shardings(cfg, mesh, sharding.TRAIN_RULES)
    decode = param_shardings(cfg, mesh, sharding.DECODE_RULES)
    same = all(a.spec == b.spec for a, b in zip(jax.tree.leaves(train), jax.tree.leaves(decode)))
    if jax.process_count() == 1 and same:
        return params
    if not same:
        params = jax.device_put(params, decode)  # the collective part of the switch
    local_decode = param_shardings(cfg, local_mesh, sharding.DECODE_RULES)

    def local(a: jax.Array, target: NamedSharding) -> jax.Array:
        by_index = {}
        for shard in a.addressable_shards:
            by_index.setdefault(shard.device, shard.data)
        arrays = [by_index[d] for d in target.addressable_devices_indices_map(a.shape)]
        return jax.make_array_from_single_device_arrays(a.shape, target, arrays)

    return jax.tree.map(local, params, local_decode)


class Switch:
    """`switch(master)` -> the engine's params (see the module docstring); `metrics` then holds
    its cost: `time/switch_cast_s` (the cast alone), `switch/bytes` (what the cast wrote: 0
    when the engine reads the master itself) and `time/switch_view_s` (cast + re-layout,
    blocked until ready). Timings sit under time/ with the run's other timings, so a resumed
    run's metrics compare equal without them (tests/train/runner.py `deterministic`)."""

    def __init__(self, cfg: TrainConfig, mesh: Mesh, local_mesh: Mesh):
        self.model, self.mesh, self.local_mesh = cfg.model, mesh, local_mesh
        self.view = DecodeView(cfg.model, dtype=cfg.engine.decode_dtype)
        self.metrics: dict[str, float] = {}

    def __call__(self, params: dict) -> dict:
        t0 = time.perf_counter()
        out = jax.block_until_ready(engine_params(self.view(params), self.model, self.mesh,
                                                  self.local_mesh))
        self.metrics = {"time/switch_view_s": time.perf_counter() - t0,
                        "time/switch_cast_s": self.view.last_seconds,
                        "switch/bytes": 0 if self.view.identity else self.view.nbytes()}
        return out


def global_batch(local_batch, batch_sharding: NamedSharding):
    """Assemble the global training batch from each process's packed sequences."""
    if jax.process_count() == 1:
        return local_batch
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(batch_sharding, np.asarray(x)),
        local_batch)
