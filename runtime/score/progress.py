"""Progress of a long run on stderr: a redrawn bar with rate and ETA on a terminal, else a plain
line every PLAIN_EVERY_S seconds (a log file or CI keeps a readable record, no \\r noise).

The fraction done and the ETA come from the input position (bytes, or rows for Parquet), so
they are right from the start of a file whose record count is unknown; the rate is records of
this run per second. Stdlib only.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_EVERY_S = 0.25
PLAIN_EVERY_S = 30.0
BAR_WIDTH = 24


def duration(seconds: float) -> str:
    """3h 05m, 4m 31s, 12s."""
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds}s"


class Progress:
    """`update(records, position)` as work finishes; `finish()` once at the end."""

    def __init__(self, total: int, start_position: int = 0, stream: TextIO | None = None,
                 tty: bool | None = None, enabled: bool = True, label: str = "score"):
        self.total = max(total, 1)
        self.start_position = self.position = start_position
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self._isatty() if tty is None else tty
        self.enabled = enabled
        self.label = label
        self.records = 0
        self.started = self.shown = time.monotonic()
        self._drawn = False

    def _isatty(self) -> bool:
        try:
            return self.stream.isatty()
        except (AttributeError, ValueError):
            return False

    def update(self, records: int, position: int) -> None:
        """`records` more records are done; the input is read up to `position`."""
        self.records += records
        self.position = position
        now = time.monotonic()
        if self.enabled and now - self.shown >= (BAR_EVERY_S if self.tty else PLAIN_EVERY_S):
            self.shown = now
            self._show(now)

    def line(self, now: float | None = None) -> str:
        """The current figures: percent, records, rate, ETA."""
        elapsed = max((now or time.monotonic()) - self.started, 1e-9)
        fraction = min(1.0, self.position / self.total)
        moved = self.position - self.start_position
        eta = (self.total - self.position) * elapsed / moved if moved > 0 else None
        return (f"{fraction * 100:5.1f}%  {self.records:,} records  {self.records / elapsed:,.0f}/s  "
                f"ETA {duration(eta) if eta is not None else '?'}")

    def _show(self, now: float) -> None:
        try:
            if self.tty:
                filled = int(BAR_WIDTH * min(1.0, self.position / self.total))
                bar = "█" * filled + "░" * (BAR_WIDTH - filled)
                self.stream.write(f"\r{bar} {self.line(now)}\x1b[K")
                self._drawn = True
            else:
                self.stream.write(f"decide: {self.label}: {self.line(now)}\n")
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False  # stderr gone: keep working, stop reporting

    def finish(self) -> None:
        """End the bar's line (the caller prints the summary)."""
        if self._drawn:
            try:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            except (OSError, ValueError):
                pass
