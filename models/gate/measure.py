"""A variant measured through the runtime's own code: `runtime.engine.engine.Engine` (its tokenizer,
buckets, batching and calibrated softmax) on texts: probabilities and batch-1 latency.

The publish step's gate (models/publish/publish.py) and `python -m models evaluate`
(models/evaluate/evaluate.py) both measure through here, so the figures are what ships. Torch-free.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from models.progress import Progress


def uncalibrated(package):
    """The package as seen without its temperature (scores at T = 1), e.g. to compare with the
    model it was made from."""
    from runtime.package.load import Package

    return Package(package.root, replace(package.manifest, calibration={}))


def classify_results(engine, texts: list[str], chunk: int = 64) -> list:
    """The runtime Engine's Classification of each text (its tokenizer, buckets and batching)."""
    results: list = []
    progress = Progress(f"evaluate {engine.variant.name}", len(texts))
    for start in range(0, len(texts), chunk):
        batch = texts[start : start + chunk]
        results += engine.classify(batch)
        progress.advance(len(batch))
    return results


def classify_probs(engine, texts: list[str], chunk: int = 64) -> np.ndarray:
    """Probabilities [len(texts), labels] from the runtime's Engine (its tokenizer, buckets and batching)."""
    rows = [c.probs for c in classify_results(engine, texts, chunk)]
    return np.array(rows, dtype=np.float64).reshape(len(texts), len(engine.labels))


def engine_latency_ms(engine, texts: list[str], runs: int = 100) -> dict:
    """Median / p90 wall time of Engine.classify on one text at a time (tokenizer included)."""
    sample = [texts[i % len(texts)] for i in range(runs)]
    for text in sample[:10]:
        engine.classify([text])
    times = []
    for text in sample:
        start = time.perf_counter()
        engine.classify([text])
        times.append((time.perf_counter() - start) * 1000)
    tokens = sorted(len(item.ids) for item in engine.encoder.tokenize(sample))
    return {"median_ms": round(float(np.median(times)), 3), "p90_ms": round(float(np.percentile(times, 90)), 3),
            "runs": runs, "median_tokens": tokens[len(tokens) // 2], "threads": engine.settings.threads,
            "includes": "tokenizer + session.run + softmax"}
