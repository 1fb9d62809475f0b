"""OrgConfig.scaled keeps the real limits at the real window (the pod config's summary cap is
the report's 12,000 tokens) and scales toy windows as before."""

from avalon.org import OrgConfig
from avalon.org.config import REAL_SUMMARY_CAP, REAL_WINDOW


def test_real_window_keeps_the_real_limits():
    real = OrgConfig.scaled(REAL_WINDOW)
    assert real == OrgConfig()
    assert real.summary_cap == REAL_SUMMARY_CAP == 12000
    assert OrgConfig.scaled(2 * REAL_WINDOW).summary_cap == 24000
    # Toy windows: unchanged (window/32, window/16 turns).
    toy = OrgConfig.scaled(4096)
    assert (toy.summary_cap, toy.max_new_tokens) == (128, 256)


def test_pod_config_gets_the_report_summary_cap():
    import math

    from avalon.train.config import from_config_dict
    from configs.nemotron3_super_pod import get_config
    c = get_config()
    c.init_from = ""  # the checkpoint directory exists on the pod only
    # The pod runs 32 hosts, one process each (its engine slots are per process).
    train = from_config_dict(c, num_devices=math.prod(dict(c.mesh).values()), num_processes=32)
    assert train.org.window == REAL_WINDOW and train.org.summary_cap == 12000
