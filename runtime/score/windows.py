"""Records → windows: what one classify call gets, read ahead on a thread, and the rows that come
back for a window in input order. Shared by the local job (job.py) and the Ray predictor (ray_data.py).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from runtime.engine.classifier import Answer
from runtime.score.outputs import answer_row, error_row
from runtime.score.records import InputError, Record

WINDOW_RECORDS = 1024  # records per classify call: enough for full length-bucketed batches
WINDOW_CHARS = 4 << 20  # …or this much text (bounds memory when records are long)
READ_AHEAD = 4  # windows the reader thread keeps ready


@dataclass
class Window:
    """Records read together and classified in one call; `offset`: the input position after them."""

    records: list[Record]
    offset: int


class WindowReader:
    """A thread reading records into windows ahead of the classifier (parsing overlaps the model)."""

    def __init__(self, records: Iterator[tuple[Record, int]], window_records: int = WINDOW_RECORDS):
        self._records = records
        self._window_records = window_records
        self._queue: queue.Queue = queue.Queue(maxsize=READ_AHEAD)
        self._done = False
        threading.Thread(target=self._run, name="score-reader", daemon=True).start()

    def _run(self) -> None:
        try:
            window: list[Record] = []
            chars, offset = 0, 0
            for record, offset in self._records:
                window.append(record)
                chars += len(record.text or "")
                if len(window) >= self._window_records or chars >= WINDOW_CHARS:
                    self._queue.put(Window(window, offset))
                    window, chars = [], 0
            if window:
                self._queue.put(Window(window, offset))
            self._queue.put(None)
        except OSError as exc:  # e.g. EIO, or the file went away: the parts so far are kept
            self._queue.put(InputError(f"cannot read INPUT: {exc.strerror or exc}; fix that and run again "
                                       "with --resume"))
        except BaseException as exc:  # noqa: BLE001 — handed to the main thread, which reports it
            self._queue.put(exc)

    def next(self) -> Window | None:
        """The next window, None at the end; re-raises what stopped the reader."""
        if self._done:
            return None
        item = self._queue.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._done = item is None
        return item


def window_rows(window: Window, answers: list[Answer | str]) -> list[tuple]:
    """Rows for a window in input order: error records keep their error, the rest take answers in turn."""
    results = iter(answers)
    rows = []
    for record in window.records:
        if record.error is not None:
            rows.append(error_row(record.id, record.error))
            continue
        result = next(results)
        rows.append(error_row(record.id, result) if isinstance(result, str) else answer_row(record.id, result))
    return rows
