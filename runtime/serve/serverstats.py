"""What the socket server adds to the stats op: batch sizes, latency, queue, connections, busy
answers by cause, CPU and memory. Kept by the event loop thread only (requests and errors are
counted by the Service)."""

from __future__ import annotations

import os
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from runtime.serve.service import percentile

LATENCY_WINDOW = 10_000  # the stats op's percentiles cover the last this-many requests
BUSY_CAUSES = ("queue_timeout", "max_connections", "shutting_down")


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
    """The server's own counters."""

    batch_sizes: Counter[int] = field(default_factory=Counter)  # requests per engine batch
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    connections_total: int = 0
    busy: Counter[str] = field(default_factory=lambda: Counter({cause: 0 for cause in BUSY_CAUSES}))
    answers_written: int = 0  # shutdown waits while this grows

    def to_json(self, queue_depth: int, connections_open: int, engine: dict[str, Any]) -> dict[str, Any]:
        """What the stats op adds for the socket server."""
        ordered = sorted(self.latencies_ms)
        return {
            "batch_sizes": {str(size): count for size, count in sorted(self.batch_sizes.items())},
            "latency_ms": {name: None if (v := percentile(ordered, q)) is None else round(v, 3)
                           for name, q in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))},
            "latency_window": len(ordered),
            "queue_depth": queue_depth,
            "connections": {"open": connections_open, "total": self.connections_total},
            "busy": dict(self.busy),
            "cpu_s": round(sum(os.times()[:2]), 3),  # user + system, all threads of this process
            **memory_usage(),
            "engine": {k: engine[k] for k in ("texts", "engine_calls", "engine_ms")},
        }
