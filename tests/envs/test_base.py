"""The environment interface: deterministic, non-overlapping splits, task ids, clocks and
vocabularies, for every environment, in-process and over ORS (the Avalon extension)."""

import pytest

from avalon.envs.base import Split, TaskTable, UnknownTaskError, check_clock, split_of
from avalon.envs.hidden_profile import HiddenProfile, ProfileConfig
from avalon.envs.hidden_profile.tasks import signature as profile_signature
from avalon.envs.parallel import ParallelConfig, ParallelSubtasks
from avalon.envs.parallel.tasks import signature as parallel_signature
from avalon.envs.software import SoftwareBuild, SoftwareConfig
from avalon.envs.wealth import Wealth, WealthConfig
from avalon.org.vocabulary import org_vocabulary
from avalon.tokenizer import WordTokenizer
from tests.envs.helpers import MODES, environment

ENVS = {
    "parallel": (lambda seed=0: ParallelSubtasks(ParallelConfig(n_train=64, n_heldout=16,
                                                                seed=seed)),
                 parallel_signature),
    "hidden_profile": (lambda seed=0: HiddenProfile(ProfileConfig(n_train=64, n_heldout=16,
                                                                  seed=seed)),
                       profile_signature),
    "wealth": (lambda seed=0: Wealth(WealthConfig(n_train=64, n_heldout=16, seed=seed)),
               lambda t: t.probs),
    "software": (lambda seed=0: SoftwareBuild(SoftwareConfig(n_train=64, n_heldout=16,
                                                             seed=seed)),
                 lambda t: t.functions),
}


@pytest.mark.parametrize("name", ENVS)
def test_splits_are_deterministic_and_disjoint(name):
    make, sig = ENVS[name]
    a, b, other = make(), make(), make(seed=1)
    for split in Split:
        ids = a.task_ids(split)
        assert ids == b.task_ids(split) and len(set(ids)) == len(ids)
        assert all(split_of(t) is split for t in ids)
        assert [a.task(t).prompt for t in ids] == [b.task(t).prompt for t in ids]
    train = {sig(a.spec(t)) for t in a.task_ids(Split.TRAIN)}
    held = [sig(a.spec(t)) for t in a.task_ids(Split.HELDOUT)]
    assert not train & set(held) and len(set(held)) == len(held)
    assert not set(a.task_ids(Split.TRAIN)) & set(a.task_ids(Split.HELDOUT))
    first = a.task_ids(Split.TRAIN)[0]
    assert a.task(first).prompt != other.task(first).prompt  # the seed matters


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ENVS)
def test_unknown_task_ids(name, mode):
    with environment(ENVS[name][0](), mode) as env:
        prefix = env.task_ids(Split.TRAIN)[0].rsplit("-", 2)[0]
        for bad in (f"{prefix}-train-64", f"{prefix}-train-01", f"{prefix}-test-0",
                    "other-train-0", "nonsense"):
            with pytest.raises(UnknownTaskError):
                env.session(bad, 0)
        with pytest.raises(ValueError, match="clock_s"):
            env.task(env.task_ids(Split.TRAIN)[0], clock_s=float("nan"))


@pytest.mark.parametrize("name", ENVS)
def test_vocabularies_make_word_tokenizers(name):
    env = ENVS[name][0]()
    tok = WordTokenizer(org_vocabulary() + list(env.vocabulary()))  # validates every word
    if name == "parallel":
        assert tok.vocab_size <= 512  # the toy model's vocabulary


def test_task_table_limits():
    with pytest.raises(ValueError, match="n_train must be an int >= 1"):
        TaskTable("t", lambda rng: 0, lambda s: s, 0, 1, 0)
    tiny = TaskTable("t", lambda rng: int(rng.integers(3)), lambda s: s, 8, 2, 0)
    with pytest.raises(ValueError, match="held-out tasks unlike"):
        tiny.specs(Split.HELDOUT)  # three possible tasks, all used by train
    assert check_clock(None, 5.0, "x") == 5.0 and check_clock(7, 5.0, "x") == 7.0
    for bad in (0, -1.0, True, "10"):
        with pytest.raises(ValueError, match="x: clock_s"):
            check_clock(bad, 5.0, "x")
