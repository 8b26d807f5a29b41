"""Measuring scripts (`python3 benchmarks/<name>.py`, with the project installed: README)."""

from runtime.platform.offline import keep_offline

# Measuring scripts import onnxruntime directly: offline too (runtime/platform/offline.py).
keep_offline()
