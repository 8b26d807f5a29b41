"""The socket server's request queue and the fair way into it.

- `RequestQueue`: bounded FIFO between the event loop (which offers, never blocking) and the
  batch threads (which take whole batches). Thread-safe.
- `Admission`: the way in, on the event loop thread only. While the queue has room and nobody
  waits, a request goes straight in. Otherwise its connection waits (and is not read meanwhile:
  backpressure), and each place the batch threads free goes to the waiting connection with the
  fewest requests in the queue, the longest waiting first among equals — not to whichever reader
  happens to wake first (issue 23: with 8 pipelining clients on a loaded box, the readers that
  woke first took every freed place and others waited past --queue-timeout into `busy`). A
  request that waits longer than --queue-timeout is answered busy: the model is overloaded or
  stuck, not merely busy with other connections' shares.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from runtime.protocol import ClassifyRequest


@dataclass
class Pending:
    """A classify request waiting for the engine, and where its answer goes."""

    request: ClassifyRequest
    future: asyncio.Future
    connection: Any  # runtime.serve.connection.Connection (only `.closed` is read by batch threads)
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
        """Queue the item; False if the queue is full."""
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

    def _gather(self, max_texts: int, delay_s: float, wait_for: Callable[[], int]) -> bool:
        """With the lock held: wait for a request, then up to delay_s for wait_for() of them.
        False when closed and empty."""
        while True:
            while not self.items and not self.closed:
                self.condition.wait()
            if not self.items:
                return False
            if delay_s > 0:
                deadline = time.monotonic() + delay_s
                while not self.closed and len(self.items) < min(max_texts, wait_for()):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self.condition.wait(remaining)
            if self.items:
                return True
            # another batch thread took everything while this one gathered: wait again

    def take_batch(self, max_texts: int, delay_s: float, wait_for: Callable[[], int],
                   takers: int = 1) -> list[Pending] | None:
        """Block for at least one request, then gather for up to delay_s while fewer than
        wait_for() requests are queued; return up to max_texts texts' worth (always ≥ 1 request),
        and with several `takers` (batch threads) at most a fair share of the requests queued or
        in flight. Taken requests count in flight until `answered`. None when closed and empty."""
        with self.condition:
            if not self._gather(max_texts, delay_s, wait_for):
                return None
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


@dataclass
class _Waiter:
    item: Pending
    granted: asyncio.Future
    since: float = field(default_factory=time.monotonic)


class Admission:
    """Fair entry into a RequestQueue for the connections of one event loop (module docstring).
    Every method runs on the loop thread; batch threads report taken requests through `taken`
    (with loop.call_soon_threadsafe)."""

    def __init__(self, queue: RequestQueue, timeout_s: float):
        self.queue = queue
        self.timeout_s = timeout_s
        self.waiting: list[_Waiter] = []  # at most one per connection: its reader waits here
        self.queued: Counter[Hashable] = Counter()  # requests of each connection in the queue now

    async def enter(self, item: Pending) -> bool:
        """Put the item into the queue, waiting for a fair turn while it is full; False when no
        place came within timeout_s (or the queue is closed): the caller answers busy."""
        if self.queue.closed:
            return False
        if not self.waiting and self.queue.offer(item):
            self.queued[item.connection] += 1
            return True
        waiter = _Waiter(item, asyncio.get_running_loop().create_future())
        self.waiting.append(waiter)
        try:
            async with asyncio.timeout(self.timeout_s):
                await waiter.granted
            return True
        except TimeoutError:
            # granted in the same loop turn as the timeout fired: it is in the queue already
            return waiter.granted.done() and not waiter.granted.cancelled()
        finally:
            if waiter in self.waiting:
                self.waiting.remove(waiter)

    def taken(self, batch: list[Pending]) -> None:
        """Batch threads took these requests: their places go to the waiting connections."""
        for item in batch:
            self.queued[item.connection] -= 1
            if self.queued[item.connection] <= 0:
                del self.queued[item.connection]
        self.grant()

    def grant(self) -> None:
        """Fill the queue's free places from the waiting connections, fewest queued first."""
        while self.waiting and len(self.queue) < self.queue.capacity:
            waiter = min(self.waiting, key=lambda w: (self.queued[w.item.connection], w.since))
            self.waiting.remove(waiter)
            if waiter.granted.done() or not self.queue.offer(waiter.item):
                continue  # timed out or cancelled (its connection closed) meanwhile
            self.queued[waiter.item.connection] += 1
            waiter.granted.set_result(None)
