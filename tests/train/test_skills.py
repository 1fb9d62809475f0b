"""Skill rows (the toy's stand-in for pretraining) and how SFT mixes them with teacher rows."""

from __future__ import annotations

import re
import types

import numpy as np
import pytest

from avalon.rl.types import TokenFlag, TrajectoryRow
from avalon.tokenizer import ChatFormat, WordTokenizer
from avalon.train.config import from_config_dict
from avalon.train.sft import SFTBatches
from avalon.train.skills import Skill, SkillRows, recall_keys

WORDS = ("add", "max", "min", "sub", "mul", "p1", "p2", "p3", "s1", "s2", "r1", "hire",
         *(str(i) for i in range(10, 100)))


def _tok():
    return WordTokenizer(WORDS)


def _expected_answers(text: str) -> list[str]:
    """The answers of a decoded skill row, worked out from its text alone."""
    out = []
    for line in text.strip("\n").split("\n"):
        m = re.fullmatch(r"(add|sub|mul|max|min) (\d) (\d) (\d+)", line)
        if m:
            a, b = int(m.group(2)), int(m.group(3))
            out.append(str({"add": a + b, "sub": a - b, "mul": a * b, "max": max(a, b),
                            "min": min(a, b)}[m.group(1)]))
            assert m.group(4) == out[-1], line  # the row states the right result
            continue
        facts, asked = line.split(" ; ")
        pairs = dict(p.split(" ") for p in facts.split(" , "))
        asked = asked.split()
        for k, v in zip(asked[::2], asked[1::2]):
            assert v == pairs[k], line  # a key asked back gets the value it was given
            out.append(pairs[k])
        assert sorted(asked[::2]) == sorted(pairs), line  # every key is asked once
    return out


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_loss_is_on_the_answers_only_and_they_are_right(seed):
    tok = _tok()
    rows = SkillRows(tok, tuple(Skill), recall_keys(WORDS), row_tokens=(200, 300), seed=seed)
    for i in range(5):
        r = rows.row((i,))
        assert len(r.tokens) <= 300
        text = tok.decode(list(r.tokens))
        masked = [tok.decode([t]) for t, m in zip(r.tokens, r.loss_mask) if m]
        assert masked == _expected_answers(text)
        assert len(masked) >= 10
        assert (r.flags == TokenFlag.NORMAL).all()


def test_rows_are_a_function_of_seed_and_index():
    keys = ("p1", "p2", "s1")
    a = SkillRows(_tok(), (Skill.RECALL, Skill.ADD), keys, row_tokens=(48, 200), seed=3)
    b = SkillRows(_tok(), (Skill.RECALL, Skill.ADD), keys, row_tokens=(48, 200), seed=3)
    assert np.array_equal(a.row((4, 1)).tokens, b.row((4, 1)).tokens)
    assert not np.array_equal(a.row((4, 1)).tokens, a.row((4, 2)).tokens)
    lengths = {len(a.row((i,)).tokens) for i in range(20)}
    assert min(lengths) < 100 and max(lengths) > 150  # lengths spread over the range


def test_fill_packs_one_sequence():
    rows = SkillRows(_tok(), (Skill.RECALL, Skill.MIN), ("p1", "p2", "s1"), row_tokens=(48, 120),
                     seed=0)
    filled = rows.fill((2, 0), 500)
    total = sum(len(r.tokens) for r in filled)
    assert 500 - 48 < total <= 500 and len(filled) >= 4


def test_recall_needs_id_like_words():
    assert recall_keys(("p1", "hire", "42", "s2", "p1")) == ("p1", "s2")
    with pytest.raises(ValueError, match="id-like words"):
        recall_keys(("hire", "add", "42"))


def _teacher_row(i: int) -> TrajectoryRow:
    t = 40 + i
    tokens = np.full(t, 3 + i % 50, np.int32)  # a marker no skill row holds at every position
    return TrajectoryRow(tokens=tokens, loss_mask=np.ones(t, bool),
                         sampler_logp=np.zeros(t, np.float32), routing=None,
                         flags=np.zeros(t, np.int8), agent="ceo", role="CEO")


class _Env:
    def vocabulary(self):
        return WORDS


def _setup(skill_steps: int, skill_seqs: int):
    sft = types.SimpleNamespace(batch_seqs=4, micro_batches=0, skills=(Skill.RECALL, Skill.MAX),
                                skill_steps=skill_steps, skill_seqs=skill_seqs,
                                skill_row_tokens=(40, 60))
    cfg = types.SimpleNamespace(sft=sft, seed=0, mesh={"data": 1, "fsdp": 1, "expert": 1},
                                rl=types.SimpleNamespace(micro_batches=1, sequence_parallel=False),
                                rollout=types.SimpleNamespace(seq_len=64))
    mesh = types.SimpleNamespace(shape={"data": 1, "fsdp": 1, "expert": 1})
    return types.SimpleNamespace(cfg=cfg, mesh=mesh, envs=[_Env()], chat=ChatFormat(_tok()))


def _is_teacher(seq: np.ndarray) -> bool:
    live = seq[seq != 0]
    return len(set(live.tolist())) == 1


def _segments(seq_ids: np.ndarray) -> int:
    return len(set(seq_ids.tolist()) - {0})


def test_sft_batches_mix_skill_rows_as_configured():
    traces = types.SimpleNamespace(rows=[_teacher_row(i) for i in range(12)])
    batches = SFTBatches(_setup(skill_steps=2, skill_seqs=1), traces)
    kinds = [[_is_teacher(s) for s in batches.batch(i).tokens] for i in range(5)]
    assert kinds[0] == kinds[1] == [False] * 4  # the skill-only updates
    b0 = batches.batch(0)
    assert all(_segments(s) >= 1 for s in b0.segment_ids)  # short rows packed several a row
    assert b0.loss_mask.sum() > 0
    for k in kinds[2:]:
        assert sorted(k) == [False, True, True, True]  # 3 teacher sequences + 1 skill one
    # Later updates walk the teacher rows in order of a permutation, from its start.
    firsts = [batches.batch(i).tokens[0] for i in range(2, 4)]
    assert not np.array_equal(firsts[0], firsts[1])
    # Deterministic: the same update gets the same batch (resume regenerates it).
    assert np.array_equal(batches.batch(3).tokens, batches.batch(3).tokens)


def test_no_skills_is_the_teacher_rows_alone():
    traces = types.SimpleNamespace(rows=[_teacher_row(i) for i in range(12)])
    setup = _setup(0, 0)
    setup.cfg.sft.skills = ()
    batches = SFTBatches(setup, traces)
    assert all(_is_teacher(s) for i in range(3) for s in batches.batch(i).tokens)


def _toy(**sft):
    from configs import toy_org
    c = toy_org.get_config("smoke")
    for k, v in sft.items():
        c.sft[k] = v
    return c


def test_config_names_the_bad_skill_field():
    with pytest.raises(ValueError, match=r"sft\.skills\[1\].*'juggle'"):
        from_config_dict(_toy(skills=("recall", "juggle")), num_devices=1)
    with pytest.raises(ValueError, match=r"sft\.skill_seqs.*9"):
        from_config_dict(_toy(skill_seqs=9), num_devices=1)
    with pytest.raises(ValueError, match=r"sft\.skill_row_tokens.*4096"):
        from_config_dict(_toy(skill_row_tokens=(48, 4096)), num_devices=1)
    with pytest.raises(ValueError, match=r"sft\.skills.*empty"):
        from_config_dict(_toy(skills=(), skill_steps=3), num_devices=1)
