"""RLCR on Nemotron 3 Super (120B total, 12B active) on a TPU v5p pod: the report's recipe.

    # on every worker of the pod (see launch/README.md; launch/run_pod.sh does this):
    python -m avalon.main --config=configs/nemotron3_super_pod.py --workdir=gs://BUCKET/super \\
        --distributed_auto

Recipe (SPEC §4): start from the Nemotron 3 Super *base* checkpoint (Hugging Face layout, read
tensor by tensor onto the mesh), SFT on teacher organisation traces, then RLCR with CISPO
(eps_high 5, delta-from-1), AdamW at a constant 4e-6, the MoE router frozen and routing replayed,
K = 16 rollouts per task, 20% single-agent rollouts and b uniform in 1..8 otherwise, batches of
200 task groups rising to 800, the wall-clock cap rising from 2 h to 5.1 h by step 200, and
learning-progress samplers over environments and tasks. Windows are the real 131,072 tokens
(compaction at 114,688, summaries capped at 12,000).

Mesh (v5p-256: 128 chips, 32 hosts of 4): fsdp 32 across hosts (params, optimizer state and
activations split along embed), expert 4 within each host (512 experts, 128 per chip). The
update step runs sequence parallel (`rl.sequence_parallel`, sharding.TRAIN_SEQ_RULES): rows
over fsdp, each 131,072-token row's positions over the host's 4 chips; Mamba and attention
layers switch by all-to-all to whole rows with a quarter of the heads, so each chip holds the
activations of 32,768 tokens. The routed experts are reached by all-to-all over `expert`
(avalon/model/moe_ep.py) with a capacity of 1.1 x the mean load (`rl.moe_capacity_factor`,
below RLConfig's default 1.25): per 4,096-token dispatch chunk (90,112 choices) each chip's 128
experts take at most 1.1 x a quarter of them (24,781 rows) from each chip, and choices past that
are dropped (in token order) and counted: the step metric `moe_dropped_choices`, out of
tokens x 22 x 40 choices. The trade-off: the routed experts run 4 passes over those buffers, so
each 0.1 of the factor costs ~0.038x of the model FLOPs (compiled: 1.29x at 1.1, 1.35x at 1.25,
against a 1.3x target), while a chunk drops choices only where one chip's quarter of the experts
draws more than 27.5% of the chunk's choices (31.25% at 1.25). A balanced router's share per
chip varies by ~0.6% of its mean over 90,112 choices, so it drops none; a window of one document
that favours one quarter of the experts does. Not measured on Super's router (no weights on the
CPU host): watch `moe_dropped_choices`, and raise the factor if it passes ~1% of the choices.
The MoE backend is `auto` (megablox on TPU: `lax.ragged_dot`'s weight gradient compiles to a
dense masked product over the experts there). Attention is the causal block scan (blocks of
1,024: causal FLOPs, no [t, t] scores); remat is per layer (`selective`: Mamba layers and the
experts' activations recomputed, attention kept); the Mamba layers' conv, SSD and gated norm
run 8,192 positions at a time (`ssd_block`: only their bf16 inputs and outputs are whole rows).
`selective_units` would keep one input per "EM" pair instead of two (-10 GB per chip) for
+0.019x FLOPs: the FLOP target binds here, the memory one does not.
The engine of each host decodes from a bf16 view of the same params (`engine.decode_dtype`),
re-laid out for decoding (DECODE_RULES: the dense layers tensor-parallel over the host's 4
chips, experts split over them, the KV pool split by pages); that switch is timed every step.

Global batch of one update call: micro_batches x 32 rows (one per fsdp shard, split over its
host's 4 chips) of 131,072 tokens = 64 x 32 = 2,048 rows (268M token positions); the recipe's
200-800 groups x K 16 x (1 + up to 8 agents) contexts are packed into such rows, and an RLCR
step whose rollouts pack into more (`rollout.max_update_rows`) runs several AdamW updates of
2,048 rows each, every one after the first off the sampling policy (CISPO's clipped ratio to
the sampler's log-probs weighs them): not one update per step. Per chip that
is 64 quarter-rows, and the batch itself (tokens, targets, ids, mask, log-probs, advantages,
uint16 routing of 40 layers x 22 experts) is 3.7 GB beside 13.9 GB of fp32 params and AdamW
moments (together the step's 17.6 GB of arguments) and a temporary fp32 gradient accumulator
the size of the params (~4.6 GB). Measured (experiments/bench/RESULTS.md, "The pod's update
step, fifth pass", and at this very call's shape "The pod: start-up checks and the update step
at the loop's batch"; `python -m experiments.scale.aot --config=configs/nemotron3_super_pod.py
--topology=v5p-256`, a 20-minute compile on one CPU core, ~11 GB of host memory): peak 77.4 GB
of HBM allocated per chip (arguments 17.6 + temporaries 59.8; 81.5% of HBM) and compiled matmul
FLOPs 1.29x the model's. Smaller micro-batches cannot help (one row per
fsdp shard is the floor); the micro-batch count only sets the global batch (and the batch's
bytes per chip: 3.7 GB at 64).
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
    """The five built-in environments, each under its own clock, the curriculum scaling them
    all by the report's ratio (2 h -> 5.1 h: 1 -> 2.55). The clocks are those of
    configs/gpu_hybrid_2b.py, at which a single agent cannot finish (see there). Add
    `avalon.envs.ors.OrsEnvironment`s to train on an external environment server."""
    return [ParallelSubtasks(ParallelConfig(n_subtasks=(5, 8), cost_units=(1, 3), dep_prob=0.8,
                                            max_depth=1, unit_s=120.0, clock_s=600.0,
                                            seed=env.seed)),
            HiddenProfile(ProfileConfig(seed=env.seed)),
            SoftwareBuild(SoftwareConfig(seed=env.seed)), Wealth(WealthConfig(seed=env.seed)),
            Verification(VerificationConfig(seed=env.seed))]


def make_teacher(env, chat):
    return env.teacher(chat)


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    config_arg(arg, ("",))
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = ml_collections.ConfigDict({
        "preset": "nemotron3_super_120b_a12b",
        "overrides": ml_collections.ConfigDict({
            "param_dtype": "float32",  # fp32 masters: 4e-6 AdamW steps are below bf16's grain
            "dtype": "bfloat16", "decode_dt_clamp": True, "remat": "selective",
            "attention_impl": "causal_scan", "moe_backend": "auto",
            "moe_dispatch_chunk": 4096, "attention_query_chunk": 1024, "ssd_block": 8192})})
    c.init_from = "/mnt/checkpoints/NVIDIA-Nemotron-3-Super-120B-A12B-Base-BF16"
    c.mesh = mesh_section(fsdp=32, expert=4)
    c.tokenizer = "hf"
    c.tokenizer_path = c.init_from
    c.org = ml_collections.ConfigDict({"window": 131072, "prompt_style": "full"})
    c.env = ml_collections.ConfigDict({"seed": 0})
    c.make_environments = make_environments
    c.make_teacher = make_teacher
    c.budget = ml_collections.ConfigDict({"p_single": 0.2, "max_budget": 8})
    c.clock = ml_collections.ConfigDict({"start_s": 7200.0, "end_s": 18360.0, "ramp_steps": 200})
    c.progress = ml_collections.ConfigDict({"fast_rate": 0.3, "slow_rate": 0.05, "floor": 0.02,
                                            "unvisited_weight": 0.02})
    # SPEC §4: 38,374 examples, 600M tokens, 3 epochs.
    c.sft = ml_collections.ConfigDict({"teacher_episodes": 38374, "steps": 3 * 2300,
                                       "batch_seqs": 256, "micro_batches": 8, "lr": 1e-5})
    c.rollout = ml_collections.ConfigDict({
        "steps": 800, "groups_per_step": 200, "groups_per_step_end": 800,
        "groups_ramp_steps": 400, "rollouts_per_group": 16, "seq_len": 131072,
        "seq_bucket": 32, "max_update_rows": 2048, "temperature": 1.0, "top_p": 1.0})
    c.rl = ml_collections.ConfigDict({"lr": 4e-6, "temperature": 1.0, "eps_high": 5.0,
                                      "cap_mode": "delta", "freeze_router": True,
                                      "micro_batches": 64, "moe_capacity_factor": 1.1,
                                      "sequence_parallel": True})  # see the module doc
    # One host's engine (4 chips, 95 GB each; measured: python -m experiments.scale.aot
    # --config=this --topology=v5p-256 --step=decode; RESULTS.md, "The pod's decode fits a v5p
    # host"). Per
    # chip: the bf16 decode view is 61.6 GB (routed experts split over the 4 chips, the dense
    # layers tensor-parallel over them); a slot's Mamba state is 170 MB, 42.6 MB per chip;
    # KV is 8 KB a token (8 layers x 2 heads x 128 x K,V in bf16), 2 KB per chip (pages split
    # over the chips). 64 slots with a pool of 64 x 65,536 tokens: an agent's context grows
    # from its <= 12,000-token summary to the 114,688-token compaction point and starts again,
    # so over a long rollout it holds (12,000 + 114,688) / 2 ~ 63K tokens on average; any one
    # context can still reach the 131,072 window (page tables span it). The recipe's agents
    # alive at once (25 of 800 groups x 16 x up to 9 = 3,600 per host) cannot all be resident
    # (613 GB of Mamba state alone): the driver admits rollouts as slots free up
    # (RolloutDriver max_agents = slots), so a step plays its rollouts in waves.
    c.engine = ml_collections.ConfigDict({"slots": 64, "kv_pages": 64 * 65536 // 16,
                                          "max_kv_pages": 64 * 65536 // 16,
                                          "steps_per_dispatch": 32, "prefill_chunk": 4096,
                                          "decode_dtype": "bfloat16", "continuous": True})
    c.eval = ml_collections.ConfigDict({"every": 25, "tasks": 64, "seeds": 4, "budget": 8,
                                        "clock_s": 7200.0})
    c.checkpoint = ml_collections.ConfigDict({"every": 10, "keep": 3})
    c.plots = True
    c.keep_event_logs = True
    return c
