"""Red-team attacks: sandbox (filled in by the hardening work)."""

ATTACKS = []
