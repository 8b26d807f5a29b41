"""Measuring scripts (`python3 benchmarks/<name>.py`, with the project installed: README)."""

from runtime.offline import keep_offline

# Measuring scripts import onnxruntime directly: offline too (runtime/offline.py).
keep_offline()
