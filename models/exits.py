"""The factory's exit codes, for every command (`python -m models`, `python -m models.quantize`):
0 done; 2 bad input or a file-system problem the user can fix (one stderr line); 1 an internal
failure (DECIDE_DEBUG=1 for the traceback); 130 interrupted, 143 terminated (models/__main__.py)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

from models.data.userdata import DataError
from models.keys import SigningError
from models.publish.publish import PublishError
from models.publish.staging import OutDirError, user_os_error
from runtime.package.load import PackageError


class UsageError(Exception):
    """A bad command-line value (exit 2)."""


class Terminated(BaseException):
    """SIGTERM arrived: unwind like Ctrl-C, so that every staging directory is removed."""


def _on_signal(signum: int, _frame) -> None:
    # the first signal unwinds; a second one must not interrupt the clean-up it started
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated()


def guarded(action: Callable[[], int]) -> int:
    """`action()` with the documented exit codes: bad input is one stderr line and exit 2, never a
    traceback; SIGTERM and Ctrl-C unwind (the staging directory is removed) with 143 / 130."""
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        return action()
    except (DataError, UsageError, PackageError, OutDirError, PublishError, SigningError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        line = user_os_error(exc)
        if line is None:
            return _internal(exc)
        print(f"error: {line}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as exc:
        what = "interrupted" if isinstance(exc, KeyboardInterrupt) else "terminated"
        print(f"{what} after {time.monotonic() - started:.0f}s; no package was written", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else 143
    except Exception as exc:  # noqa: BLE001 — the user gets one line; developers ask for the traceback
        return _internal(exc)


def _internal(exc: Exception) -> int:
    if os.environ.get("DECIDE_DEBUG"):
        raise exc
    print(f"error: internal failure: {exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
          "(DECIDE_DEBUG=1 shows the traceback)", file=sys.stderr)
    return 1
