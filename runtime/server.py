"""Local socket service: many connections, one warmed engine, dynamic micro-batching.

`decide serve --socket PATH` (Unix domain socket, mode 0600) or `--tcp HOST:PORT` (loopback
unless --allow-remote). Each connection speaks the stdio framing: JSON lines in, one response
line per request out, in that connection's request order.

Threads and data flow:
- The asyncio event loop (main thread) accepts connections, splits and parses lines, answers
  errors and control ops at once, and offers classify requests to one bounded `RequestQueue`.
  A full queue answers `busy` at once: memory stays bounded and nothing is dropped silently.
- One engine thread owns the `Service` (not thread-safe, and ORT wants one caller): it takes the
  queued requests of ALL connections as one batch, makes one `Service.answer` call (ORT releases
  the GIL, so the loop keeps reading meanwhile) and hands the responses back to the loop, which
  resolves each request's future; a per-connection writer awaits those futures in order.
- Gathering: requests that pile up while the engine runs form the next batch by themselves. The
  engine additionally waits up to --batch-delay-ms for more, but only when the previous batch
  held several requests (concurrent load) and fewer requests are queued than connections are
  open, so a lone client (batch-1 traffic) never waits.
- The socket is bound before the model loads: `{"op":"health"}` says "loading" until warm-up is
  done; classify requests sent meanwhile wait in the queue. systemd gets READY=1 after warm-up.
- SIGTERM/SIGINT: stop accepting, stop reading, answer and write every request already read,
  remove the socket file, return 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import os
import signal
import socket
import stat
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime import __version__, sdnotify
from runtime.protocol import (
    BUSY,
    INTERNAL_ERROR,
    ClassifyRequest,
    ControlRequest,
    ErrorReply,
    Limits,
    Request,
    encode_line,
    parse_line,
)
from runtime.stdio import LineSplitter, write_all  # the same framing as stdin

if TYPE_CHECKING:  # the service imports numpy; the server must be importable before the CPU check
    from runtime.service import Service

log = logging.getLogger("decide")

DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_QUEUE_SIZE = 256  # classify requests waiting for the engine, all connections together
DEFAULT_BATCH_DELAY_MS = 2.0
PENDING_PER_CONNECTION = 256  # responses a connection may owe before we stop reading it
READ_CHUNK = 1 << 16
WRITE_BUFFER_HIGH = 1 << 20  # bytes buffered for a slow reader before the writer waits for it
DRAIN_TIMEOUT_S = 30.0
LATENCY_WINDOW = 10_000  # the stats op's percentiles cover the last this-many requests
LISTEN_BACKLOG = 128


class ListenError(Exception):
    """A listen address that is refused (security rules) or cannot be bound."""


# ---------------------------------------------------------------------------------------------
# Listening: address checks and binding (pure checks first, so they are testable without sockets).


@dataclass(frozen=True)
class ListenAddress:
    """Where to listen: a Unix socket path, or a TCP host and port."""

    path: str | None = None
    host: str | None = None
    port: int | None = None

    def describe(self) -> str:
        """`unix:/run/decide.sock` or `tcp:127.0.0.1:7878` (for logs, info and the ready event)."""
        if self.path is not None:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"tcp:{host}:{self.port}"


def parse_tcp_address(value: str) -> tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT → (host, port); raises ListenError."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ListenError(f"--tcp needs HOST:PORT (e.g. 127.0.0.1:7878), got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ListenError(f"--tcp port must be a number, got {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise ListenError(f"--tcp port {port} is out of range 0–65535")
    return host, port


def resolve_host(host: str, port: int) -> list[tuple[int, str]]:
    """(family, address) for every address `host` resolves to (numeric hosts need no DNS)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ListenError(f"cannot resolve {host!r}: {exc}") from exc
    return [(family, str(sockaddr[0])) for family, _, _, _, sockaddr in infos]


def is_loopback(addresses: Sequence[str]) -> bool:
    """True only if every address is a loopback address (127/8, ::1)."""
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def check_socket_directory(path: str) -> None:
    """Refuse a socket path whose directory others could write to (they could swap the socket
    for their own between our checks and a client's connect), unless the sticky bit is set."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        info = os.stat(directory)
    except OSError as exc:
        raise ListenError(f"socket directory {directory}: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise ListenError(f"{directory} is not a directory")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise ListenError(f"socket directory {directory} is writable by other users; use a directory only "
                          "you control (e.g. $XDG_RUNTIME_DIR or /run/decide)")


def socket_is_live(path: str) -> bool:
    """True if a server accepts connections on the Unix socket `path`."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # e.g. EAGAIN (backlog full) or a timeout: something is there; do not remove it
    finally:
        probe.close()
    return True


def bind_unix(path: str) -> tuple[socket.socket, tuple[int, int]]:
    """A listening Unix socket created 0600, and its (st_dev, st_ino) so we remove only our file.

    A leftover socket file (a crashed server) is replaced only if nothing listens on it; a path
    that is not a socket is never touched."""
    check_socket_directory(path)
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise ListenError(f"{path} exists and is not a socket; not replacing it")
        if socket_is_live(path):
            raise ListenError(f"another server is listening on {path}")
        os.unlink(path)
        log.info("removed stale socket %s (nothing was listening)", path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # bind() creates the file with mode 0777 & ~umask: a tight umask makes it 0600 from the first
    # instant (a chmod after bind would leave a window). No other thread runs yet at this point.
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot bind {path}: {exc.strerror}") from exc
    finally:
        os.umask(old_umask)
    sock.listen(LISTEN_BACKLOG)
    info = os.stat(path)
    return sock, (info.st_dev, info.st_ino)


def bind_tcp(host: str, port: int, allow_remote: bool) -> socket.socket:
    """A listening TCP socket; non-loopback addresses need allow_remote (and get a warning)."""
    resolved = resolve_host(host, port)
    if not is_loopback([address for _, address in resolved]):
        if not allow_remote:
            raise ListenError(f"{host} is not a loopback address; decide has no authentication or TLS. "
                              "Pass --allow-remote to listen on it anyway")
        log.warning("listening on non-loopback %s: anyone who can reach this port can use the model "
                    "(no authentication, no TLS)", host)
    family, address = resolved[0]
    try:
        return socket.create_server((address, port), family=family, backlog=LISTEN_BACKLOG)
    except OSError as exc:
        raise ListenError(f"cannot bind {host}:{port}: {exc.strerror}") from exc


# ---------------------------------------------------------------------------------------------
# Stats: pure helpers plus the counters the event loop keeps.


def percentile(sorted_values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, -(-int(round(fraction * 1000)) * len(sorted_values) // 1000))  # ceil(fraction·n)
    return sorted_values[min(rank, len(sorted_values)) - 1]


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
    """Counters kept by the event loop thread only (so the stats op reads a consistent view)."""

    started: float = field(default_factory=time.time)
    requests: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    batch_sizes: Counter[int] = field(default_factory=Counter)  # requests per engine batch
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    connections_total: int = 0

    def to_json(self, queue_depth: int, connections_open: int, engine: dict[str, Any] | None) -> dict[str, Any]:
        """The stats op body: requests, errors, batch-size histogram, latency percentiles, queue, RSS."""
        ordered = sorted(self.latencies_ms)
        body: dict[str, Any] = {
            "uptime_s": round(time.time() - self.started, 3),
            "requests": self.requests,
            "errors": dict(self.errors),
            "batch_sizes": {str(size): count for size, count in sorted(self.batch_sizes.items())},
            "latency_ms": {name: None if (v := percentile(ordered, q)) is None else round(v, 3)
                           for name, q in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))},
            "latency_window": len(ordered),
            "queue_depth": queue_depth,
            "connections": {"open": connections_open, "total": self.connections_total},
            "cpu_s": round(sum(os.times()[:2]), 3),  # user + system, all threads of this process
            **memory_usage(),
        }
        if engine is not None:
            body["engine"] = {k: engine[k] for k in ("texts", "engine_calls", "engine_ms") if k in engine}
        return body


# ---------------------------------------------------------------------------------------------
# The queue between the event loop and the engine thread.


@dataclass
class Pending:
    """A classify request waiting for the engine, and where its answer goes."""

    request: ClassifyRequest
    future: asyncio.Future
    connection: "Connection"
    enqueued: float  # time.perf_counter() when it was queued


class RequestQueue:
    """Bounded FIFO: the loop offers (never blocks), the engine thread takes whole batches."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.items: deque[Pending] = deque()
        self.condition = threading.Condition()
        self.closed = False

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
        """Wake the engine thread; take_batch returns None once the queue is empty."""
        with self.condition:
            self.closed = True
            self.condition.notify_all()

    def take_batch(self, max_texts: int, delay_s: float, wait_for: Callable[[], int]) -> list[Pending] | None:
        """Block for at least one request, then gather for up to delay_s while fewer than
        wait_for() requests are queued; return up to max_texts texts' worth (always ≥ 1 request).
        None when closed and empty."""
        with self.condition:
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
            batch = [self.items.popleft()]
            texts = len(batch[0].request.texts)
            while self.items and texts + len(self.items[0].request.texts) <= max_texts:
                texts += len(self.items[0].request.texts)
                batch.append(self.items.popleft())
            return batch


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
    max_batch_texts: int = 32
    allow_remote: bool = False


class Connection:
    """One client: a reader task parses lines, the connection task writes answers in order."""

    def __init__(self, server: "SocketServer", reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.closed = False  # set when the client is gone: the engine skips its queued requests
        self.answers: asyncio.Queue[asyncio.Future | None] = asyncio.Queue()  # None = no more
        self.owed = asyncio.Semaphore(PENDING_PER_CONNECTION)  # bounds answers not yet written
        self.reader_task: asyncio.Task | None = None
        self.stopping = False  # shutdown: read no more, answer what was read
        self.waiting_for_data = False

    def stop_reading(self) -> None:
        """Shutdown: every line already read is still answered; nothing more is read."""
        self.stopping = True
        if self.waiting_for_data and self.reader_task is not None:
            self.reader_task.cancel()  # idle in read(): nothing half-done to lose

    async def read_requests(self) -> None:
        """Split, parse and dispatch lines until EOF or shutdown, then mark the end of answers."""
        splitter = LineSplitter(self.server.config.limits.max_line_bytes)
        try:
            while not self.stopping:
                self.waiting_for_data = True
                try:
                    chunk = await self.reader.read(READ_CHUNK)
                except ConnectionError:
                    chunk = b""  # reset by the client: same as EOF for what it already sent
                finally:
                    self.waiting_for_data = False
                lines = splitter.feed(chunk) if chunk else splitter.finish()
                for line in lines:
                    request = parse_line(line, self.server.config.limits)
                    if request is None:
                        continue
                    await self.owed.acquire()  # a client that does not read its answers stops being read
                    future = asyncio.get_running_loop().create_future()
                    self.answers.put_nowait(future)
                    self.server.dispatch(request, future, self)
                if not chunk:
                    return
        finally:
            self.answers.put_nowait(None)

    async def write_answers(self) -> None:
        """Write each answer as soon as it and all earlier ones on this connection are ready."""
        transport = self.writer.transport
        while True:
            future = await self.answers.get()
            if future is None:
                break
            response = await future
            self.owed.release()
            if transport.is_closing():
                break  # the client left; keep nothing for it
            self.writer.write(encode_line(response))
            if transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
                await self.writer.drain()  # a slow reader: stop here until it catches up
        if not transport.is_closing():
            await self.writer.drain()


class SocketServer:
    """Accepts connections, batches classify requests across them, answers in per-connection order."""

    def __init__(self, config: ServerConfig, load_service: Callable[[], "Service"], ready_wire: int | None = None):
        self.config = config
        self.load_service = load_service
        self.ready_wire = ready_wire  # fd for the ready event line (--ready), or None
        self.queue = RequestQueue(config.queue_size)
        self.stats = ServerStats()
        self.service: "Service | None" = None
        self.state = "loading"  # → ready → draining
        self.load_error: BaseException | None = None
        self.connections: set[Connection] = set()
        self.connection_tasks: set[asyncio.Task] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_requested: asyncio.Event | None = None

    # -- engine thread ------------------------------------------------------------------------

    def _engine_main(self) -> None:
        """Load and warm the model, then answer batches until the queue is closed."""
        assert self.loop is not None
        try:
            service = self.load_service()
        except BaseException as exc:  # noqa: BLE001 — re-raised in the main thread by run()
            self.load_error = exc
            self.loop.call_soon_threadsafe(self._stop)
            self._refuse_queued(f"the model failed to load: {type(exc).__name__}: {exc}")
            return
        self.loop.call_soon_threadsafe(self._on_ready, service)
        delay_s = self.config.batch_delay_ms / 1000
        previous_batch = 1
        while True:
            # Wait for company only under concurrent load (see the module docstring).
            batch = self.queue.take_batch(self.config.max_batch_texts, delay_s if previous_batch > 1 else 0.0,
                                          lambda: len(self.connections))
            if batch is None:
                return
            previous_batch = len(batch)
            live = [item for item in batch if not item.connection.closed]
            responses = self._answer(service, [item.request for item in live])
            self.loop.call_soon_threadsafe(self._deliver, batch, live, responses, time.perf_counter())

    def _refuse_queued(self, message: str) -> None:
        """After a failed load: answer everything queued (until shutdown closes the queue) with an error."""
        assert self.loop is not None
        while (batch := self.queue.take_batch(self.config.max_batch_texts, 0.0, lambda: 1)) is not None:
            responses = [ErrorReply(item.request.id, INTERNAL_ERROR, message).to_json() for item in batch]
            self.loop.call_soon_threadsafe(self._deliver, batch, batch, responses, time.perf_counter())

    @staticmethod
    def _answer(service: "Service", requests: list[Request]) -> list[dict[str, Any]]:
        """One Service call; an unexpected failure becomes internal_error answers, not a dead thread."""
        if not requests:
            return []
        try:
            return service.answer(requests)
        except Exception as exc:  # noqa: BLE001 — the engine thread must survive any one batch
            log.exception("batch of %d requests failed", len(requests))
            return [ErrorReply(r.id, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}").to_json() for r in requests]

    # -- event loop thread --------------------------------------------------------------------

    def _on_ready(self, service: "Service") -> None:
        self.service = service
        if self.state == "loading":
            self.state = "ready"
        log.info("ready on %s: model %s, variant %s, warm-up %.0f ms", self.config.address.describe(),
                 service.info["model"]["name"], service.variant, service.engine.warm_up_ms)
        if self.ready_wire is not None:
            event = {**service.ready_event(), "listen": self.config.address.describe()}
            try:
                write_all(self.ready_wire, encode_line(event))
            except OSError as exc:  # whoever started us stopped reading stdout; serving goes on
                log.warning("cannot write the ready event to stdout: %s", exc)
        sdnotify.notify("READY=1", f"STATUS=serving on {self.config.address.describe()}")

    def _deliver(self, batch: list[Pending], live: list[Pending], responses: list[dict[str, Any]],
                 finished: float) -> None:
        """Resolve the futures of one engine batch and record its size and latencies."""
        self.stats.batch_sizes[len(batch)] += 1
        for item, response in zip(live, responses):
            if "error" in response:
                self.stats.errors[response["error"]["code"]] += 1
            self.stats.latencies_ms.append((finished - item.enqueued) * 1000)
            if not item.future.done():
                item.future.set_result(response)
        for item in batch:
            if not item.future.done():
                item.future.cancel()  # its client is gone

    def dispatch(self, request: Request, future: asyncio.Future, connection: Connection) -> None:
        """Answer errors and control ops now; queue classify requests or answer busy."""
        self.stats.requests += 1
        if isinstance(request, ErrorReply):
            self.stats.errors[request.code] += 1
            future.set_result(request.to_json())
        elif isinstance(request, ControlRequest):
            future.set_result(self.control(request))
        elif not self.queue.offer(Pending(request, future, connection, time.perf_counter())):
            self.stats.errors[BUSY] += 1
            future.set_result(ErrorReply(
                request.id, BUSY, f"request queue full ({self.config.queue_size} waiting); retry later").to_json())

    def control(self, request: ControlRequest) -> dict[str, Any]:
        """health / info / stats, answered by the loop without waiting for the engine."""
        if request.op == "health":
            return {"id": request.id, "op": "health", "status": self.state}
        if request.op == "info":
            base = dict(self.service.info) if self.service else {"version": __version__, "status": self.state}
            return {"id": request.id, "op": "info", **base, "server": self.server_info()}
        engine = self.service.stats.to_json() if self.service else None
        body = self.stats.to_json(len(self.queue), len(self.connections), engine)
        return {"id": request.id, "op": "stats", **body}

    def server_info(self) -> dict[str, Any]:
        """The transport settings, for the info op."""
        config = self.config
        return {"listen": config.address.describe(), "max_connections": config.max_connections,
                "queue_size": config.queue_size, "batch_delay_ms": config.batch_delay_ms,
                "max_batch_texts": config.max_batch_texts}

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection from accept to close."""
        task = asyncio.current_task()
        assert task is not None
        self.stats.connections_total += 1
        if len(self.connections) >= self.config.max_connections or self.state == "draining":
            self.stats.errors[BUSY] += 1
            reason = "server is shutting down" if self.state == "draining" else (
                f"too many connections ({self.config.max_connections})")
            writer.write(encode_line(ErrorReply(None, BUSY, reason).to_json()))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
            return
        connection = Connection(self, reader, writer)
        self.connections.add(connection)
        self.connection_tasks.add(task)
        connection.reader_task = asyncio.create_task(connection.read_requests())
        try:
            await connection.write_answers()
        except ConnectionError:
            pass  # the client left mid-answer: only this connection is affected
        finally:
            connection.closed = True
            connection.reader_task.cancel()
            await asyncio.gather(connection.reader_task, return_exceptions=True)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self.connections.discard(connection)
            self.connection_tasks.discard(task)

    def _stop(self, signum: int | None = None) -> None:
        if signum is not None:
            log.info("%s received: finishing requests in flight", signal.Signals(signum).name)
        assert self.stop_requested is not None
        self.stop_requested.set()

    async def serve(self, listener: socket.socket) -> None:
        """Serve on a bound listening socket until a signal (or a failed model load), then drain."""
        self.loop = asyncio.get_running_loop()
        self.stop_requested = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(signum, self._stop, signum)
        if listener.family == socket.AF_UNIX:
            server = await asyncio.start_unix_server(self._serve_connection, sock=listener)
        else:
            server = await asyncio.start_server(self._serve_connection, sock=listener)
        log.info("listening on %s (loading the model)", self.config.address.describe())
        engine = threading.Thread(target=self._engine_main, name="engine", daemon=True)
        engine.start()
        await self.stop_requested.wait()

        self.state = "draining"
        sdnotify.notify("STOPPING=1")
        server.close()  # no new connections
        for connection in list(self.connections):
            connection.stop_reading()
        if self.connection_tasks:
            _, unfinished = await asyncio.wait(set(self.connection_tasks), timeout=DRAIN_TIMEOUT_S)
            if unfinished:
                log.warning("%d connections not drained after %.0f s; closing them", len(unfinished),
                            DRAIN_TIMEOUT_S)
                for task in unfinished:
                    task.cancel()
        self.queue.close()
        await asyncio.to_thread(engine.join)
        await server.wait_closed()


def listen(config: ServerConfig) -> tuple[socket.socket, Callable[[], None]]:
    """Bind the configured address; returns the socket and a cleanup that removes our socket file."""
    address = config.address
    if address.path is not None:
        sock, identity = bind_unix(address.path)
        path = address.path

        def remove_socket_file() -> None:
            with contextlib.suppress(OSError):
                info = os.stat(path)
                if (info.st_dev, info.st_ino) == identity:  # never remove a successor's socket
                    os.unlink(path)
        return sock, remove_socket_file
    assert address.host is not None and address.port is not None
    return bind_tcp(address.host, address.port, config.allow_remote), lambda: None


def run(config: ServerConfig, load_service: Callable[[], "Service"], ready_wire: int | None = None) -> int:
    """Bind, serve until SIGTERM/SIGINT, clean up; returns 0. A failed model load is re-raised
    (after the socket file is removed) so the caller maps it to its exit code."""
    listener, cleanup = listen(config)
    if config.address.port == 0:  # an ephemeral port: say which one we got
        host, port = listener.getsockname()[:2]
        config = dataclasses.replace(config, address=ListenAddress(host=host, port=port))
    server = SocketServer(config, load_service, ready_wire)
    try:
        asyncio.run(server.serve(listener))
    finally:
        listener.close()
        cleanup()
    if server.load_error is not None:
        raise server.load_error
    log.info("stopped after %d requests", server.stats.requests)
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
                       help=f"classify requests waiting for the model (default {DEFAULT_QUEUE_SIZE}); "
                            "beyond it requests get a busy error at once")
    group.add_argument("--batch-delay-ms", type=float, default=DEFAULT_BATCH_DELAY_MS,
                       help=f"under concurrent load, wait up to this long to fill a batch "
                            f"(default {DEFAULT_BATCH_DELAY_MS}; 0 = never wait)")


def config_from_args(args: argparse.Namespace, limits: Limits) -> ServerConfig:
    """Validate the socket options (before the model is loaded); raises ListenError."""
    if args.max_connections < 1 or args.queue_size < 1:
        raise ListenError("--max-connections and --queue-size must be at least 1")
    if not 0 <= args.batch_delay_ms <= 1000:
        raise ListenError("--batch-delay-ms must be between 0 and 1000")
    if args.socket:
        address = ListenAddress(path=args.socket)
    else:
        host, port = parse_tcp_address(args.tcp)
        if not args.allow_remote and not is_loopback([a for _, a in resolve_host(host, port)]):
            raise ListenError(f"{host} is not a loopback address; decide has no authentication or TLS. "
                              "Pass --allow-remote to listen on it anyway")
        address = ListenAddress(host=host, port=port)
    return ServerConfig(address=address, limits=limits, max_connections=args.max_connections,
                        queue_size=args.queue_size, batch_delay_ms=args.batch_delay_ms,
                        max_batch_texts=args.max_batch, allow_remote=args.allow_remote)
