"""Local socket service: many connections, one warmed engine, dynamic micro-batching.

`decide serve --socket PATH` (Unix domain socket, mode 0600) or `--tcp HOST:PORT` (loopback
unless --allow-remote). Each connection speaks the stdio framing: JSON lines in, one response
line per request out, in that connection's request order. This module only moves bytes and
schedules: lines go to the shared `Service` (runtime/service.py) for parsing, control ops and
answers; addresses and accepting live in runtime/listen.py, line splitting in runtime/framing.py.

Threads and data flow:
- The asyncio event loop (main thread) accepts connections, splits lines and triages each one
  through the Service: errors and control ops are answered at once, classify requests go to one
  bounded `RequestQueue`.
- Backpressure, not refusal: a connection stops being read while it owes PENDING_PER_CONNECTION
  answers or while the queue is full (TCP then slows the client down). Only a request that finds
  no room in the queue for --queue-timeout seconds (the model is overloaded or stuck) is
  answered `busy`, and so is a connection beyond --max-connections.
- Batch threads (one per engine worker, --workers, default: usable cores) take the queued
  requests of ALL connections as batches, each makes one `Service.classify` call (ORT releases
  the GIL and takes concurrent runs, so the loop keeps reading meanwhile) and hands the responses
  back to the loop, which resolves each request's future; a per-connection writer awaits those
  futures in order. With several threads each takes a fair share of what is queued or in flight,
  so one batch computes while the clients of the other read their answers and send again
  (16 closed-loop clients: 1,020 → 1,265 req/s with 2 threads, `benchmarks/load.py --engine-ceiling`).
- Gathering: requests that pile up while the engine runs form the next batch by themselves. The
  engine additionally waits up to --batch-delay-ms for more, but only when the previous batch
  held several requests (concurrent load) and fewer requests are queued than connections sent
  one in the last ACTIVE_SENDER_S and are not waiting for an answer, so a lone client (batch-1
  traffic) never waits, and neither does a busy wave of clients for connections left open idle.
- Idle and slow clients: a connection that sends nothing for --idle-timeout seconds while owing
  nothing, holds an incomplete line that long, or leaves its answers unread that long, is closed,
  so stalled clients cannot hold the --max-connections slots.
- The socket is bound before the model loads: `{"op":"health"}` says "loading" until warm-up is
  done; classify requests sent meanwhile wait in the queue. systemd gets READY=1 after warm-up.
- SIGTERM/SIGINT: stop accepting, stop reading, answer and write every request already read,
  remove the socket file, return 0. A client that does not read its answers is dropped after
  SHUTDOWN_WRITE_STALL_S, so shutdown never waits long on it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime import sdnotify
from runtime.framing import LineSplitter, OutputFailed, write_all
from runtime.listen import (
    Acceptor,
    ListenAddress,
    ListenError,
    bind,
    check_socket_path,
    check_tcp_host,
    parse_tcp_address,
)
from runtime.protocol import BUSY, DEFAULT_MAX_BATCH, INTERNAL_ERROR, ClassifyRequest, Limits, encode_line
from runtime.service import Service, TransportHooks, percentile

if TYPE_CHECKING:  # the engine imports numpy; the server must be importable before the CPU check
    from runtime.engine import Engine

log = logging.getLogger("decide")

DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_QUEUE_SIZE = 256  # classify requests waiting for the engine, all connections together
DEFAULT_BATCH_DELAY_MS = 2.0
DEFAULT_IDLE_TIMEOUT_S = 60.0
DEFAULT_QUEUE_TIMEOUT_S = 10.0  # a request finding the queue full this long gets busy
PENDING_PER_CONNECTION = 256  # answers a connection may owe before we stop reading it
# A connection that sent a classify request this recently is expected to send again soon (a
# closed-loop client comes back within one batch round trip, ~10 ms at 16 clients); the batch
# delay waits for those only. Counting every open connection instead made each batch wait the
# whole delay for idle ones.
ACTIVE_SENDER_S = 0.05
READ_CHUNK = 1 << 16
WRITE_BUFFER_HIGH = 1 << 20  # bytes buffered for a slow reader before the writer waits for it
DRAIN_TIMEOUT_S = 30.0  # shutdown: the most we wait for the model to finish what was read
SHUTDOWN_WRITE_STALL_S = 2.0  # shutdown: a client that reads nothing this long is dropped
CLOSE_FLUSH_S = 2.0  # closing: time for a client to take its last bytes before we reset
LATENCY_WINDOW = 10_000  # the stats op's percentiles cover the last this-many requests


# ---------------------------------------------------------------------------------------------
# Stats: pure helpers plus the counters the event loop keeps.


def parse_proc_status(text: str) -> dict[str, float]:
    """VmRSS/VmHWM (kB in /proc/self/status) → {"rss_mb", "peak_rss_mb"}."""
    fields = {"VmRSS": "rss_mb", "VmHWM": "peak_rss_mb"}
    memory: dict[str, float] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in fields and value.split():
            memory[fields[key]] = round(int(value.split()[0]) / 1024, 1)
    return memory


def memory_usage() -> dict[str, float]:
    """This process's resident memory (Linux); empty elsewhere."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            return parse_proc_status(fh.read())
    except OSError:
        return {}


@dataclass
class ServerStats:
    """The server's own counters, kept by the event loop thread only (requests and errors are
    counted by the Service)."""

    batch_sizes: Counter[int] = field(default_factory=Counter)  # requests per engine batch
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    connections_total: int = 0

    def to_json(self, queue_depth: int, connections_open: int, engine: dict[str, Any]) -> dict[str, Any]:
        """What the stats op adds for the socket server: batch-size histogram, latency
        percentiles, queue, connections, CPU, RSS."""
        ordered = sorted(self.latencies_ms)
        return {
            "batch_sizes": {str(size): count for size, count in sorted(self.batch_sizes.items())},
            "latency_ms": {name: None if (v := percentile(ordered, q)) is None else round(v, 3)
                           for name, q in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))},
            "latency_window": len(ordered),
            "queue_depth": queue_depth,
            "connections": {"open": connections_open, "total": self.connections_total},
            "cpu_s": round(sum(os.times()[:2]), 3),  # user + system, all threads of this process
            **memory_usage(),
            "engine": {k: engine[k] for k in ("texts", "engine_calls", "engine_ms")},
        }


# ---------------------------------------------------------------------------------------------
# The queue between the event loop and the batch threads.


@dataclass
class Pending:
    """A classify request waiting for the engine, and where its answer goes."""

    request: ClassifyRequest
    future: asyncio.Future
    connection: "Connection"
    enqueued: float  # time.perf_counter() when it was queued


class RequestQueue:
    """Bounded FIFO: the loop offers (never blocks), the batch threads take whole batches."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.items: deque[Pending] = deque()
        self.condition = threading.Condition()
        self.closed = False
        self.in_flight = 0  # requests taken by batch threads and not yet answered

    def __len__(self) -> int:
        return len(self.items)

    def offer(self, item: Pending) -> bool:
        """Queue the item; False if the queue is full (the caller answers busy)."""
        with self.condition:
            if len(self.items) >= self.capacity:
                return False
            self.items.append(item)
            self.condition.notify()
            return True

    def close(self) -> None:
        """Wake the batch threads; take_batch returns None once the queue is empty."""
        with self.condition:
            self.closed = True
            self.condition.notify_all()

    def take_batch(self, max_texts: int, delay_s: float, wait_for: Callable[[], int],
                   takers: int = 1) -> list[Pending] | None:
        """Block for at least one request, then gather for up to delay_s while fewer than
        wait_for() requests are queued; return up to max_texts texts' worth (always ≥ 1 request),
        and with several `takers` (batch threads) at most a fair share of the requests queued or
        in flight. Taken requests count in flight until `answered`. None when closed and empty."""
        with self.condition:
            while True:
                while not self.items and not self.closed:
                    self.condition.wait()
                if not self.items:
                    return None
                if delay_s > 0:
                    deadline = time.monotonic() + delay_s
                    while not self.closed and len(self.items) < min(max_texts, wait_for()):
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self.condition.wait(remaining)
                if self.items:
                    break
                # another batch thread took everything while this one gathered: wait again
            share = -(-(len(self.items) + self.in_flight) // takers)  # ceil
            batch = [self.items.popleft()]
            texts = len(batch[0].request.texts)
            while self.items and len(batch) < share and texts + len(self.items[0].request.texts) <= max_texts:
                texts += len(self.items[0].request.texts)
                batch.append(self.items.popleft())
            self.in_flight += len(batch)
            return batch

    def answered(self, batch: list[Pending]) -> None:
        """A batch taken by take_batch has its responses."""
        with self.condition:
            self.in_flight -= len(batch)


# ---------------------------------------------------------------------------------------------
# The server.


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server needs besides the service."""

    address: ListenAddress
    limits: Limits = Limits()
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    queue_size: int = DEFAULT_QUEUE_SIZE
    batch_delay_ms: float = DEFAULT_BATCH_DELAY_MS
    max_batch_texts: int = DEFAULT_MAX_BATCH
    allow_remote: bool = False
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S  # 0 = never close idle connections
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S


class Connection:
    """One client: a reader task triages lines, the connection task writes answers in order."""

    def __init__(self, server: "SocketServer", reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.closed = False  # set when the client is gone: the engine skips its queued requests
        self.answers: asyncio.Queue[asyncio.Future | None] = asyncio.Queue()  # None = no more
        self.owed = asyncio.Semaphore(PENDING_PER_CONNECTION)  # bounds answers not yet written
        self.owed_count = 0
        self.reader_task: asyncio.Task | None = None
        self.stopping = False  # shutdown or timeout: read no more, answer what was read
        self.waiting_for_data = False
        now = time.monotonic()
        self.last_activity = now  # last byte read or answer written
        self.last_request = float("-inf")  # when it last queued a classify request
        self.partial_since: float | None = None  # when the incomplete line held now began
        self.write_stalled_since: float | None = None  # when the writer began waiting for the client

    def stop_reading(self) -> None:
        """Every line already read is still answered; nothing more is read."""
        self.stopping = True
        if self.waiting_for_data and self.reader_task is not None:
            self.reader_task.cancel()  # idle in read(): nothing half-done to lose

    def expired(self, now: float, idle_s: float, write_stall_s: float) -> str | None:
        """Why this connection should be closed now (None: it may stay)."""
        if self.write_stalled_since is not None and now - self.write_stalled_since > write_stall_s:
            return f"its answers were not read for {write_stall_s:g} s"
        if idle_s <= 0 or self.stopping:
            return None
        if self.partial_since is not None and now - self.partial_since > idle_s:
            return f"an incomplete line for {idle_s:g} s"
        if self.partial_since is None and not self.owed_count and now - self.last_activity > idle_s:
            return f"idle for {idle_s:g} s"
        return None

    async def read_requests(self) -> None:
        """Split and triage lines until EOF, shutdown or timeout, then mark the end of answers."""
        splitter = LineSplitter(self.server.config.limits.max_line_bytes)
        service = self.server.service
        loop = asyncio.get_running_loop()
        try:
            while not self.stopping:
                self.waiting_for_data = True
                try:
                    chunk = await self.reader.read(READ_CHUNK)
                except ConnectionError:
                    chunk = b""  # reset by the client: same as EOF for what it already sent
                finally:
                    self.waiting_for_data = False
                now = time.monotonic()
                self.last_activity = now
                lines = splitter.feed(chunk) if chunk else splitter.finish()
                if not splitter.holds_partial_line:
                    self.partial_since = None
                elif lines or self.partial_since is None:
                    self.partial_since = now  # a new line began in this chunk
                for line in lines:
                    answer = service.triage(line)
                    if answer is None:
                        continue
                    await self.owed.acquire()  # a client that does not read its answers stops being read
                    self.owed_count += 1
                    future = loop.create_future()
                    self.answers.put_nowait(future)
                    if isinstance(answer, ClassifyRequest):
                        self.last_request = now
                        await self.server.enqueue(answer, future, self)  # waits while the queue is full
                    else:
                        future.set_result(answer)
                if not chunk:
                    return
        finally:
            self.answers.put_nowait(None)

    async def write_answers(self) -> None:
        """Write each answer as soon as it and all earlier ones on this connection are ready."""
        transport = self.writer.transport
        service = self.server.service
        while True:
            future = await self.answers.get()
            if future is None:
                break
            response = await future
            self.owed.release()
            self.owed_count -= 1
            if transport.is_closing():
                break  # the client left; keep nothing for it
            self.writer.write(service.encode(response))
            self.last_activity = time.monotonic()
            if transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
                await self._drain()  # a slow reader: stop here until it catches up
        if not transport.is_closing():
            await self._drain()

    async def _drain(self) -> None:
        self.write_stalled_since = time.monotonic()
        try:
            await self.writer.drain()
        finally:
            self.write_stalled_since = None


async def close_writer(writer: asyncio.StreamWriter) -> None:
    """Close, giving the client CLOSE_FLUSH_S to take what is buffered; then reset."""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), CLOSE_FLUSH_S)
    except (TimeoutError, ConnectionError):
        writer.transport.abort()


class SocketServer:
    """Accepts connections, batches classify requests across them, answers in per-connection order."""

    def __init__(self, config: ServerConfig, service: Service, load_engine: Callable[[], "Engine"],
                 ready_wire: int | None = None):
        self.config = config
        self.service = service
        service.hooks = TransportHooks(status=lambda: self.state, info=self._info, stats=self._stats)
        self.load_engine = load_engine
        self.ready_wire = ready_wire  # fd for the ready event line (--ready), or None
        self.queue = RequestQueue(config.queue_size)
        self.stats = ServerStats()
        self.state = "loading"  # → ready → draining
        self.load_error: BaseException | None = None
        self.connections: set[Connection] = set()
        self.connection_tasks: set[asyncio.Task] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_requested: asyncio.Event | None = None
        self.queue_space: asyncio.Event | None = None  # set by a batch thread after each take

    # -- engine and batch threads -------------------------------------------------------------

    def _engine_main(self) -> None:
        """Load and warm the model, then answer batches until the queue is closed."""
        assert self.loop is not None
        try:
            self.service.attach(self.load_engine())
        except BaseException as exc:  # noqa: BLE001 — re-raised in the main thread by run()
            self.load_error = exc
            self.loop.call_soon_threadsafe(self._stop)
            self._refuse_queued(f"the model failed to load: {type(exc).__name__}: {exc}")
            return
        self.loop.call_soon_threadsafe(self._on_ready)
        workers = max(1, self.service.engine.settings.workers if self.service.engine is not None else 1)
        others = [threading.Thread(target=self._answer_batches, args=(workers,), name=f"batch-{n}", daemon=True)
                  for n in range(1, workers)]
        for thread in others:
            thread.start()
        self._answer_batches(workers)
        for thread in others:
            thread.join()

    def _answer_batches(self, workers: int) -> None:
        """One batch thread: take a batch, classify it, hand the responses to the loop; until the
        queue is closed. With several threads, each takes at most its share of the requests queued
        or in flight, so one batch computes while the clients of another read their answers and
        send the next requests (with one thread the cores idle during that round trip)."""
        assert self.loop is not None
        delay_s = self.config.batch_delay_ms / 1000
        previous_batch = 1
        while True:
            # Wait for company only under concurrent load (see the module docstring), and only for
            # requests no other batch thread is answering.
            batch = self.queue.take_batch(self.config.max_batch_texts, delay_s if previous_batch > 1 else 0.0,
                                          lambda: self._active_senders() - self.queue.in_flight, workers)
            if batch is None:
                return
            self.loop.call_soon_threadsafe(self._queue_has_space)
            previous_batch = len(batch)
            live = [item for item in batch if not item.connection.closed]
            responses = self.service.classify([item.request for item in live])  # never raises
            self.queue.answered(batch)
            self.loop.call_soon_threadsafe(self._deliver, batch, live, responses, time.perf_counter())

    def _active_senders(self) -> int:
        """Connections that queued a classify request in the last ACTIVE_SENDER_S (read from the
        batch threads: a set copy and float reads, no loop state is changed)."""
        since = time.monotonic() - ACTIVE_SENDER_S
        return sum(1 for connection in list(self.connections) if connection.last_request >= since)

    def _refuse_queued(self, message: str) -> None:
        """After a failed load: answer everything queued (until shutdown closes the queue) with an error."""
        assert self.loop is not None
        while (batch := self.queue.take_batch(self.config.max_batch_texts, 0.0, lambda: 1)) is not None:
            self.loop.call_soon_threadsafe(self._queue_has_space)
            responses = [self.service.error(item.request.id, INTERNAL_ERROR, message) for item in batch]
            self.loop.call_soon_threadsafe(self._deliver, batch, batch, responses, time.perf_counter())

    # -- event loop thread --------------------------------------------------------------------

    def _queue_has_space(self) -> None:
        assert self.queue_space is not None
        self.queue_space.set()

    def _on_ready(self) -> None:
        service = self.service
        if self.state == "loading":
            self.state = "ready"
        log.info("ready on %s: model %s, variant %s, warm-up %.0f ms", self.config.address.describe(),
                 service.info["model"]["name"], service.variant, service.ready_event()["warm_up_ms"])
        if self.ready_wire is not None:
            event = {**service.ready_event(), "listen": self.config.address.describe()}
            try:
                write_all(self.ready_wire, encode_line(event))
            except (OSError, OutputFailed) as exc:  # whoever started us stopped reading stdout
                log.warning("cannot write the ready event to stdout: %s", exc)
        sdnotify.notify("READY=1", f"STATUS=serving on {self.config.address.describe()}")

    def _deliver(self, batch: list[Pending], live: list[Pending], responses: list[dict[str, Any]],
                 finished: float) -> None:
        """Resolve the futures of one engine batch and record its size and latencies."""
        self.stats.batch_sizes[len(batch)] += 1
        for item, response in zip(live, responses):
            self.stats.latencies_ms.append((finished - item.enqueued) * 1000)
            if not item.future.done():
                item.future.set_result(response)
        for item in batch:
            if not item.future.done():
                item.future.cancel()  # its client is gone

    async def enqueue(self, request: ClassifyRequest, future: asyncio.Future, connection: Connection) -> None:
        """Queue a classify request, waiting while the queue is full (backpressure: the caller
        reads nothing meanwhile); busy only after --queue-timeout seconds without room."""
        assert self.queue_space is not None
        item = Pending(request, future, connection, time.perf_counter())
        deadline = time.monotonic() + self.config.queue_timeout_s
        while True:
            self.queue_space.clear()
            if self.queue.offer(item):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.queue.closed:
                future.set_result(self.service.error(
                    request.id, BUSY, f"overloaded: the request queue ({self.config.queue_size}) stayed full "
                                      f"for {self.config.queue_timeout_s:g} s; retry later"))
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.queue_space.wait(), remaining)

    def _info(self) -> dict[str, Any]:
        """The transport settings, for the info op."""
        config = self.config
        return {"server": {"listen": config.address.describe(), "max_connections": config.max_connections,
                           "queue_size": config.queue_size, "batch_delay_ms": config.batch_delay_ms,
                           "max_batch_texts": config.max_batch_texts, "idle_timeout_s": config.idle_timeout_s,
                           "queue_timeout_s": config.queue_timeout_s}}

    def _stats(self) -> dict[str, Any]:
        return self.stats.to_json(len(self.queue), len(self.connections), self.service.stats.to_json())

    def _accepted(self, sock: socket.socket) -> None:
        """A new connection from the Acceptor: serve it in its own task."""
        assert self.loop is not None
        task = self.loop.create_task(self._serve_connection(sock))
        self.connection_tasks.add(task)
        task.add_done_callback(self.connection_tasks.discard)

    async def _serve_connection(self, sock: socket.socket) -> None:
        """One connection from accept to close."""
        self.stats.connections_total += 1
        try:
            reader, writer = await asyncio.open_connection(sock=sock)
        except OSError:
            sock.close()
            return
        if len(self.connections) >= self.config.max_connections or self.state == "draining":
            reason = "server is shutting down" if self.state == "draining" else (
                f"too many connections ({self.config.max_connections})")
            writer.write(self.service.encode(self.service.error(None, BUSY, reason)))
            await close_writer(writer)
            return
        connection = Connection(self, reader, writer)
        self.connections.add(connection)
        connection.reader_task = asyncio.create_task(connection.read_requests())
        try:
            await connection.write_answers()
        except ConnectionError:
            pass  # the client left mid-answer: only this connection is affected
        finally:
            connection.closed = True
            connection.reader_task.cancel()
            await asyncio.gather(connection.reader_task, return_exceptions=True)
            await close_writer(writer)
            self.connections.discard(connection)

    async def _watch_connections(self) -> None:
        """Close idle, half-line and non-reading connections (see the module docstring)."""
        idle_s = self.config.idle_timeout_s
        period = min(1.0, idle_s / 4) if idle_s > 0 else 1.0
        while True:
            await asyncio.sleep(min(period, SHUTDOWN_WRITE_STALL_S / 4) if self.state == "draining" else period)
            stall_s = SHUTDOWN_WRITE_STALL_S if self.state == "draining" else (idle_s or float("inf"))
            now = time.monotonic()
            for connection in list(self.connections):
                reason = connection.expired(now, idle_s, stall_s)
                if reason is None:
                    continue
                log.info("closing a connection: %s", reason)
                if connection.write_stalled_since is not None:
                    connection.writer.transport.abort()  # it reads nothing: its answers cannot arrive
                else:
                    connection.stop_reading()  # answers already owed are still written

    def _stop(self, signum: int | None = None) -> None:
        if signum is not None:
            log.info("%s received: finishing requests in flight", signal.Signals(signum).name)
        assert self.stop_requested is not None
        self.stop_requested.set()

    @staticmethod
    def _log_loop_error(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Unexpected errors inside asyncio callbacks: one log line, no traceback."""
        exc = context.get("exception")
        log.warning("event loop: %s", f"{type(exc).__name__}: {exc}" if exc else context.get("message"))

    async def serve(self, listener: socket.socket) -> None:
        """Serve on a bound listening socket until a signal (or a failed model load), then drain."""
        self.loop = asyncio.get_running_loop()
        self.loop.set_exception_handler(self._log_loop_error)
        self.stop_requested = asyncio.Event()
        self.queue_space = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(signum, self._stop, signum)
        acceptor = Acceptor(listener, self._accepted)
        acceptor.start(self.loop)
        watcher = asyncio.create_task(self._watch_connections())
        log.info("listening on %s (loading the model)", self.config.address.describe())
        engine = threading.Thread(target=self._engine_main, name="engine", daemon=True)
        engine.start()
        await self.stop_requested.wait()

        self.state = "draining"
        sdnotify.notify("STOPPING=1")
        acceptor.close()  # no new connections
        for connection in list(self.connections):
            connection.stop_reading()
        if self.connection_tasks:
            _, unfinished = await asyncio.wait(set(self.connection_tasks), timeout=DRAIN_TIMEOUT_S)
            if unfinished:
                log.warning("%d connections not drained after %.0f s; closing them", len(unfinished),
                            DRAIN_TIMEOUT_S)
                for task in unfinished:
                    task.cancel()
                await asyncio.wait(unfinished, timeout=CLOSE_FLUSH_S)
        self.queue.close()
        await asyncio.to_thread(engine.join)
        watcher.cancel()


def run(config: ServerConfig, service: Service, load_engine: Callable[[], "Engine"],
        ready_wire: int | None = None) -> int:
    """Bind, serve until SIGTERM/SIGINT, clean up; returns 0. A failed model load is re-raised
    (after the socket file is removed) so the caller maps it to its exit code."""
    listener, cleanup = bind(config.address, config.allow_remote)
    if config.address.port == 0:  # an ephemeral port: say which one we got
        host, port = listener.getsockname()[:2]
        config = dataclasses.replace(config, address=ListenAddress(host=host, port=port))
    server = SocketServer(config, service, load_engine, ready_wire)
    try:
        asyncio.run(server.serve(listener))
    finally:
        listener.close()
        cleanup()
    if server.load_error is not None:
        raise server.load_error
    log.info("stopped after %d requests", service.stats.requests)
    return 0


# ---------------------------------------------------------------------------------------------
# Command line glue (the options are added to `decide serve` by runtime.cli).


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The socket options of `decide serve`."""
    group = parser.add_argument_group("socket service (instead of stdin/stdout)")
    where = group.add_mutually_exclusive_group()
    where.add_argument("--socket", metavar="PATH", help="listen on a Unix domain socket (created mode 0600)")
    where.add_argument("--tcp", metavar="HOST:PORT", help="listen on TCP (loopback only unless --allow-remote)")
    group.add_argument("--allow-remote", action="store_true",
                       help="allow a non-loopback --tcp address (no authentication, no TLS)")
    group.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                       help=f"concurrent connections (default {DEFAULT_MAX_CONNECTIONS}); more get a busy line")
    group.add_argument("--queue-size", type=int, default=DEFAULT_QUEUE_SIZE,
                       help=f"classify requests waiting for the model (default {DEFAULT_QUEUE_SIZE}); while it "
                            "is full, connections are not read (backpressure)")
    group.add_argument("--queue-timeout", type=float, default=DEFAULT_QUEUE_TIMEOUT_S, metavar="SECONDS",
                       help=f"a request that finds the queue full this long is answered busy "
                            f"(default {DEFAULT_QUEUE_TIMEOUT_S:g})")
    group.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S, metavar="SECONDS",
                       help=f"close a connection silent this long (owing nothing), holding an incomplete "
                            f"line or leaving its answers unread this long (default {DEFAULT_IDLE_TIMEOUT_S:g}; "
                            "0 = never)")
    group.add_argument("--batch-delay-ms", type=float, default=DEFAULT_BATCH_DELAY_MS,
                       help=f"under concurrent load, wait up to this long to fill a batch "
                            f"(default {DEFAULT_BATCH_DELAY_MS}; 0 = never wait)")


def wants_socket(args: argparse.Namespace) -> bool:
    """True if `decide serve` was asked to listen (an empty --socket counts: it is refused later)."""
    return args.socket is not None or args.tcp is not None


def config_from_args(args: argparse.Namespace, limits: Limits) -> ServerConfig:
    """Validate the socket options (before the model is loaded); raises ListenError."""
    if args.max_connections < 1 or args.queue_size < 1:
        raise ListenError("--max-connections and --queue-size must be at least 1")
    if not 0 <= args.batch_delay_ms <= 1000:
        raise ListenError("--batch-delay-ms must be between 0 and 1000")
    if not 0 <= args.idle_timeout <= 86_400:
        raise ListenError("--idle-timeout must be between 0 (never) and 86400 seconds")
    if not 0 <= args.queue_timeout <= 3600:
        raise ListenError("--queue-timeout must be between 0 and 3600 seconds")
    if args.socket is not None:
        check_socket_path(args.socket)
        address = ListenAddress(path=args.socket)
    else:
        host, port = parse_tcp_address(args.tcp)
        check_tcp_host(host, port, args.allow_remote)
        address = ListenAddress(host=host, port=port)
    return ServerConfig(address=address, limits=limits, max_connections=args.max_connections,
                        queue_size=args.queue_size, batch_delay_ms=args.batch_delay_ms,
                        max_batch_texts=args.max_batch, allow_remote=args.allow_remote,
                        idle_timeout_s=args.idle_timeout, queue_timeout_s=args.queue_timeout)
