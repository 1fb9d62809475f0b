"""RLCR on one H200: the `hybrid_2b_a06b` benchmark hybrid (2.16B total, 0.59B active).

    python -m avalon.main --config=configs/gpu_hybrid_2b.py --workdir=runs/gpu2b

The organisation plays all four environments (parallel subtasks, hidden profile, software build,
wealth) with a byte-level tokenizer (the model's 131,072-entry vocabulary covers it) and real
windows (16K tokens per agent here, to fit 256+ agents' caches on one card). Weights are
fp32 masters (AdamW steps at RL learning rates are below bf16 resolution; the forward computes
in bf16); MoE dispatch uses the batched-matmul capacity path (never `ragged_dot` on GPU). The
SFT teacher plays its environments' best strategies. `get_config("smoke")` shrinks the run.
"""

from __future__ import annotations

import ml_collections

from avalon.envs.hidden_profile.env import HiddenProfile
from avalon.envs.parallel.env import ParallelConfig, ParallelSubtasks
from avalon.envs.software.env import SoftwareBuild
from avalon.envs.wealth.env import Wealth
from avalon.train.config import config_arg, mesh_section


def make_environments(env):
    return [ParallelSubtasks(ParallelConfig(seed=env.seed)), HiddenProfile(),
            SoftwareBuild(), Wealth()]


def make_teacher(env, chat):
    return env.teacher(chat)


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    smoke = config_arg(arg, ("", "smoke")) == "smoke"
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = ml_collections.ConfigDict({"preset": "hybrid_2b_a06b", "overrides":
                                         ml_collections.ConfigDict({
                                             "param_dtype": "float32", "dtype": "bfloat16",
                                             "decode_dt_clamp": True, "remat": "dots",
                                             "attention_impl": "query_chunked",
                                             "max_context": 16384})})
    c.init_from = ""  # or a local Hugging Face Nemotron-H checkpoint directory
    c.mesh = mesh_section(data=1)
    c.tokenizer = "byte"
    c.tokenizer_path = ""
    c.org = ml_collections.ConfigDict({"window": 16384, "prompt_style": "full"})
    c.env = ml_collections.ConfigDict({"seed": 0})
    c.make_environments = make_environments
    c.make_teacher = make_teacher
    c.budget = ml_collections.ConfigDict({"p_single": 0.2, "max_budget": 8})
    # The report's clock curriculum, scaled to a 16K window: 20 -> 51 minutes by step 200.
    c.clock = ml_collections.ConfigDict({"start_s": 1200.0, "end_s": 3060.0, "ramp_steps": 200})
    c.progress = ml_collections.ConfigDict({"fast_rate": 0.3, "slow_rate": 0.05, "floor": 0.02,
                                            "unvisited_weight": 0.02})
    c.sft = ml_collections.ConfigDict({"teacher_episodes": 64 if smoke else 4096,
                                       "steps": 4 if smoke else 1000, "batch_seqs": 8,
                                       "lr": 2e-5})
    c.rollout = ml_collections.ConfigDict({"steps": 2 if smoke else 400, "groups_per_step": 8,
                                           "rollouts_per_group": 16, "seq_len": 16384,
                                           "seq_bucket": 8, "temperature": 1.0, "top_p": 1.0})
    c.rl = ml_collections.ConfigDict({"lr": 4e-6, "temperature": 1.0, "micro_batches": 8})
    c.engine = ml_collections.ConfigDict({"slots": 1152, "steps_per_dispatch": 16,
                                          "prefill_chunk": 1024})
    c.eval = ml_collections.ConfigDict({"every": 20, "tasks": 8, "seeds": 2, "budget": 8,
                                        "clock_s": 1200.0})
    c.checkpoint = ml_collections.ConfigDict({"every": 10, "keep": 3})
    c.plots = True
    c.keep_event_logs = False
    return c
