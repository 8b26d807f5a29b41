"""Group texts into model batches by length bucket, and pad each batch into the session's arrays.

Padding every input to one fixed length wastes most of the compute on short texts (attention is
quadratic in length); padding to a few bucket lengths keeps the shapes few (ORT's CPU arena grows
to the largest shape and never shrinks) while short texts stay cheap. Pure functions over token
counts (and numpy for the arrays): the engine runs each planned batch with one session.run and
scatters results back to input order, so callers never see the grouping.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from runtime.protocol import DEFAULT_MAX_BATCH

if TYPE_CHECKING:
    from runtime.engine.text import Encoded

# Fine steps at the short end: chat-like inputs are 3–15 tokens, and padding an 8-token text to
# 16 doubles its cost in a batch (measured: 5.1 → 3.5 CPU ms/text at batch 32, MiniLM-L6 int8).
# Steps of ≤ 25 % up to 48 tokens: the golden mix costs 9–18 % less CPU per text in bulk than with
# (8, 12, 16, 24, 32, 48, …) (benchmarks/batch_plan.py); the batch planner merges neighbours that
# hold too few texts.
DEFAULT_BUCKETS = (4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 64, 80, 96, 128, 192, 256, 384)

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


def bucket_lengths(max_length: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> tuple[int, ...]:
    """Sorted bucket lengths below max_length, plus max_length itself as the last bucket."""
    return tuple(sorted({b for b in buckets if 0 < b < max_length} | {max_length}))


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """Smallest bucket that holds `length` tokens (buckets sorted, last = max length)."""
    for bucket in buckets:
        if length <= bucket:
            return bucket
    return buckets[-1]


def pad_batch(items: Sequence[Encoded], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """input_ids and attention_mask (int64 [batch, length]) for items no longer than `length`."""
    input_ids = np.full((len(items), length), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(items), length), dtype=np.int64)
    for row, item in enumerate(items):
        n = len(item.ids)
        input_ids[row, :n] = item.ids
        attention_mask[row, :n] = 1
    return input_ids, attention_mask


