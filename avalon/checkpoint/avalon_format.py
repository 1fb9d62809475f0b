"""Avalon's own params checkpoint: an orbax checkpoint of the params plus the ModelConfig.

    DIR/config.json     every ModelConfig field (enums by value)
    DIR/params/         orbax StandardCheckpointer (tensorstore), restorable onto any mesh

`save_avalon(path, cfg, params)` / `load_avalon(path, mesh=None) -> (cfg, params)`. This is what
`python -m avalon.tools.convert --to=avalon` writes; training state (optimizer, step, RNG,
samplers) lives in `train_state.TrainCheckpointer` instead.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import typing
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from avalon.checkpoint.train_state import array_registry
from avalon.model.config import ModelConfig
from avalon.model.params import abstract_params, param_shardings
from avalon.sharding import TRAIN_RULES, Rules

CONFIG_NAME = "config.json"
PARAMS_DIR = "params"
FORMAT = "avalon-params-v1"


def _checkpointer() -> ocp.Checkpointer:
    """A synchronous orbax checkpointer (replica-parallel writes off: see array_registry)."""
    return ocp.Checkpointer(ocp.PyTreeCheckpointHandler(
        type_handler_registry=array_registry(replica_parallel=False)))


def config_to_dict(cfg: ModelConfig) -> dict:
    """Every ModelConfig field, JSON-ready (enums as their values)."""
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        out[f.name] = v.value if isinstance(v, enum.Enum) else v
    return out


def config_from_dict(d: dict) -> ModelConfig:
    """Inverse of `config_to_dict`; fields absent from `d` take their defaults."""
    hints = typing.get_type_hints(ModelConfig)
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    kw = {}
    for k, v in d.items():
        if k not in names:
            raise ValueError(f"avalon config: unknown ModelConfig field {k!r}={v!r}")
        hint = hints[k]
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            try:
                v = hint(v)
            except ValueError:
                raise ValueError(f"avalon config: {k}={v!r} is not a {hint.__name__} "
                                 f"(one of {[m.value for m in hint]})") from None
        kw[k] = v
    return ModelConfig(**kw)


def save_avalon(path: str | os.PathLike, cfg: ModelConfig, params) -> None:
    """Write params (any sharding) and the config; returns once the write is durable."""
    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    with _checkpointer() as ckptr:
        ckptr.save(path / PARAMS_DIR, args=ocp.args.PyTreeSave(params))
    tmp = path / (CONFIG_NAME + ".partial")
    tmp.write_text(json.dumps({"format": FORMAT, "model": config_to_dict(cfg)}, indent=2) + "\n")
    os.replace(tmp, path / CONFIG_NAME)


def read_config(path: str | os.PathLike) -> ModelConfig:
    path = Path(path)
    try:
        d = json.loads((path / CONFIG_NAME).read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no {CONFIG_NAME}; not an avalon params checkpoint") from None
    if d.get("format") != FORMAT:
        raise ValueError(f"{path / CONFIG_NAME}: format {d.get('format')!r} is not {FORMAT!r}")
    return config_from_dict(d["model"])


def is_avalon_checkpoint(path: str | os.PathLike) -> bool:
    path = Path(path)
    return (path / PARAMS_DIR).is_dir() and (path / CONFIG_NAME).is_file()


def load_avalon(path: str | os.PathLike, mesh: jax.sharding.Mesh | None = None, *,
                rules: Rules = TRAIN_RULES,
                param_dtype: str | None = None) -> tuple[ModelConfig, dict]:
    """Restore (cfg, params): onto `mesh` per `param_shardings(cfg, mesh, rules)`, or onto the
    default device when mesh is None. Each device reads only its own shards. `param_dtype`
    casts while reading (and sets the config's `param_dtype` and `dtype`)."""
    path = Path(path).absolute()
    cfg = read_config(path)
    if param_dtype is not None:
        cfg = cfg.replace(param_dtype=param_dtype, dtype=param_dtype)
    abstract = abstract_params(cfg)
    if mesh is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree.map(lambda _: device, abstract)
    else:
        shardings = param_shardings(cfg, mesh, rules)
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, shardings)
    with _checkpointer() as ckptr:
        params = ckptr.restore(path / PARAMS_DIR, args=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target)))
    return cfg, params
