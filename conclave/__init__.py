"""Conclave: ask a panel of LLMs at once, or run a proposer -> critics -> synthesizer debate."""

__version__ = "0.1.0"
