"""decide opens no network connection and writes no file it was not asked to: onnxruntime's
telemetry stays off in every process decide runs in.

onnxruntime ≥ 1.29 on Linux carries 1DS telemetry (onnxruntime PR #27379): a process that imports
1.32 writes a device id and an SQLite event queue under ~/.cache/Microsoft/ and, ~40 s later,
looks up hosts to upload them. `CI` in the environment suppresses it, so CI never saw it (issue
33). Measured with 1.32: `ORT_DISABLE_TELEMETRY=1` set before onnxruntime loads stops both (no
file, no look-up); `ORT_TELEMETRY_DISABLED` does not. `disable_telemetry_events()` is
onnxruntime's own switch for the events of this process, called as well.

Stdlib only. `runtime/__init__.py` and `models/__init__.py` call `keep_offline()`, so the variable
is in the environment before any module of decide imports onnxruntime, and every child process
(decide score's workers, Ray's local workers) inherits it. A user who sets the variable
themselves decides: their value is never overwritten.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from types import ModuleType

TELEMETRY_VARIABLE = "ORT_DISABLE_TELEMETRY"
_USER_WANTS_TELEMETRY = ("0", "false", "no", "off")


def keep_offline(environ: MutableMapping[str, str] = os.environ) -> None:
    """Put ORT_DISABLE_TELEMETRY=1 in the environment unless it is already set."""
    environ.setdefault(TELEMETRY_VARIABLE, "1")


def telemetry_allowed(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Whether the user asked for onnxruntime's telemetry (set the variable to a false value)."""
    return environ.get(TELEMETRY_VARIABLE, "1").strip().lower() in _USER_WANTS_TELEMETRY


def import_onnxruntime() -> ModuleType:
    """onnxruntime, imported with its telemetry off (unless the user's own variable allows it)."""
    keep_offline()
    import onnxruntime

    if not telemetry_allowed():
        onnxruntime.disable_telemetry_events()
    return onnxruntime
