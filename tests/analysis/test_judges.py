"""Judges: the rule judge's rules, the model judge's parsing and batching (a scripted engine),
the model judge through the real engine with the tiny random model, Cohen's kappa by hand."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avalon import model as M
from avalon.analysis.judges import (
    CONTENT_FREE,
    HELP_OFFER,
    HELP_PLAN,
    OPENING_PLAN,
    REVIEW,
    RUBRICS,
    ModelJudge,
    RuleJudge,
    ScoringJudge,
    cohen_kappa,
    load_model_judge,
)
from avalon.checkpoint.avalon_format import save_avalon
from avalon.inference.api import StopReason, TurnResult
from avalon.inference.engine import Engine
from avalon.tokenizer import ByteTokenizer, ChatFormat, WordTokenizer

CHAT = ChatFormat(ByteTokenizer())


def test_rule_judge():
    j = RuleJudge()
    assert j.label(REVIEW, ["Reviewed a1's parser: LGTM", "reviewed it: the test fails",
                            "found a bug while I checked your code", "starting on part b"]) == [
        "approve", "reject", "reject", "none"]
    assert j.label(HELP_OFFER, ["Happy to help with part b", "done with a"]) == ["yes", "no"]
    assert j.label(HELP_PLAN, ["a2 is stuck; I will help a2 with the parser", "solve c"]) == [
        "yes", "no"]
    assert j.label(OPENING_PLAN, ["hire Builder: part a\nhire Tester: test part a",
                                  "each hire takes one subtask", "hire a1"]) == [
        "pipeline", "component", "other"]
    with pytest.raises(ValueError, match="not one of"):
        RuleJudge({"review": [("maybe", "x")]}).label(REVIEW, ["x"])


class ScriptedEngine:
    """Answers each prompt with the next scripted text; records batch sizes."""

    max_context = 1024

    def __init__(self, answers, num_slots=2):
        self.answers, self.num_slots, self.batches = list(answers), num_slots, []
        self._free = list(range(num_slots))

    def allocate(self):
        return self._free.pop(0)

    def release(self, slot):
        self._free.append(slot)

    def generate(self, requests):
        self.batches.append(len(requests))
        out = []
        for r in requests:
            ids = np.asarray(CHAT.output(self.answers.pop(0)), np.int32)
            out.append(TurnResult(slot=r.slot, tokens=ids, logprobs=np.zeros(len(ids)),
                                  routing=None, stop_reason=StopReason.STOP,
                                  n_in_new=len(r.new_tokens), context_length=0))
        return out


def test_model_judge_parses_and_batches():
    engine = ScriptedEngine(["Approve.", "I'd say REJECT, not approve", "none", "maybe?",
                             "reject"], num_slots=2)
    j = ModelJudge(engine, CHAT)
    assert j.label(REVIEW, ["t1", "t2", "t3", "t4", "t5"]) == [
        "approve", "reject", "none", "none", "reject"]
    assert engine.batches == [2, 2, 1]  # as many texts per engine call as it has slots
    assert (j.answered, j.invalid) == (5, 1)  # "maybe?" named no label: the fallback


def test_model_judge_cuts_long_texts_to_the_context():
    j = ModelJudge(ScriptedEngine([]), CHAT)
    prompt = j.prompt(REVIEW, "x" * 5000)
    assert len(prompt) <= ScriptedEngine.max_context - j.max_answer_tokens


@pytest.mark.slow  # compiling the engine: ~20-60 s on 2 loaded cores
def test_model_judge_through_the_engine_with_a_random_model(tmp_path):
    # A word vocabulary keeps the rubric prompts short (about 110 tokens): one small KV bucket.
    words = sorted({w for r in RUBRICS for w in re.findall(r"[A-Za-z]{2,}", r.instruction)}
                   | {"You", "are", "judge", "Answer", "with", "one", "word", "Text"})
    chat = ChatFormat(WordTokenizer(words))
    cfg = M.presets.get("tiny", vocab_size=512, max_context=256)
    # Saved in Avalon's own format and loaded back the way any checkpoint is.
    save_avalon(tmp_path / "judge", cfg, M.init_params(jax.random.key(0), cfg))
    j = load_model_judge(str(tmp_path / "judge"), chat=chat, slots=4, max_context=256,
                         max_answer_tokens=4)
    assert isinstance(j.engine, Engine) and j.engine.max_context == 256
    assert max(len(j.prompt(r, "")) for r in RUBRICS) < 128
    texts = ["LGTM", "please fix the bug", "happy to help", "plan: split by part", "hi"]
    for rubric in RUBRICS:
        labels = j.label(rubric, texts)
        assert len(labels) == len(texts) and set(labels) <= set(rubric.labels)
    assert j.answered == len(texts) * len(RUBRICS)


def _word_chat():
    # A word vocabulary keeps the rubric prompts short (about 110 tokens).
    words = sorted({w for r in RUBRICS for w in re.findall(r"[A-Za-z]{2,}", r.instruction)}
                   | {"You", "are", "judge", "Answer", "with", "one", "word", "Text", "LGTM",
                      "fix", "bug", "happy", "help", "plan", "split", "part", "hi"})
    return ChatFormat(WordTokenizer(words))


def _reference_scores(j, params, cfg, chat, rubric, texts):
    """log p(label's answer | prompt), one unpadded row at a time, logits in full."""
    want = np.zeros((len(texts), len(rubric.labels)))
    for i, t in enumerate(texts):
        p = j.prompt(rubric, t)
        for k, lab in enumerate(rubric.labels):
            row = p + chat.output(lab)
            logits = M.forward(params, jnp.asarray([row[:-1]], jnp.int32), cfg).logits[0]
            logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
            want[i, k] = sum(float(logp[pos, row[pos + 1]])
                             for pos in range(len(p) - 1, len(row) - 1))
    return want


def test_scoring_judge_against_the_full_forward():
    chat = _word_chat()
    cfg = M.presets.get("tiny", vocab_size=512, max_context=256)
    params = M.init_params(jax.random.key(1), cfg)
    # 3 rows a batch and 16-token length steps: padded rows, padded tails, two lengths.
    j = ScoringJudge(cfg, params, chat, rows=3, length_step=16)
    calibrated = ScoringJudge(cfg, params, chat, rows=3, length_step=16, calibrate=True)
    texts = ["LGTM", "please fix the bug " * 6, "happy to help", "hi"]
    for rubric in (REVIEW, HELP_OFFER):
        got = j.scores(rubric, texts)
        want = _reference_scores(j, params, cfg, chat, rubric, texts)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert j.label(rubric, texts) == [rubric.labels[k] for k in np.argmax(want, axis=1)]
        # Calibrated: less the content-free text's scores, label by label.
        prior = _reference_scores(j, params, cfg, chat, rubric, [CONTENT_FREE])[0]
        np.testing.assert_allclose(calibrated.scores(rubric, texts), want - prior, rtol=1e-5,
                                   atol=1e-5)
    assert (j.answered, j.invalid) == (2 * len(texts), 0)


def test_scoring_judge_cuts_long_texts_to_the_context():
    chat = _word_chat()
    cfg = M.presets.get("tiny", vocab_size=512, max_context=256)
    j = ScoringJudge(cfg, {}, chat, max_context=160)
    for rubric in RUBRICS:
        prompt = j.prompt(rubric, "fix the bug " * 400)
        assert len(prompt) + max(len(a) for a in j.answers(rubric)) <= 160
        assert prompt[-len(chat.turn_prompt("")):][-1] == chat.turn_prompt("")[-1]  # the header
    with pytest.raises(ValueError, match="leaves no room"):
        ScoringJudge(cfg, {}, chat, max_context=40).prompt(REVIEW, "hi")
    with pytest.raises(ValueError, match="rows must be >= 1, got 0"):
        ScoringJudge(cfg, {}, chat, rows=0)


def test_load_model_judge_that_scores(tmp_path):
    chat = _word_chat()
    cfg = M.presets.get("tiny", vocab_size=512, max_context=256)
    save_avalon(tmp_path / "judge", cfg, M.init_params(jax.random.key(0), cfg))
    j = load_model_judge(str(tmp_path / "judge"), chat=chat, slots=4, max_context=256,
                         answer="score")
    assert isinstance(j, ScoringJudge) and (j.rows, j.max_context) == (4, 256)
    texts = ["LGTM", "please fix the bug", "hi"]
    assert set(j.label(OPENING_PLAN, texts)) <= set(OPENING_PLAN.labels)
    with pytest.raises(ValueError, match="answer must be one of .* got 'vote'"):
        load_model_judge(str(tmp_path / "judge"), chat=chat, answer="vote")


def test_cohen_kappa_by_hand():
    # p_o = 4/5; p_e = (3/5)(2/5) + (2/5)(3/5) = 0.48; kappa = 0.32 / 0.52.
    a = ["y", "y", "n", "n", "y"]
    b = ["y", "n", "n", "n", "y"]
    assert cohen_kappa(a, b) == pytest.approx(0.32 / 0.52, rel=1e-12)
    assert cohen_kappa(a, a) == 1.0
    assert cohen_kappa(["y", "n"], ["n", "y"]) == -1.0  # p_o 0, p_e 1/2
    with pytest.raises(ValueError, match="labels against"):
        cohen_kappa(["y"], [])
