"""A client for decide: one long-running `decide --ready` child (or the socket service), many calls.

Copy this file into your project (Python 3.8+, standard library only):

    from decide_client import DecideClient, DecideError

    with DecideClient.spawn(["/opt/decide/decide", "--model", "/opt/models/alarms"]) as client:
        answer = client.classify("Pump 3 is leaking oil")        # -> Answer(label="leak", ...)
        answers = client.classify_many(["...", "..."])           # pipelined, in order
        future = client.submit("...")                            # concurrent.futures.Future

It waits for the ready line; a writer, a reader and a stderr thread keep every pipe flowing; many
requests are in flight at once, each answer matched to its request by id; a timeout per call; a
child that dies fails the requests in flight (`connection_lost`) and the next call restarts it,
with backoff. Errors are `DecideError` with the protocol's code (`empty_text`, `busy`, ...) or
this client's: `timeout`, `start_failed`, `connection_lost`, `protocol_error`, `closed`. Threads
may share one client. docs/embedding.md says more.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import json
import queue
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:  # for annotations only: the client needs nothing beyond the standard library
    from typing_extensions import Self

TIMEOUT = "timeout"  # no answer within the call's timeout (the child keeps running)
START_FAILED = "start_failed"  # the child exited or printed no ready line in time; connect refused
CONNECTION_LOST = "connection_lost"  # the child exited / the service closed the connection
PROTOCOL_ERROR = "protocol_error"  # a line that is not a JSON object: the link is dropped
CLOSED = "closed"  # the client was closed

READ_CHUNK = 1 << 16
STDERR_LINES = 20  # the child's last stderr lines, quoted in start/crash messages
MAX_BACKOFF_S = 5.0


class DecideError(Exception):
    """An error answer (`code` is the protocol's error code) or a failure of the client itself."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Answer:
    """One text's decision. `label` is None when abstained; `leaning` is what the model leans to."""

    label: str | None
    leaning: str
    score: float
    scores: dict[str, float]
    abstained: bool
    reason: str | None
    truncated: bool
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Answer:
        """An answer line (already parsed) as an Answer."""
        return cls(data.get("label"), data.get("leaning"), float(data.get("score", 0.0)),
                   dict(data.get("scores") or {}), bool(data.get("abstained")), data.get("reason"),
                   bool(data.get("truncated")), data)


def _describe_exit(code: int | None) -> str:
    if code is None or code >= 0:
        return f"decide exited with code {code}"
    names = {s.value: s.name for s in signal.Signals}
    return f"decide was killed by signal {-code} ({names.get(-code, '?')})"


class _Link:
    """One child process or one socket connection, with its requests in flight in sending order.

    The protocol answers every request line exactly once, in order: an answer carries our id, or
    null when the runtime could not read the line (line_too_long, invalid_utf8) — then it belongs
    to the oldest request in flight; an id-less `busy` is the service refusing the connection. A
    request whose call timed out stays in `pending`, so that its late answer is recognised and dropped."""

    def __init__(self, recv: Callable[[int], bytes], send: Callable[[bytes], Any], shut: Callable[[], Any],
                 release: Callable[[], Any], process: subprocess.Popen | None = None,
                 on_stderr: Callable[[str], Any] | None = None):
        # shut: no more requests (EOF to decide); release: free the stream once it has ended
        self.recv, self.send, self.shut, self.release, self.process = recv, send, shut, release, process
        self.lock = threading.Lock()
        self.pending: collections.OrderedDict[int, concurrent.futures.Future] = collections.OrderedDict()
        self.next_id = 1
        self.outbox: queue.Queue[bytes | None] = queue.Queue()
        self.failure: DecideError | None = None
        self.closing = self.answered = False
        self.ended_at = 0.0
        self.ready: concurrent.futures.Future = concurrent.futures.Future()
        if process is None:
            self.ready.set_result(None)  # the socket service sends no ready line
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.stderr_thread = self._thread(self._drain_stderr, on_stderr) if process is not None else None
        self.reader = self._thread(self._read)
        self._thread(self._write)

    def _thread(self, target: Callable[..., None], *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=f"decide-{target.__name__}", daemon=True)
        thread.start()
        return thread

    def request(self, text: str) -> concurrent.futures.Future:
        """Queue one request line; the future gets its Answer or DecideError."""
        body = json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self.lock:  # ids, pending order and the line order on the wire agree
            if self.failure is not None:
                raise DecideError(self.failure.code, self.failure.message)
            request_id, self.next_id = self.next_id, self.next_id + 1
            self.pending[request_id] = future
            self.outbox.put(b'{"id": %d, "text": %s}\n' % (request_id, body))
        return future

    def _write(self) -> None:
        while True:
            items = [self.outbox.get()]
            while items[-1] is not None and len(items) < 256 and not self.outbox.empty():
                items.append(self.outbox.get())  # many small lines, one write
            try:
                self.send(b"".join(item for item in items if item is not None))
                if items[-1] is None:
                    self.shut()
                    return
            except (OSError, ValueError):
                # The child or the service is gone (or closed its input): end the stream, so the
                # reader reports why (exit status, last stderr line) to every request in flight.
                self.kill()
                return

    def _read(self) -> None:
        buffer = b""
        try:
            while chunk := self.recv(READ_CHUNK):
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in filter(bytes.strip, lines):
                    self._answer(line)
        except (OSError, ValueError):
            pass  # the end of the stream, as EOF
        except DecideError as exc:  # a refusal, or a line that is not the protocol's: this link is done
            self.fail(exc)
            self.kill()
        finally:
            self.fail(self._ended())  # (a failure already set stays)
            self.release()

    def _answer(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            raise DecideError(PROTOCOL_ERROR, f"decide wrote a line that is not a JSON object: {line[:200]!r}")
        if not self.ready.done():
            if message.get("event") != "ready":
                raise DecideError(PROTOCOL_ERROR, f"expected the ready line, got: {line[:200]!r}")
            self.ready.set_result(message)
            return
        request_id, error = message.get("id"), message.get("error")
        if request_id is None and isinstance(error, dict) and error.get("code") == "busy":
            raise DecideError("busy", str(error.get("message")))  # the service refuses this connection
        with self.lock:
            if isinstance(request_id, int) and request_id in self.pending:
                future = self.pending.pop(request_id)
            elif request_id is None and "error" in message and self.pending:
                future = self.pending.popitem(last=False)[1]  # an unreadable line: the oldest
            else:
                return  # a late answer: its call timed out
        self.answered = True
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled by its caller
            if isinstance(error, dict):
                future.set_exception(DecideError(str(error.get("code")), str(error.get("message"))))
            else:
                future.set_result(Answer.from_json(message))

    def _drain_stderr(self, on_stderr: Callable[[str], Any] | None) -> None:
        assert self.process is not None and self.process.stderr is not None
        for raw in iter(self.process.stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.stderr_tail.append(line)
            if on_stderr is not None:
                with contextlib.suppress(Exception):  # a failing callback must not stop the draining
                    on_stderr(line)
        self.process.stderr.close()

    def _ended(self) -> DecideError:
        """Why the stream ended: the child's exit status and last stderr line, or the service."""
        if self.closing:
            return DecideError(CLOSED, "the client was closed")
        if self.process is None:
            return DecideError(CONNECTION_LOST, "the decide service closed the connection")
        try:
            self.process.wait(2.0)
        except subprocess.TimeoutExpired:
            self.kill()  # it closed stdout but lives on: no more answers can come
        return DecideError(CONNECTION_LOST, _describe_exit(self.process.returncode) + self.stderr_note())

    def stderr_note(self) -> str:
        """'; last stderr: …' once the stderr thread has read what the child wrote (or '')."""
        if self.stderr_thread is not None:
            self.stderr_thread.join(1.0)
        return f"; last stderr: {self.stderr_tail[-1]}" if self.stderr_tail else ""

    def fail(self, error: DecideError) -> None:
        """Fail every request in flight (and the ready wait) with `error`; later requests too."""
        with self.lock:
            if self.failure is None:
                self.failure, self.ended_at = error, time.monotonic()
            waiting, self.pending = list(self.pending.values()), collections.OrderedDict()
        self.outbox.put(None)  # the writer thread ends
        for future in [self.ready, *waiting]:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                future.set_exception(self.failure)

    def kill(self) -> None:
        """End the child now (SIGKILL) or the connection (both directions); the reader then ends."""
        if self.process is None:
            self.shut(socket.SHUT_RDWR)
        elif self.process.poll() is None:
            self.process.kill()

    def close(self, timeout: float) -> None:
        """EOF after the lines queued; decide answers what it read and exits (the service closes)."""
        self.closing = True
        self.outbox.put(None)
        process = self.process
        for stop in (None, process.terminate, process.kill) if process is not None else ():
            if stop is not None and process.poll() is None:
                stop()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(1.0 if stop is None else timeout)  # EOF first, then SIGTERM, SIGKILL
                break
        self.reader.join(timeout)
        self.fail(DecideError(CLOSED, "the client was closed"))


class DecideClient:
    """A decide child process (`spawn`) or socket connection (`connect`), shared by any threads."""

    def __init__(self, command: Sequence[str] | None = None, socket_path: str | None = None,
                 timeout: float = 30.0, ready_timeout: float = 120.0, cwd: str | None = None,
                 env: dict[str, str] | None = None, on_stderr: Callable[[str], Any] | None = None):
        if (command is None) == (socket_path is None):
            raise ValueError("give either a command or a socket path")
        self.command = [*command, "--ready"] if command is not None else None
        self.socket_path, self.timeout, self.ready_timeout = socket_path, timeout, ready_timeout
        self.cwd, self.env, self.on_stderr = cwd, env, on_stderr
        self.ready: dict[str, Any] | None = None  # the child's ready line (model, labels, limits)
        self._start_lock = threading.Lock()
        self._link: _Link | None = None
        self._failures = 0  # starts in a row that ended without any answer
        self._not_before = 0.0
        self._closed = False
        self._current()

    @classmethod
    def spawn(cls, command: Sequence[str], **options: Any) -> DecideClient:
        """Start `command` (decide and its arguments; `--ready` is added) and wait until it is ready."""
        return cls(command=command, **options)

    @classmethod
    def connect(cls, socket_path: str, **options: Any) -> DecideClient:
        """Use a running `decide serve --socket PATH`."""
        return cls(socket_path=socket_path, **options)

    def classify(self, text: str, timeout: float | None = None) -> Answer:
        """One text → its Answer; raises DecideError."""
        return self._wait(self.submit(text), self._deadline(timeout))

    def classify_many(self, texts: Sequence[str], timeout: float | None = None) -> list[Answer]:
        """Many texts, pipelined (one request line each, all in flight at once); answers in order.
        The timeout is for the whole call; the first error raises."""
        link = self._current()  # (a restart waits for the ready line first, as in classify)
        deadline = self._deadline(timeout)
        return [self._wait(future, deadline) for future in [link.request(text) for text in texts]]

    def submit(self, text: str) -> concurrent.futures.Future:
        """Send one request now; the Future gets its Answer (or DecideError). Wait for it with a
        timeout (`future.result(timeout)`): a timed-out request's late answer is dropped."""
        return self._current().request(text)

    async def aclassify(self, text: str, timeout: float | None = None) -> Answer:
        """classify for asyncio code."""
        limit = self.timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self.submit(text)), limit)
        except asyncio.TimeoutError:
            raise DecideError(TIMEOUT, f"no answer within {limit:g} s") from None

    def close(self, timeout: float = 5.0) -> None:
        """Stop: requests already sent are answered, then the child exits (SIGTERM, then SIGKILL
        after `timeout` s if it does not); later calls raise `closed`."""
        with self._start_lock:
            self._closed = True
            link, self._link = self._link, None
        if link is not None:
            link.close(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _deadline(self, timeout: float | None) -> float:
        return time.monotonic() + (self.timeout if timeout is None else timeout)

    @staticmethod
    def _wait(future: concurrent.futures.Future, deadline: float) -> Answer:
        limit = max(0.0, deadline - time.monotonic())
        try:
            return future.result(limit)
        except concurrent.futures.TimeoutError:
            raise DecideError(TIMEOUT, "no answer in time (decide runs on; a late answer is dropped)") from None

    def _current(self) -> _Link:
        """The live link, (re)started if the last one ended: at most one start at a time, each
        after a backoff of 0.1 s doubling to 5 s while starts end without any answer."""
        with self._start_lock:
            if self._closed:
                raise DecideError(CLOSED, "the client was closed")
            link = self._link
            if link is not None and link.failure is None:
                return link
            if link is not None:
                self._back_off(1 if link.answered else self._failures + 1, link.ended_at)
                self._link = None
            time.sleep(max(0.0, self._not_before - time.monotonic()))
            try:
                self._link = self._start()
            except DecideError:
                self._back_off(self._failures + 1, time.monotonic())
                raise
            return self._link

    def _back_off(self, failures: int, since: float) -> None:
        self._failures, self._not_before = failures, since + min(0.1 * 2 ** (failures - 1), MAX_BACKOFF_S)

    def _start(self) -> _Link:
        if self.socket_path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(self.ready_timeout)  # a full listen backlog makes connect wait
                sock.connect(self.socket_path)
                sock.settimeout(None)
            except OSError as exc:
                sock.close()
                raise DecideError(START_FAILED, f"cannot connect to {self.socket_path}: {exc}") from None

            def shut(how: int = socket.SHUT_WR) -> None:
                with contextlib.suppress(OSError):  # already closed by the service
                    sock.shutdown(how)

            return _Link(sock.recv, sock.sendall, shut, sock.close)
        assert self.command is not None
        try:
            process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, cwd=self.cwd, env=self.env)
        except OSError as exc:
            raise DecideError(START_FAILED, f"cannot run {self.command[0]}: {exc}") from None
        stdin, stdout = process.stdin, process.stdout
        assert stdin is not None and stdout is not None

        def send(data: bytes) -> None:
            stdin.write(data)
            stdin.flush()

        link = _Link(stdout.read1, send, stdin.close, stdout.close, process, self.on_stderr)
        try:
            self.ready = link.ready.result(self.ready_timeout)
            return link
        except (concurrent.futures.TimeoutError, DecideError) as exc:
            link.kill()
            why = exc.message if isinstance(exc, DecideError) else \
                f"no ready line within {self.ready_timeout:g} s{link.stderr_note()}"
            raise DecideError(START_FAILED, f"decide did not become ready: {why}") from None
