"""The socket server's pure parts: framing, address rules, stats helpers, the batch queue, sd_notify."""

import os
import random
import socket
import threading
import time

import pytest

from runtime.protocol import ClassifyRequest
from runtime.serve import sdnotify
from runtime.serve.admission import Pending, RequestQueue
from runtime.serve.framing import LineSplitter, split_lines
from runtime.serve.listen import ListenError, check_socket_directory, is_loopback, parse_tcp_address
from runtime.serve.serverstats import parse_proc_status
from runtime.serve.service import percentile


def split_incrementally(chunks: list[bytes], limit: int) -> list:
    splitter = LineSplitter(limit)
    lines = []
    for chunk in chunks:
        lines.extend(splitter.feed(chunk))
    return lines + splitter.finish()


@pytest.mark.parametrize("seed", range(20))
def test_line_splitting_does_not_depend_on_how_the_socket_chunks_the_stream(seed):
    rng = random.Random(seed)
    pieces = [b"short", b"x" * 70, b"", b'{"id": 1, "text": "r\xc3\xa9gen"}\r', b"y" * 40, b"tail"]
    stream = b"\n".join(rng.choice(pieces) for _ in range(30))
    cuts = sorted(rng.sample(range(1, len(stream)), 12))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
    assert split_incrementally(chunks, limit=50) == split_lines([stream], max_line_bytes=50)


@pytest.mark.parametrize("value, expected", [
    ("127.0.0.1:7878", ("127.0.0.1", 7878)),
    ("[::1]:0", ("::1", 0)),
    ("localhost:80", ("localhost", 80)),
])
def test_tcp_addresses_parse(value, expected):
    assert parse_tcp_address(value) == expected


@pytest.mark.parametrize("value", ["7878", ":7878", "127.0.0.1:http", "127.0.0.1:70000"])
def test_bad_tcp_addresses_are_refused(value):
    with pytest.raises(ListenError):
        parse_tcp_address(value)


def test_only_loopback_addresses_count_as_loopback():
    assert is_loopback(["127.0.0.1", "::1", "127.3.4.5"])
    assert not is_loopback(["127.0.0.1", "0.0.0.0"])
    assert not is_loopback(["192.168.1.10"])
    assert not is_loopback([])


def test_percentile_is_nearest_rank():
    values = sorted(float(v) for v in range(1, 101))
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 0.95) == 95.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.5) is None


def test_memory_is_read_from_proc_status():
    text = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t3\n"
    assert parse_proc_status(text) == {"peak_rss_mb": 200.0, "rss_mb": 100.0}


def test_socket_directory_writable_by_others_is_refused_unless_sticky(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(ListenError, match="writable by other users"):
        check_socket_directory(str(shared / "decide.sock"))
    os.chmod(shared, 0o1777)  # like /tmp: others cannot remove or rename our file
    check_socket_directory(str(shared / "decide.sock"))
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    check_socket_directory(str(private / "decide.sock"))
    with pytest.raises(ListenError):
        check_socket_directory(str(tmp_path / "missing" / "decide.sock"))


def pending(texts: int) -> Pending:
    request = ClassifyRequest(id=None, texts=("rain",) * texts, single=texts == 1)
    return Pending(request, future=None, connection=None, enqueued=0.0)  # the queue never touches these


def test_queue_refuses_beyond_capacity_and_batches_up_to_max_texts():
    queue = RequestQueue(capacity=4)
    items = [pending(1), pending(2), pending(1), pending(3)]
    assert all(queue.offer(item) for item in items)
    assert not queue.offer(pending(1))
    first = queue.take_batch(max_texts=4, delay_s=0.0, wait_for=lambda: 1)
    assert first == items[:3]  # 1 + 2 + 1 texts; the 3-text request would exceed 4
    assert queue.take_batch(max_texts=4, delay_s=0.0, wait_for=lambda: 1) == items[3:]
    big = pending(9)
    queue.offer(big)
    assert queue.take_batch(max_texts=4, delay_s=0.0, wait_for=lambda: 1) == [big]  # never starves
    queue.close()
    assert queue.take_batch(max_texts=4, delay_s=0.0, wait_for=lambda: 1) is None


def test_queue_gives_each_batch_thread_a_fair_share_and_counts_what_is_in_flight():
    queue = RequestQueue(capacity=16)
    for _ in range(10):
        queue.offer(pending(1))
    first = queue.take_batch(max_texts=32, delay_s=0.0, wait_for=lambda: 1, takers=2)
    assert len(first) == 5 and queue.in_flight == 5  # half of the 10 waiting: the other thread gets the rest
    second = queue.take_batch(max_texts=32, delay_s=0.0, wait_for=lambda: 1, takers=2)
    assert len(second) == 5 and queue.in_flight == 10
    queue.answered(first)
    assert queue.in_flight == 5
    for _ in range(3):
        queue.offer(pending(1))
    # 3 waiting + 5 still in flight, two threads: a share is 4, so all 3 waiting go now
    assert len(queue.take_batch(max_texts=32, delay_s=0.0, wait_for=lambda: 1, takers=2)) == 3


def test_a_batch_thread_gathering_while_another_takes_everything_waits_again():
    """Two batch threads both in the gathering delay: the one that wakes second finds the queue
    empty and must wait for the next request, not fail (it once died with IndexError)."""
    queue = RequestQueue(capacity=16)
    queue.offer(pending(1))
    results: list = []

    def take():
        results.append(queue.take_batch(max_texts=32, delay_s=0.2, wait_for=lambda: 5, takers=1))

    threads = [threading.Thread(target=take) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)  # both are gathering, waiting for 5 requests that will not come
    last = pending(1)
    time.sleep(0.4)  # the delay ran out: one thread took the single request, the other waits again
    assert len(results) == 1 and len(results[0]) == 1
    queue.offer(last)
    for thread in threads:
        thread.join(timeout=5)
    assert [len(batch) for batch in results] == [1, 1] and results[1] == [last]


def test_the_batch_delay_waits_only_for_connections_that_sent_recently():
    """An open but idle connection must not make every batch wait the whole delay for it."""
    from runtime.serve.listen import ListenAddress
    from runtime.serve.server import ACTIVE_SENDER_S, ServerConfig, SocketServer
    from runtime.serve.service import Service

    server = SocketServer(ServerConfig(address=ListenAddress(path="/unused.sock")), Service(), lambda: None)
    class Sender:  # the one Connection attribute the count reads
        def __init__(self, last_request: float):
            self.last_request = last_request

    now = time.monotonic()
    server.connections = {Sender(now),  # a client in a closed loop
                          Sender(now - ACTIVE_SENDER_S / 2),
                          Sender(now - 10 * ACTIVE_SENDER_S),  # gone quiet
                          Sender(float("-inf"))}  # connected, never sent
    assert server._active_senders() == 2


def test_queue_gathers_requests_arriving_within_the_delay():
    queue = RequestQueue(capacity=16)
    queue.offer(pending(1))

    def late_arrivals():
        for _ in range(3):
            time.sleep(0.02)
            queue.offer(pending(1))

    producer = threading.Thread(target=late_arrivals)
    producer.start()
    batch = queue.take_batch(max_texts=32, delay_s=5.0, wait_for=lambda: 4)
    producer.join()
    assert len(batch) == 4  # returned as soon as the 4 expected requests were there


def test_queue_does_not_wait_when_no_one_else_could_send():
    queue = RequestQueue(capacity=16)
    queue.offer(pending(1))
    start = time.monotonic()
    batch = queue.take_batch(max_texts=32, delay_s=30.0, wait_for=lambda: 1)
    assert len(batch) == 1
    assert time.monotonic() - start < 15.0  # far below the 30 s delay: it did not wait for it


def test_notify_address_forms():
    assert sdnotify.notify_address(None) is None
    assert sdnotify.notify_address("/run/systemd/notify") == "/run/systemd/notify"
    assert sdnotify.notify_address("@abstract/notify") == b"\0abstract/notify"
    assert sdnotify.notify_address("vsock:2:1234") is None


def test_notify_sends_one_datagram(tmp_path, monkeypatch):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        assert sdnotify.notify("READY=1", "STATUS=serving")
        assert receiver.recv(4096) == b"READY=1\nSTATUS=serving"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not sdnotify.notify("READY=1")


# -- framing: whole-line writes ------------------------------------------------------------------


def test_write_all_waits_on_a_non_blocking_pipe_and_writes_everything():
    from runtime.serve.framing import write_all

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    data = b"".join(b'{"id": %d}\n' % i for i in range(100_000))  # far more than the pipe holds
    received = bytearray()

    def slow_reader():
        time.sleep(0.3)  # the writer meets EAGAIN first
        while chunk := os.read(read_fd, 4096):
            received.extend(chunk)

    reader = threading.Thread(target=slow_reader)
    reader.start()
    write_all(write_fd, data)
    os.close(write_fd)
    reader.join(timeout=30)
    os.close(read_fd)
    assert bytes(received) == data


def test_write_all_errors_are_typed():
    from runtime.serve.framing import OutputFailed, write_all

    with open("/dev/full", "wb") as full, pytest.raises(OutputFailed, match="No space left"):
        write_all(full.fileno(), b"x\n")
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    with pytest.raises(BrokenPipeError):
        write_all(write_fd, b"x\n")
    os.close(write_fd)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    with pytest.raises(OutputFailed, match="stopped reading"):
        write_all(write_fd, b"y" * (1 << 20), give_up=lambda: True)  # nobody reads: give up when asked
    os.close(read_fd)
    os.close(write_fd)


def test_splitter_knows_when_it_holds_a_partial_line():
    splitter = LineSplitter(10)
    assert splitter.feed(b"abc") == [] and splitter.holds_partial_line
    assert splitter.feed(b"\n") == [b"abc"] and not splitter.holds_partial_line
    splitter.feed(b"x" * 20)
    assert splitter.holds_partial_line  # discarding an over-long line counts too


# -- fair admission (issue 23) -------------------------------------------------------------------


def test_freed_places_go_to_the_waiting_connection_with_the_fewest_queued():
    """A full queue of connection A's requests; B and C wait, then A waits again. Freed places go
    to B and C first (nothing queued), and A's waiting reader gets a place only after them, in
    spite of waiting first, so a pipelining connection cannot take every freed place."""
    import asyncio

    from runtime.serve.admission import Admission

    async def scenario() -> list[str]:
        queue = RequestQueue(capacity=3)
        admission = Admission(queue, timeout_s=5.0)
        loop = asyncio.get_running_loop()

        def item(connection: str) -> Pending:
            return Pending(ClassifyRequest(None, ("rain",), True), loop.create_future(), connection, 0.0)

        for _ in range(3):
            assert await admission.enter(item("A"))  # room: straight in
        order: list[str] = []

        async def wait_for_place(connection: str) -> None:
            assert await admission.enter(item(connection))
            order.append(connection)

        waiters = [asyncio.create_task(wait_for_place(name)) for name in ("A", "B", "C")]
        await asyncio.sleep(0.01)
        assert order == [] and len(admission.waiting) == 3  # all wait: the queue is full
        for _ in range(3):  # the batch thread takes one request at a time
            admission.taken(queue.take_batch(max_texts=1, delay_s=0.0, wait_for=lambda: 1))
            await asyncio.sleep(0)
        await asyncio.gather(*waiters)
        return order

    assert asyncio.run(scenario()) == ["B", "C", "A"]


def test_a_request_that_finds_no_place_within_the_timeout_is_refused_and_leaves_no_waiter():
    import asyncio

    from runtime.serve.admission import Admission

    async def scenario() -> tuple[bool, int, int]:
        queue = RequestQueue(capacity=1)
        admission = Admission(queue, timeout_s=0.05)
        loop = asyncio.get_running_loop()
        first = Pending(ClassifyRequest(None, ("rain",), True), loop.create_future(), "A", 0.0)
        second = Pending(ClassifyRequest(None, ("goal",), True), loop.create_future(), "B", 0.0)
        assert await admission.enter(first)
        admitted = await admission.enter(second)  # nothing is taken: the model is stuck
        admission.taken(queue.take_batch(max_texts=1, delay_s=0.0, wait_for=lambda: 1))  # late: no one waits
        return admitted, len(admission.waiting), len(queue)

    assert asyncio.run(scenario()) == (False, 0, 0)


def test_a_closing_connection_leaves_the_waiting_line_without_taking_a_place():
    import asyncio

    from runtime.serve.admission import Admission

    async def scenario() -> tuple[int, list]:
        queue = RequestQueue(capacity=1)
        admission = Admission(queue, timeout_s=5.0)
        loop = asyncio.get_running_loop()

        def item(connection: str) -> Pending:
            return Pending(ClassifyRequest(None, ("rain",), True), loop.create_future(), connection, 0.0)

        await admission.enter(item("A"))
        gone = asyncio.create_task(admission.enter(item("gone")))
        stays = asyncio.create_task(admission.enter(item("B")))
        await asyncio.sleep(0.01)
        gone.cancel()  # its connection closed while it waited
        await asyncio.gather(gone, return_exceptions=True)
        admission.taken(queue.take_batch(max_texts=1, delay_s=0.0, wait_for=lambda: 1))
        assert await stays
        return len(admission.waiting), [p.connection for p in queue.items]

    assert asyncio.run(scenario()) == (0, ["B"])


def test_bytes_the_client_has_not_read_yet_are_seen_in_the_kernel_queue():
    # A connection whose answers wait in the kernel for a slow client is not idle (issue 33).
    from runtime.serve.connection import unread_by_peer

    class Transport:
        def __init__(self, sock: socket.socket):
            self.sock = sock

        def get_extra_info(self, name: str) -> socket.socket:
            return self.sock

    server, client = socket.socketpair()
    with server, client:
        assert unread_by_peer(Transport(server)) == 0
        server.sendall(b"x" * 5000)
        assert unread_by_peer(Transport(server)) >= 5000
        received = 0
        while received < 5000:
            received += len(client.recv(8192))
        assert unread_by_peer(Transport(server)) == 0
    assert unread_by_peer(Transport(server)) == 0  # a closed socket: the kernel cannot say
