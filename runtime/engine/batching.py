"""Group texts into model batches by length bucket.

Pure functions over token counts: the engine runs each planned batch with one session.run and
scatters results back to input order, so callers never see the grouping.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.engine.text import bucket_for
from runtime.protocol import DEFAULT_MAX_BATCH

# Caps batch × length: ORT's arena grows to the largest batch and never shrinks, and long texts
# gain nothing from batching (measured on topics-multilingual: ~45 CPU ms/text at 128 tokens for
# batch 1 to 16), while short texts already reach their best per-text cost at 32 × 16 tokens.
DEFAULT_MAX_BATCH_TOKENS = 2048
# What one session.run costs beyond its padded tokens, in token rows: batch 1 vs batch 32 of the
# same length on topics-multilingual int8 gave 8–11 (`python3 benchmarks/batch_plan.py`).
DEFAULT_CALL_COST_TOKENS = 10


@dataclass(frozen=True)
class PlannedBatch:
    """Indices (into the caller's list) that run together, padded to `length`."""

    length: int
    indices: tuple[int, ...]


def _rows_per_batch(length: int, max_batch: int, max_batch_tokens: int) -> int:
    return max(1, min(max_batch, max_batch_tokens // length))


def plan_batches(
    token_counts: Sequence[int],
    buckets: Sequence[int],
    max_batch: int = DEFAULT_MAX_BATCH,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    call_cost_tokens: int = DEFAULT_CALL_COST_TOKENS,
) -> list[PlannedBatch]:
    """Split items into batches padded to a bucket length, at most max_batch items and
    max_batch_tokens each, at the least estimated cost.

    Fine buckets keep padding small, but a bucket with a single text would then cost a call of its
    own; so neighbouring buckets are merged (padded to the longer one) whenever that is cheaper,
    with cost = calls × call_cost_tokens + rows × padded length. The best merge is found exactly
    by dynamic programming over the sorted, non-empty buckets. Items keep their relative order
    inside a bucket; batches are emitted shortest first.
    """
    by_bucket: dict[int, list[int]] = {}
    for index, count in enumerate(token_counts):
        by_bucket.setdefault(bucket_for(count, buckets), []).append(index)
    lengths = sorted(by_bucket)
    # best[j]: least cost of the first j buckets; start[j]: where the last merged run begins
    best = [0.0] + [math.inf] * len(lengths)
    start = [0] * (len(lengths) + 1)
    for end in range(1, len(lengths) + 1):
        length = lengths[end - 1]
        per_batch = _rows_per_batch(length, max_batch, max_batch_tokens)
        rows = 0
        for first in range(end - 1, -1, -1):
            rows += len(by_bucket[lengths[first]])
            cost = best[first] + math.ceil(rows / per_batch) * call_cost_tokens + rows * length
            if cost < best[end]:
                best[end], start[end] = cost, first
    runs = []
    end = len(lengths)
    while end > 0:
        runs.append((start[end], end))
        end = start[end]
    batches: list[PlannedBatch] = []
    for first, end in reversed(runs):
        length = lengths[end - 1]
        indices = [index for bucket in lengths[first:end] for index in by_bucket[bucket]]
        per_batch = _rows_per_batch(length, max_batch, max_batch_tokens)
        for offset in range(0, len(indices), per_batch):
            batches.append(PlannedBatch(length, tuple(indices[offset:offset + per_batch])))
    return batches


def spread_batches(plan: Sequence[PlannedBatch], workers: int) -> list[PlannedBatch]:
    """The plan with its biggest batches halved until there are at least `workers` batches (or
    every batch holds one text), so that concurrent workers all get a share of one call.

    Halving costs one more session.run per split (~10 token rows, see DEFAULT_CALL_COST_TOKENS);
    a second core doing the other half pays far more. Order does not matter to the caller, which
    scatters results by index; answers do not depend on batch-mates (fixed int8 scales).
    """
    batches = list(plan)
    while len(batches) < workers:
        biggest = max(range(len(batches)), key=lambda i: len(batches[i].indices) * batches[i].length, default=None)
        if biggest is None or len(batches[biggest].indices) < 2:
            break
        batch = batches.pop(biggest)
        half = (len(batch.indices) + 1) // 2
        batches[biggest:biggest] = [PlannedBatch(batch.length, batch.indices[:half]),
                                    PlannedBatch(batch.length, batch.indices[half:])]
    return batches
