"""Which external-data files an ONNX graph makes ONNX Runtime open, read from the graph's bytes.

ORT loads a tensor's bytes from the file its `external_data` "location" names, relative to the
graph, without asking anyone: a graph that names a file the manifest does not list would run on
weights no checksum covers (issue 23: altered scores were served that way). The package check
therefore lists every location the graph holds and requires each to be a data file of its variant.

Stdlib only, no `onnx` package: a protobuf wire-format walk that descends only into the messages
that can hold tensors (graphs, nodes, attributes, functions, sparse tensors, training info) and
skips everything else by its length, so a 100 MB graph is walked without copying its weights.
Field numbers are those of onnx/onnx.proto3 (IR version ≤ 10).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator

# bytes, or an mmap (indexing and slicing give ints and bytes, and no buffer stays exported, so
# the mmap can be closed whatever happens here)
Buffer = bytes | bytearray | mmap.mmap

# message kind → {field number: kind of the embedded message} for the fields that lead to tensors
MODEL, GRAPH, NODE, ATTRIBUTE, TENSOR, SPARSE, FUNCTION, TRAINING, ENTRY = range(9)
_CHILDREN: dict[int, dict[int, int]] = {
    MODEL: {7: GRAPH, 20: TRAINING, 25: FUNCTION},  # graph, training_info, functions
    TRAINING: {1: GRAPH, 2: GRAPH},  # initialization, algorithm
    GRAPH: {1: NODE, 5: TENSOR, 15: SPARSE},  # node, initializer, sparse_initializer
    NODE: {5: ATTRIBUTE},
    FUNCTION: {7: NODE, 11: ATTRIBUTE},  # node, attribute_proto (default values)
    ATTRIBUTE: {5: TENSOR, 6: GRAPH, 10: TENSOR, 11: GRAPH, 22: SPARSE, 23: SPARSE},  # t, g, tensors, graphs, …
    SPARSE: {1: TENSOR, 2: TENSOR},  # values, indices
    TENSOR: {13: ENTRY},  # external_data: StringStringEntryProto {key = 1, value = 2}
    ENTRY: {},
}
MAX_DEPTH = 64  # nested subgraphs (If/Loop bodies) deeper than this are not a graph we serve


class NotOnnx(ValueError):
    """The bytes are not a well-formed ONNX model protobuf."""


def _varint(data: Buffer, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise NotOnnx("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: Buffer, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, payload start, payload end) of one message's fields; varint
    payloads are given as their value in place of the start (end = -1)."""
    pos = start
    while pos < end:
        key, pos = _varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos, end)
            yield number, wire, value, -1
            continue
        if wire == 2:
            length, pos = _varint(data, pos, end)
            stop = pos + length
        elif wire in (1, 5):
            stop = pos + (8 if wire == 1 else 4)
        else:
            raise NotOnnx(f"wire type {wire} (field {number}) is not used by ONNX")
        if number == 0 or stop > end:
            raise NotOnnx("a field runs past the end of its message")
        yield number, wire, pos, stop
        pos = stop


def external_data_locations(data: Buffer) -> set[str]:
    """Every "location" any tensor of the model names (as written in the graph). Raises NotOnnx."""
    locations: set[str] = set()
    stack = [(MODEL, 0, len(data), 0)]
    while stack:
        message, start, end, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise NotOnnx(f"messages nested deeper than {MAX_DEPTH}")
        if message == ENTRY:
            entry = {number: data[a:b] for number, wire, a, b in _fields(data, start, end) if wire == 2}
            if entry.get(1) == b"location":
                try:
                    locations.add(entry.get(2, b"").decode("utf-8"))
                except UnicodeDecodeError:
                    raise NotOnnx("an external-data location is not UTF-8") from None
            continue
        children = _CHILDREN[message]
        for number, wire, a, b in _fields(data, start, end):
            if wire == 2 and number in children:
                stack.append((children[number], a, b, depth + 1))
    return locations
