"""The red-team suite: attacks through the project's own APIs, and how each ended."""
