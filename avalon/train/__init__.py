"""The SFT -> RLCR training driver (`loop.run`), its config, telemetry and evaluation."""
