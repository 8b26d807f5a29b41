"""Progress lines with an ETA on stderr for the factory's long steps."""

from __future__ import annotations

import sys
import time


class Progress:
    """Counts work items and prints `label i/n (rate, ETA)` to stderr at most every `every_s` seconds."""

    def __init__(self, label: str, total: int, every_s: float = 5.0) -> None:
        self.label, self.total, self.every_s = label, max(total, 1), every_s
        self.done = 0
        self.start = self.last_print = time.monotonic()

    def advance(self, count: int = 1, note: str = "") -> None:
        """Record `count` finished items; print if enough time has passed or the step is complete."""
        self.done += count
        now = time.monotonic()
        if now - self.last_print >= self.every_s or self.done >= self.total:
            self.last_print = now
            elapsed = now - self.start
            eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
            extra = f" {note}" if note else ""
            print(f"[{self.label}] {self.done}/{self.total} {elapsed:.0f}s elapsed, ETA {eta:.0f}s{extra}",
                  file=sys.stderr, flush=True)


def log(message: str) -> None:
    """One factory log line on stderr."""
    print(f"[factory] {message}", file=sys.stderr, flush=True)
