"""The trained params of a run directory (what `python -m avalon.main` wrote), for export and
for `init_from`.

    RUN/config.json              the resolved config (its `model` and `rl` sections are read)
    RUN/checkpoints/N/           orbax training states (params, optimizer, step), newest = last

`load_run_params(path, mesh)` accepts `RUN` (the newest checkpoint) or `RUN/checkpoints/N` (that
step). The restore target is the training state `make_update_step` builds for the run's model
and RL config, laid out on `mesh`, so each device reads only its part of the params (a run
trained on a pod loads onto one host's devices); the optimizer state is read and dropped.
"""

from __future__ import annotations

import json
import os

import jax
from etils import epath
from jax.sharding import Mesh

from avalon import paths
from avalon.checkpoint import avalon_format
from avalon.checkpoint.train_state import TrainCheckpointer
from avalon.model.config import ModelConfig
from avalon.model.params import abstract_params, param_shardings
from avalon.rl.config import RLConfig
from avalon.rl.update import make_update_step
from avalon.sharding import TRAIN_RULES
from avalon.train.config import build_dataclass

CHECKPOINTS = "checkpoints"


def resolve(path: str | os.PathLike) -> tuple[epath.Path, epath.Path, int | None] | None:
    """(run directory, checkpoints directory, step or None for the newest) when `path` is a
    run directory (local or a gs:// URL) or one of its checkpoint steps; None otherwise."""
    path = paths.path(path)
    if path.name.isdigit() and path.parent.name == CHECKPOINTS:
        return path.parent.parent, path.parent, int(path.name)
    if (path / CHECKPOINTS).is_dir():
        return path, path / CHECKPOINTS, None
    return None


def is_run(path: str | os.PathLike) -> bool:
    return resolve(path) is not None


def run_config(run: epath.Path) -> dict:
    file = run / "config.json"
    if not file.is_file():
        raise ValueError(f"{run}: no config.json; not a run directory of avalon.main")
    d = json.loads(file.read_text())
    if not isinstance(d.get("model"), dict) or not isinstance(d.get("rl"), dict):
        raise ValueError(f"{file}: no model and rl sections; not a run directory's config")
    return d


def model_config(path: str | os.PathLike) -> ModelConfig:
    """The run's ModelConfig (from its config.json)."""
    where = resolve(path)
    if where is None:
        raise ValueError(f"{path}: not a run directory (no {CHECKPOINTS}/)")
    return avalon_format.config_from_dict(run_config(where[0])["model"])


def load_run_params(path: str | os.PathLike, mesh: Mesh) -> tuple[ModelConfig, dict, int]:
    """(model config, params on `mesh` per TRAIN_RULES, checkpoint step); see the module
    docstring."""
    where = resolve(path)
    if where is None:
        raise ValueError(f"{path}: not a run directory (no {CHECKPOINTS}/) nor one of its "
                         f"{CHECKPOINTS}/N")
    run, ckpt_dir, step = where
    d = run_config(run)
    cfg = avalon_format.config_from_dict(d["model"])
    rl = build_dataclass(RLConfig, d["rl"], "rl")
    update = make_update_step(cfg, rl, mesh=mesh)
    shardings = param_shardings(cfg, mesh, TRAIN_RULES)
    params_abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                   abstract_params(cfg), shardings)
    state_abstract = jax.eval_shape(update.init_state, params_abstract)
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          state_abstract, update.state_shardings)
    if not ckpt_dir.is_dir():
        raise ValueError(f"{ckpt_dir}: no such checkpoints directory")
    with TrainCheckpointer(ckpt_dir, max_to_keep=None) as ckpt:
        step = ckpt.latest_step() if step is None else step
        if step is None:
            raise ValueError(f"{ckpt_dir}: no finished checkpoint")
        state, _ = ckpt.restore(step, target=target)
    return cfg, state.params, step
