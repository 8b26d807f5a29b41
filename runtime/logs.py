"""decide's log: one line per message on stderr, UTF-8, with control characters escaped.

A message carries strings decide did not write itself (a model's name from its manifest, a
path, an exception's text): a newline in one forged a second log line, an ANSI escape repainted
the terminal (issue 23). Every control character of the formatted line (C0 but tab, DEL, C1) is
written as a visible escape, so one message is always exactly one line.
"""

from __future__ import annotations

import logging
import re
import sys

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\x1b": "\\x1b"}


def escape_controls(text: str) -> str:
    """`text` with every control character but tab shown as an escape (\\n, \\r, \\x1b, \\x07 …)."""
    return _CONTROL.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


class OneLineFormatter(logging.Formatter):
    """A formatter whose records are one line each: control characters escaped, a traceback (only
    logged with DECIDE_DEBUG=1) kept on its own lines after the message."""

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            line = escape_controls(super().format(record))
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(quiet: bool) -> None:
    """Logs go to stderr, UTF-8 whatever the locale, one line per message."""
    if hasattr(sys.stderr, "reconfigure"):
        sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter("decide: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING if quiet else logging.INFO)
