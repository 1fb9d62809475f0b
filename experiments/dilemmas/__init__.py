"""Co-operation of checkpoints in OpenSpiel's social dilemmas (`run.py`)."""
