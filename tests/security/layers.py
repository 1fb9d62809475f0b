"""Which sandbox layers a test needs, and what it does without them: in CI
(`AVALON_REQUIRE_BWRAP=1`, set by `.ci/run`, which installs bubblewrap) a missing layer fails
the test; elsewhere it skips with the reason."""

import os
import shutil

import pytest


def require_bwrap() -> None:
    if shutil.which("bwrap") is not None:
        return
    message = "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    if os.environ.get("AVALON_REQUIRE_BWRAP") == "1":
        pytest.fail(message)
    pytest.skip(message)
