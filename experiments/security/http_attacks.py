"""Red-team attacks: http (filled in by the hardening work)."""

ATTACKS = []
