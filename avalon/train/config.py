"""The experiment configuration: ml_collections at the edge, frozen dataclasses inside.

A config file (`configs/<name>.py::get_config()`) returns a `ConfigDict`; `from_config_dict`
converts it once into a `TrainConfig`, checking every key: an unknown key, a missing section, a
value of the wrong type, an impossible mesh or a budget above the configured maximum stops the
run at start-up with a message naming the field (`config.rl.lr=...`). Enum fields accept the
enum member or its value string (so `--config.rl.cap_mode=absolute` works on the command line).

`env` is a free-form section read only by `make_environments(config.env)`. Two fields are code,
not data: `make_environments(config) -> list[Environment]` and
`make_teacher(env, chat) -> Policy` (the SFT teacher organisation of an environment), so
environments are chosen by constructing them, never by a registry of names.

`curriculum` is the one optional section (`DifficultyConfig`, `avalon/envs/difficulty.py`:
online difficulty filtering and tier promotion); a config without it gets the default, off
(tasks drawn by the learning-progress sampler, `progress`, as the report does).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import typing
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

from avalon.envs.curriculum import ClockSchedule
from avalon.envs.difficulty import DifficultyConfig
from avalon.envs.samplers import BudgetConfig, ProgressConfig
from avalon.inference.api import SamplingParams
from avalon.model import presets
from avalon.model.config import ModelConfig
from avalon.org.config import OrgConfig
from avalon.rl.config import RLConfig, check_rl_sampling
from avalon.sharding import MESH_AXES
from avalon.train import batch_plan
from avalon.train.skills import Skill
from avalon.validation import FieldChecks

# The organisation's hire budget at most: the report samples b up to 8 (9 agents at most).
MAX_HIRES = 8


class TokenizerKind(enum.Enum):
    WORD = "word"  # compact word list from the environments' and the organisation's vocabulary
    BYTE = "byte"  # 256 bytes + specials
    HF = "hf"  # `tokenizer.json` from `tokenizer_path` (a checkpoint directory), or a GGUF
    # file's vocabulary and chat template


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    teacher_episodes: int = 256  # teacher rollouts whose rows form the SFT set
    steps: int = 200  # SFT updates
    batch_seqs: int = 16  # packed sequences per SFT update
    # Micro-batches of an SFT update (0: rl.micro_batches); batch_seqs must be a multiple of
    # this x the devices rows are split over (`train/batch_plan.py`).
    micro_batches: int = 0
    lr: float = 1e-3  # constant
    # Skill rows (`avalon/train/skills.py`, the toy's stand-in for pretraining): the first
    # `skill_steps` updates take skill rows only, every later one `skill_seqs` of its
    # `batch_seqs` sequences. No skills: teacher rows only.
    skills: tuple[Skill, ...] = ()
    skill_steps: int = 0
    skill_seqs: int = 0
    skill_row_tokens: tuple[int, int] = (48, 512)  # a skill row's length is drawn from this


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    steps: int = 40  # RLCR updates
    groups_per_step: int = 4  # tasks per step at step 0 (the report: 200 rising to 800)
    groups_per_step_end: int = 0  # 0: constant; else the count reached at groups_ramp_steps
    groups_ramp_steps: int = 1  # linear ramp of the group count
    rollouts_per_group: int = 8  # K (the report: 16)
    seq_len: int = 2048  # packed training sequence length
    seq_bucket: int = 8  # sequences per batch padded to a multiple of this (fewer compiles)
    # Rows of one update call at most (0: no cap, every row of a step in one call). An RL step
    # that packs more runs several updates of exactly this many rows: one compiled shape, the
    # one `experiments/scale/aot.py` measures (`train/batch_plan.py`).
    max_update_rows: int = 0
    # Length rungs of an update call (seq_len, seq_len / 2, ...; `train/batch_plan.py`): a call
    # whose rows end early takes the shortest rung that holds them. Each rung is one more
    # compiled shape: 1 (every call at seq_len) where a compile costs minutes (the pod).
    update_length_rungs: int = 1
    # Fresh groups played in place of groups without signal (every rollout's collective reward
    # the same, `rl.group_filter`), at most this many a step (`train/rl_groups.py`; DAPO's
    # dynamic sampling). 0: dropped and not replaced (the report's behaviour).
    refill_groups: int = 0
    temperature: float = 1.0  # sampling temperature (the log-probs use the same)
    top_p: float = 1.0  # must stay 1 for RL (refused otherwise: rl/config.check_rl_sampling)
    # The K sessions of a group share one environment seed (same bet outcomes, hidden test
    # inputs, defects): advantages compare policies, not luck (`envs.base.group_seeds`).
    common_random_numbers: bool = True
    # Write the event logs of every `log_every`-th RLCR step's rollouts under
    # WORKDIR/events/rl/ (0: none; `keep_event_logs` writes every step's).
    log_every: int = 0

    def __post_init__(self):
        if self.steps > 0:
            check_rl_sampling(self.top_p, 0, "rollout")


def groups_at(rollout: RolloutConfig, rl_step: int) -> int:
    """Task groups in RLCR step `rl_step` (a linear ramp when `groups_per_step_end` is set)."""
    if not rollout.groups_per_step_end:
        return rollout.groups_per_step
    frac = min(rl_step, rollout.groups_ramp_steps) / rollout.groups_ramp_steps
    return int(round(rollout.groups_per_step
                     + frac * (rollout.groups_per_step_end - rollout.groups_per_step)))


DECODE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    slots: int = 256  # engine slots: agents alive at once (rollouts beyond wait, RolloutDriver)
    steps_per_dispatch: int = 8
    prefill_chunk: int = 256
    # KV pool pages (16 positions each) at start; the pool doubles when short. Every size it
    # passes through compiles its own programs, so a config that knows its need starts there
    # (the toy: slots x window / 16, all of it).
    kv_pages: int = 16
    # The pool's ceiling (0: none, the pool doubles whenever it runs short). With one, a turn
    # starts only when its worst case fits beside the running turns' (it waits otherwise),
    # and a prompt the pool cannot hold even then is refused: a penalised turn that stops its
    # agent (`StopReason.POOL_FULL`). Set it where the memory budget ends: the accelerator
    # configs size it from the AOT compile of the decode step (RESULTS.md).
    max_kv_pages: int = 0
    # The weights the engine decodes with, made from the trainer's master at every switch
    # (avalon/inference/weights.py DecodeView): "float32" reads the master itself (no copy);
    # "bfloat16" a bf16 view of its matrices (half the bytes per decoded token; the sampler /
    # trainer mismatch shows in train/ratio_*). On the accelerators bf16; see the configs.
    decode_dtype: str = "float32"
    # Feed the engine continuously (`RolloutDriver(continuous=True)`): each rollout's next turns
    # join the running dispatches as soon as its last ones came back and its tools ran, instead
    # of every rollout waiting for the slowest turn of a tick. The same turns either way.
    continuous: bool = True

    def __post_init__(self):
        if self.decode_dtype not in DECODE_DTYPES:
            raise ValueError(f"decode_dtype={self.decode_dtype!r}: must be one of "
                             f"{list(DECODE_DTYPES)}")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    every: int = 10  # RL steps between held-out evaluations (and at step 0, after SFT)
    tasks: int = 16  # held-out tasks per evaluation (per environment)
    tier: int = -1  # the difficulty tier they come from (-1: the top, today's; eval_seeds.py)
    seeds: int = 2  # sampled rollouts per task and arm
    budget: int = 8  # the organisation arm's hire budget (the single agent has 0)
    clock_s: float = 300.0  # wall-clock cap of evaluation rollouts
    log_events: bool = True  # write every evaluation rollout's event log (WORKDIR/events/eval/)
    # Baselines (avalon/train/baselines.py), run after each evaluation on the same tasks:
    s8: bool = False  # S8: one agent per org rollout, refused until it matches its output tokens
    s8_clock_s: float = 0.0  # S8's wall clock; 0: clock_s x (1 + budget)
    best_of_k: int = 0  # k single agents per task, scored best-of-k and by vote; 0: off
    sweep_clocks: tuple[float, ...] = ()  # the org and single arms again under each clock


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = 10  # RL steps between checkpoints (SFT saves once at its end)
    keep: int = 3
    # Arrays in one OCDBT database per step (orbax's default); False: one zarr store per array,
    # for storage without conditional writes (a GCS emulator; tests/train/test_remote_workdir.py).
    ocdbt: bool = True


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    seed: int
    model: ModelConfig
    init_from: str  # "" = random init; else a run directory (or its checkpoints/N), an avalon
    # params checkpoint, a Hugging Face directory or a GGUF file (`setup.load_init_from`)
    mesh: dict[str, int]
    tokenizer: TokenizerKind
    tokenizer_path: str
    org: OrgConfig
    make_environments: Callable
    make_teacher: Callable
    budget: BudgetConfig
    clock: ClockSchedule
    progress: ProgressConfig
    sft: SFTConfig
    rollout: RolloutConfig
    rl: RLConfig
    engine: EngineConfig
    eval: EvalConfig
    checkpoint: CheckpointConfig
    plots: bool
    keep_event_logs: bool  # write every rollout's event log under WORKDIR/events/
    # Online difficulty filtering and tier promotion (optional section; off by default)
    curriculum: DifficultyConfig = DifficultyConfig()

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.rollout.temperature, top_p=self.rollout.top_p)


def mesh_section(**sizes: int) -> ml_collections.ConfigDict:
    """A `mesh` section naming every mesh axis (size 1 unless given), so any axis can be set
    from the command line (`--config.mesh.tensor=2`)."""
    for name in sizes:
        if name not in MESH_AXES:
            raise ValueError(f"mesh_section: {name}={sizes[name]!r}: unknown mesh axis; the axes "
                             f"are {list(MESH_AXES)}")
    return ml_collections.ConfigDict({a: int(sizes.get(a, 1)) for a in MESH_AXES})


def curriculum_section(**fields) -> ml_collections.ConfigDict:
    """A `curriculum` section naming every `DifficultyConfig` field (its default unless given),
    so any can be set from the command line (`--config.curriculum.enabled=True`)."""
    names = [f.name for f in dataclasses.fields(DifficultyConfig)]
    for name in fields:
        if name not in names:
            raise ValueError(f"curriculum_section: {name}={fields[name]!r}: unknown field; "
                             f"DifficultyConfig has {names}")
    return ml_collections.ConfigDict({**dataclasses.asdict(DifficultyConfig()), **fields})


def config_arg(arg: str, accepted: tuple[str, ...]) -> str:
    """`arg` (the `:arg` of `--config=FILE:arg`) if the config accepts it, else a ValueError
    naming it: a misspelt `:smok` must not silently run the full config."""
    if arg not in accepted:
        raise ValueError(f"config argument {arg!r} is not accepted; this config takes "
                         f"{[a for a in accepted if a] or 'none'}"
                         + (" (or none)" if "" in accepted and any(accepted) else ""))
    return arg


_fail = FieldChecks("config").fail  # config.PATH=value: why


def _coerce(path: str, value, annotation):
    """Check (and for enums and tuples, convert) one value against its field's type."""
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        if isinstance(value, annotation):
            return value
        try:
            return annotation(value)
        except ValueError:
            _fail(path, value, f"must be one of {[m.value for m in annotation]}")
    if annotation is bool:
        if not isinstance(value, bool):
            _fail(path, value, "must be a bool")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(path, value, "must be an int")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(path, value, "must be a number")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            _fail(path, value, "must be a string")
        return value
    if origin is tuple and isinstance(value, (list, tuple)):
        args = typing.get_args(annotation)
        if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: each element an X
            return tuple(_coerce(f"{path}[{i}]", v, args[0]) for i, v in enumerate(value))
        return tuple(value)
    if dataclasses.is_dataclass(annotation) and isinstance(value, (Mapping,
                                                                   ml_collections.ConfigDict)):
        return build_dataclass(annotation, value, path)  # a nested section (org.permissions)
    return value


def org_config(section) -> OrgConfig:
    """The OrgConfig of a config's `org` section (or of a run's config.json): `window` scales
    the rest (OrgConfig.scaled), every other key is an OrgConfig field."""
    org_section = dict(section.items())
    window = org_section.pop("window", None)
    if isinstance(window, bool) or not isinstance(window, int) or window < 64:
        _fail("org.window", window, "must be an int >= 64")
    org_fields = typing.get_type_hints(OrgConfig)
    for k in org_section:
        if k not in org_fields:
            raise ValueError(f"config.org: unknown OrgConfig field {k!r}")
    org_section = {k: _coerce(f"org.{k}", v, org_fields[k]) for k, v in org_section.items()}
    try:
        return OrgConfig.scaled(window, **org_section)
    except (TypeError, ValueError) as e:
        raise ValueError(f"config.org: {e}") from None


def model_config(section) -> ModelConfig:
    """The ModelConfig of a config's `model` section (`preset` + `overrides`), checked."""
    model_section = dict(section.items())
    if set(model_section) - {"preset", "overrides"}:
        raise ValueError(f"config.model: unknown key(s) "
                         f"{sorted(set(model_section) - {'preset', 'overrides'})}; "
                         "use model.preset and model.overrides")
    preset = model_section.get("preset")
    if preset not in presets.NAMES:
        _fail("model.preset", preset, f"must be one of {list(presets.NAMES)}")
    overrides = dict(model_section.get("overrides", {}).items())
    hints = typing.get_type_hints(ModelConfig)
    for k, v in overrides.items():
        if k not in hints:
            raise ValueError(f"config.model.overrides: unknown ModelConfig field {k!r}")
        overrides[k] = _coerce(f"model.overrides.{k}", v, hints[k])
    try:
        return presets.get(preset, **overrides)
    except ValueError as e:
        raise ValueError(f"config.model: {e}") from None


def build_dataclass(cls, section, path: str):
    """`cls(**section)` with every key checked against `cls`'s fields."""
    if isinstance(section, cls):
        return section
    if not isinstance(section, (Mapping, ml_collections.ConfigDict)):
        _fail(path, section, f"must be a section of {cls.__name__} fields")
    items = dict(section.items())
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(items) - names)
    if unknown:
        raise ValueError(f"config.{path}: unknown key(s) {unknown}; {cls.__name__} has "
                         f"{sorted(names)}")
    kwargs = {k: _coerce(f"{path}.{k}", v, hints[k]) for k, v in items.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"config.{path}: {e}") from None


_TOP = {"seed", "model", "init_from", "env", "mesh", "tokenizer", "tokenizer_path", "org",
        "make_environments", "make_teacher", "budget", "clock", "progress", "sft", "rollout",
        "rl", "engine", "eval", "checkpoint", "plots", "keep_event_logs"}
_OPTIONAL = {"curriculum"}  # sections a config may leave out (their defaults)


def _is_gguf(path) -> bool:
    """A GGUF model file (llama.cpp's format), which `init_from` and `tokenizer_path` take."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except (OSError, TypeError):
        return False


def from_config_dict(config: ml_collections.ConfigDict, *, num_devices: int,
                     num_processes: int = 1) -> TrainConfig:
    """Convert and validate (see the module docstring)."""
    items = dict(config.items())
    unknown = sorted(set(items) - _TOP - _OPTIONAL)
    if unknown:
        raise ValueError(f"config: unknown key(s) {unknown}; the sections are "
                         f"{sorted(_TOP | _OPTIONAL)}")
    missing = sorted(_TOP - set(items))
    if missing:
        raise ValueError(f"config: missing key(s) {missing}")

    model = model_config(items["model"])
    mesh = {k: v for k, v in dict(items["mesh"].items()).items()}
    for k, v in mesh.items():
        if k not in MESH_AXES:
            _fail(f"mesh.{k}", v, f"unknown mesh axis; the axes are {list(MESH_AXES)}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            _fail(f"mesh.{k}", v, "must be an int >= 1")
    size = 1
    for v in mesh.values():
        size *= v
    if size != num_devices:
        _fail("mesh", mesh, f"needs {size} devices but {num_devices} are available")

    org = org_config(items["org"])

    if items["init_from"] and not os.path.isdir(items["init_from"]) \
            and not _is_gguf(items["init_from"]):
        _fail("init_from", items["init_from"], "no such checkpoint directory or GGUF file")
    for name in ("make_environments", "make_teacher"):
        if not callable(items[name]):
            _fail(name, items[name], "must be a function")

    cfg = TrainConfig(
        seed=_coerce("seed", items["seed"], int),
        model=model,
        init_from=_coerce("init_from", items["init_from"], str),
        mesh=mesh,
        tokenizer=_coerce("tokenizer", items["tokenizer"], TokenizerKind),
        tokenizer_path=_coerce("tokenizer_path", items["tokenizer_path"], str),
        org=org,
        make_environments=items["make_environments"],
        make_teacher=items["make_teacher"],
        budget=build_dataclass(BudgetConfig, items["budget"], "budget"),
        clock=build_dataclass(ClockSchedule, items["clock"], "clock"),
        progress=build_dataclass(ProgressConfig, items["progress"], "progress"),
        sft=build_dataclass(SFTConfig, items["sft"], "sft"),
        rollout=build_dataclass(RolloutConfig, items["rollout"], "rollout"),
        rl=build_dataclass(RLConfig, items["rl"], "rl"),
        engine=build_dataclass(EngineConfig, items["engine"], "engine"),
        eval=build_dataclass(EvalConfig, items["eval"], "eval"),
        checkpoint=build_dataclass(CheckpointConfig, items["checkpoint"], "checkpoint"),
        plots=_coerce("plots", items["plots"], bool),
        keep_event_logs=_coerce("keep_event_logs", items["keep_event_logs"], bool),
        curriculum=build_dataclass(DifficultyConfig, items.get("curriculum", {}), "curriculum"),
    )
    _check_consistency(cfg, num_processes)
    batch_plan.check(cfg, num_processes)  # batch vs mesh, before any episode is played
    return cfg


def _check_consistency(cfg: TrainConfig, num_processes: int) -> None:
    """Cross-field rules, each naming the field to change."""
    if cfg.budget.max_budget > MAX_HIRES:
        _fail("budget.max_budget", cfg.budget.max_budget,
              f"is above the organisation's limit of {MAX_HIRES} hires (the report's b <= 8, "
              f"at most 9 agents)")
    if cfg.eval.tier < -1:
        _fail("eval.tier", cfg.eval.tier, "must be -1 (the top tier) or a tier >= 0")
    if cfg.eval.budget > cfg.budget.max_budget:
        _fail("eval.budget", cfg.eval.budget,
              f"is above the configured maximum budget.max_budget={cfg.budget.max_budget}")
    if cfg.tokenizer is TokenizerKind.HF and not cfg.tokenizer_path:
        _fail("tokenizer_path", cfg.tokenizer_path, "is required with tokenizer='hf'")
    if cfg.org.text_tool_calls and cfg.tokenizer is not TokenizerKind.HF:
        _fail("org.text_tool_calls", True, "needs tokenizer='hf' (a chat template renders "
              "the calls' text)")
    if cfg.rollout.temperature != cfg.rl.temperature:
        _fail("rl.temperature", cfg.rl.temperature,
              f"must equal rollout.temperature={cfg.rollout.temperature}: the trainer must "
              "recompute log-probs under the distribution the engine sampled from")
    # Rollouts beyond the slots wait for room (the driver's admission), but one rollout at its
    # largest must fit.
    if cfg.engine.slots < 1 + cfg.budget.max_budget:
        _fail("engine.slots", cfg.engine.slots, f"must be >= 1 + budget.max_budget = "
              f"{1 + cfg.budget.max_budget} (one rollout's agents at once)")
    if cfg.engine.kv_pages < 1:
        _fail("engine.kv_pages", cfg.engine.kv_pages, "must be >= 1")
    if cfg.engine.max_kv_pages:
        # The engine's pool is split by pages over the devices of its process.
        chips = max(1, math.prod(cfg.mesh.values()) // num_processes)
        if cfg.engine.max_kv_pages < cfg.engine.kv_pages or cfg.engine.max_kv_pages % chips:
            _fail("engine.max_kv_pages", cfg.engine.max_kv_pages,
                  f"must be 0 (no ceiling), or >= engine.kv_pages={cfg.engine.kv_pages} and a "
                  f"multiple of the {chips} devices each process's KV pool is split over")
    eval_alive = cfg.eval.seeds * (2 + cfg.eval.budget)  # one task, both arms
    if cfg.engine.slots < eval_alive:
        _fail("engine.slots", cfg.engine.slots, f"must be >= {eval_alive} for evaluation")
    if cfg.rollout.seq_len < cfg.org.window:
        _fail("rollout.seq_len", cfg.rollout.seq_len,
              f"must be >= org.window={cfg.org.window} (an agent's whole context is one row)")
    if cfg.model.max_context < cfg.org.window:
        _fail("org.window", cfg.org.window,
              f"exceeds the model's max_context={cfg.model.max_context}")
    if cfg.rollout.steps < 0:  # 0: no RLCR (SFT only, or evaluation only of `init_from`)
        _fail("rollout.steps", cfg.rollout.steps, "must be >= 0")
    for name in ("groups_per_step", "rollouts_per_group", "groups_ramp_steps", "seq_bucket"):
        if getattr(cfg.rollout, name) < 1:
            _fail(f"rollout.{name}", getattr(cfg.rollout, name), "must be >= 1")
    if cfg.sft.steps < 0 or cfg.sft.teacher_episodes < 0 or cfg.sft.batch_seqs < 1:
        _fail("sft", dataclasses.asdict(cfg.sft), "steps and teacher_episodes must be >= 0, "
              "batch_seqs >= 1")
    if cfg.rollout.refill_groups < 0:
        _fail("rollout.refill_groups", cfg.rollout.refill_groups, "must be >= 0")
    if cfg.rollout.refill_groups and num_processes > 1:
        _fail("rollout.refill_groups", cfg.rollout.refill_groups,
              f"needs one process ({num_processes} here: each would draw its own refills)")
    if cfg.rollout.update_length_rungs < 1:
        _fail("rollout.update_length_rungs", cfg.rollout.update_length_rungs, "must be >= 1")
    if cfg.sft.micro_batches < 0 or cfg.rollout.max_update_rows < 0:
        _fail("sft.micro_batches" if cfg.sft.micro_batches < 0 else "rollout.max_update_rows",
              min(cfg.sft.micro_batches, cfg.rollout.max_update_rows), "must be >= 0")
    if not 0 <= cfg.sft.skill_seqs <= cfg.sft.batch_seqs:
        _fail("sft.skill_seqs", cfg.sft.skill_seqs,
              f"must be in 0..batch_seqs={cfg.sft.batch_seqs}")
    lo, hi = cfg.sft.skill_row_tokens
    if not 32 <= lo <= hi <= cfg.rollout.seq_len:
        _fail("sft.skill_row_tokens", cfg.sft.skill_row_tokens,
              f"must be (lo, hi) with 32 <= lo <= hi <= rollout.seq_len={cfg.rollout.seq_len}")
    if cfg.sft.skill_steps < 0:
        _fail("sft.skill_steps", cfg.sft.skill_steps, "must be >= 0")
    if not cfg.sft.skills and (cfg.sft.skill_steps or cfg.sft.skill_seqs):
        _fail("sft.skills", cfg.sft.skills, "is empty but skill_steps or skill_seqs is set")
    if cfg.sft.teacher_episodes and 0 < cfg.sft.steps <= cfg.sft.skill_steps:
        # A shortened SFT (sft.steps lowered alone) would otherwise never see a teacher trace.
        _fail("sft.skill_steps", cfg.sft.skill_steps,
              f"is not below sft.steps={cfg.sft.steps}, so no SFT update sees a teacher trace "
              "(lower it, or set sft.teacher_episodes=0 to train on skill rows alone)")
    if cfg.eval.s8 and not cfg.eval.log_events:
        _fail("eval.s8", cfg.eval.s8, "needs eval.log_events=True (S8 matches the logged "
              "organisation rollouts' output tokens)")
    if cfg.eval.best_of_k < 0 or cfg.eval.s8_clock_s < 0 or any(
            not c > 0 for c in cfg.eval.sweep_clocks):
        _fail("eval", dataclasses.asdict(cfg.eval), "best_of_k and s8_clock_s must be >= 0 and "
              "sweep_clocks > 0")
    if cfg.rollout.log_every < 0:
        _fail("rollout.log_every", cfg.rollout.log_every, "must be >= 0")
    if cfg.eval.every < 1 or cfg.checkpoint.every < 1:
        _fail("eval.every" if cfg.eval.every < 1 else "checkpoint.every",
              min(cfg.eval.every, cfg.checkpoint.every), "must be >= 1")


def describe(cfg: TrainConfig, env_section=None) -> dict[str, Any]:
    """A JSON-able summary of the config (written to WORKDIR/config.json): every field, and the
    free-form `env` section when given (`make_environments` reads it, so it is the config)."""
    def plain(v):
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, enum.Enum):
            return v.value
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        if callable(v):
            return getattr(v, "__qualname__", repr(v))
        return v
    out = plain(cfg)
    if env_section is not None:
        env = env_section.to_dict() if hasattr(env_section, "to_dict") else dict(env_section)
        out["env"] = plain(env)
    return out
