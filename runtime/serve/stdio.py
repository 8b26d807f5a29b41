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
- Each batch of responses is written with os.write straight away (no userspace buffer to flush),
  whole lines only, also when stdout was inherited non-blocking (runtime/framing.write_all).
- Memory: read-ahead and each engine call take at most MAX_BATCH_LINES lines and MAX_BATCH_BYTES
  bytes; over-long lines are skipped as they stream by; texts are cut to the model's budget.
- EOF: answer everything read, return 0. SIGTERM/SIGINT/SIGQUIT: read no more, answer every
  complete line already read (the sender handed those over), return 0. SIGHUP (a background
  reload of the package directory, runtime/serve/swap.py) and SIGUSR1 (a stats log line) are acted on
  between batches; the other signals of runtime/serve/signals.py's table are ignored, so none loses a line.
- Live swaps: SIGHUP and --watch DIR (looked at between batches and while idle) make a new package
  ready in a background thread; the next batch is answered by it. The reload/rollback ops are
  the socket service's: here they are answered `forbidden` (whoever writes to stdin owns the
  process and can send SIGHUP).
  Reader gone (EPIPE): return 0 quietly. Other output failures (ENOSPC, EBADF) raise
  OutputFailed, which the command line turns into one log line and exit code 6.
"""

from __future__ import annotations

import fcntl
import logging
import os
import select
import sys
import time
from collections import deque
from typing import TYPE_CHECKING

from runtime.protocol import ControlRequest, LineTooLong, encode_line
from runtime.serve import signals
from runtime.serve.framing import LineSplitter, OutputFailed, write_all

if TYPE_CHECKING:  # the service imports numpy; stdio must be importable before the CPU check
    from runtime.package.watch import PackageWatcher
    from runtime.serve.service import Service
    from runtime.serve.swap import Swapper

log = logging.getLogger("decide")

READ_CHUNK = 1 << 16
MAX_BATCH_LINES = 256  # lines answered per engine call at most
# Bytes of complete lines read ahead / answered per call at most (at least one line is always
# taken): with texts cut to the model's budget, this is what bounds memory for any input.
MAX_BATCH_BYTES = 4 << 20
STOP_POLL_S = 0.2  # how often an idle server checks for signals (stop, reload, report)


def ensure_std_fds() -> set[int]:
    """Open /dev/null on any of fds 0–2 that is closed (`decide <&-`): otherwise the next file
    opened (the model!) would get fd 0 and be read as requests. Returns the fds that were closed."""
    closed = set()
    for fd, mode in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
            opened = os.open(os.devnull, mode)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
    return closed


def protect_stdout(require_stdout: bool = False) -> int:
    """Keep fd 1 for the protocol (returned as a new fd) and send everything else on fd 1 to stderr.
    With require_stdout, a closed stdout (`decide >&-`) raises OutputFailed: answers would be lost."""
    if 1 in ensure_std_fds() and require_stdout:
        raise OutputFailed("stdout is closed (started with >&-); nowhere to write answers")
    sys.stdout.flush()
    wire = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)  # ≥ 3: never one of the standard fds
    os.dup2(2, 1)
    return wire


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

    def read_into(self, lines: _Lines) -> None:
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


def _swap_actions(swapper: Swapper | None, watcher: PackageWatcher | None):
    """(the SIGHUP action, the between-batches check of --watch) for a swapper (or none)."""
    def on_sighup(_stats: object) -> None:
        if swapper is None:
            log.info("SIGHUP received: this service cannot reload; ignored")
        elif (refused := swapper.reload(None, "SIGHUP")) is not None:
            log.info("SIGHUP received: %s; ignored", refused)

    next_look = time.monotonic() + (watcher.interval_s if watcher else 0)

    def look() -> None:
        nonlocal next_look
        if watcher is None or swapper is None or swapper.busy or time.monotonic() < next_look:
            return
        next_look = time.monotonic() + watcher.interval_s
        candidate = watcher.poll()
        if candidate is not None and swapper.reload(candidate, "watch") is not None:
            watcher.forget(candidate)

    return on_sighup, look


def serve(service: Service, wire: int, ready: bool = False, input_fd: int = 0,
          max_batch_lines: int = MAX_BATCH_LINES, max_batch_bytes: int = MAX_BATCH_BYTES,
          swapper: Swapper | None = None, watcher: PackageWatcher | None = None) -> int:
    """Serve until EOF or a stop signal; returns the exit code (0). Raises framing.OutputFailed
    when stdout cannot take our lines (full disk, closed fd); EPIPE ends serving quietly."""
    stop = False
    on_sighup, look_for_packages = _swap_actions(swapper, watcher)

    def request_stop(name: str) -> None:
        nonlocal stop
        if not stop:
            log.info("%s received: answering the lines already read, then exiting", name)
        stop = True

    inbox = signals.Inbox(signals.Actions(stop=request_stop, stats=lambda: service.control(ControlRequest(None, "stats")),
                                          reload=on_sighup))
    inbox.install()
    source = _Input(input_fd, service.limits.max_line_bytes)
    lines = _Lines()

    def answer_next_batch() -> None:
        responses = service.answer_lines(lines.take(max_batch_lines, max_batch_bytes))
        if responses:
            write_all(wire, b"".join(responses))
        inbox.dispatch()  # reload/report between batches, never inside one
        look_for_packages()

    try:
        if ready:
            write_all(wire, encode_line(service.ready_event()))
        while not stop:
            inbox.dispatch()
            look_for_packages()
            if not lines and not source.eof:
                if not source.readable(STOP_POLL_S):
                    continue  # idle (or input gone): check for a signal or EOF
                source.read_into(lines)
            # Read ahead: whatever else already arrived joins this batch. The stop check matters
            # when the input streams bytes without a newline (no line ever completes).
            while (not stop and not source.eof and len(lines) < max_batch_lines
                   and lines.bytes < max_batch_bytes and source.readable(0)):
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
    finally:
        signals.after_serving()
    return 0


class _Lines:
    """Complete lines read but not answered yet, with their size in bytes."""

    def __init__(self) -> None:
        self.items: deque[bytes | LineTooLong] = deque()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.items)

    def extend(self, lines: list[bytes | LineTooLong]) -> None:
        self.items.extend(lines)
        self.bytes += sum(len(line) for line in lines if isinstance(line, bytes))

    def take(self, max_lines: int, max_bytes: int) -> list[bytes | LineTooLong]:
        """The oldest lines, at most max_lines and (beyond the first) max_bytes."""
        batch: list[bytes | LineTooLong] = []
        size = 0
        while self.items and len(batch) < max_lines:
            line = self.items[0]
            length = len(line) if isinstance(line, bytes) else 0
            if batch and size + length > max_bytes:
                break
            batch.append(self.items.popleft())
            size += length
        self.bytes -= size
        return batch
