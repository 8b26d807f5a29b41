"""Measuring scripts (`python3 benchmarks/<name>.py`, with the project installed: README)."""
