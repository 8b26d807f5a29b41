"""One client connection of the socket server: a reader task splits and triages lines, the
connection's own task writes the answers in request order.

The rules that keep answers from being lost (issue 23):
- decide closes only a connection it is itself reading (waiting in read() for the client's
  bytes): silent and owed nothing for --idle-timeout, or holding an incomplete line that long.
  Time the reader spends held back by backpressure (answers owed, the queue full) or waiting for
  the client to read its answers never counts: a pipelining client that decide slows down, or a
  client that stops reading for a while, keeps its connection and gets every answer.
- every line the reader has split off is answered before the connection ends; stopping (shutdown,
  idle timeout) only means no more bytes are taken, and a line cut off by the stop is not a line.
"""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios
import time
from typing import TYPE_CHECKING, Protocol

from runtime.protocol import ClassifyRequest, ControlRequest, LineTooLong
from runtime.serve.framing import LineSplitter

if TYPE_CHECKING:
    from runtime.serve.config import ServerConfig
    from runtime.serve.serverstats import ServerStats
    from runtime.serve.service import Service
    from runtime.serve.swapops import SocketSwaps

READ_CHUNK = 1 << 16
WRITE_BUFFER_HIGH = 1 << 20  # bytes buffered for a slow reader before the writer waits for it
PENDING_PER_CONNECTION = 256  # answers a connection may owe before we stop reading it
CLOSE_FLUSH_S = 2.0  # closing: time for a client to take its last bytes before we reset


def unread_by_peer(transport: asyncio.BaseTransport) -> int:
    """Bytes written to the socket that the peer has not taken yet (SIOCOUTQ: for a Unix socket,
    not yet read by the client; over TCP, not yet acknowledged); 0 if the kernel cannot say."""
    sock = transport.get_extra_info("socket")
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, struct.pack("i", 0))
    except (OSError, AttributeError, ValueError):
        return 0
    return struct.unpack("i", raw)[0]


class ConnectionHost(Protocol):
    """What a connection uses of its socket server (server.py's SocketServer), named here so that
    this module needs nothing above it."""

    config: ServerConfig
    service: Service
    stats: ServerStats
    swaps: SocketSwaps

    def admission_must_wait(self) -> bool:
        """True while a new request must wait for a place in the queue."""

    async def enqueue(self, request: ClassifyRequest, future: asyncio.Future, connection: Connection) -> None:
        """Queue a classify request; `future` gets its answer."""


class Connection:
    """One client: a reader task triages lines, the connection task writes answers in order."""

    def __init__(self, server: ConnectionHost, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.closed = False  # set when the client is gone: the engine skips its queued requests
        self.answers: asyncio.Queue[asyncio.Future | None] = asyncio.Queue()  # None = no more
        self.owed = asyncio.Semaphore(PENDING_PER_CONNECTION)  # bounds answers not yet written
        self.owed_count = 0
        self.reader_task: asyncio.Task | None = None
        self.stopping = False  # shutdown or timeout: read no more, answer what was read
        self.client_eof = False  # the client sent EOF: its input was read to the end
        self.reading = False  # the reader waits in read() for the client's bytes
        now = time.monotonic()
        self.last_activity = now  # last byte read or answer written
        self.resumed = now  # when backpressure last let the reader go back to reading
        self.last_request = float("-inf")  # when it last queued a classify request
        self.partial_since: float | None = None  # when the incomplete line held now began
        self.write_stalled_since: float | None = None  # when the writer began waiting for the client
        self.peer_uid: int | None = None  # the client's uid (Unix socket); None over TCP

    def stop_reading(self) -> None:
        """Take no more bytes; every line already split off is still answered."""
        self.stopping = True
        if self.reading and not self.writer.transport.is_closing():
            # Wake the read without cancelling it: bytes that arrived in the same instant are
            # still handed over (and answered); pausing first keeps more from coming after EOF.
            self.writer.transport.pause_reading()
            self.reader.feed_eof()

    def expired(self, now: float, idle_s: float) -> str | None:
        """Why decide should close this connection now (None: it stays). Only a connection
        decide is reading can expire (see the module docstring)."""
        if (idle_s <= 0 or self.stopping or not self.reading or self.write_stalled_since is not None
                or self.writer.transport.get_write_buffer_size()):  # answers still wait for the client
            return None
        if self.partial_since is not None:
            if now - max(self.partial_since, self.resumed) > idle_s:
                return f"an incomplete line for {idle_s:g} s"
            return None
        if unread_by_peer(self.writer.transport):
            # Answers sit in the kernel's send queue: the client is still reading them (slowly, on
            # a loaded box), so the exchange is not over and the idle clock starts when it is.
            self.last_activity = now
            return None
        if not self.owed_count and now - max(self.last_activity, self.resumed) > idle_s:
            return f"idle for {idle_s:g} s"
        return None

    async def read_requests(self) -> None:
        """Split and triage lines until EOF, shutdown or timeout, then mark the end of answers."""
        splitter = LineSplitter(self.server.config.limits.max_line_bytes)
        try:
            while not self.stopping:
                self.reading = True
                try:
                    chunk = await self.reader.read(READ_CHUNK)
                except ConnectionError:
                    chunk = b""  # reset by the client: same as EOF for what it already sent
                finally:
                    self.reading = False
                self.client_eof = not chunk and not self.stopping
                now = time.monotonic()
                self.last_activity = now
                if chunk:
                    lines = splitter.feed(chunk)
                else:  # EOF ends the last line; a stop cuts it off (it was never sent whole)
                    lines = [] if self.stopping else splitter.finish()
                if not splitter.holds_partial_line:
                    self.partial_since = None
                elif lines or self.partial_since is None:
                    self.partial_since = now  # a new line began in this chunk
                if await self._accept(lines, now):
                    self.resumed = time.monotonic()
                if not chunk:
                    return
        finally:
            self.answers.put_nowait(None)

    async def _accept(self, lines: list[bytes | LineTooLong], now: float) -> bool:
        """Triage each line and line up its answer; True if backpressure held the reader back."""
        service, loop = self.server.service, asyncio.get_running_loop()
        held = False
        for line in lines:
            answer = service.triage(line)
            if answer is None:
                continue
            held = held or self.owed.locked()
            await self.owed.acquire()  # a client that does not read its answers stops being read
            self.owed_count += 1
            future = loop.create_future()
            self.answers.put_nowait(future)
            if isinstance(answer, ClassifyRequest):
                self.last_request = now
                held = held or self.server.admission_must_wait()
                await self.server.enqueue(answer, future, self)  # waits while the queue is full
            elif isinstance(answer, ControlRequest):  # reload/rollback: the server checks who asks
                self.server.swaps.op(answer, future, self.peer_uid)
            else:
                future.set_result(answer)
        return held

    async def write_answers(self) -> None:
        """Write each answer as soon as it and all earlier ones on this connection are ready."""
        transport = self.writer.transport
        service, stats = self.server.service, self.server.stats
        while True:
            future = await self.answers.get()
            if future is None:
                break
            response = await future
            self.owed.release()
            self.owed_count -= 1
            if transport.is_closing():
                break  # the client left; keep nothing for it
            self.writer.write(service.wire_line(response))
            self.last_activity = time.monotonic()
            stats.answers_written += 1
            if transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
                await self._drain()  # a slow reader: stop here until it catches up
        if not transport.is_closing():
            transport.set_write_buffer_limits(high=0)  # the end: wait for every byte, not just most
            await self._drain()

    async def _drain(self) -> None:
        self.write_stalled_since = time.monotonic()
        try:
            await self.writer.drain()
        finally:
            self.write_stalled_since = None


class _Discard(asyncio.Protocol):
    """Takes over a connection being closed: drops what the client still sends, notes its EOF."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.eof, self.lost = loop.create_future(), loop.create_future()

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> None:
        if not self.eof.done():
            self.eof.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        for future in (self.eof, self.lost):
            if not future.done():
                future.set_result(None)


async def close_writer(writer: asyncio.StreamWriter, unread_input: bool = True) -> None:
    """Close a connection so that the client gets everything written, then EOF.

    Closing a socket whose input was not read to the end resets the connection: the client sees
    ECONNRESET instead of EOF, and over TCP answers still in flight can be destroyed. So unless
    the client already sent its EOF (unread_input=False), decide sends its own EOF, drops what the
    client still sends until it closes (CLOSE_FLUSH_S at most), then closes; a client that takes
    nothing for CLOSE_FLUSH_S is reset."""
    transport = writer.transport
    if transport.is_closing():
        return
    discard = _Discard()
    transport.set_protocol(discard)
    if unread_input and transport.can_write_eof():
        try:
            transport.write_eof()  # after the buffered answers
            transport.resume_reading()
            await asyncio.wait_for(asyncio.shield(discard.eof), CLOSE_FLUSH_S)
        except (TimeoutError, OSError, RuntimeError):
            pass
    transport.close()
    try:
        await asyncio.wait_for(asyncio.shield(discard.lost), CLOSE_FLUSH_S)
    except TimeoutError:
        transport.abort()
