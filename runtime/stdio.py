"""JSON lines on stdin/stdout: a thin transport around `Service.answer_lines`.

- stdout is the wire and carries protocol lines only. `protect_stdout` duplicates fd 1 for the
  protocol and points fd 1 (so sys.stdout, print() and C libraries) at stderr, as the MCP python
  SDK's stdio transport does: a stray print from a dependency then lands in the log, not in the
  middle of a response.
- Bytes, not text: requests are decoded as UTF-8 by the protocol and responses encoded as UTF-8,
  whatever the locale says (a C/POSIX locale would otherwise make Python use ASCII).
- One thread, no reader thread: the server waits in select() on fd 0, then reads everything
  already in the pipe (os.read, no Python buffered reader) and answers the complete lines as one
  batch. Interactive input gives batches of one, answered immediately; piped bulk input piles up in
  the pipe while the model runs and is answered at batch speed. (A reader thread handing lines
  over a queue costs an extra thread wake-up per request, which a loaded machine makes slow.)
- Each batch of responses is written with os.write straight away (no userspace buffer to flush).
- EOF: answer everything read, return 0. SIGTERM/SIGINT: read no more, answer every complete
  line already read (the sender handed those over), return 0.
  Reader gone (EPIPE): return 0 quietly.
"""

from __future__ import annotations

import fcntl
import logging
import os
import select
import signal
import sys
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from runtime.protocol import LineTooLong, encode_line

if TYPE_CHECKING:  # the service imports numpy; stdio must be importable before the CPU check
    from runtime.service import Service

log = logging.getLogger("decide")

READ_CHUNK = 1 << 16
MAX_BATCH_LINES = 256  # lines answered per engine call at most
STOP_POLL_S = 0.2  # how often an idle server checks for SIGTERM/SIGINT


def ensure_std_fds() -> None:
    """Open /dev/null on any of fds 0–2 that is closed (`decide <&-`): otherwise the next file
    opened (the model!) would get fd 0 and be read as requests."""
    for fd, mode in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, mode)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)


def protect_stdout() -> int:
    """Keep fd 1 for the protocol (returned as a new fd) and send everything else on fd 1 to stderr."""
    ensure_std_fds()
    sys.stdout.flush()
    wire = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)  # ≥ 3: never one of the standard fds
    os.dup2(2, 1)
    return wire


class LineSplitter:
    """Bytes in, lines out (without the newline). Over-long lines are dropped as they stream by
    and reported as LineTooLong, so memory stays bounded by the limit."""

    def __init__(self, max_line_bytes: int):
        self.max_line_bytes = max_line_bytes
        self.pending = bytearray()
        self.discarding = 0  # bytes of an over-long line seen so far, 0 = not discarding

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
        return [self._take()] if self.discarding or self.pending else []

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


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is out (pipes may accept partial writes)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class _Input:
    """Non-blocking view of the input fd: wait for data, read what is there, notice EOF."""

    def __init__(self, fd: int, max_line_bytes: int):
        self.fd = fd
        self.splitter = LineSplitter(max_line_bytes)
        self.eof = False

    def readable(self, timeout: float) -> bool:
        """True if a read would not block (data or EOF); a closed/invalid fd counts as EOF."""
        try:
            return bool(select.select([self.fd], [], [], timeout)[0])
        except (OSError, ValueError) as exc:  # e.g. started with stdin closed (`decide <&-`)
            log.warning("cannot read stdin (%s); treating as end of input", exc)
            self.eof = True
            return False

    def read_into(self, lines: deque) -> None:
        """One read; lines completed by it are appended."""
        try:
            chunk = os.read(self.fd, READ_CHUNK)
        except OSError as exc:
            log.warning("stdin read failed (%s); treating as end of input", exc)
            chunk = b""
        if chunk:
            lines.extend(self.splitter.feed(chunk))
        else:
            self.eof = True
            lines.extend(self.splitter.finish())


def serve(service: Service, wire: int, ready: bool = False, input_fd: int = 0,
          max_batch_lines: int = MAX_BATCH_LINES) -> int:
    """Serve until EOF or SIGTERM/SIGINT; returns the exit code (0)."""
    stop = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stop
        log.info("%s received: answering the lines already read, then exiting", signal.Signals(signum).name)
        stop = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    source = _Input(input_fd, service.limits.max_line_bytes)
    lines: deque = deque()

    def answer_next_batch() -> None:
        batch = [lines.popleft() for _ in range(min(len(lines), max_batch_lines))]
        responses = service.answer_lines(batch)
        if responses:
            write_all(wire, b"".join(responses))

    try:
        if ready:
            write_all(wire, encode_line(service.ready_event()))
        while not stop:
            if not lines and not source.eof:
                if not source.readable(STOP_POLL_S):
                    continue  # idle (or input gone): check for a stop request or EOF
                source.read_into(lines)
            # Read ahead: whatever else already arrived joins this batch.
            while not source.eof and len(lines) < max_batch_lines and source.readable(0):
                source.read_into(lines)
            if not lines:
                if source.eof:
                    break
                continue
            answer_next_batch()
        while lines:  # stopped by a signal: nothing read is lost
            answer_next_batch()
    except BrokenPipeError:
        # The reader closed stdout: nobody is listening, so stop quietly (no traceback).
        log.info("stdout closed by the reader; exiting")
    return 0
