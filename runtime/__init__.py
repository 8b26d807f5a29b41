"""decide runtime: probe the CPU, pick a model variant, serve JSON lines.

The library API is `from runtime import Classifier` (runtime/engine/classifier.py; docs/scoring.md).
"""

from __future__ import annotations

from typing import Any

from runtime.platform.offline import keep_offline
from runtime.version import __version__

# Before any module of decide imports onnxruntime (runtime/platform/offline.py: its telemetry, issue 33).
keep_offline()

__all__ = ["Answer", "Classifier", "__version__"]


def __getattr__(name: str) -> Any:
    """`runtime.Classifier` / `runtime.Answer`, imported on first use: `import runtime.platform.cpu` and the
    other stdlib-only stages must not pay for the library module (nor numpy, which it never imports
    at load time anyway)."""
    if name in ("Answer", "Classifier"):
        from runtime.engine import classifier

        return getattr(classifier, name)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
