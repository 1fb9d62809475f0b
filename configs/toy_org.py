"""The toy organisation: SFT on teacher traces, then RLCR, on a laptop CPU.

    python -m avalon.main --config=configs/toy_org.py --workdir=runs/toy

Three environments where talking is needed, answers checked, with a hybrid (`toy` preset:
Mamba-2, MoE, attention) and a compact word vocabulary:
- parallel subtasks (environment 1): star-shaped dependency trees whose results only their
  solver sees, so splitting a tree means passing its root's result on by message;
- hidden profile (2): the answer is identified only by pooling every analyst's brief;
- collective verification (5): a build's defect is found only by a teammate's review.
`python -m avalon.tools.env_baselines --config=configs/toy_org.py` prints the co-ordination gap
(scripted chance / single / silent organisation / teacher / optimum; experiments/bench/
RESULTS.md). SFT starts on skill rows (avalon/train/skills.py: recall a value read earlier,
add/max/min), the toy's stand-in for the pretraining a real model brings; without them a model
trained from scratch learns the traces' form but copies no code and computes no answer. The
SFT teacher is imperfect on purpose (random head-count and 10% wrong answers in
environment 1, a verifier in three teams of four), which leaves RLCR room. Evaluation compares the
organisation (budget 3) with a single agent (budget 0) on the same held-out tasks, each
environment under its own clock. `get_config("smoke")` shrinks everything for a quick check:
a half-width model started from a seed shipped with the package (SMOKE_SEED, made by
`get_config("smoke_seed")`: the SFT recipe on that model), so its few minutes show an
organisation that hires, messages and reviews. `get_config("tiers")`: all three environments with
`SMALL_MODEL_TIERS`, easier tiers below each (`python -m avalon.tools.env_baselines
--config=configs/toy_org.py:tiers --by_tier` measures each tier's baselines).

History (experiments/bench/RESULTS.md): the earlier toy trained on environment 1 with answers
unchecked and no dependencies, where a silent script reaches the optimum; its organisation
learnt to hire and not to talk.
"""

from __future__ import annotations

import os

import ml_collections

import avalon
from avalon.envs.hidden_profile.env import HiddenProfile, ProfileConfig
from avalon.envs.parallel.env import ParallelConfig, ParallelSubtasks
from avalon.envs.parallel.tasks import Op
from avalon.envs.parallel.teacher import HirePolicy, ParallelTeacherConfig
from avalon.envs.verification import Verification, VerificationConfig, VerifyTeacherConfig
from avalon.org.config import PromptStyle
from avalon.train.config import config_arg, curriculum_section, mesh_section


def make_environments(env):
    """The environments of this run, from the `env` section (constructed: no name registry).
    Each environment's config above is its top tier (today's tasks); `env.<name>_tiers` adds
    easier tiers below it (`avalon/envs/tiers.py`)."""
    sizes = dict(n_train=env.n_train, n_heldout=env.n_heldout, seed=env.seed)
    verification = Verification(VerificationConfig(clock_s=env.verification_clock_s, **sizes),
                                tiers=env.verification_tiers)
    if not env.three_environments:
        return [verification]
    return [
        ParallelSubtasks(ParallelConfig(
            n_subtasks=(env.n_subtasks_min, env.n_subtasks_max), cost_units=(1, 2),
            dep_prob=env.dep_prob, max_depth=1, ops=tuple(Op(o) for o in env.ops),
            check_answers=env.check_answers, clock_s=env.parallel_clock_s, **sizes),
            tiers=[_with_ops(t) for t in env.parallel_tiers]),
        HiddenProfile(ProfileConfig(n_holders=(2, 3), clock_s=env.profile_clock_s, **sizes),
                      tiers=env.profile_tiers),
        verification,
    ]


def _with_ops(tier):
    """A parallel tier with its ops (names in the config) as `Op`s."""
    tier = dict(tier)
    if "ops" in tier:
        tier["ops"] = tuple(Op(o) for o in tier["ops"])
    return tier


def make_teacher(env, chat):
    """The SFT teacher organisation of each environment: imperfect on purpose."""
    if isinstance(env, ParallelSubtasks):
        # One hire and three solves per turn keep every teacher turn under the 96-token cap.
        return env.teacher(chat, ParallelTeacherConfig(hire_policy=HirePolicy.RANDOM,
                                                       answer_error_rate=0.1, hires_per_turn=1,
                                                       solves_per_turn=3))
    if isinstance(env, Verification):
        # A verifier in 3 of 4 teams: with 1 in 2, the held-out share of reviewed teams after
        # SFT was 0.29-0.42 and fell to 0 within 20 RLCR steps in two of four runs (one
        # early plan token decides it; RESULTS.md, "Why the review habit collapsed").
        return env.teacher(chat, VerifyTeacherConfig(verifier_rate=0.75, hires_per_turn=1))
    return env.teacher(chat)


# The smoke model: the toy's layers at half the width and half the experts (0.22M params), so
# its trained seed ships with the package in bf16 (SMOKE_SEED, ~450 KB).
SMOKE_MODEL = {"hidden_size": 64, "head_dim": 16, "mamba_head_dim": 16, "n_routed_experts": 4,
               "moe_intermediate_size": 64, "moe_shared_expert_intermediate_size": 64,
               "intermediate_size": 128}
# The smoke run starts from this checkpoint (a Hugging Face directory: config.json, bf16
# safetensors, the word tokenizer as tokenizer.json, how it was made in README.md), trained by
# `get_config("smoke_seed")`; remade with one command: `python -m experiments.smoke_seed`.
SMOKE_SEED = os.path.join(os.path.dirname(avalon.__file__), "data", "toy_smoke_seed")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    arg = config_arg(arg, ("", "smoke", "smoke_seed", "tiers"))
    smoke, seed = arg == "smoke", arg == "smoke_seed"
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = ml_collections.ConfigDict()
    c.model.preset = "toy"  # ~0.94M params, vocab 512 (the word tokenizer needs ~440)
    # decode_dt_clamp: the engine's one-token step clamps dt like the trainer's full forward,
    # so on-policy importance ratios are exactly 1.
    # flash: packed training rows skip the attention blocks above the diagonal and never hold
    # [t, t] scores (the update step at 8 x 1024 tokens on one CPU core: 1.71 s against 2.01 s
    # with block_causal; block_causal was 1.5x faster than naive).
    c.model.overrides = ml_collections.ConfigDict({"vocab_size": 640,  # the words need ~560
                                                   "decode_dt_clamp": True,
                                                   "attention_impl": "flash",
                                                   **(SMOKE_MODEL if smoke or seed else {})})
    # random init (a toy learns everything from the teacher); the smoke run starts trained, so
    # that its few minutes show an organisation at work (hires, messages, reviews)
    c.init_from = SMOKE_SEED if smoke else ""
    c.mesh = mesh_section(data=1)  # one CPU device
    c.tokenizer = "word"
    c.tokenizer_path = ""
    c.org = ml_collections.ConfigDict()
    # Tokens per agent context (compaction at 87.5%): rows stay under 1024, so packed training
    # sequences can be 1024 long (attention cost grows with the packed length).
    c.org.window = 1024
    c.org.compaction_ratio = 0.8  # trigger at 819 tokens: room for 96-token turns
    c.org.max_new_tokens = 96
    c.org.summary_cap = 64
    c.org.prompt_style = PromptStyle.MINIMAL.value  # tool names only in role cards: short rows
    c.org.max_turns = 8 if smoke else 16  # per agent
    # Environment sizes for the toy. Parallel: 4-6 subtasks of 1-2 minutes, most of them
    # needing one root's result, under a 5-minute clock: one agent finishes about three, a team
    # that passes results on all of them, a silent team four (env_baselines).
    c.env = ml_collections.ConfigDict()
    # False (the default run): collective verification alone. True: all three co-ordination
    # environments (what env_baselines measures on the toy); the toy model does not learn
    # them together on 2 cores in 45 minutes (RESULTS.md).
    c.env.three_environments = False
    c.env.n_subtasks_min = 4
    c.env.n_subtasks_max = 6
    c.env.dep_prob = 0.8
    c.env.ops = ("add", "max", "min")
    c.env.check_answers = True  # answers are checked (the earlier toy's False is history)
    c.env.parallel_clock_s = 300.0
    c.env.profile_clock_s = 300.0
    c.env.verification_clock_s = 480.0
    c.env.n_train = 512
    c.env.n_heldout = 64
    c.env.seed = 0
    # Difficulty tiers below each environment's tasks (avalon/envs/tiers.py), easiest first, each
    # a dict of the environment's TIER_FIELDS over its config above; () (the toy): today's tasks
    # alone. SMALL_MODEL_TIERS (below) is a set for a pretrained model too small to score on
    # today's tasks.
    c.env.parallel_tiers = ()
    c.env.profile_tiers = ()
    c.env.verification_tiers = ()
    if arg == "tiers":  # the three environments with SMALL_MODEL_TIERS (env_baselines --by_tier)
        c.env.three_environments = True
        c.env.update(SMALL_MODEL_TIERS)
    c.make_environments = make_environments
    c.make_teacher = make_teacher
    c.budget = ml_collections.ConfigDict({"p_single": 0.2, "max_budget": 3})
    # The clock schedule: constant (ratio 1) for the toy, so each environment keeps its own
    # clock above (the real schedule ramps every clock by 2.55 over 200 steps).
    c.clock = ml_collections.ConfigDict({"start_s": 300.0, "end_s": 300.0, "ramp_steps": 1})
    c.progress = ml_collections.ConfigDict({"fast_rate": 0.3, "slow_rate": 0.05,
                                            "floor": 0.02, "unvisited_weight": 0.02})
    # Online difficulty filtering and tier promotion (avalon/envs/difficulty.py): off, so the
    # learning-progress sampler above draws the tasks (the report's).
    c.curriculum = curriculum_section()
    c.sft = ml_collections.ConfigDict()
    c.sft.teacher_episodes = 16 if smoke else 1024
    c.sft.steps = 4 if smoke else 600
    c.sft.batch_seqs = 8
    c.sft.lr = 2e-3
    # Skill rows (avalon/train/skills.py), the toy's stand-in for pretraining: recall a value
    # read earlier, and the ops of environment 1. Without them the toy learns the traces' form
    # but copies no code and computes no answer (RESULTS.md): 150 updates of skill rows, then
    # 2 of every 8 sequences.
    c.sft.skills = ("recall", "add", "max", "min")
    c.sft.skill_steps = 2 if smoke else 150
    c.sft.skill_seqs = 2
    c.rollout = ml_collections.ConfigDict()
    # 100 RLCR steps: 16 moved nothing by 3 standard errors; 100 raise the held-out reward and
    # messages per agent by > 3 SE in two seeds, each with its own SFT (RESULTS.md, topic 4).
    c.rollout.steps = 3 if smoke else 0 if seed else 100  # the seed: SFT only
    c.rollout.groups_per_step = 2 if smoke else 4
    c.rollout.rollouts_per_group = 4 if smoke else 8  # K
    c.rollout.seq_len = 1024
    c.rollout.seq_bucket = 8
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rl = ml_collections.ConfigDict()
    c.rl.lr = 3e-4  # the 120B recipe's 4e-6 is far too small for a 1M-parameter toy
    c.rl.temperature = 1.0
    c.rl.underhire_slope = 0.1
    c.rl.weight_decay = 0.0
    c.engine = ml_collections.ConfigDict()
    c.engine.slots = 128  # groups x K x (1 + max budget) = 4 x 8 x 4
    c.engine.steps_per_dispatch = 8
    c.engine.prefill_chunk = 256
    # The whole KV pool up front (slots x window / 16 positions a page; ~8 KB a page per
    # attention layer here, 64 MB each): a pool grown from 16 pages passes through 10 sizes,
    # and each compiles its own prefill / decode programs (~10 s and ~500 JIT memory maps each
    # on CPU; a 100-step run grown that way reached the kernel's 65,530-map limit).
    c.engine.kv_pages = 128 * 1024 // 16
    # The master itself. The toy computes in fp32, so a bf16 view would be cast back to fp32
    # before every matmul of every decode step: slower on CPU (decode.py --config=this, 64
    # slots x 512, two interleaved pairs: 20.2 vs 24.6 and 57 vs 100 ms/step, fp32 vs bf16;
    # RESULTS.md) and a sampler/trainer mismatch besides. The accelerator configs use bf16.
    c.engine.decode_dtype = "float32"
    c.engine.continuous = True  # rollouts feed the engine as they are ready (not per tick)
    c.eval = ml_collections.ConfigDict()
    c.eval.every = 2 if smoke else 20  # after SFT, every 20 RLCR steps and at the end
    c.eval.tasks = 2 if smoke else 24  # per environment
    c.eval.seeds = 2
    c.eval.budget = 3
    c.eval.clock_s = 300.0
    c.checkpoint = ml_collections.ConfigDict({"every": 2 if smoke else 10, "keep": 2})
    c.plots = True
    c.keep_event_logs = False
    return c


# Difficulty tiers for a pretrained model too small to score on today's tasks (SmolLM2-135M:
# a rollout scored with p ~ 0.05-0.1), easiest first; `c.env.update(SMALL_MODEL_TIERS)` adds
# them. Each tier's scripted baselines: `python -m avalon.tools.env_baselines --by_tier`.
SMALL_MODEL_TIERS = {
    "parallel_tiers": (
        {"n_subtasks": (1, 2), "dep_prob": 0.0},
        {"n_subtasks": (2, 3), "dep_prob": 0.0},
        {"n_subtasks": (3, 4), "dep_prob": 0.5},
    ),
    "profile_tiers": (
        {"n_options": 2, "n_holders": (0, 0)},
        {"n_options": 2, "n_holders": (1, 1)},
        {"n_options": 3, "n_holders": (1, 1)},
    ),
    "verification_tiers": (
        {"n_items": (1, 2), "cost_units": (1, 4), "defect_rates": (0.0, 0.1), "n_train": 24,
         "n_heldout": 8},
        {"n_items": (2, 3), "defect_rates": (0.1, 0.2), "n_train": 64, "n_heldout": 16},
        {"n_items": (3, 5), "defect_rates": (0.2, 0.3), "n_train": 256, "n_heldout": 32},
    ),
}
