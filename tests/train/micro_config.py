"""A micro run for the driver's tests: the tiny model, environment 1, a few steps of each phase.

Every size is the smallest that exercises the path (teacher traces, SFT, rollouts through the
engine, the update, evaluation, checkpoints), so the subprocess tests stay within seconds once
the compilation cache is warm. Most of a warm run is tracing and loading compiled programs, so:
three layers (one of each mixer kind the driver touches), one RL batch shape (`seq_bucket` 16
holds every step's rows, so the update compiles once), and evaluation only after SFT and at the
end.
"""

from __future__ import annotations

import ml_collections

from avalon.envs.parallel.env import ParallelConfig, ParallelSubtasks
from avalon.envs.parallel.teacher import HirePolicy, ParallelTeacherConfig
from avalon.org.config import PromptStyle
from avalon.train.config import curriculum_section, mesh_section


def make_environments(env):
    # `env.tiers`: one easier tier below the tasks (one subtask each), for the curriculum.
    tiers = ({"n_subtasks": (1, 1), "n_train": 8, "n_heldout": 2},) if env.tiers else ()
    return [ParallelSubtasks(ParallelConfig(n_subtasks=(2, 3), dep_prob=0.0, clock_s=240.0,
                                            n_train=16, n_heldout=4, seed=env.seed),
                             tiers=tiers)]


def make_teacher(env, chat):
    return env.teacher(chat, ParallelTeacherConfig(hire_policy=HirePolicy.RANDOM,
                                                   hires_per_turn=1, solves_per_turn=2))


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    del arg
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = ml_collections.ConfigDict({"preset": "tiny", "overrides": ml_collections.ConfigDict(
        {"vocab_size": 512, "pattern": "ME*", "decode_dt_clamp": True, "max_context": 512})})
    c.init_from = ""
    c.mesh = mesh_section(data=1)
    c.tokenizer = "word"
    c.tokenizer_path = ""
    c.org = ml_collections.ConfigDict({"window": 512, "prompt_style": PromptStyle.MINIMAL.value,
                                       "compaction_ratio": 0.75, "max_new_tokens": 64,
                                       "summary_cap": 16, "max_turns": 6})
    c.env = ml_collections.ConfigDict({"seed": 0, "tiers": False})
    c.make_environments = make_environments
    c.make_teacher = make_teacher
    c.budget = ml_collections.ConfigDict({"p_single": 0.5, "max_budget": 1})
    c.clock = ml_collections.ConfigDict({"start_s": 240.0, "end_s": 300.0, "ramp_steps": 4})
    c.progress = ml_collections.ConfigDict({"fast_rate": 0.3, "slow_rate": 0.05, "floor": 0.02,
                                            "unvisited_weight": 0.02})
    c.sft = ml_collections.ConfigDict({"teacher_episodes": 4, "steps": 2, "batch_seqs": 2,
                                       "lr": 1e-3})
    c.rollout = ml_collections.ConfigDict({"steps": 3, "groups_per_step": 2,
                                           "rollouts_per_group": 2, "seq_len": 512,
                                           "seq_bucket": 16, "max_update_rows": 0,
                                           "temperature": 1.0, "top_p": 1.0})
    # The shaped group filter: a random model's groups differ only in their penalties, and
    # the tests that train want rows to update on (the raw filter would drop them all).
    c.rl = ml_collections.ConfigDict({"lr": 1e-3, "temperature": 1.0, "update_mode": "one",
                                      "group_filter": "shaped"})
    c.engine = ml_collections.ConfigDict({"slots": 16, "steps_per_dispatch": 8,
                                          "prefill_chunk": 128, "decode_dtype": "float32"})
    c.eval = ml_collections.ConfigDict({"every": 10, "tasks": 1, "seeds": 1, "budget": 1,
                                        "clock_s": 240.0})
    c.checkpoint = ml_collections.ConfigDict({"every": 1, "keep": 2, "ocdbt": True})
    c.plots = False
    c.keep_event_logs = False
    c.curriculum = curriculum_section()  # off: `--config.curriculum.enabled=True`
    return c
