"""JSON lines on stdin/stdout: a thin transport around `Service.answer_lines`.

- stdout is the wire and carries protocol lines only. `protect_stdout` duplicates fd 1 for the
  protocol and points fd 1 (so sys.stdout, print() and C libraries) at stderr, as the MCP python
  SDK's stdio transport does: a stray print from a dependency then lands in the log, not in the
  middle of a response.
- Bytes, not text: requests are decoded as UTF-8 by the protocol and responses encoded as UTF-8,
  whatever the locale says (a C/POSIX locale would otherwise make Python use ASCII).
- A reader thread reads raw fd 0 (os.read, no Python buffered reader: a daemon thread blocked in
  sys.stdin at exit can abort the interpreter with "could not acquire lock for <stdin>") and queues
  lines. The server takes whatever is queued as one batch: interactive input gives batches of one
  answered immediately; piped bulk input piles up while the model runs and is answered at batch speed.
- Each batch of responses is written with os.write straight away (no userspace buffer to flush).
- EOF: answer everything read, return 0. SIGTERM/SIGINT: finish the batch in flight, return 0.
  Reader gone (EPIPE): return 0 quietly.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from runtime.protocol import LineTooLong, encode_line

if TYPE_CHECKING:  # the service imports numpy; stdio must be importable before the CPU check
    from runtime.service import Service

log = logging.getLogger("decide")

READ_CHUNK = 1 << 16
MAX_BATCH_LINES = 128  # lines answered per engine call at most (also the read-ahead depth)
_EOF = object()


def protect_stdout() -> int:
    """Keep fd 1 for the protocol (returned as a new fd) and send everything else on fd 1 to stderr."""
    sys.stdout.flush()
    wire = os.dup(1)
    os.dup2(2, 1)
    return wire


def split_lines(chunks: Iterator[bytes], max_line_bytes: int) -> Iterator[bytes | LineTooLong]:
    """Lines (without the newline) from a stream of chunks; over-long lines are skipped as they
    stream by and reported as LineTooLong, so memory stays bounded by the limit."""
    pending = bytearray()
    discarding = 0  # bytes of an over-long line seen so far, 0 = not discarding
    for chunk in chunks:
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            piece = chunk[start:] if newline < 0 else chunk[start:newline]
            if discarding:
                discarding += len(piece)
            elif len(pending) + len(piece) > max_line_bytes:
                discarding = len(pending) + len(piece)
                pending.clear()
            else:
                pending += piece
            if newline < 0:
                break
            if discarding:
                yield LineTooLong(discarding)
                discarding = 0
            else:
                yield _strip_cr(bytes(pending))
                pending.clear()
            start = newline + 1
    if discarding:
        yield LineTooLong(discarding)
    elif pending:
        yield _strip_cr(bytes(pending))  # last line without a trailing newline


def _strip_cr(line: bytes) -> bytes:
    """Accept CRLF line endings."""
    return line[:-1] if line.endswith(b"\r") else line


def _read_chunks(fd: int) -> Iterator[bytes]:
    """Raw reads from fd until EOF (or a read error, treated as EOF)."""
    while True:
        try:
            chunk = os.read(fd, READ_CHUNK)
        except OSError as exc:
            log.warning("stdin read failed (%s); treating as end of input", exc)
            return
        if not chunk:
            return
        yield chunk


def _reader(fd: int, max_line_bytes: int, lines: queue.Queue) -> None:
    """Thread body: queue every line, then the EOF marker."""
    for line in split_lines(_read_chunks(fd), max_line_bytes):
        lines.put(line)
    lines.put(_EOF)


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is out (pipes may accept partial writes)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def serve(service: "Service", wire: int, ready: bool = False, input_fd: int = 0,
          max_batch_lines: int = MAX_BATCH_LINES) -> int:
    """Serve until EOF or SIGTERM/SIGINT; returns the exit code (0)."""
    stop = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        log.info("%s received: finishing the request in flight", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    lines: queue.Queue = queue.Queue(maxsize=max_batch_lines)
    reader = threading.Thread(
        target=_reader, args=(input_fd, service.limits.max_line_bytes, lines), name="stdin-reader", daemon=True
    )
    reader.start()
    try:
        if ready:
            write_all(wire, encode_line(service.ready_event()))
        at_eof = False
        while not at_eof and not stop.is_set():
            try:
                first = lines.get(timeout=0.1)  # wake up regularly to notice a stop request
            except queue.Empty:
                continue
            if first is _EOF:
                break
            batch = [first]
            while len(batch) < max_batch_lines:
                try:
                    item = lines.get_nowait()
                except queue.Empty:
                    break
                if item is _EOF:
                    at_eof = True
                    break
                batch.append(item)
            responses = service.answer_lines(batch)
            if responses:
                write_all(wire, b"".join(responses))
    except BrokenPipeError:
        # The reader closed stdout: nobody is listening, so stop quietly (no traceback).
        log.info("stdout closed by the reader; exiting")
    return 0

