"""Group texts into model batches by length bucket.

Pure functions over token counts: the engine runs each planned batch with one session.run and
scatters results back to input order, so callers never see the grouping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.text import bucket_for

DEFAULT_MAX_BATCH = 32
# Caps batch × length: ORT's arena grows to the largest batch and never shrinks, and long texts
# gain nothing from batching (measured on topics-multilingual: ~45 CPU ms/text at 128 tokens for
# batch 1 to 16), while short texts already reach their best per-text cost at 32 × 16 tokens.
DEFAULT_MAX_BATCH_TOKENS = 2048


@dataclass(frozen=True)
class PlannedBatch:
    """Indices (into the caller's list) that run together, padded to `length`."""

    length: int
    indices: tuple[int, ...]


def plan_batches(
    token_counts: Sequence[int],
    buckets: Sequence[int],
    max_batch: int = DEFAULT_MAX_BATCH,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
) -> list[PlannedBatch]:
    """Split items into batches of one bucket each, at most max_batch items and max_batch_tokens.

    Items keep their relative order inside a bucket; buckets are emitted shortest first.
    """
    by_bucket: dict[int, list[int]] = {}
    for index, count in enumerate(token_counts):
        by_bucket.setdefault(bucket_for(count, buckets), []).append(index)
    batches: list[PlannedBatch] = []
    for length in sorted(by_bucket):
        per_batch = max(1, min(max_batch, max_batch_tokens // length))
        indices = by_bucket[length]
        for start in range(0, len(indices), per_batch):
            batches.append(PlannedBatch(length, tuple(indices[start:start + per_batch])))
    return batches
