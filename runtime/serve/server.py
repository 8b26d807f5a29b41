"""Local socket service: many connections, one warmed engine, dynamic micro-batching.

`decide serve --socket PATH` (Unix domain socket, mode 0600) or `--tcp HOST:PORT` (loopback
unless --allow-remote). Each connection speaks the stdio framing: JSON lines in, one response
line per request out, in that connection's request order. This module schedules: lines go to
the shared `Service` (runtime/serve/service.py) for parsing, control ops and answers; one client's
connection is runtime/serve/connection.py, the queue and fair admission runtime/serve/admission.py, the
stats runtime/serve/serverstats.py, addresses and accepting runtime/serve/listen.py, signals runtime/serve/signals.py.

Threads and data flow:
- The asyncio event loop (main thread) accepts connections, splits lines and triages each one
  through the Service: errors and control ops are answered at once, classify requests go to one
  bounded `RequestQueue` through `Admission`.
- Backpressure, not refusal: a connection stops being read while it owes PENDING_PER_CONNECTION
  answers or while the queue is full (TCP then slows the client down); freed places go to the
  waiting connections fairly (fewest queued first). Only a request that finds no place for
  --queue-timeout seconds (the model is overloaded or stuck) is answered `busy`, and so is a
  connection beyond --max-connections; `stats` counts busy answers by cause.
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
- Idle clients: a connection decide is reading that sends nothing for --idle-timeout seconds
  while owed nothing, or holds an incomplete line that long, is closed, so stalled clients cannot
  hold the --max-connections slots. Backpressure and unread answers never count (connection.py).
- The socket is bound before the model loads: `{"op":"health"}` says "loading" until warm-up is
  done; classify requests sent meanwhile wait in the queue. systemd gets READY=1 after warm-up.
- Stop signals (SIGTERM, SIGINT, SIGQUIT): stop accepting, stop reading, answer and write every
  request already read, remove the socket file, return 0. Shutdown waits as long as answers keep
  being written, and gives up on unfinished connections only after DRAIN_STALL_S without any
  (a stuck model); a client that does not read its answers during shutdown is reset after
  SHUTDOWN_WRITE_STALL_S, so shutdown never waits long on it. SIGHUP and SIGUSR1 are acted on
  by the loop (a background reload, a stats log line); the other signals of the table are ignored.
- Live swaps (runtime/serve/swap.py): SIGHUP, `{"op": "reload", "model": DIR}`, `{"op": "rollback"}` and
  --watch DIR make a new package ready in a background thread while the old one answers; batch
  threads pick up the new model with their next batch. The swap ops are taken only from a peer
  that runs as the server's own user (SO_PEERCRED on the Unix socket); TCP peers cannot prove a
  uid and are refused (`forbidden`). The answer to a reload comes when it is done (or failed):
  answers to that connection's later lines wait behind it, other connections are not held up.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.protocol import (
    BUSY,
    INTERNAL_ERROR,
    ClassifyRequest,
    ControlRequest,
    Limits,
    encode_line,
)
from runtime.serve import sdnotify, signals
from runtime.serve.admission import Admission, Pending, RequestQueue
from runtime.serve.config import (
    DEFAULT_BATCH_DELAY_MS,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_QUEUE_SIZE,
    DEFAULT_QUEUE_TIMEOUT_S,
    ServerConfig,
)
from runtime.serve.connection import Connection, close_writer
from runtime.serve.framing import OutputFailed, write_all
from runtime.serve.listen import (
    Acceptor,
    ListenAddress,
    ListenError,
    bind,
    check_socket_path,
    check_tcp_host,
    parse_tcp_address,
)
from runtime.serve.serverstats import ServerStats
from runtime.serve.service import Service, TransportHooks
from runtime.serve.swap import Loaded, Swapper
from runtime.serve.swapops import SocketSwaps, peer_uid

if TYPE_CHECKING:
    from runtime.package.watch import PackageWatcher

log = logging.getLogger("decide")

# A connection that sent a classify request this recently is expected to send again soon (a
# closed-loop client comes back within one batch round trip, ~10 ms at 16 clients); the batch
# delay waits for those only. Counting every open connection instead made each batch wait the
# whole delay for idle ones.
ACTIVE_SENDER_S = 0.05
DRAIN_STALL_S = 30.0  # shutdown: unfinished connections are closed after this long without an answer
SHUTDOWN_WRITE_STALL_S = 2.0  # shutdown: a client that reads nothing this long is dropped
CLOSE_WAIT_S = 2.0  # shutdown: time for cancelled connections to finish closing


class SocketServer:
    """Accepts connections, batches classify requests across them, answers in per-connection order."""

    def __init__(self, config: ServerConfig, service: Service, load_engine: Callable[[], Loaded],
                 ready_wire: int | None = None, rebuild: Callable[[Path], Loaded] | None = None,
                 watcher: PackageWatcher | None = None):
        self.config = config
        self.service = service
        service.hooks = TransportHooks(status=lambda: self.state, info=self._info, stats=self._stats, swap_ops=True)
        self.load_engine = load_engine
        self.rebuild = rebuild  # a package directory → a checked, warm, self-tested model (None: no swaps)
        self.watcher = watcher
        self.swapper: Swapper | None = None
        self.swaps = SocketSwaps(self)
        self.ready_wire = ready_wire  # fd for the ready event line (--ready), or None
        self.queue = RequestQueue(config.queue_size)
        self.admission = Admission(self.queue, config.queue_timeout_s)
        self.stats = ServerStats()
        self.state = "loading"  # → ready → draining
        self.load_error: BaseException | None = None
        self.connections: set[Connection] = set()
        self.connection_tasks: set[asyncio.Task] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_requested: asyncio.Event | None = None

    # -- engine and batch threads -------------------------------------------------------------

    def _engine_main(self) -> None:
        """Load and warm the model, then answer batches until the queue is closed."""
        assert self.loop is not None
        try:
            self.swapper = Swapper(self.service, self.rebuild, self.load_engine())
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
            self.loop.call_soon_threadsafe(self.admission.taken, batch)
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
            self.loop.call_soon_threadsafe(self.admission.taken, batch)
            responses = [self.service.error(item.request.id, INTERNAL_ERROR, message) for item in batch]
            self.loop.call_soon_threadsafe(self._deliver, batch, batch, responses, time.perf_counter())

    # -- event loop thread --------------------------------------------------------------------

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

    def admission_must_wait(self) -> bool:
        """True when a classify request offered now would wait for a place (backpressure)."""
        return bool(self.admission.waiting) or len(self.queue) >= self.queue.capacity

    async def enqueue(self, request: ClassifyRequest, future: asyncio.Future, connection: Connection) -> None:
        """Queue a classify request, waiting for a fair turn while the queue is full (the caller
        reads nothing meanwhile); busy only after --queue-timeout seconds without a place."""
        if await self.admission.enter(Pending(request, future, connection, time.perf_counter())):
            return
        self.stats.busy["queue_timeout"] += 1
        future.set_result(self.service.error(
            request.id, BUSY, f"overloaded: no place in the request queue ({self.config.queue_size}) for "
                              f"{self.config.queue_timeout_s:g} s; retry later"))

    def _info(self) -> dict[str, Any]:
        """The transport settings and the swap state, for the info op."""
        config = self.config
        return {"swap": self.swapper.to_json() if self.swapper is not None else None, "server": {"listen": config.address.describe(), "max_connections": config.max_connections,
                           "queue_size": config.queue_size, "batch_delay_ms": config.batch_delay_ms,
                           "max_batch_texts": config.max_batch_texts, "idle_timeout_s": config.idle_timeout_s,
                           "queue_timeout_s": config.queue_timeout_s}}

    def _stats(self) -> dict[str, Any]:
        swap = {"swap": self.swapper.stats_json()} if self.swapper is not None else {}
        return {**self.stats.to_json(len(self.queue), len(self.connections), self.service.stats.to_json()), **swap}

    def _accepted(self, sock: socket.socket) -> None:
        """A new connection from the Acceptor: serve it in its own task."""
        assert self.loop is not None
        task = self.loop.create_task(self._serve_connection(sock))
        self.connection_tasks.add(task)
        task.add_done_callback(self.connection_tasks.discard)

    async def _refuse_connection(self, writer: asyncio.StreamWriter) -> None:
        """One busy line for a connection beyond --max-connections (or during shutdown), then close."""
        cause, reason = (("shutting_down", "server is shutting down") if self.state == "draining" else
                         ("max_connections", f"too many connections ({self.config.max_connections})"))
        self.stats.busy[cause] += 1
        writer.write(self.service.wire_line(self.service.error(None, BUSY, reason)))
        await close_writer(writer)

    async def _serve_connection(self, sock: socket.socket) -> None:
        """One connection from accept to close."""
        self.stats.connections_total += 1
        try:
            reader, writer = await asyncio.open_connection(sock=sock)
        except OSError:
            sock.close()
            return
        if len(self.connections) >= self.config.max_connections or self.state == "draining":
            await self._refuse_connection(writer)
            return
        connection = Connection(self, reader, writer)
        connection.peer_uid = peer_uid(sock)
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
            self.connections.discard(connection)  # its slot is free while the close lingers
            await close_writer(writer, unread_input=not connection.client_eof)

    async def _watch_connections(self) -> None:
        """Close idle and half-line connections; during shutdown, reset clients that read nothing."""
        idle_s = self.config.idle_timeout_s
        period = min(1.0, idle_s / 4) if idle_s > 0 else 1.0
        while True:
            await asyncio.sleep(min(period, SHUTDOWN_WRITE_STALL_S / 4) if self.state == "draining" else period)
            now = time.monotonic()
            for connection in list(self.connections):
                stalled = connection.write_stalled_since
                if self.state == "draining" and stalled is not None and now - stalled > SHUTDOWN_WRITE_STALL_S:
                    log.info("shutting down: resetting a connection that read no answer for %g s",
                             SHUTDOWN_WRITE_STALL_S)
                    connection.writer.transport.abort()  # it reads nothing: its answers cannot arrive
                elif (reason := connection.expired(now, idle_s)) is not None:
                    log.info("closing a connection: %s", reason)
                    connection.stop_reading()  # answers already owed are still written

    def _stop(self, name: str | None = None) -> None:
        if name is not None and self.state != "draining":
            log.info("%s received: finishing requests in flight", name)
        assert self.stop_requested is not None
        self.stop_requested.set()

    def _signal(self, signum: int, actions: signals.Actions) -> None:
        """A signal of the table, on the loop thread."""
        actions.run(signum)

    @staticmethod
    def _log_loop_error(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Unexpected errors inside asyncio callbacks: one log line, no traceback."""
        exc = context.get("exception")
        log.warning("event loop: %s", f"{type(exc).__name__}: {exc}" if exc else context.get("message"))

    def _install_signals(self) -> None:
        """Every signal of runtime/serve/signals.py's table: stop, reload and report on the loop, the rest ignored."""
        assert self.loop is not None
        actions = signals.Actions(stop=self._stop, stats=lambda: self.service.control(ControlRequest(None, "stats")),
                                  reload=lambda _stats: self.swaps.on_sighup())
        signals.ignore_the_ignored()
        loop = self.loop

        def caught(signum: int, _frame: object) -> None:
            # A plain handler, not loop.add_signal_handler: asyncio learns of those signals from a
            # byte in its self-pipe, which the batch threads' call_soon_threadsafe can fill; the
            # byte is then dropped and the signal with it (a SIGTERM that never stopped the server).
            # Python runs this in the main thread; the callback it queues wakes the loop.
            try:
                loop.call_soon_threadsafe(self._signal, signum, actions)
            except RuntimeError:  # the loop has closed: serving is over
                pass

        for signum, _action in signals.handled():
            signal.signal(signum, caught)

    async def _drain(self) -> None:
        """Shutdown: wait for the connections while answers keep being written; close the rest
        after DRAIN_STALL_S without progress (a stuck model)."""
        written = -1
        while self.connection_tasks and written != self.stats.answers_written:
            written = self.stats.answers_written
            await asyncio.wait(set(self.connection_tasks), timeout=DRAIN_STALL_S)
        if self.connection_tasks:
            unfinished = set(self.connection_tasks)
            log.warning("%d connections got no answer for %.0f s during shutdown; closing them",
                        len(unfinished), DRAIN_STALL_S)
            for task in unfinished:
                task.cancel()
            await asyncio.wait(unfinished, timeout=CLOSE_WAIT_S)

    async def serve(self, listener: socket.socket) -> None:
        """Serve on a bound listening socket until a stop signal (or a failed model load), then drain."""
        self.loop = asyncio.get_running_loop()
        self.loop.set_exception_handler(self._log_loop_error)
        self.stop_requested = asyncio.Event()
        self._install_signals()
        acceptor = Acceptor(listener, self._accepted)
        acceptor.start(self.loop)
        watcher = asyncio.create_task(self._watch_connections())
        packages = asyncio.create_task(self.swaps.watch(self.watcher)) if self.watcher is not None else None
        log.info("listening on %s (loading the model)", self.config.address.describe())
        engine = threading.Thread(target=self._engine_main, name="engine", daemon=True)
        engine.start()
        await self.stop_requested.wait()

        self.state = "draining"
        sdnotify.notify("STOPPING=1")
        acceptor.close()  # no new connections
        for connection in list(self.connections):
            connection.stop_reading()
        await self._drain()
        self.queue.close()
        await asyncio.to_thread(engine.join)
        watcher.cancel()
        if packages is not None:
            packages.cancel()


def run(config: ServerConfig, service: Service, load_engine: Callable[[], Loaded],
        ready_wire: int | None = None, rebuild: Callable[[Path], Loaded] | None = None,
        watcher: PackageWatcher | None = None) -> int:
    """Bind, serve until a stop signal, clean up; returns 0. A failed model load is re-raised
    (after the socket file is removed) so the caller maps it to its exit code."""
    listener, cleanup = bind(config.address, config.allow_remote)
    if config.address.port == 0:  # an ephemeral port: say which one we got
        host, port = listener.getsockname()[:2]
        config = dataclasses.replace(config, address=ListenAddress(host=host, port=port))
    server = SocketServer(config, service, load_engine, ready_wire, rebuild, watcher)
    try:
        asyncio.run(server.serve(listener))
    finally:
        signals.after_serving()  # nothing in the table may end the exit path now
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
                       help=f"a request that finds no place in the queue this long is answered busy "
                            f"(default {DEFAULT_QUEUE_TIMEOUT_S:g})")
    group.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S, metavar="SECONDS",
                       help=f"close a connection that sends nothing this long while owed no answer, or holds "
                            f"an incomplete line this long (default {DEFAULT_IDLE_TIMEOUT_S:g}; 0 = never); "
                            "time decide itself holds a connection back never counts")
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
