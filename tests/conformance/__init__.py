"""The conformance suite: the board's contract (section 3) as tests that every board backend must pass."""
