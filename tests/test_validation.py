"""One message format for a refused configuration value (`avalon/validation.py`): every config
of the model, the RL core, the organisation and the environments refuses a bad value with
`Owner.field=value: why`, one line naming the field and the value."""

import re

import pytest

from avalon.envs.escalation import EscalationConfig
from avalon.envs.hidden_profile.env import ProfileConfig
from avalon.envs.parallel.env import ParallelConfig
from avalon.envs.parallel.teacher import ParallelTeacherConfig
from avalon.envs.samplers import BudgetConfig, ProgressConfig
from avalon.envs.software.env import SoftwareConfig
from avalon.envs.verification.env import VerificationConfig
from avalon.envs.verification.teacher import VerifyTeacherConfig
from avalon.envs.wealth.tasks import WealthConfig
from avalon.model import presets
from avalon.org.config import OrgConfig
from avalon.rl.config import GKPO_BETA, RLConfig
from avalon.validation import FieldChecks

CASES = [
    (WealthConfig, {"n_bets": (5, 3)}, "WealthConfig.n_bets=(5, 3): must be 1 <= lo <= hi <= 9"),
    (WealthConfig, {"clock_s": 0.0}, "WealthConfig.clock_s=0.0: must be > 0"),
    (ParallelConfig, {"dep_prob": 1.5}, "ParallelConfig.dep_prob=1.5: must be in [0, 1]"),
    (ParallelConfig, {"overhead_s": -1.0},  # a rule over two fields
     "ParallelConfig.overhead_s=-1.0, wrong_penalty=0.0: must both be >= 0"),
    (ParallelTeacherConfig, {"answer_error_rate": 2.0},
     "ParallelTeacherConfig.answer_error_rate=2.0: must be in [0, 1]"),
    (VerificationConfig, {"defect_cost": 0.0}, "VerificationConfig.defect_cost=0.0: must be > 0"),
    (VerifyTeacherConfig, {"hires_per_turn": 0},
     "VerifyTeacherConfig.hires_per_turn=0: must be >= 1"),
    (ProfileConfig, {"clock_s": -5.0}, "ProfileConfig.clock_s=-5.0: must be > 0"),
    (SoftwareConfig, {"pass_threshold": 0.0},
     "SoftwareConfig.pass_threshold=0.0: must be in (0, 1]"),
    (BudgetConfig, {"p_single": -0.1}, "BudgetConfig.p_single=-0.1: must be in [0, 1]"),
    (ProgressConfig, {"slow_rate": 0.5, "fast_rate": 0.4},
     "ProgressConfig.slow_rate=0.5, fast_rate=0.4: need 0 < slow_rate < fast_rate <= 1"),
    (EscalationConfig, {"salt": "x"}, "EscalationConfig.salt='x': must be an int"),
    (OrgConfig, {"max_turns": 0}, "OrgConfig.max_turns=0: must be > 0"),
    (OrgConfig, {"keep_recent_obs": -1}, "OrgConfig.keep_recent_obs=-1: must be >= 0"),
    (RLConfig, {"beta": 0.0}, "RLConfig.beta=0.0: must be > 0"),
]


@pytest.mark.parametrize("cls,fields,message", CASES,
                         ids=[f"{c.__name__}.{','.join(f)}" for c, f, _ in CASES])
def test_a_bad_value_is_one_line_naming_field_and_value(cls, fields, message):
    with pytest.raises(ValueError) as e:
        cls(**fields)
    text = str(e.value)
    assert text.startswith(message), text
    assert "\n" not in text
    assert re.match(r"^\w+\.\w+=", text)


def test_model_config_uses_the_same_format():
    with pytest.raises(ValueError, match=r"^ModelConfig\.hidden_size=0: must be a positive "):
        presets.get("tiny", hidden_size=0)


def test_the_helper_formats_one_and_several_fields():
    check = FieldChecks("Owner")
    with pytest.raises(ValueError, match=r"^Owner\.field=3: why$"):
        check.fail("field", 3, "why")
    with pytest.raises(ValueError, match=r"^Owner\.a=1, b='x': must agree$"):
        check.fail_together({"a": 1, "b": "x"}, "must agree")


def test_gkpo_beta_is_defined_once():
    """The loss's beta and the wealth environment's reported utility default to one constant,
    the report's value."""
    assert GKPO_BETA == 0.2582
    assert RLConfig().beta == WealthConfig().utility_beta == GKPO_BETA
