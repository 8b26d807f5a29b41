"""The external-data file a package's graphs share (the frozen word table, stored once).

ONNX keeps large initializers outside the graph file by reference (location, offset, length);
every variant of a package points at the same `embeddings.bin`, so the table costs its bytes
once however many variants there are. onnx only (no torch).
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, numpy_helper

SHARED_DATA_FILE = "embeddings.bin"
_ALIGN = 4096  # offsets in the shared file are page-aligned so ORT may mmap them


def write_shared_data(model: onnx.ModelProto, names: list[str], path: Path) -> dict[str, tuple[int, int]]:
    """Write the named initializers into one external-data file; returns name → (offset, length)."""
    layout, offset = {}, 0
    with open(path, "wb") as fh:
        for init in model.graph.initializer:
            if init.name in names:
                raw = numpy_helper.to_array(init).tobytes()
                fh.write(b"\0" * (offset - fh.tell()))
                fh.write(raw)
                layout[init.name] = (offset, len(raw))
                offset = (offset + len(raw) + _ALIGN - 1) // _ALIGN * _ALIGN
    return layout


def point_to_shared_data(model: onnx.ModelProto, layout: dict[str, tuple[int, int]], location: str) -> None:
    """Replace the named initializers' bytes by references into the shared external-data file."""
    reference_external_data(model, {name: {"location": location, "offset": str(offset), "length": str(length)}
                                    for name, (offset, length) in layout.items()})


def point_to_shared_data_tensor(init: TensorProto, place: tuple[int, int], location: str) -> None:
    """One initializer's bytes replaced by its (offset, length) reference into `location`."""
    offset, length = place
    _reference(init, {"location": location, "offset": str(offset), "length": str(length)})


def reference_external_data(model: onnx.ModelProto, entries: dict[str, dict[str, str]]) -> None:
    """Make the named initializers reference external data ({location, offset, length}), no bytes inline."""
    for init in model.graph.initializer:
        if init.name in entries:
            _reference(init, entries[init.name])


def _reference(init: TensorProto, entries: dict[str, str]) -> None:
    for field in ("raw_data", "int32_data", "float_data"):
        init.ClearField(field)
    init.data_location = TensorProto.EXTERNAL
    del init.external_data[:]
    for key, value in entries.items():
        entry = init.external_data.add()
        entry.key, entry.value = key, value


def shared_data_layout(model: onnx.ModelProto) -> dict[str, dict[str, str]]:
    """Initializer name → its external-data entries (location, offset, length)."""
    return {init.name: {e.key: e.value for e in init.external_data}
            for init in model.graph.initializer if init.data_location == TensorProto.EXTERNAL}
