"""RLCR on one H200: the `hybrid_2b_a06b` benchmark hybrid (2.16B total, 0.59B active).

    python -m avalon.main --config=configs/gpu_hybrid_2b.py --workdir=runs/gpu2b

The organisation plays all five environments (parallel subtasks, hidden profile, software build,
wealth, collective verification) with a byte-level tokenizer (the model's 131,072-entry
vocabulary covers it) and real windows (16K tokens per agent here, to fit 256+ agents' caches
on one card). Weights are fp32 masters (AdamW steps at RL learning rates are below bf16
resolution; the forward computes in bf16) and the engine decodes a bf16 view of them
(`engine.decode_dtype`); MoE dispatch uses the batched-matmul capacity path
(never `ragged_dot` on GPU). The SFT teacher plays its environments' best strategies (the
verification teacher hires a verifier in half the teams). `get_config("smoke")` shrinks the run.
"""

from __future__ import annotations

import ml_collections

from avalon.envs.hidden_profile.env import HiddenProfile, ProfileConfig
from avalon.envs.parallel.env import ParallelConfig, ParallelSubtasks
from avalon.envs.software.env import SoftwareBuild, SoftwareConfig
from avalon.envs.verification import Verification, VerificationConfig
from avalon.envs.wealth.env import Wealth, WealthConfig
from avalon.train.config import config_arg, mesh_section


def make_environments(env):
    """The five environments, each under its own clock (the curriculum scales them all by the
    same ratio, 1 -> 2.55 over 200 steps), chosen so a single agent cannot finish: parallel
    subtasks need 10-16 work units of 2 minutes against a 10-minute clock (4 units after the
    overhead; 12 at the end of the ramp); wealth's research fits 3 of 4-6 bets; verification's
    builds, reviews and rebuilds take a team; software asks for 3-5 functions in 150 s."""
    return [ParallelSubtasks(ParallelConfig(n_subtasks=(5, 8), cost_units=(1, 3), dep_prob=0.8,
                                            max_depth=1, unit_s=120.0, clock_s=600.0,
                                            seed=env.seed)),
            HiddenProfile(ProfileConfig(seed=env.seed)),
            SoftwareBuild(SoftwareConfig(seed=env.seed)), Wealth(WealthConfig(seed=env.seed)),
            Verification(VerificationConfig(seed=env.seed))]


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
    # The report's clock curriculum as a ratio (1 -> 2.55 by step 200) applied to each
    # environment's own clock; evaluation at ratio eval.clock_s / start_s = 1.
    c.clock = ml_collections.ConfigDict({"start_s": 1200.0, "end_s": 3060.0, "ramp_steps": 200})
    c.progress = ml_collections.ConfigDict({"fast_rate": 0.3, "slow_rate": 0.05, "floor": 0.02,
                                            "unvisited_weight": 0.02})
    c.sft = ml_collections.ConfigDict({"teacher_episodes": 64 if smoke else 4096,
                                       "steps": 4 if smoke else 1000, "batch_seqs": 8,
                                       "micro_batches": 8, "lr": 2e-5})
    c.rollout = ml_collections.ConfigDict({"steps": 2 if smoke else 400, "groups_per_step": 8,
                                           "rollouts_per_group": 16, "seq_len": 16384,
                                           "seq_bucket": 8, "max_update_rows": 64,
                                           "temperature": 1.0, "top_p": 1.0})
    # One row of 16,384 tokens per micro-batch, 64 rows per update call (rollout.max_update_rows:
    # a step that packs more runs more calls of that one shape, the one measured on paper).
    c.rl = ml_collections.ConfigDict({"lr": 4e-6, "temperature": 1.0, "micro_batches": 64})
    # The KV pool starts at its ceiling: 2^19 pages of 16 = 8.4M tokens (7.3K a slot on
    # average; any one context may still reach the 16K window), 34.4 GB of bf16 KV beside the
    # slots' 18.5 GB of Mamba state. Measured with the 25.9 GB of trainer state that stays on
    # the card while rollouts decode (RESULTS.md, "One H200 on paper").
    c.engine = ml_collections.ConfigDict({"slots": 1152, "steps_per_dispatch": 16,
                                          "prefill_chunk": 1024, "decode_dtype": "bfloat16",
                                          "kv_pages": 2 ** 19, "max_kv_pages": 2 ** 19,
                                          "continuous": True})
    c.eval = ml_collections.ConfigDict({"every": 20, "tasks": 8, "seeds": 2, "budget": 8,
                                        "clock_s": 1200.0})
    c.checkpoint = ml_collections.ConfigDict({"every": 10, "keep": 3})
    c.plots = True
    c.keep_event_logs = False
    return c
