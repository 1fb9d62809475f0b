"""Judges: who labels messages, reasoning and opening plans (SPEC §5: "labelled by a judge").

A `Rubric` is one question with a closed set of labels (its first label is the answer when a
judge cannot tell). A `Judge` labels a batch of texts under one rubric:

    judge.label(REVIEW, ["LGTM, tests pass", "on it"]) -> ["approve", "none"]

- `RuleJudge`: regular expressions per rubric and label, first match wins (the rules are data);
  for toys and tests.
- `ModelJudge`: any model Avalon can load, through the inference engine: each text becomes a
  prompt (the rubric as a system segment, the text as an observation), all of a batch decoded
  together greedily, and the first allowed label in the answer is the label; an answer naming
  none gets the fallback label and is counted in `invalid`.
- `ScoringJudge`: the same prompt, but the model answers only in labels: each label's answer
  (the label, then the end of the turn) is scored by its log-likelihood after the prompt, and
  the likeliest is the label. A small model that does not follow the "answer with one word"
  instruction (SmolLM2-135M writes "p4 66 ok" back) still ranks the labels.
- `cohen_kappa(a, b)`: agreement of two judges' labels beyond chance, for audit.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from avalon import model as M
from avalon.backends.platform import model_ops
from avalon.inference.api import SamplingParams, TurnRequest
from avalon.rl.logprobs import token_logprobs
from avalon.tokenizer.chat import ChatFormat


@dataclasses.dataclass(frozen=True)
class Rubric:
    name: str
    instruction: str  # what a model judge reads
    labels: tuple[str, ...]  # labels[0]: the answer when a judge cannot tell

    def __post_init__(self):
        if len(self.labels) < 2 or len(set(self.labels)) != len(self.labels):
            raise ValueError(f"Rubric {self.name!r}: needs >= 2 distinct labels, got "
                             f"{self.labels}")


REVIEW = Rubric(
    "review", "Is this message a review of a teammate's work? Answer approve (a review that "
    "accepts the work), reject (a review that finds faults or asks for changes) or none (not a "
    "review).", ("none", "approve", "reject"))
HELP_OFFER = Rubric(
    "help_offer", "Does this message offer help to a teammate? Answer yes or no.", ("no", "yes"))
HELP_PLAN = Rubric(
    "help_plan", "Does this reasoning plan to help a teammate with their work? Answer yes or no.",
    ("no", "yes"))
OPENING_PLAN = Rubric(
    "opening_plan", "How does this opening plan divide the work among the hires? Answer "
    "component (each hire owns a part of the task), pipeline (hires are stages: build, test, "
    "review) or other.", ("other", "component", "pipeline"))
RUBRICS = (REVIEW, HELP_OFFER, HELP_PLAN, OPENING_PLAN)


class Judge(Protocol):
    def label(self, rubric: Rubric, texts: Sequence[str]) -> list[str]:
        """One label of `rubric.labels` per text."""
        ...


# Rule judge ------------------------------------------------------------------------------------

_REVIEW_CUE = r"\b(review(ed|ing)?|lgtm|verified|checked|tested|approved?)\b"
DEFAULT_RULES: Mapping[str, Sequence[tuple[str, str]]] = {
    # (label, pattern): the first pattern that matches gives the label; none: the fallback.
    "review": (
        # Bare verdicts on a named piece of work, as the toy's verifiers write them
        # (`p2 47 ok`, `p2 defect`, `p2 47 no defect found`): "defect" rejects unless "no"
        # comes before it; "ok" approves after an item and a result code. A result passed on
        # without a verdict (`p2 47`) is no review.
        ("approve", r"\bno defects?( found)?\b"),
        ("reject", r"\bdefect(s|ive)?\b"),
        ("approve", r"\b[a-z]+\d+ \d+ (ok|okay|sound|passe[sd])\b"),
        ("reject", _REVIEW_CUE + r".*\b(bug|wrong|fails?|failing|incorrect|broken|reject(ed)?|"
                                 r"fix|changes)\b"),
        ("reject", r"\b(bug|wrong|fails?|failing|incorrect|broken|reject(ed)?)\b.*" + _REVIEW_CUE),
        ("approve", _REVIEW_CUE),
    ),
    "help_offer": (
        ("yes", r"\b(can i help|happy to help|i can help|i can take|need (a )?hand|"
                r"want me to|shall i|let me help|i'?ll help|help you)\b"),
    ),
    "help_plan": (
        ("yes", r"\b(help(ing)? (a1|a\d+|them|him|her|the team|my teammate|teammates?)|"
                r"assist|offer (to )?help|take over|pick up (their|the rest))\b"),
    ),
    "opening_plan": (
        ("pipeline", r"\b(review(er)?|test(er|ing)?|verif\w*|qa|pipeline|stages?)\b"),
        ("component", r"\b(parts?|components?|modules?|subtasks?|pieces?|sections?|each|"
                      r"split)\b"),
    ),
}


@dataclasses.dataclass(frozen=True)
class RuleJudge:
    """Labels by regular expressions (case-insensitive, searched anywhere, across lines)."""

    rules: Mapping[str, Sequence[tuple[str, str]]] = dataclasses.field(
        default_factory=lambda: dict(DEFAULT_RULES))

    def label(self, rubric: Rubric, texts: Sequence[str]) -> list[str]:
        rules = self.rules.get(rubric.name)
        if rules is None:
            raise ValueError(f"RuleJudge has no rules for rubric {rubric.name!r}")
        for lab, _ in rules:
            if lab not in rubric.labels:
                raise ValueError(f"RuleJudge rule label {lab!r} is not one of {rubric.labels}")
        compiled = [(lab, re.compile(p, re.IGNORECASE | re.DOTALL)) for lab, p in rules]
        out = []
        for t in texts:
            out.append(next((lab for lab, p in compiled if p.search(t)), rubric.labels[0]))
        return out


# Model judges ----------------------------------------------------------------------------------

def judge_prompt(who: str, chat: ChatFormat, rubric: Rubric, text: str, room: int) -> list[int]:
    """The rubric as a system segment, the text as an observation, then the answer's header:
    at most `room` tokens (the text is cut to fit)."""
    system = chat.system(f"You are a judge. {rubric.instruction} Answer with one word: "
                         + ", ".join(rubric.labels) + ".")
    frame = len(system) + len(chat.turn_prompt("Text: "))
    if room - frame < 1:
        raise ValueError(f"{who}: rubric {rubric.name!r} takes {frame} tokens; a context of "
                         f"{room} tokens for the prompt leaves no room for the text")
    keep = room - frame
    while True:
        ids = chat.tok.encode(text)
        if len(ids) > keep:
            text = chat.tok.decode(ids[:max(keep, 0)])
        prompt = system + chat.turn_prompt(f"Text: {text}")
        if len(prompt) <= room:
            return prompt
        # "Text: " and the cut text can tokenise longer than apart (BPE merges across them).
        keep -= len(prompt) - room


class ModelJudge:
    """A model as a judge, through the engine (see the module docstring).

    `engine`: an `avalon.inference.engine.Engine` over any loaded checkpoint (HF or Avalon's
    own: `avalon.checkpoint.hf.load`, `avalon.checkpoint.avalon_format.load_avalon`), with
    `chat` its tokenizer's chat format. Texts are cut to leave room for the rubric and the
    answer within the engine's context.
    """

    def __init__(self, engine, chat: ChatFormat, *, max_answer_tokens: int = 8):
        if max_answer_tokens < 1:
            raise ValueError(f"ModelJudge max_answer_tokens must be >= 1, got "
                             f"{max_answer_tokens}")
        self.engine, self.chat = engine, chat
        self.max_answer_tokens = max_answer_tokens
        self.invalid = 0  # answers that named no allowed label (given the fallback)
        self.answered = 0

    def prompt(self, rubric: Rubric, text: str) -> list[int]:
        return judge_prompt("ModelJudge", self.chat, rubric, text,
                            self.engine.max_context - self.max_answer_tokens)

    def parse(self, rubric: Rubric, answer: str) -> str | None:
        """The allowed label named first in `answer`, or None."""
        found = [(m.start(), lab) for lab in rubric.labels
                 for m in [re.search(rf"\b{re.escape(lab)}\b", answer, re.IGNORECASE)] if m]
        return min(found)[1] if found else None

    def label(self, rubric: Rubric, texts: Sequence[str]) -> list[str]:
        out: list[str] = []
        slots_free = self.engine.num_slots
        for start in range(0, len(texts), slots_free):
            batch = texts[start:start + slots_free]
            slots = [self.engine.allocate() for _ in batch]
            try:
                results = self.engine.generate([
                    TurnRequest(slot=s, new_tokens=np.asarray(self.prompt(rubric, t), np.int32),
                                max_new_tokens=self.max_answer_tokens,
                                sampling=SamplingParams(greedy=True),
                                stop_tokens=(self.chat.end_id,))
                    for s, t in zip(slots, batch)])
            finally:
                for s in slots:
                    self.engine.release(s)
            for res in results:
                answer = self.chat.split_output(res.tokens).text
                lab = self.parse(rubric, answer)
                self.answered += 1
                if lab is None:
                    self.invalid += 1
                    lab = rubric.labels[0]
                out.append(lab)
        return out


CONTENT_FREE = "N/A"  # a text with nothing to judge: its label scores are the model's prior


class ScoringJudge:
    """A model as a judge that answers in labels only (see the module docstring).

    For each text and label the row is the prompt (`judge_prompt`, ModelJudge's) then the
    label's answer as the model would write it (`chat.output(label)`: the label's tokens and the
    end of the turn); the label's score is the sum of the answer tokens' log-probabilities, and
    the label with the highest score is the answer (the first label on a tie). Rows go through
    the model's forward `rows` at a time, padded on the right to a multiple of `length_step`
    tokens (each length compiles once), the LM head only where an answer token is predicted
    (SmolLM2's 49,152-word head is about a fifth of its forward's products per position).
    `cfg`/`params`: any loaded checkpoint in the model's own layout (not an engine's decode
    layout).

    `calibrate`: a small model's label scores lean to the labels it likes whatever the text
    (SmolLM2-135M: "none" for every review); calibrated, each score is less the same label's score
    for a content-free text (`CONTENT_FREE`), so a label wins where the text makes it likelier
    than it is a priori (Zhao et al. 2021, "Calibrate before use", in log space).
    """

    def __init__(self, cfg, params: dict, chat: ChatFormat, *, max_context: int | None = None,
                 rows: int = 8, length_step: int = 64, calibrate: bool = False):
        for name, value in (("rows", rows), ("length_step", length_step)):
            if value < 1:
                raise ValueError(f"ScoringJudge {name} must be >= 1, got {value}")
        self.cfg, self.params, self.chat = cfg, params, chat
        self.max_context = cfg.max_context if max_context is None else max_context
        if not 1 <= self.max_context <= cfg.max_context:
            raise ValueError(f"ScoringJudge max_context must be in [1, {cfg.max_context}], got "
                             f"{max_context}")
        self.rows, self.length_step = rows, length_step
        self.calibrate = calibrate
        self._prior: dict[str, np.ndarray] = {}  # rubric name -> its content-free scores
        self.invalid = 0  # never: every answer is a label (kept for ModelJudge's callers)
        self.answered = 0

        ops = model_ops(jax.default_backend(), cfg)  # the platform the jit below runs on

        def score(params, tokens, at, targets, mask):  # tokens [r, s]; at, targets, mask [r, a]
            hidden = M.forward(params, tokens, cfg, return_logits=False, ops=ops).hidden
            # The LM head only where an answer token is predicted (a few positions a row).
            picked = jnp.take_along_axis(hidden, at[..., None], axis=1)
            logp = token_logprobs(params, picked, targets, cfg, chunk=at.shape[1], ops=ops)[0]
            return jnp.sum(jnp.where(mask, logp, 0.0), axis=1)
        self._score = jax.jit(score)

    def answers(self, rubric: Rubric) -> list[list[int]]:
        return [self.chat.output(lab) for lab in rubric.labels]

    def prompt(self, rubric: Rubric, text: str) -> list[int]:
        return self._prompt(rubric, text, self.answers(rubric))

    def _prompt(self, rubric: Rubric, text: str, answers: list[list[int]]) -> list[int]:
        longest = max(len(a) for a in answers)  # room left for the longest answer
        return judge_prompt("ScoringJudge", self.chat, rubric, text, self.max_context - longest)

    def scores(self, rubric: Rubric, texts: Sequence[str]) -> np.ndarray:
        """[len(texts), len(rubric.labels)]: log p(label's answer | prompt) per text and label;
        calibrated, less the same for the content-free text ("N/A")."""
        raw = self.raw_scores(rubric, texts)
        if not self.calibrate:
            return raw
        if rubric.name not in self._prior:
            self._prior[rubric.name] = self.raw_scores(rubric, [CONTENT_FREE])[0]
        return raw - self._prior[rubric.name]

    def raw_scores(self, rubric: Rubric, texts: Sequence[str]) -> np.ndarray:
        """`scores` uncalibrated."""
        answers = self.answers(rubric)
        prompts = [self._prompt(rubric, t, answers) for t in texts]  # one per text
        rows = [(p, a) for p in prompts for a in answers]
        width = max(len(a) for a in answers)
        out = np.zeros(len(rows), np.float64)
        for start in range(0, len(rows), self.rows):
            batch = rows[start:start + self.rows]
            longest = max(len(p) + len(a) for p, a in batch) - 1  # inputs: all but the last
            length = min(-(-longest // self.length_step) * self.length_step, self.max_context)
            tokens = np.zeros((self.rows, length), np.int32)
            at = np.zeros((self.rows, width), np.int32)  # where each answer token is predicted
            targets = np.zeros((self.rows, width), np.int32)
            mask = np.zeros((self.rows, width), bool)
            for r, (p, a) in enumerate(batch):
                row = p + a
                tokens[r, :len(row) - 1] = row[:-1]
                at[r, :len(a)] = np.arange(len(p) - 1, len(row) - 1)
                targets[r, :len(a)] = a
                mask[r, :len(a)] = True
            got = np.asarray(self._score(self.params, tokens, at, targets, mask))
            out[start:start + len(batch)] = got[:len(batch)]
        return out.reshape(len(texts), len(answers))

    def label(self, rubric: Rubric, texts: Sequence[str]) -> list[str]:
        if not texts:
            return []
        best = np.argmax(self.scores(rubric, texts), axis=1)
        self.answered += len(texts)
        return [rubric.labels[i] for i in best]


JUDGE_ANSWERS = ("generate", "score")


def load_model_judge(path: str, *, chat: ChatFormat | None = None, slots: int = 64,
                     max_context: int = 4096, max_answer_tokens: int = 8,
                     answer: str = "generate", calibrate: bool = False
                     ) -> ModelJudge | ScoringJudge:
    """A model judge over a checkpoint: Avalon's own format (`save_avalon`), a Hugging Face
    directory or a GGUF file (`hf.load`); `chat` defaults to the checkpoint's own tokenizer
    (`tokenizer.json` or the GGUF file's vocabulary), rendered through its chat template.
    `answer`: "generate" (a `ModelJudge`: decoded answers, `slots` at a time) or "score" (a
    `ScoringJudge`: the labels' likelihoods, `slots` rows at a time, `calibrate` as it says)."""
    import os

    if answer not in JUDGE_ANSWERS:
        raise ValueError(f"load_model_judge answer must be one of {JUDGE_ANSWERS}, got "
                         f"{answer!r}")
    if calibrate and answer != "score":
        raise ValueError(f"load_model_judge calibrate applies to answer='score', not {answer!r}")

    from avalon.checkpoint import hf
    from avalon.checkpoint.avalon_format import is_avalon_checkpoint, load_avalon
    from avalon.inference.engine import Engine
    from avalon.tokenizer import HFTokenizer

    if is_avalon_checkpoint(path):
        cfg, params = load_avalon(path)
    else:
        cfg, params = hf.load(path, max_context=max_context)
    if chat is None:
        if os.path.isfile(path) and hf.is_gguf(path):
            from avalon.tokenizer.gguf import load_gguf_tokenizer
            tok = load_gguf_tokenizer(path, text_calls=True)
        else:
            tok = HFTokenizer.from_dir(path)
        chat = ChatFormat(tok, tok.rendering)
    if answer == "score":
        return ScoringJudge(cfg, params, chat, max_context=min(max_context, cfg.max_context),
                            rows=slots, calibrate=calibrate)
    engine = Engine(cfg, params, num_slots=slots, max_context=min(max_context, cfg.max_context))
    return ModelJudge(engine, chat, max_answer_tokens=max_answer_tokens)


def cohen_kappa(a: Sequence[str], b: Sequence[str]) -> float:
    """Cohen's kappa of two label sequences: (p_o - p_e) / (1 - p_e); 1.0 when both judges give
    one and the same label throughout (p_e = 1)."""
    if len(a) != len(b):
        raise ValueError(f"cohen_kappa: {len(a)} labels against {len(b)}")
    if not a:
        raise ValueError("cohen_kappa of no labels")
    n = len(a)
    p_o = sum(x == y for x, y in zip(a, b)) / n
    labels = set(a) | set(b)
    p_e = sum((list(a).count(lab) / n) * (list(b).count(lab) / n) for lab in labels)
    if p_e == 1.0:
        return 1.0
    return (p_o - p_e) / (1 - p_e)
