"""Line framing shared by every transport: bytes in → lines out, whole lines out → bytes on a fd.

Stdlib only (imported before the CPU check). The stdio transport and the socket server both
split their input with `LineSplitter` and hand the lines to `Service`; neither knows JSON.
"""

from __future__ import annotations

import errno
import os
import select
from collections.abc import Callable, Iterable

from runtime.protocol import LineTooLong

OUTPUT_POLL_S = 0.2  # how often a writer waiting for a full pipe checks whether to give up


class LineSplitter:
    """Bytes in, lines out (without the newline). Over-long lines are dropped as they stream by
    and reported as LineTooLong, so memory stays bounded by the limit."""

    def __init__(self, max_line_bytes: int):
        self.max_line_bytes = max_line_bytes
        self.pending = bytearray()
        self.discarding = 0  # bytes of an over-long line seen so far, 0 = not discarding

    @property
    def holds_partial_line(self) -> bool:
        """True while bytes of a line without its newline are held (or being discarded)."""
        return bool(self.pending or self.discarding)

    def feed(self, chunk: bytes) -> list[bytes | LineTooLong]:
        """Complete lines found in `chunk` (plus what was pending)."""
        lines: list[bytes | LineTooLong] = []
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            piece = chunk[start:] if newline < 0 else chunk[start:newline]
            if self.discarding:
                self.discarding += len(piece)
            elif len(self.pending) + len(piece) > self.max_line_bytes:
                self.discarding = len(self.pending) + len(piece)
                self.pending.clear()
            else:
                self.pending += piece
            if newline < 0:
                return lines
            lines.append(self._take())
            start = newline + 1

    def finish(self) -> list[bytes | LineTooLong]:
        """At EOF: the last line if it had no trailing newline."""
        return [self._take()] if self.holds_partial_line else []

    def _take(self) -> bytes | LineTooLong:
        if self.discarding:
            line: bytes | LineTooLong = LineTooLong(self.discarding)
            self.discarding = 0
        else:
            line = bytes(self.pending)
            line = line[:-1] if line.endswith(b"\r") else line  # accept CRLF
            self.pending.clear()
        return line


def split_lines(chunks: Iterable[bytes], max_line_bytes: int) -> list[bytes | LineTooLong]:
    """All lines of a chunked stream (LineSplitter over an iterable)."""
    splitter = LineSplitter(max_line_bytes)
    lines = [line for chunk in chunks for line in splitter.feed(chunk)]
    return lines + splitter.finish()


class OutputFailed(Exception):
    """The output fd cannot take our lines (full disk, closed, invalid fd). EPIPE is not this:
    it raises BrokenPipeError, which callers treat as "the reader left"."""


def write_all(fd: int, data: bytes, give_up: Callable[[], bool] | None = None) -> None:
    """Write every byte of `data` to `fd`, so a line is never cut in the middle.

    A pipe may take part of a write; a fd inherited with O_NONBLOCK (Node.js and Java parents
    leave stdout so) raises EAGAIN when full: then wait for POLLOUT and go on. `give_up()` is asked
    while waiting (e.g. a shutdown that cannot wait for a reader forever); if it says so, raise
    OutputFailed. Raises BrokenPipeError when the reader left, OutputFailed for other errors.
    """
    view = memoryview(data)
    poller: select.poll | None = None
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            written = 0
        except BrokenPipeError:
            raise
        except OSError as exc:  # ENOSPC (/dev/full), EBADF (closed), EIO …
            raise OutputFailed(exc.strerror or str(exc)) from exc
        view = view[written:]
        if view and not written:
            if poller is None:
                poller = select.poll()
                poller.register(fd, select.POLLOUT)
            events = poller.poll(OUTPUT_POLL_S * 1000)
            if any(event & (select.POLLERR | select.POLLNVAL) for _, event in events):
                _raise_for_fd(fd)
            if not events and give_up is not None and give_up():
                raise OutputFailed("the reader stopped reading")


def _raise_for_fd(fd: int) -> None:
    """After POLLERR/POLLNVAL: the error a write would see (EPIPE → BrokenPipeError)."""
    try:
        os.fstat(fd)
    except OSError as exc:
        raise OutputFailed(exc.strerror or str(exc)) from exc
    raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))
