"""decide model factory (dev-time only: torch/transformers live here, never in the bundle)."""

from runtime.platform.offline import keep_offline

# The factory's onnxruntime (export, quantization, gate) stays offline too (runtime/platform/offline.py).
keep_offline()
