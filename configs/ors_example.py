"""Train the toy organisation on any Open Reward Standard (ORS) environment server.

    # an environment server: anyone's, written with the `openreward` SDK, whose script ends
    # in Server([MyEnv]).run(host="127.0.0.1", port=8080) ...
    OPENREWARD_DISABLE_UPDATE_CHECK=1 python my_env.py
    # ... or Avalon's own environments, served as ORS
    python -m avalon.envs.serve --env=avalon.envs.parallel:ParallelSubtasks --port=8080
    # then
    python -m avalon.main --config=configs/ors_example.py --workdir=runs/ors \\
        --config.env.base_url=http://127.0.0.1:8080 --config.env.env_name=myenv
    python -m avalon.main --config=configs/ors_example.py:smoke --workdir=/tmp/ors_smoke \\
        --config.env.base_url=http://127.0.0.1:8080 --config.env.env_name=myenv

The environment is an `OrsEnvironment` (avalon/envs/ors.py): its `train` split trains, its
`heldout` / `validation` / `test` split evaluates; every agent of a rollout calls into that
rollout's one ORS session; rewards arrive on the calling agent and `finished` ends the episode.
ORS environments have no scripted teacher, so there is no SFT phase here: the toy model starts
from random weights (or `--config.init_from=...`) and learns by RLCR alone, with a byte
tokenizer (an ORS environment's words are not known in advance). `:smoke` runs a few short
steps: a check that the pipeline runs end to end, not a result.
"""

from __future__ import annotations

import ml_collections

from avalon.envs.ors import OrsEnvironment
from avalon.org.config import PromptStyle
from avalon.train.config import config_arg, mesh_section


def make_environments(env):
    """The ORS environment this run trains on, from the `env` section."""
    return [OrsEnvironment(env.base_url, env.env_name, wall_clock_s=env.clock_s,
                           ping_s=env.ping_s, retries=env.retries)]


def make_teacher(env, chat):
    raise ValueError(f"{env.name}: ORS environments have no scripted teacher; keep "
                     f"config.sft.steps=0 (or train from a checkpoint with init_from)")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    smoke = config_arg(arg, ("", "smoke")) == "smoke"
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = ml_collections.ConfigDict()
    c.model.preset = "toy"  # vocab 512 holds the byte tokenizer
    c.model.overrides = ml_collections.ConfigDict({"decode_dt_clamp": True,
                                                   "attention_impl": "block_causal",
                                                   "attention_query_chunk": 128})
    c.init_from = ""
    c.mesh = mesh_section(data=1)
    c.tokenizer = "byte"
    c.tokenizer_path = ""
    c.org = ml_collections.ConfigDict()
    c.org.window = 2048  # bytes: the role card alone is about 1 KiB
    c.org.compaction_ratio = 0.8
    c.org.max_new_tokens = 48 if smoke else 128
    c.org.summary_cap = 64
    c.org.prompt_style = PromptStyle.MINIMAL.value
    c.org.max_turns = 3 if smoke else 16
    c.env = ml_collections.ConfigDict()
    c.env.base_url = "http://127.0.0.1:8080"  # the ORS server (--config.env.base_url=URL)
    c.env.env_name = ""  # one of its /list_environments (--config.env.env_name=NAME)
    c.env.clock_s = 600.0  # the derived-clock cap (ORS has no clock of its own)
    c.env.ping_s = 30.0  # keepalive of open sessions (servers reap them after 900 s idle)
    c.env.retries = 4  # on 429/5xx and dropped streams (a resumed call never runs twice)
    c.make_environments = make_environments
    c.make_teacher = make_teacher
    c.budget = ml_collections.ConfigDict({"p_single": 0.5, "max_budget": 1 if smoke else 3})
    c.clock = ml_collections.ConfigDict({"start_s": 600.0, "end_s": 600.0, "ramp_steps": 1})
    c.progress = ml_collections.ConfigDict({"fast_rate": 0.3, "slow_rate": 0.05,
                                            "floor": 0.02, "unvisited_weight": 0.02})
    c.sft = ml_collections.ConfigDict()
    c.sft.teacher_episodes = 0  # no teacher: see the module docstring
    c.sft.steps = 0
    c.sft.batch_seqs = 8
    c.sft.lr = 2e-3
    c.rollout = ml_collections.ConfigDict()
    c.rollout.steps = 2 if smoke else 100
    c.rollout.groups_per_step = 1 if smoke else 4
    c.rollout.rollouts_per_group = 2 if smoke else 8
    c.rollout.seq_len = 2048
    c.rollout.seq_bucket = 8
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rl = ml_collections.ConfigDict()
    c.rl.lr = 3e-4
    c.rl.temperature = 1.0
    c.rl.underhire_slope = 0.1
    c.rl.weight_decay = 0.0
    c.engine = ml_collections.ConfigDict()
    c.engine.slots = 8 if smoke else 128
    c.engine.steps_per_dispatch = 8
    c.engine.prefill_chunk = 256
    c.engine.continuous = True
    c.eval = ml_collections.ConfigDict()
    c.eval.every = 2 if smoke else 10
    c.eval.tasks = 1 if smoke else 16
    c.eval.seeds = 1 if smoke else 2
    c.eval.budget = 1 if smoke else 3
    c.eval.clock_s = 600.0
    c.checkpoint = ml_collections.ConfigDict({"every": 2 if smoke else 10, "keep": 2})
    c.plots = not smoke
    c.keep_event_logs = False
    return c
