"""Truncated sampling with RL is refused at start-up, naming the field: the sampler's log-probs
are those of the untruncated distribution, which is what the trainer scores."""

import pytest

from avalon.rl.config import check_rl_sampling
from avalon.train.config import RolloutConfig


def test_truncation_is_refused_for_rl_and_names_the_field():
    with pytest.raises(ValueError, match=r"config\.rollout\.top_p=0\.9: RL rollouts need"):
        RolloutConfig(top_p=0.9)
    with pytest.raises(ValueError, match=r"config\.rollout\.top_k=40"):
        check_rl_sampling(1.0, 40, "rollout")
    check_rl_sampling(1.0, 0, "rollout")
    RolloutConfig(top_p=0.9, steps=0)  # no RL steps: nothing is trained on the samples


def test_toy_config_with_top_p_fails_at_start_up():
    from avalon.train.config import from_config_dict
    from configs.toy_org import get_config
    c = get_config("smoke")
    c.rollout.top_p = 0.95
    with pytest.raises(ValueError, match=r"rollout\.top_p=0\.95"):
        from_config_dict(c, num_devices=1)
