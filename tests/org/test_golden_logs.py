"""The same seeds give byte-identical event logs, training rows and scheduler records as the
code before the organisation became state plus effects: the toy teacher on all three
environments, a scripted episode calling every organisation tool (clock and lock-step), and the
no-CEO mode. The digests in golden_logs.json were recorded from that earlier code
(`python -m tests.org.golden`); a change here is a change of behaviour, not of hashes to
refresh, unless the change is meant and said so in its commit."""

import json

import pytest

from tests.org.golden import GOLDEN, digest, episodes

EPISODES = dict(episodes())


def test_every_golden_episode_is_played():
    assert sorted(json.loads(GOLDEN.read_text())) == sorted(EPISODES)


@pytest.mark.parametrize("name", sorted(EPISODES))
def test_episode_is_byte_identical(name):
    want = json.loads(GOLDEN.read_text())[name]
    assert digest(EPISODES[name]()) == want
