"""bench: latency percentiles and throughput per batch size, for short and long texts.

Texts come from the package's golden set (real multilingual inputs): "short" are the golden
texts of at most 16 tokens, "long" are golden texts joined to about 128 tokens (capped at the
model's max length). The extra row "short, fixed pad" runs the same short texts padded to one
fixed length (128 or the max length) to show what length buckets save. "cpu ms/item" is process
CPU time (all threads) per text: on a shared machine it moves far less with other load than wall time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from runtime.engine.engine import Engine
from runtime.engine.text import Encoded
from runtime.package.load import read_golden
from runtime.serve.service import percentile

SHORT_TOKENS = 16
LONG_TOKENS = 128
FALLBACK_TEXTS = (
    "Pumpe 3: Vibration über Grenzwert",
    "The invoice was paid twice, please refund",
    "La livraison est en retard de deux semaines",
    "El servidor no responde desde esta mañana",
    "Il treno è in ritardo di venti minuti",
)


def bench_texts(engine: Engine) -> tuple[list[str], list[str]]:
    """Short (≤ 16 tokens) and long (~128 tokens) texts from the golden set."""
    pool = [g["text"] for g in read_golden(engine.package)] or list(FALLBACK_TEXTS)
    counts = [len(e.ids) for e in engine.encoder.tokenize(pool)]
    short = [t for t, n in zip(pool, counts) if n <= SHORT_TOKENS] or [pool[counts.index(min(counts))]]
    target = min(LONG_TOKENS, engine.encoder.max_length)
    long_texts: list[str] = []
    for start in range(min(len(pool), 32)):
        pieces, tokens, i = [], 0, start
        while tokens < target:
            pieces.append(pool[i % len(pool)])
            tokens += counts[i % len(pool)]
            i += 1
        long_texts.append(" ".join(pieces))
    return short, long_texts


def measure(call: Callable[[int], None], batch_size: int, seconds: float, min_calls: int = 5) -> dict[str, float]:
    """Time call(i) repeatedly for about `seconds`; latency is per call (= per batch)."""
    latencies: list[float] = []
    start, start_cpu = time.perf_counter(), time.process_time()
    i = 0
    while i < min_calls or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        call(i)
        latencies.append((time.perf_counter() - t0) * 1000)
        i += 1
    total_s = time.perf_counter() - start
    cpu_s = time.process_time() - start_cpu  # all threads; unlike wall time, not inflated by other load
    ordered = sorted(latencies)
    return {
        "batch": batch_size,
        "calls": len(latencies),
        "p50_ms": round(percentile(ordered, 0.50), 3),
        "p95_ms": round(percentile(ordered, 0.95), 3),
        "p99_ms": round(percentile(ordered, 0.99), 3),
        "per_item_ms": round(statistics.median(latencies) / batch_size, 3),
        "items_per_s": round(len(latencies) * batch_size / total_s, 1),
        "cpu_ms_per_item": round(cpu_s * 1000 / (len(latencies) * batch_size), 3),
    }


def _batches(texts: Sequence[str], batch_size: int) -> Callable[[int], list[str]]:
    """The i-th batch of `batch_size` texts, cycling through the texts."""
    def nth(i: int) -> list[str]:
        return [texts[(i * batch_size + k) % len(texts)] for k in range(batch_size)]
    return nth


def run_bench(engine: Engine, batch_sizes: Sequence[int], seconds: float = 2.0) -> dict[str, Any]:
    """Every (kind, batch size) measurement plus the fixed-padding comparison, as JSON."""
    short, long_texts = bench_texts(engine)
    rows: list[dict[str, Any]] = []
    for kind, texts in (("short", short), ("long", long_texts)):
        for batch_size in batch_sizes:
            nth = _batches(texts, batch_size)
            rows.append({"texts": kind, **measure(lambda i, nth=nth: engine.classify(nth(i)), batch_size, seconds)})

    fixed = min(LONG_TOKENS, engine.encoder.max_length)
    encoded_short = engine.encoder.tokenize(short)
    for batch_size in (1, max(batch_sizes)):
        def run_fixed(i: int, size: int = batch_size) -> None:
            items: list[Encoded] = [encoded_short[(i * size + k) % len(encoded_short)] for k in range(size)]
            engine.run_padded(items, fixed)
        rows.append({"texts": f"short, fixed pad {fixed}", **measure(run_fixed, batch_size, seconds)})

    short_tokens = [len(e.ids) for e in encoded_short]
    return {
        "model": f"{engine.package.manifest.name} {engine.package.manifest.version}",
        "variant": engine.variant.name,
        "threads": engine.settings.threads,
        "buckets": list(engine.buckets),
        "short_texts": {"count": len(short), "max_tokens": max(short_tokens)},
        "long_texts": {"count": len(long_texts), "target_tokens": min(LONG_TOKENS, engine.encoder.max_length)},
        "rows": rows,
    }


def format_table(report: dict[str, Any]) -> str:
    """The bench report as a plain text table."""
    lines = [
        (f"model {report['model']}, variant {report['variant']}, tier {report.get('tier', '?')}, "
         f"{report['threads']} threads, buckets {report['buckets']}"),
        (f"short texts: {report['short_texts']['count']} (≤ {report['short_texts']['max_tokens']} tokens); "
         f"long texts: ~{report['long_texts']['target_tokens']} tokens"),
        (f"{'texts':<22}{'batch':>6}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'ms/item':>10}{'items/s':>10}"
         f"{'cpu ms/item':>13}"),
    ]
    for row in report["rows"]:
        lines.append(
            f"{row['texts']:<22}{row['batch']:>6}{row['p50_ms']:>10.2f}{row['p95_ms']:>10.2f}"
            f"{row['p99_ms']:>10.2f}{row['per_item_ms']:>10.3f}{row['items_per_s']:>10.1f}"
            f"{row['cpu_ms_per_item']:>13.3f}"
        )
    return "\n".join(lines)
