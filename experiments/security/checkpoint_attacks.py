"""Red-team attacks: checkpoint (filled in by the hardening work)."""

ATTACKS = []
