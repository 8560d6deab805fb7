"""Deliberation: confer and coordinate."""
